#!/usr/bin/env python3
"""Interop: a rolling upgrade from the original Rust-based Prosody to ours,
and the rollback, under load.

Run by scripts/interop-tests.sh with OUR package's venv. Three members of
the original (tests/interop/member.py with --from-python) consume one
4-partition topic in one group on one keyspace while a producer sends a
round of one record per key (KEYS keys) every PACE s; one key in five
schedules a timer TIMER_IN s later. Every STEP s one member is replaced: a
member of ours (--to-python) starts, then the oldest member is stopped
(SIGTERM: it unsubscribes and shuts down), until all three are ours; then
back the same way. The producer then stops, and the test waits until every
record succeeded and every timer fired.

Checks: no record lost (each succeeded at least once); each member handled
each key's records in order; no timer fired twice or never, none early
(see group_move.early_ok for the original). It
reports the duplicates (records handled again after a partition moved:
at-least-once, and the dedup store shared by both limits them). Every wait
is bounded (PROSODY_INTEROP_WAIT s, default 120); exit 0 when it passed;
the keyspace is dropped either way.
"""

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Tuple

from cassandra.cluster import Cluster  # cassandra-driver, test-only
from cleanup_util import drop_keyspace

from group_move import Failure, Member, early_ok, successes, timers
from prosody import AdminClient, ProsodyClient

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
KEYS, PACE, TIMER_IN, MEMBERS = 50, 0.5, 8.0, 3


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    topic, group, keyspace = (f"interop-roll-{suffix}", f"interop-roll-{suffix}",
                              f"interop_roll_{suffix}")
    log = Path(args.log_dir) / f"rolling-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.create_topic(topic, partition_count=4, replication_factor=1)
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-roll",
                             probe_port=None, telemetry_enabled=False)
    sent: Dict[Tuple[str, int], Dict[str, Any]] = {}
    everyone: List[Member] = []
    running: List[Member] = []
    stop_sending = asyncio.Event()
    events = asyncio.Condition()  # woken by every member's events
    t0 = time.monotonic()

    async def start(label: str, python: str) -> None:
        m = Member(f"{len(everyone)}:{label}", python, events)
        everyone.append(m)
        await m.start(group, topic, keyspace, log)
        await m.wait_for(lambda: any(e["event"] == "subscribed" for e in m.events),
                         "its subscription")
        running.append(m)

    async def send() -> None:
        seq = 0
        while not stop_sending.is_set():
            now = time.time()
            sends = []
            for k in range(KEYS):
                key = f"k{k:03d}"
                p: Dict[str, Any] = {"key": key, "seq": seq, "batch": "roll"}
                if (k + seq) % 5 == 0:
                    p["timer_at"] = int(now + TIMER_IN)
                sent[(key, seq)] = p
                sends.append(producer.send(topic, key, p))
            await asyncio.gather(*sends)
            seq += 1
            try:
                await asyncio.wait_for(stop_sending.wait(), PACE)
            except asyncio.TimeoutError:
                pass

    sender = asyncio.create_task(send())
    try:
        for _ in range(MEMBERS):
            await start("original", args.from_python)
        steps = [("ours", args.to_python)] * MEMBERS + [("original", args.from_python)] * MEMBERS
        for label, python in steps:
            await asyncio.sleep(args.step)  # the pace of the upgrade itself
            if sender.done():
                await sender  # raises what stopped the producer
            await start(label, python)
            await running.pop(0).stop()
            print(f"interop rolling: {time.monotonic() - t0:.0f} s: members "
                  f"{[m.name for m in running]}", flush=True)
        stop_sending.set()
        await sender
        last = running[-1]
        wanted = {(k, p["timer_at"]) for (k, _), p in sent.items() if "timer_at" in p}

        def drained() -> bool:
            ok = {(e["key"], e["seq"]) for e in successes(everyone)}
            fired = {(e["key"], round(e["time"])) for e in timers(everyone)}
            return set(sent) <= ok and wanted <= fired

        try:
            await last.wait_for(drained, f"all {len(sent)} records to succeed and "
                                         f"{len(wanted)} timers to fire")
        except Failure as e:
            ok = {(e["key"], e["seq"]) for e in successes(everyone)}
            fired = {(e["key"], round(e["time"])) for e in timers(everyone)}
            lost, unfired = sorted(set(sent) - ok), sorted(wanted - fired)
            raise Failure(f"{e}: {len(lost)} records never succeeded (e.g. {lost[:4]}), "
                          f"{len(unfired)} timers never fired (e.g. {unfired[:4]}, now "
                          f"{time.time():.0f})") from None
        for m in list(running):
            await m.stop()
        return check(everyone, sent, wanted) + f"; wall {time.monotonic() - t0:.0f} s"
    finally:
        stop_sending.set()
        for m in everyone:
            try:
                await m.stop()
            except Failure as e:
                print(f"interop: {e}", file=sys.stderr)
        cluster = Cluster([CASSANDRA.split(":")[0]], port=int(CASSANDRA.split(":")[1]))
        try:
            drop_keyspace(cluster.connect(), keyspace)
        finally:
            cluster.shutdown()
        try:
            await admin.delete_topic(topic)
        except Exception as e:  # noqa: BLE001 - best effort cleanup
            print(f"interop: could not delete topic {topic}: {e}", file=sys.stderr)


def check(members: List[Member], sent: Dict[Tuple[str, int], Dict[str, Any]],
          wanted: set) -> str:
    problems = []
    for m in members:
        last: Dict[str, int] = {}
        for e in m.events:
            if e["event"] != "message" or not e["ok"]:
                continue
            if e["key"] in last and e["seq"] <= last[e["key"]]:
                problems.append(f"{m.name} handled {e['key']} seq {e['seq']} after "
                                f"{last[e['key']]}")
            last[e["key"]] = e["seq"]
    fired: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for e in timers(members):
        fired.setdefault((e["key"], round(e["time"])), []).append(e)
    for kt in sorted(wanted | set(fired)):
        es = fired.get(kt, [])
        if len(es) != 1 or kt not in wanted:
            problems.append(f"timer {kt} fired {len(es)} times ({[e['member'] for e in es]}), "
                            f"scheduled: {kt in wanted}")
        elif es[0]["at"] < kt[1] - 0.001 - early_ok(es[0]["member"]):
            problems.append(f"timer {kt} fired {kt[1] - es[0]['at']:.2f} s early")
    if problems:
        raise Failure(f"{len(problems)} problems: " + "; ".join(problems[:8]))
    ok = successes(members)
    by_impl: Dict[str, int] = {}
    for e in ok:
        impl = e["member"].split(":", 1)[1]
        by_impl[impl] = by_impl.get(impl, 0) + 1
    fired_by: Dict[str, int] = {}
    for es in fired.values():
        impl = es[0]["member"].split(":", 1)[1]
        fired_by[impl] = fired_by.get(impl, 0) + 1
    return (f"{len(sent)} records, {len(ok) - len(sent)} duplicates, handled by {by_impl}; "
            f"{len(wanted)} timers fired once each, by {fired_by}; key order held per member")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-python", required=True, help="the original's interpreter (venv)")
    ap.add_argument("--to-python", required=True, help="ours")
    ap.add_argument("--step", type=float, default=10.0, help="seconds between replacements")
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop rolling: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop rolling: passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
