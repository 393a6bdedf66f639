#!/usr/bin/env python3
"""Interop: one consumer of ours and one of the original Rust-based Prosody
(PyPI prosody-events) share ONE consumer group on a real Kafka.

Run by scripts/interop-tests.sh with OUR package's venv; the original's
consumer (tests/interop/member.py) runs as a subprocess with the
original's venv (--original-python) and reports each record it handles as a
JSON line on its standard output.

Scenario, on a fresh 4-partition topic and a fresh group:
  1. our producer sends batch A (ROUNDS_A rounds of one record for each of
     KEYS keys; each payload carries its key's sequence number);
  2. the original's consumer joins the group and handles some of batch A;
  3. ours joins the same group while batch B keeps arriving (a round every
     PACE s until ours owns partitions);
  4. once ours owns partitions, batch C is sent;
  5. the test waits until every record was handled by one member or both.
Checks: both members own partitions after the join and both handled batch C
records (sent after the join), every record was handled at least once, and
each member handled each key's records in order (strictly increasing
sequence numbers). It prints one summary line (records handled by each
member, duplicates) and stops both consumers cleanly: ours with
`await client.unsubscribe()`, the original by SIGTERM (it then unsubscribes
and shuts down).

Every wait is bounded (PROSODY_INTEROP_WAIT seconds, default 120) and fails
with what was awaited and what was seen. Exit status 0 when it passed.
Kafka: PROSODY_TEST_BOOTSTRAP (127.0.0.1:9094); Cassandra:
PROSODY_TEST_CASSANDRA_NODES (127.0.0.1:9042). Both use one keyspace, the
Python suite's (prosody_pytest, as bindings/python/tests/conftest.py), as a
fleet moving from one to the other does.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from prosody import AdminClient, EventHandler, ProsodyClient

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
WAIT = float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
OURS_KEYSPACE = "prosody_pytest"  # the Python suite's (conftest.py)
ORIGINAL_KEYSPACE = OURS_KEYSPACE  # one keyspace for both
PARTITIONS = 4
KEYS = 100
ROUNDS_A = 20          # batch A: 2 000 records before either consumer joins
ROUNDS_B_MAX = 40      # batch B: a round every PACE s while ours joins, at most this many
PACE = 0.5
ROUNDS_C = 10          # batch C: 1 000 records after ours owns partitions
ORIGINAL_FIRST = 200   # records the original handles before ours joins

Record = Tuple[str, int]  # (key, seq)


class Failure(Exception):
    pass


class Tracker:
    """What each member handled and what the original's process reported;
    waits are on its condition, woken by each record or report."""

    def __init__(self) -> None:
        self.handled: Dict[str, List[Tuple[str, int, str, int]]] = {"original": [], "ours": []}
        self.distinct: Set[Record] = set()
        self.produced = 0
        self.original_subscribed = False
        self.original_partitions: Optional[int] = None
        self.original_stopped = False
        self.original_eof = False
        self.cond = asyncio.Condition()

    async def add(self, member: str, key: str, seq: int, batch: str, partition: int) -> None:
        async with self.cond:
            self.handled[member].append((key, seq, batch, partition))
            self.distinct.add((key, seq))
            self.cond.notify_all()

    async def update(self, fn: Callable[[], None]) -> None:
        async with self.cond:
            fn()
            self.cond.notify_all()

    def state(self) -> str:
        return (f"produced {self.produced}, distinct handled {len(self.distinct)}, "
                f"original handled {len(self.handled['original'])} "
                f"(subscribed={self.original_subscribed}, partitions={self.original_partitions}, "
                f"exited={self.original_eof}), ours handled {len(self.handled['ours'])}")

    async def wait_for(self, pred: Callable[[], bool], what: str, timeout: float = WAIT,
                       original_alive: bool = True) -> None:
        """Waits until pred() holds; fails after timeout s, or at once if the
        original's process ended while it had to stay alive."""
        def done() -> bool:
            return pred() or (original_alive and self.original_eof)
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(done), timeout)
            except asyncio.TimeoutError:
                raise Failure(f"timed out after {timeout:.0f} s waiting for {what}; "
                              f"{self.state()}") from None
            if not pred():
                raise Failure(f"the original's consumer exited while the test waited for "
                              f"{what}; {self.state()}")


class Ours(EventHandler):
    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    async def on_message(self, context: Any, message: Any) -> None:
        p = message.payload
        await self.tracker.add("ours", message.key, p["seq"], p["batch"], message.partition)


async def read_original(stream: asyncio.StreamReader, tracker: Tracker) -> None:
    """Turns the original's JSON lines into tracker updates until EOF."""
    try:
        while True:
            line = await stream.readline()
            if not line:
                break
            try:
                ev = json.loads(line)
            except ValueError:
                print(f"interop: unexpected line from the original: {line!r}", file=sys.stderr)
                continue
            kind = ev.get("event")
            if kind == "message":
                await tracker.add("original", ev["key"], ev["seq"], ev["batch"], ev["partition"])
            elif kind == "subscribed":
                await tracker.update(lambda: setattr(tracker, "original_subscribed", True))
            elif kind == "partitions":
                await tracker.update(lambda: setattr(tracker, "original_partitions", ev["count"]))
            elif kind == "stopped":
                await tracker.update(lambda: setattr(tracker, "original_stopped", True))
            else:
                print(f"interop: unexpected event from the original: {ev!r}", file=sys.stderr)
    finally:
        await tracker.update(lambda: setattr(tracker, "original_eof", True))


class Producer:
    """Sends rounds of one record per key; a key's sequence numbers run on
    across batches. A round's sends are awaited before the next round, so
    each key's records land in order."""

    def __init__(self, client: ProsodyClient, topic: str, tracker: Tracker) -> None:
        self.client, self.topic, self.tracker = client, topic, tracker
        self.next_seq = [0] * KEYS
        self.by_batch: Dict[str, int] = defaultdict(int)

    async def round(self, batch: str) -> None:
        sends = []
        for k in range(KEYS):
            seq = self.next_seq[k]
            self.next_seq[k] += 1
            key = f"k{k:03d}"
            sends.append(self.client.send(self.topic, key, {"key": key, "seq": seq, "batch": batch}))
        await asyncio.gather(*sends)
        self.by_batch[batch] += KEYS
        await self.tracker.update(lambda: setattr(self.tracker, "produced",
                                                  self.tracker.produced + KEYS))


def check(tracker: Tracker, ours_partitions: int, original_partitions: int) -> str:
    """The assertions, on a snapshot taken before the consumers stop; returns
    the summary line."""
    handled = {m: list(v) for m, v in tracker.handled.items()}
    problems = []
    if not 1 <= ours_partitions < PARTITIONS or not 1 <= original_partitions < PARTITIONS:
        problems.append(f"partitions after the join: ours {ours_partitions}, "
                        f"original {original_partitions} (both should own some)")
    after = {m: sum(1 for r in v if r[2] == "C") for m, v in handled.items()}
    for member, n in after.items():
        if n == 0:
            problems.append(f"{member} handled none of batch C (sent after the join)")
    expected = {(f"k{k:03d}", s) for k in range(KEYS) for s in range(tracker.produced // KEYS)}
    missing = expected - tracker.distinct
    if missing or len(expected) != tracker.produced:
        problems.append(f"{len(missing)} of {tracker.produced} records never handled, "
                        f"e.g. {sorted(missing)[:5]}")
    for member, recs in handled.items():
        last: Dict[str, int] = {}
        bad = []
        for key, seq, _, _ in recs:
            if key in last and seq <= last[key]:
                bad.append(f"{key}: {seq} after {last[key]}")
            last[key] = seq
        if bad:
            problems.append(f"{member} handled {len(bad)} records out of per-key order, "
                            f"e.g. {bad[:5]}")
    if problems:
        raise Failure("; ".join(problems))
    def by_batch(member: str) -> str:
        n = defaultdict(int)
        for r in handled[member]:
            n[r[2]] += 1
        return ", ".join(f"{b} {n[b]}" for b in "ABC")
    total = sum(len(v) for v in handled.values())
    both = (set((k, s) for k, s, _, _ in handled["original"])
            & set((k, s) for k, s, _, _ in handled["ours"]))
    return (f"records {tracker.produced} (A {ROUNDS_A * KEYS}, "
            f"B {tracker.produced - (ROUNDS_A + ROUNDS_C) * KEYS}, C {ROUNDS_C * KEYS}); "
            f"original handled {len(handled['original'])} ({by_batch('original')}), "
            f"{original_partitions} partitions after the join; ours handled "
            f"{len(handled['ours'])} ({by_batch('ours')}), {ours_partitions} partitions; "
            f"duplicates {total - len(tracker.distinct)} ({len(both)} records handled by both)")


async def run(args: argparse.Namespace) -> str:
    t0 = time.monotonic()
    tracker = Tracker()
    suffix = uuid.uuid4().hex[:12]
    topic, group = f"interop-topic-{suffix}", f"interop-group-{suffix}"
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.create_topic(topic, partition_count=PARTITIONS, replication_factor=1)
    producer_client = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-producer",
                                    probe_port=None, send_timeout=10, telemetry_enabled=False)
    producer = Producer(producer_client, topic, tracker)
    ours: Optional[ProsodyClient] = None
    proc: Optional[asyncio.subprocess.Process] = None
    reader: Optional["asyncio.Task[None]"] = None
    log_path = Path(args.log_dir) / f"original-{suffix}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ok = False
    try:
        for _ in range(ROUNDS_A):
            await producer.round("A")

        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                args.original_python, str(Path(__file__).with_name("member.py")),
                "--bootstrap", BOOTSTRAP, "--group", group, "--topic", topic,
                "--cassandra", CASSANDRA, "--keyspace", ORIGINAL_KEYSPACE,
                stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL)
        assert proc.stdout is not None
        reader = asyncio.create_task(read_original(proc.stdout, tracker))
        await tracker.wait_for(lambda: len(tracker.handled["original"]) >= ORIGINAL_FIRST,
                               f"the original's consumer to handle {ORIGINAL_FIRST} records")
        before_join = len(tracker.handled["original"])
        print(f"interop: the original handled {before_join} records "
              f"{time.monotonic() - t0:.1f} s in; ours joins group {group}", flush=True)

        ours = ProsodyClient(bootstrap_servers=BOOTSTRAP, group_id=group, subscribed_topics=topic,
                             source_system="interop-ours", cassandra_nodes=CASSANDRA,
                             cassandra_keyspace=OURS_KEYSPACE, probe_port=None,
                             commit_interval=0.1, poll_interval=0.02, shutdown_timeout=10,
                             telemetry_enabled=False)
        await ours.subscribe(Ours(tracker))
        # Batch B arrives while ours joins: a round every PACE s until ours
        # owns partitions (the group's rebalance is asynchronous).
        deadline = time.monotonic() + WAIT
        next_round = time.monotonic()
        ours_partitions = 0
        while True:
            ours_partitions = await ours.assigned_partition_count()
            if ours_partitions > 0:
                break
            now = time.monotonic()
            if now > deadline:
                raise Failure(f"ours owned no partition {WAIT:.0f} s after subscribing to the "
                              f"group the original is in; {tracker.state()}")
            if tracker.original_eof:
                raise Failure(f"the original's consumer exited while ours joined; {tracker.state()}")
            if now >= next_round and producer.by_batch["B"] < ROUNDS_B_MAX * KEYS:
                await producer.round("B")
                next_round = now + PACE
            await asyncio.sleep(0.05)
        joined = time.monotonic()
        print(f"interop: ours owns {ours_partitions} partitions {joined - t0:.1f} s in", flush=True)
        # The original gave those up: wait until it reports owning the rest.
        await tracker.wait_for(lambda: tracker.original_partitions == PARTITIONS - ours_partitions,
                               f"the original to own {PARTITIONS - ours_partitions} partitions")
        for _ in range(ROUNDS_C):
            await producer.round("C")
        await tracker.wait_for(lambda: len(tracker.distinct) >= tracker.produced,
                               f"all {tracker.produced} records to be handled")
        # Both still own what they owned (no later rebalance moved partitions).
        now_ours = await ours.assigned_partition_count()
        if now_ours != ours_partitions or tracker.original_partitions != PARTITIONS - ours_partitions:
            raise Failure(f"partitions moved after the join: ours {ours_partitions} -> {now_ours}, "
                          f"original now {tracker.original_partitions}")
        summary = check(tracker, ours_partitions, PARTITIONS - ours_partitions)
        ok = True
        return summary + f"; wall {time.monotonic() - t0:.1f} s"
    finally:
        await stop(ours, proc, reader, tracker, ok)
        try:
            await admin.delete_topic(topic)
        except Exception as e:  # noqa: BLE001 - best effort cleanup
            print(f"interop: could not delete topic {topic}: {e}", file=sys.stderr)
        if not ok:
            print(f"interop: the original's log: {log_path}", file=sys.stderr)
            try:
                text = log_path.read_text(errors="replace")
                for line in text.splitlines()[-30:]:
                    print(f"  | {line}", file=sys.stderr)
                if "pool is broken" in text or "Connection refused" in text:
                    # The original keeps each record's dedup and defer state
                    # in Cassandra and stalls while it is away.
                    print("interop: the original lost Cassandra during the run (see its log): "
                          "was Cassandra stopped or restarted meanwhile?", file=sys.stderr)
            except OSError:
                pass


async def stop(ours: Optional[ProsodyClient], proc: Optional[asyncio.subprocess.Process],
               reader: Optional["asyncio.Task[None]"], tracker: Tracker, ok: bool) -> None:
    """Stops both consumers at once: ours unsubscribes, the original gets
    SIGTERM and must report "stopped" and exit 0 within WAIT s (checked only
    when the test got that far; otherwise it is killed after the wait)."""
    async def stop_ours() -> None:
        if ours is not None:
            await asyncio.wait_for(ours.unsubscribe(), WAIT)

    async def stop_original() -> None:
        if proc is None:
            return
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = await asyncio.wait_for(proc.wait(), WAIT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise Failure(f"the original's consumer did not exit within {WAIT:.0f} s of SIGTERM")
        if reader is not None:
            await reader
        if ok and (rc != 0 or not tracker.original_stopped):
            raise Failure(f"the original's consumer exited with {rc} "
                          f"(reported stopped: {tracker.original_stopped})")

    results = await asyncio.gather(stop_ours(), stop_original(), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors and ok:
        raise Failure(f"stopping the consumers: {errors}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original-python", required=True,
                    help="python of the venv that has the original prosody-events")
    ap.add_argument("--log-dir", default="build/interop",
                    help="where the original consumer's standard error goes")
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop: shared_group FAILED: {e}", file=sys.stderr)
        print("interop: 0 passed, 1 failed")
        return 1
    except Exception:  # noqa: BLE001 - a client call failed: report it as a failure
        traceback.print_exc()
        print("interop: shared_group FAILED (exception above)", file=sys.stderr)
        print("interop: 0 passed, 1 failed")
        return 1
    print(f"interop: shared_group: {summary}")
    print("interop: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
