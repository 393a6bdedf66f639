#!/usr/bin/env python3
"""Interop: timers move between the original Rust-based Prosody (PyPI
prosody-events, its own venv, run as a subprocess: original_timers.py) and
ours, on one consumer group, topic and Cassandra keyspace.

Run by scripts/interop-tests.sh with OUR package's venv (cassandra-driver
too, to drop the keyspace). Scenario, on a fresh 2-partition topic, group
and keyspace; each record asks its handler for a timer operation on the
record's key (schedule times, unschedule one, list scheduled()):
  1. the original owns the group: it schedules timers due about LEAD s
     later, one on some keys (its key index holds them inline) and three on
     others (overflow rows); then it stops;
  2. ours takes the group: its scheduled() lists the original's timers, it
     unschedules one of them, schedules timers of its own due later, and
     fires every timer of the original's (except the unscheduled one), each
     once, at its second;
  3. ours stops and the original takes the group again: its scheduled()
     lists ours' timers, it unschedules one of them, and fires every other
     timer of ours once, at its second, and none of its own again.
"At its second": at most LATE s after it (the takeover's rebalance
included) and not before it, give or take EARLY s (the original, on its own
timers too, fires up to about 0.2 s before the second). Every wait is bounded (PROSODY_INTEROP_WAIT seconds,
default 120). Exit 0 when it passed; the keyspace and topic are dropped
either way.
"""

import argparse
import asyncio
import datetime
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
LEAD = 30  # s from scheduling to the first timer: the handover happens meanwhile
LATE = 5.0  # s a timer may fire after its second
EARLY = 0.5  # ... and before it: the original fires up to ~0.2 s early (measured)
HERE = Path(__file__).parent


class Failure(Exception):
    pass


def plan(prefix: str, t0: int) -> Dict[str, List[int]]:
    """Keys {prefix}0..5: one timer on 0-2, three on 3-5."""
    return {f"{prefix}{n}": [t0 + n] if n < 3 else [t0 + n, t0 + n + 1, t0 + n + 2]
            for n in range(6)}


class Events:
    """What one consumer reported, with a condition to wait on."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.list: List[Dict[str, Any]] = []
        self.cond = asyncio.Condition()

    async def add(self, ev: Dict[str, Any]) -> None:
        async with self.cond:
            self.list.append(ev)
            self.cond.notify_all()

    async def wait(self, what: str, pred: Callable[[], bool], timeout: float = WAIT) -> None:
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(pred), timeout)
            except asyncio.TimeoutError:
                raise Failure(f"{self.who}: {what} not seen in {timeout:.0f} s; it reported "
                              f"{self.list[-8:]}") from None

    def done(self, key: str, op: str) -> List[Dict[str, Any]]:
        return [e for e in self.list if e["event"] == "done" and e["key"] == key and e["op"] == op]

    def fired(self) -> List[Tuple[str, int, float]]:
        return [(e["key"], e["time"], e["at"]) for e in self.list if e["event"] == "timer"]


class Ours(EventHandler):
    def __init__(self, events: Events) -> None:
        self.events = events

    async def on_message(self, context: Any, message: Any) -> None:
        p = message.payload
        if p["op"] == "schedule":
            for t in p["times"]:
                await context.schedule(datetime.datetime.fromtimestamp(t, datetime.timezone.utc))
        elif p["op"] == "unschedule":
            await context.unschedule(
                datetime.datetime.fromtimestamp(p["time"], datetime.timezone.utc))
        times = sorted(int(t.timestamp()) for t in await context.scheduled())
        await self.events.add({"event": "done", "key": message.key, "op": p["op"],
                               "scheduled": times})

    async def on_timer(self, context: Any, timer: Any) -> None:
        await self.events.add({"event": "timer", "key": timer.key,
                               "time": int(timer.time.timestamp()), "at": time.time()})


class Original:
    """original_timers.py as a subprocess, its reports in `events`."""

    def __init__(self, args: argparse.Namespace, log: Path) -> None:
        self.args, self.log = args, log
        self.events = Events("the original")
        self.proc: Any = None
        self.reader: Any = None

    async def start(self, group: str, topic: str, keyspace: str) -> None:
        with open(self.log, "ab") as f:
            self.proc = await asyncio.create_subprocess_exec(
                self.args.original_python, str(HERE / "original_timers.py"),
                "--bootstrap", BOOTSTRAP, "--group", group, "--topic", topic,
                "--cassandra", CASSANDRA, "--keyspace", keyspace,
                stdout=asyncio.subprocess.PIPE, stderr=f, stdin=asyncio.subprocess.DEVNULL)
        self.reader = asyncio.create_task(self.read())
        await self.events.wait("owning both partitions", lambda: any(
            e["event"] == "partitions" and e["count"] == 2 for e in self.events.list))

    async def read(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            await self.events.add(json.loads(line))

    async def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        await self.events.wait("stopped", lambda: any(
            e["event"] == "stopped" for e in self.events.list))
        await asyncio.wait_for(self.proc.wait(), WAIT)
        await self.reader
        if self.proc.returncode != 0:
            raise Failure(f"the original exited {self.proc.returncode}; log {self.log}")

    def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.kill()


def check_fired(who: str, events: Events, want: Dict[str, List[int]]) -> None:
    """Each wanted (key, time) fired exactly once, at its second; nothing else."""
    fired = events.fired()
    seen: Dict[Tuple[str, int], int] = {}
    for key, t, at in fired:
        seen[(key, t)] = seen.get((key, t), 0) + 1
        if at < t - EARLY or at > t + LATE:
            raise Failure(f"{who} fired {key} at {t} {at - t:+.2f} s off its second")
    wanted = {(k, t) for k, ts in want.items() for t in ts}
    twice = [kt for kt, n in seen.items() if n > 1]
    extra = [kt for kt in seen if kt not in wanted]
    missing = [kt for kt in wanted if kt not in seen]
    if twice or extra or missing:
        raise Failure(f"{who}: fired twice {twice}, fired but not wanted {extra}, never "
                      f"fired {missing}")


def check_listed(who: str, events: Events, key: str, op: str, want: List[int]) -> None:
    """scheduled() after `op` on `key` listed `want`, less what had fired
    before it (a late takeover may fire some first)."""
    done = events.done(key, op)
    if not done:
        raise Failure(f"{who}: no {op} of {key} reported")
    before = events.list[:events.list.index(done[-1])]
    fired = {e["time"] for e in before if e["event"] == "timer" and e["key"] == key}
    want = [t for t in want if t not in fired]
    if done[-1]["scheduled"] != want:
        raise Failure(f"{who}: scheduled() of {key} after {op} is {done[-1]['scheduled']}, "
                      f"want {want}")


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    ks, topic, group = f"interop_timers_{suffix}", f"interop-timers-{suffix}", f"interop-timers-{suffix}"
    log = Path(args.log_dir) / f"timers-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-timers",
                             probe_port=None, telemetry_enabled=False)
    first, second = Original(args, log), Original(args, log)
    t0 = time.monotonic()
    try:
        await admin.create_topic(topic, partition_count=2, replication_factor=1)

        # 1. The original schedules.
        await first.start(group, topic, ks)
        t_orig = int(time.time()) + LEAD
        by_orig = plan("o", t_orig)
        for key, times in by_orig.items():
            await producer.send(topic, key, {"op": "schedule", "times": times})
        for key, times in by_orig.items():
            await first.events.wait(f"{key} scheduled", lambda k=key: first.events.done(k, "schedule"))
            check_listed("the original", first.events, key, "schedule", times)
        await first.stop()
        if first.events.fired():
            raise Failure(f"the original fired {first.events.fired()} before its timers were due")

        # 2. Ours takes the group: lists, unschedules, schedules, fires.
        ours_events = Events("ours")
        ours = ProsodyClient(bootstrap_servers=BOOTSTRAP, group_id=group, subscribed_topics=topic,
                             cassandra_nodes=CASSANDRA, cassandra_keyspace=ks, probe_port=None,
                             telemetry_enabled=False)
        await ours.subscribe(Ours(ours_events))
        try:
            dropped_o = ("o4", t_orig + 5)
            await producer.send(topic, "o3", {"op": "list"})
            await producer.send(topic, dropped_o[0], {"op": "unschedule", "time": dropped_o[1]})
            await ours_events.wait("o3 listed", lambda: ours_events.done("o3", "list"))
            await ours_events.wait("o4 unscheduled", lambda: ours_events.done("o4", "unschedule"))
            check_listed("ours", ours_events, "o3", "list", by_orig["o3"])
            check_listed("ours", ours_events, "o4", "unschedule", [t_orig + 4, t_orig + 6])
            t_ours = max(t_orig + LEAD, int(time.time()) + LEAD)
            by_ours = plan("u", t_ours)
            for key, times in by_ours.items():
                await producer.send(topic, key, {"op": "schedule", "times": times})
            for key, times in by_ours.items():
                await ours_events.wait(f"{key} scheduled", lambda k=key: ours_events.done(k, "schedule"))
                check_listed("ours", ours_events, key, "schedule", times)
            want_o = {k: [t for t in ts if (k, t) != dropped_o] for k, ts in by_orig.items()}
            n_o = sum(len(ts) for ts in want_o.values())
            await ours_events.wait(f"the original's {n_o} timers fired", lambda: len(
                ours_events.fired()) >= n_o, timeout=LEAD + WAIT)
            await asyncio.sleep(1.5)  # a second firing of the last ones would show by now
        finally:
            await ours.unsubscribe()
        check_fired("ours (the original's timers)", ours_events, want_o)
        if time.time() > t_ours - 2:
            raise Failure("ours' timers fell due before the original took the group back")

        # 3. The original takes the group back: lists, unschedules, fires ours'.
        await second.start(group, topic, ks)
        dropped_u = ("u4", t_ours + 5)
        await producer.send(topic, "u3", {"op": "list"})
        await producer.send(topic, dropped_u[0], {"op": "unschedule", "time": dropped_u[1]})
        await second.events.wait("u3 listed", lambda: second.events.done("u3", "list"))
        await second.events.wait("u4 unscheduled", lambda: second.events.done("u4", "unschedule"))
        check_listed("the original", second.events, "u3", "list", by_ours["u3"])
        check_listed("the original", second.events, "u4", "unschedule", [t_ours + 4, t_ours + 6])
        want_u = {k: [t for t in ts if (k, t) != dropped_u] for k, ts in by_ours.items()}
        n_u = sum(len(ts) for ts in want_u.values())
        await second.events.wait(f"ours' {n_u} timers fired", lambda: len(
            second.events.fired()) >= n_u, timeout=LEAD + WAIT)
        await asyncio.sleep(1.5)
        await second.stop()
        check_fired("the original (ours' timers)", second.events, want_u)
        return (f"{n_o} timers of the original fired on ours and {n_u} of ours on the original, "
                f"each once at its second (lateness max ours "
                f"{max(at - t for _, t, at in ours_events.fired()):.2f} s, the original's "
                f"{max(at - t for _, t, at in second.events.fired()):.2f} s); scheduled() and "
                f"unschedule saw the other side's timers; wall {time.monotonic() - t0:.1f} s")
    finally:
        first.kill()
        second.kill()
        cluster = Cluster([CASSANDRA.split(":")[0]], port=int(CASSANDRA.split(":")[1]))
        try:
            drop_keyspace(cluster.connect(), ks)
        finally:
            cluster.shutdown()
        try:
            await admin.delete_topic(topic)
        except Exception as e:  # noqa: BLE001 - best effort cleanup
            print(f"interop: could not delete topic {topic}: {e}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original-python", required=True)
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop timers: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop timers: passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
