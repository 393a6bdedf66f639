#!/usr/bin/env python3
"""Interop: one Cassandra keyspace and one topic, written and read by both
the original Rust-based Prosody (PyPI prosody-events, in its own venv, run
as subprocesses: member.py, original_producer.py) and ours.

Run by scripts/interop-tests.sh with OUR package's venv, which also holds
cassandra-driver to read the keyspaces' bookkeeping. Scenarios, each on
fresh topics, groups and keyspaces:
  1. ours creates keyspace KS1 (its consumer migrates it) and handles what
     our producer sent; then the original starts on KS1 (its migrator must
     accept our bookkeeping: it refuses a keyspace whose recorded checksums
     differ from its files') and handles the same records: the original
     consumes what ours sent;
  2. the original's producer sends (and creates keyspace KS2: it opens its
     stores even to send); the original's consumer handles the records; then ours starts on KS2 and handles them too: ours
     consumes what the original sent, on a keyspace the original created.
Checks: every record handled by each side, each key's records in order;
each keyspace's schema_migrations lists every migration once, and no
migration is applied twice (the rows' applied_at are unchanged): the
original applies nothing to a keyspace ours migrated, and ours only the
migrations newer than the original's release (none for 0.6.1; five for
0.2.0, whose core 0.3.0 knew eight).
Every wait is bounded (PROSODY_INTEROP_WAIT seconds, default 120). Exit 0
when it passed; the keyspaces are dropped either way.
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
from typing import Any, Dict, List, Tuple

from cassandra.cluster import Cluster  # cassandra-driver, test-only
from cleanup_util import drop_keyspace

from prosody import AdminClient, EventHandler, ProsodyClient

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
WAIT = float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
KEYS, ROUNDS = 10, 10
HERE = Path(__file__).parent


class Failure(Exception):
    pass


def in_order(records: List[Tuple[str, int]], who: str) -> None:
    """Every (key, seq) of KEYS x ROUNDS handled, each key's in order."""
    last: Dict[str, int] = {}
    for key, seq in records:
        if key in last and seq <= last[key]:
            raise Failure(f"{who} handled {key} seq {seq} after {last[key]}")
        last[key] = seq
    want = {(f"k{k:03d}", s) for k in range(KEYS) for s in range(ROUNDS)}
    missing = want - set(records)
    if missing:
        raise Failure(f"{who} never handled {len(missing)} of {len(want)} records, "
                      f"e.g. {sorted(missing)[:3]}")


def migrations(session: Any, keyspace: str) -> Dict[str, Any]:
    rows = session.execute(f"SELECT filename, applied_at FROM {keyspace}.schema_migrations")
    return {r.filename: r.applied_at for r in rows}


class Collect(EventHandler):
    def __init__(self) -> None:
        self.records: List[Tuple[str, int]] = []
        self.cond = asyncio.Condition()

    async def on_message(self, context: Any, message: Any) -> None:
        async with self.cond:
            self.records.append((message.key, message.payload["seq"]))
            self.cond.notify_all()


async def ours_consume(topic: str, keyspace: str) -> List[Tuple[str, int]]:
    """Our consumer, in a group of its own, until it handled every record."""
    handler = Collect()
    client = ProsodyClient(bootstrap_servers=BOOTSTRAP, group_id=f"interop-ours-{uuid.uuid4().hex[:8]}",
                           subscribed_topics=topic, cassandra_nodes=CASSANDRA,
                           cassandra_keyspace=keyspace, probe_port=None, telemetry_enabled=False)
    await client.subscribe(handler)
    try:
        async with handler.cond:
            try:
                await asyncio.wait_for(handler.cond.wait_for(
                    lambda: len(handler.records) >= KEYS * ROUNDS), WAIT)
            except asyncio.TimeoutError:
                raise Failure(f"ours handled {len(handler.records)} of {KEYS * ROUNDS} records on "
                              f"keyspace {keyspace} in {WAIT:.0f} s (consumer state "
                              f"{client.consumer_state()})") from None
    finally:
        await client.unsubscribe()
    return list(handler.records)


async def original(args: argparse.Namespace, script: str, log: Path, *argv: str) -> asyncio.subprocess.Process:
    with open(log, "ab") as f:
        return await asyncio.create_subprocess_exec(
            args.original_python, str(HERE / script), "--bootstrap", BOOTSTRAP, *argv,
            stdout=asyncio.subprocess.PIPE, stderr=f, stdin=asyncio.subprocess.DEVNULL)


async def original_consume(args: argparse.Namespace, topic: str, keyspace: str,
                           log: Path) -> List[Tuple[str, int]]:
    """The original's consumer, in a group of its own, until it handled every
    record; then SIGTERM, and it must report "stopped"."""
    proc = await original(args, "member.py", log, "--group",
                          f"interop-orig-{uuid.uuid4().hex[:8]}", "--topic", topic,
                          "--cassandra", CASSANDRA, "--keyspace", keyspace)
    records: List[Tuple[str, int]] = []
    stopped = False

    async def read() -> None:
        nonlocal stopped
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            ev = json.loads(line)
            if ev.get("event") == "message":
                records.append((ev["key"], ev["seq"]))
                if len(records) == KEYS * ROUNDS:
                    proc.send_signal(signal.SIGTERM)
            elif ev.get("event") == "stopped":
                stopped = True

    try:
        await asyncio.wait_for(read(), WAIT)
        await asyncio.wait_for(proc.wait(), WAIT)
    except asyncio.TimeoutError:
        proc.kill()
        raise Failure(f"the original handled {len(records)} of {KEYS * ROUNDS} records on "
                      f"keyspace {keyspace} in {WAIT:.0f} s (log {log})") from None
    if len(records) < KEYS * ROUNDS or not stopped or proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise Failure(f"the original exited ({proc.returncode}) after {len(records)} of "
                      f"{KEYS * ROUNDS} records on keyspace {keyspace}, stopped={stopped}; "
                      f"its log ends:\n  | " + "\n  | ".join(tail))
    return records


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    ks1, ks2 = f"interop_ours_first_{suffix}", f"interop_original_first_{suffix}"
    t1, t2 = f"interop-ks-ours-{suffix}", f"interop-ks-original-{suffix}"
    log = Path(args.log_dir) / f"keyspace-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    cluster = Cluster([CASSANDRA.split(":")[0]], port=int(CASSANDRA.split(":")[1]))
    session = cluster.connect()
    t0 = time.monotonic()
    try:
        for t in (t1, t2):
            await admin.create_topic(t, partition_count=2, replication_factor=1)

        # 1. Ours first: our producer, our consumer creates KS1.
        producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-ours",
                                 probe_port=None, telemetry_enabled=False)
        for seq in range(ROUNDS):
            await asyncio.gather(*(producer.send(t1, f"k{k:03d}", {"key": f"k{k:03d}", "seq": seq, "batch": "ours"})
                                   for k in range(KEYS)))
        in_order(await ours_consume(t1, ks1), "ours (keyspace it created)")
        before = migrations(session, ks1)
        if len(before) != args.migrations:
            raise Failure(f"ours recorded {len(before)} migrations in {ks1}, want {args.migrations}")
        in_order(await original_consume(args, t1, ks1, log), "the original (on ours' keyspace)")
        if migrations(session, ks1) != before:
            raise Failure(f"the original changed {ks1}'s migrations: {before} -> "
                          f"{migrations(session, ks1)}")

        # 2. The original first: its producer, its consumer creates KS2.
        proc = await original(args, "original_producer.py", log, "--topic", t2,
                              "--cassandra", CASSANDRA, "--keyspace", ks2,
                              "--keys", str(KEYS), "--rounds", str(ROUNDS))
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
        if proc.returncode != 0:
            raise Failure(f"the original's producer failed ({proc.returncode}); log {log}")
        in_order(await original_consume(args, t2, ks2, log), "the original (keyspace it created)")
        before = migrations(session, ks2)
        if len(before) != args.original_migrations:
            raise Failure(f"the original recorded {len(before)} migrations in {ks2}, "
                          f"want {args.original_migrations}")
        in_order(await ours_consume(t2, ks2), "ours (on the original's keyspace)")
        after = migrations(session, ks2)
        again = [f for f, at in before.items() if after.get(f) != at]
        if again or len(after) != args.migrations:
            raise Failure(f"ours applied {again} again, or recorded {len(after)} migrations in "
                          f"{ks2} (want the original's {len(before)} untouched and "
                          f"{args.migrations} in all)")
        return (f"{KEYS * ROUNDS} records each way, in key order; migrations: ours "
                f"{args.migrations}, the original's {args.original_migrations}, none applied "
                f"twice; wall {time.monotonic() - t0:.1f} s")
    finally:
        for ks in (ks1, ks2):
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
    ap.add_argument("--migrations", type=int, required=True,
                    help="how many migrations a keyspace ours migrated records")
    ap.add_argument("--original-migrations", type=int, required=True,
                    help="how many migrations a keyspace this original migrated records")
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop keyspace: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop keyspace: passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
