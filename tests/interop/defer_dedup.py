#!/usr/bin/env python3
"""Interop: deferred messages and deduplication records cross between the
original Rust-based Prosody (PyPI prosody-events 0.6.1, its own venv, run as
a subprocess: original_qos_consumer.py) and ours, through the one keyspace
they share (the original's tables).

Run by scripts/interop-tests.sh with OUR package's venv (it holds
cassandra-driver). Each scenario is one topic of one partition and one
consumer group, which moves from one implementation to the other; our
producer sends every record (payload {"key", "seq", "id"}), so a key's
records share a partition whoever sends them:
  1. original -> ours. The original handles "ok" and "dup" records and
     fails every "bad" one (transient: it defers them: three rows in
     deferred_offsets, checked). It stops; then "bad" gets two more records,
     "dup" gets five records repeating the ids it handled and one with a
     new id, "ok" one more. Ours takes the group over: it retries the
     original's deferred "bad" records and handles all five in order, once
     each; it skips the five repeated ids (the original's dedup records)
     and handles only the new ones.
  2. ours -> original, the same the other way round: ours defers "bad"
     (rows checked), stops, and the original retries ours' deferred records
     and skips the ids ours recorded.
Every wait is bounded (PROSODY_INTEROP_WAIT seconds, default 120). Exit 0
when it passed; the keyspace and topics are dropped either way.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from cassandra.cluster import Cluster  # cassandra-driver, test-only
from cleanup_util import drop_keyspace

from prosody import AdminClient, EventHandler, ProsodyClient

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
WAIT = float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
HERE = Path(__file__).parent

Rec = Tuple[str, int]


class Failure(Exception):
    pass


class Seen:
    """Attempts and handled records of one consumer, awaitable."""

    def __init__(self) -> None:
        self.attempts: List[Rec] = []
        self.handled: List[Rec] = []
        self.cond = asyncio.Condition()

    async def add(self, attempt: bool, rec: Rec) -> None:
        async with self.cond:
            (self.attempts if attempt else self.handled).append(rec)
            self.cond.notify_all()

    async def until(self, what: str, pred: Callable[["Seen"], bool]) -> None:
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(lambda: pred(self)), WAIT)
            except asyncio.TimeoutError:
                raise Failure(f"{what}: not within {WAIT:.0f} s (handled {self.handled}, "
                              f"attempted {self.attempts[-5:]})") from None

    def of(self, key: str) -> List[int]:
        return [s for k, s in self.handled if k == key]


class Ours(EventHandler):
    def __init__(self, seen: Seen, fail_keys: set) -> None:
        self.seen, self.fail_keys = seen, fail_keys

    async def on_message(self, context: Any, message: Any) -> None:
        rec = (message.key, message.payload["seq"])
        await self.seen.add(True, rec)
        if message.key in self.fail_keys:
            raise RuntimeError(f"{message.key} fails (the test's transient failure)")
        await self.seen.add(False, rec)


async def send(producer: Any, topic: str, recs: List[Tuple[str, int, str]]) -> None:
    for key, seq, eid in recs:  # one at a time: each key's order holds
        await producer.send(topic, key, {"key": key, "seq": seq, "id": eid})


def deferred(session: Any, ks: str, topic: str, group: str, key: str) -> List[int]:
    """The key's deferred offsets, as the original lays them out."""
    seg = uuid.uuid5(uuid.NAMESPACE_OID, f"{topic}/0:{group}")
    rows = session.execute(f"SELECT offset FROM {ks}.deferred_offsets WHERE segment_id = %s "
                           f"AND key = %s", (seg, key))
    return [r.offset for r in rows if r.offset is not None]


async def until_deferred(session: Any, ks: str, topic: str, group: str, n: int) -> None:
    """Until 'bad' has n deferred offsets (at least n; n = 0: exactly none)."""
    deadline = time.monotonic() + WAIT
    while True:
        have = deferred(session, ks, topic, group, "bad")
        if (len(have) >= n) if n else not have:
            return
        if time.monotonic() > deadline:
            raise Failure(f"'bad' has deferred offsets {have} in {ks}.deferred_offsets after "
                          f"{WAIT:.0f} s, want {n or 'none'}")
        await asyncio.sleep(0.2)  # another process's writes: polled


class Original:
    """The original's consumer process and what it reports."""

    def __init__(self, args: argparse.Namespace, log: Path) -> None:
        self.args, self.log, self.seen, self.stopped = args, log, Seen(), False
        self.proc: Any = None
        self.reader: Any = None

    async def start(self, topic: str, group: str, ks: str, fail: str) -> None:
        with open(self.log, "ab") as f:
            self.proc = await asyncio.create_subprocess_exec(
                self.args.original_python, str(HERE / "original_qos_consumer.py"),
                "--bootstrap", BOOTSTRAP, "--group", group, "--topic", topic,
                "--cassandra", CASSANDRA, "--keyspace", ks, "--fail-keys", fail,
                stdout=asyncio.subprocess.PIPE, stderr=f, stdin=asyncio.subprocess.DEVNULL)
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            ev = json.loads(line)
            if ev.get("event") in ("attempt", "message"):
                await self.seen.add(ev["event"] == "attempt", (ev["key"], ev["seq"]))
            elif ev.get("event") == "stopped":
                self.stopped = True

    async def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.reader, WAIT)
            await asyncio.wait_for(self.proc.wait(), WAIT)
        except asyncio.TimeoutError:
            self.proc.kill()
            raise Failure(f"the original did not stop within {WAIT:.0f} s (log {self.log})") from None
        if not self.stopped or self.proc.returncode != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            raise Failure(f"the original exited ({self.proc.returncode}), stopped={self.stopped}; "
                          f"its log ends:\n  | " + "\n  | ".join(tail))


def ours_client(topic: str, group: str, ks: str) -> Any:
    return ProsodyClient(bootstrap_servers=BOOTSTRAP, group_id=group, subscribed_topics=topic,
                         cassandra_nodes=CASSANDRA, cassandra_keyspace=ks, probe_port=None,
                         telemetry_enabled=False)


def first_batch(tag: str) -> List[Tuple[str, int, str]]:
    recs = [("ok", s, f"{tag}-ok-{s}") for s in range(5)]
    recs += [("bad", s, f"{tag}-bad-{s}") for s in range(3)]
    recs += [("dup", s, f"{tag}-dup-{s}") for s in range(5)]
    return recs


def second_batch(tag: str) -> List[Tuple[str, int, str]]:
    recs = [("bad", s, f"{tag}-bad-{s}") for s in (3, 4)]
    recs += [("dup", 5 + s, f"{tag}-dup-{s}") for s in range(5)]  # the ids handled before
    recs += [("dup", 10, f"{tag}-dup-new"), ("ok", 5, f"{tag}-ok-5")]
    return recs


def handled_first(seen: Seen) -> bool:
    return (seen.of("ok") == list(range(5)) and seen.of("dup") == list(range(5))
            and any(k == "bad" for k, _ in seen.attempts))


def handled_second(seen: Seen) -> bool:
    return len(seen.of("bad")) >= 5 and 10 in seen.of("dup") and 5 in seen.of("ok")


def check_second(seen: Seen, who: str) -> None:
    if seen.of("bad") != [0, 1, 2, 3, 4]:
        raise Failure(f"{who} handled 'bad' {seen.of('bad')}: want the deferred 0, 1, 2 then "
                      f"3, 4, once each")
    if seen.of("dup") != [10]:
        raise Failure(f"{who} handled 'dup' {seen.of('dup')}: want only 10 (5-9 repeat ids "
                      f"the other side handled)")
    if seen.of("ok") != [5]:
        raise Failure(f"{who} handled 'ok' {seen.of('ok')}: want only 5")


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    ks = f"interop_qos_{suffix}"
    t1, t2 = f"interop-qos-to-ours-{suffix}", f"interop-qos-to-original-{suffix}"
    g1, g2 = f"{t1}-g", f"{t2}-g"
    log = Path(args.log_dir) / f"defer_dedup-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    cluster = Cluster([CASSANDRA.split(":")[0]], port=int(CASSANDRA.split(":")[1]))
    session = cluster.connect()
    session.default_timeout = WAIT  # schema changes on a busy node are slow
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-qos",
                             probe_port=None, telemetry_enabled=False)
    t0 = time.monotonic()
    try:
        for t in (t1, t2):
            await admin.create_topic(t, partition_count=1, replication_factor=1)

        # 1. The original first, then ours.
        await send(producer, t1, first_batch("a"))
        orig = Original(args, log)
        await orig.start(t1, g1, ks, "bad")
        await orig.seen.until("the original handling ok and dup", handled_first)
        await until_deferred(session, ks, t1, g1, 3)
        await orig.stop()
        await send(producer, t1, second_batch("a"))
        seen = Seen()
        client = ours_client(t1, g1, ks)
        await client.subscribe(Ours(seen, set()))
        try:
            await seen.until("ours after the original", handled_second)
            await until_deferred(session, ks, t1, g1, 0)  # its queue drained
        finally:
            await client.unsubscribe()
        check_second(seen, "ours (after the original)")

        # 2. Ours first, then the original.
        await send(producer, t2, first_batch("b"))
        seen = Seen()
        client = ours_client(t2, g2, ks)
        await client.subscribe(Ours(seen, {"bad"}))
        try:
            await seen.until("ours handling ok and dup", handled_first)
            await until_deferred(session, ks, t2, g2, 3)
        finally:
            await client.unsubscribe()
        await send(producer, t2, second_batch("b"))
        orig = Original(args, log)
        await orig.start(t2, g2, ks, "")
        try:
            await orig.seen.until("the original after ours", handled_second)
            await until_deferred(session, ks, t2, g2, 0)
        finally:
            await orig.stop()
        check_second(orig.seen, "the original (after ours)")
        return (f"each way: 3 deferred + 2 later 'bad' records retried by the new side, in "
                f"order, once each; 5 repeated ids skipped; wall {time.monotonic() - t0:.1f} s")
    finally:
        drop_keyspace(session, ks)
        cluster.shutdown()
        for t in (t1, t2):
            try:
                await admin.delete_topic(t)
            except Exception as e:  # noqa: BLE001 - best effort cleanup
                print(f"interop: could not delete topic {t}: {e}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original-python", required=True)
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop defer_dedup: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop defer_dedup: passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
