#!/usr/bin/env python3
"""Interop: a consumer group moves between implementations mid-topic while
timers are pending and messages are deferred, as a team switching from the
original Rust-based Prosody to ours (and back) does.

Run by scripts/interop-tests.sh with OUR package's venv. Each member is
tests/interop/member.py, run with the venv of its implementation (--python,
in order; e.g. original, ours, original), one after the other, in one group
on one keyspace. While member i runs it gets round i: one record per key
(KEYS keys), whose payload tells member.py what to do:
  - keys 0-3 schedule a timer TIMER_IN s later;
  - keys 4-7 fail (a transient error: deferred) until FAIL_FOR s later;
  - keys 8-9 just succeed.
Once member i tried every record of its round, it is stopped (SIGTERM; it
unsubscribes and shuts down) and member i+1 starts: its timers and deferred
messages are now member i+1's to fire and retry. Member i+1 stops only when
they have been (the last member waits for its own round's too).

Checks: every timer fired exactly once, not before its time (the original: at
most 1 s before, see early_ok) and at most LATE s after it (or after its member started, when that was later); every
deferred record succeeded exactly once, not before it stopped failing; no
record succeeded twice (deduplication is on in both); each key's records
succeeded in order. It prints which member fired and retried what.
Every wait is bounded (PROSODY_INTEROP_WAIT s, default 120); exit 0 when it
passed; the keyspace is dropped either way.
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
from typing import Any, Callable, Dict, List, Optional, Tuple

from cassandra.cluster import Cluster  # cassandra-driver, test-only
from cleanup_util import drop_keyspace

from prosody import AdminClient, ProsodyClient

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
WAIT = float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
HERE = Path(__file__).parent
KEYS = 10
TIMER_KEYS, FAIL_KEYS = range(0, 4), range(4, 8)
TIMER_IN, FAIL_FOR = 12.0, 10.0
LATE = 5.0


def early_ok(member: str) -> float:
    """How early a member may fire a timer: ours never; the original fires
    up to about 0.3 s before a timer's time (measured with 0.6.1), so 1 s."""
    return 0.0 if member.endswith(":ours") else 1.0


class Failure(Exception):
    pass


class Member:
    """One member.py process and the events it reported."""

    def __init__(self, name: str, python: str,
                 cond: Optional[asyncio.Condition] = None) -> None:
        """cond: shared by members whose waits look at each other's events."""
        self.name, self.python = name, python
        self.events: List[Dict[str, Any]] = []
        self.cond = cond or asyncio.Condition()
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.reader: Optional["asyncio.Task[None]"] = None
        self.eof = False
        self.started = 0.0

    async def start(self, group: str, topic: str, keyspace: str, log: Path,
                    extra: Tuple[str, ...] = ()) -> None:
        """extra: more member.py arguments."""
        self.started = time.time()
        with open(log, "ab") as f:
            self.proc = await asyncio.create_subprocess_exec(
                self.python, str(HERE / "member.py"), "--bootstrap", BOOTSTRAP, "--group", group,
                "--topic", topic, "--cassandra", CASSANDRA, "--keyspace", keyspace,
                # Retries come quickly, so a deferred record's first retries
                # fall while its member runs and later ones after the move.
                "--option", "defer_base=1.0", "--option", "defer_max_delay=4.0", *extra,
                stdout=asyncio.subprocess.PIPE, stderr=f, stdin=asyncio.subprocess.DEVNULL)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                ev = json.loads(line)
                ev["member"] = self.name
                async with self.cond:
                    self.events.append(ev)
                    self.cond.notify_all()
        finally:
            async with self.cond:
                self.eof = True
                self.cond.notify_all()

    async def wait_for(self, pred: Callable[[], bool], what: str) -> None:
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(lambda: pred() or self.eof), WAIT)
            except asyncio.TimeoutError:
                raise Failure(f"{self.name}: timed out after {WAIT:.0f} s waiting for {what}") \
                    from None
            if not pred():
                raise Failure(f"{self.name} exited while the test waited for {what}")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), WAIT)
        except asyncio.TimeoutError:
            self.proc.kill()
            raise Failure(f"{self.name} did not stop within {WAIT:.0f} s of SIGTERM") from None
        if self.reader:
            await self.reader
        if not any(e["event"] == "stopped" for e in self.events):
            raise Failure(f"{self.name} exited ({self.proc.returncode}) without stopping cleanly")


def successes(members: List[Member]) -> List[Dict[str, Any]]:
    return sorted((e for m in members for e in m.events if e["event"] == "message" and e["ok"]),
                  key=lambda e: e["at"])


def timers(members: List[Member]) -> List[Dict[str, Any]]:
    return [e for m in members for e in m.events if e["event"] == "timer"]


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    topic, group, keyspace = (f"interop-move-{suffix}", f"interop-move-{suffix}",
                              f"interop_move_{suffix}")
    log = Path(args.log_dir) / f"group-move-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.create_topic(topic, partition_count=2, replication_factor=1)
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-move",
                             probe_port=None, telemetry_enabled=False)
    members = [Member(f"{i}:{label}", python)
               for i, (label, python) in enumerate(zip(args.label, args.python))]
    # What was asked: (key, seq) -> the payload sent.
    sent: Dict[Tuple[str, int], Dict[str, Any]] = {}
    t0 = time.monotonic()
    last_timer = 0
    try:
        for seq, member in enumerate(members):
            await member.start(group, topic, keyspace, log)
            await member.wait_for(lambda m=member: any(e["event"] == "subscribed"
                                                       for e in m.events), "its subscription")
            now = time.time()
            sends = []
            for k in range(KEYS):
                key = f"k{k:03d}"
                p: Dict[str, Any] = {"key": key, "seq": seq, "batch": member.name}
                if k in TIMER_KEYS:
                    # Timers have whole seconds; a round's differ from the
                    # last round's, or they would be the same timers.
                    p["timer_at"] = max(int(now + TIMER_IN), last_timer + 1)
                elif k in FAIL_KEYS:
                    p["fail_until"] = now + FAIL_FOR
                sent[(key, seq)] = p
                sends.append(producer.send(topic, key, p))
            await asyncio.gather(*sends)
            last_timer = max(p.get("timer_at", 0) for p in sent.values())
            last = seq == len(members) - 1
            # Stop once it tried each record of its round (and, before that,
            # fired and retried what the previous member left; the last
            # member also what it scheduled and deferred itself).
            mine = {(f"k{k:03d}", seq) for k in range(KEYS)}
            due = {kv for kv in sent if kv[1] < seq or last}

            def done(m: Member = member) -> bool:
                tried = {(e["key"], e["seq"]) for e in m.events if e["event"] == "message"}
                ok = {(e["key"], e["seq"]) for e in successes(members)}
                fired = {(e["key"], round(e["time"])) for e in timers(members)}
                timers_due = {(k, sent[(k, s)]["timer_at"]) for k, s in due
                              if "timer_at" in sent[(k, s)]}
                return mine <= tried and {kv for kv in due} <= ok and timers_due <= fired

            await member.wait_for(done, f"round {seq} tried, and rounds {sorted({s for _, s in due})} "
                                        f"fired and succeeded")
            await member.stop()
        return check(members, sent) + f"; wall {time.monotonic() - t0:.1f} s"
    finally:
        await cleanup(members, keyspace, admin, topic)


def check(members: List[Member], sent: Dict[Tuple[str, int], Dict[str, Any]]) -> str:
    problems = []
    ok = successes(members)
    by_record: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for e in ok:
        by_record.setdefault((e["key"], e["seq"]), []).append(e)
    twice = {kv: [e["member"] for e in es] for kv, es in by_record.items() if len(es) > 1}
    if twice:
        problems.append(f"{len(twice)} records succeeded more than once: {dict(list(twice.items())[:4])}")
    missing = set(sent) - set(by_record)
    if missing:
        problems.append(f"{len(missing)} records never succeeded: {sorted(missing)[:4]}")
    early = [(kv, e["at"] - sent[kv]["fail_until"]) for kv, es in by_record.items() for e in es
             if "fail_until" in sent[kv] and e["at"] < sent[kv]["fail_until"]]
    if early:
        problems.append(f"deferred records succeeded while still failing: {early[:4]}")
    last: Dict[str, int] = {}
    for e in ok:
        if e["key"] in last and e["seq"] <= last[e["key"]]:
            problems.append(f"{e['key']} seq {e['seq']} succeeded after seq {last[e['key']]}")
        last[e["key"]] = e["seq"]
    fired: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for e in timers(members):
        fired.setdefault((e["key"], round(e["time"])), []).append(e)
    wanted = {(k, p["timer_at"]) for (k, _), p in sent.items() if "timer_at" in p}
    started = {m.name: m.started for m in members}
    for kt in sorted(wanted):
        es = fired.get(kt, [])
        if len(es) != 1:
            problems.append(f"timer {kt} fired {len(es)} times ({[e['member'] for e in es]})")
            continue
        e = es[0]
        if e["at"] < kt[1] - 0.001 - early_ok(e["member"]):
            problems.append(f"timer {kt} fired {kt[1] - e['at']:.2f} s early on {e['member']}")
        elif e["at"] - max(kt[1], started[e["member"]]) > LATE:
            problems.append(f"timer {kt} fired {e['at'] - kt[1]:.1f} s late on {e['member']}")
    unknown = set(fired) - wanted
    if unknown:
        problems.append(f"timers nobody scheduled fired: {sorted(unknown)[:4]}")
    if problems:
        raise Failure("; ".join(problems))
    moved_timers = sum(1 for es in fired.values()
                       for e in es if not e["member"].startswith(f"{sent_round(e, sent)}:"))
    retried = {m.name: sum(1 for e in m.events if e["event"] == "message" and e["ok"]
                           and "fail_until" in sent[(e["key"], e["seq"])]) for m in members}
    worst = max(e["at"] - max(kt[1], started[e["member"]]) for kt, es in fired.items() for e in es)
    return (f"members {' -> '.join(m.name for m in members)}: {len(sent)} records, "
            f"{len(wanted)} timers fired once each ({moved_timers} by the next member; "
            f"lateness at most {worst:.2f} s), deferred retries succeeded per member {retried}, "
            f"no record succeeded twice, key order held")


def sent_round(timer_event: Dict[str, Any], sent: Dict[Tuple[str, int], Dict[str, Any]]) -> int:
    """The round (= the member's index) whose record scheduled this timer."""
    for (k, s), p in sent.items():
        if k == timer_event["key"] and p.get("timer_at") == round(timer_event["time"]):
            return s
    return -1


def members_main(doc: str, title: str,
                 run_fn: Callable[[argparse.Namespace], Any]) -> int:
    """The command line of a scenario whose members run in turn (--python
    and --label, in order; --log-dir): runs `run_fn`, prints its summary."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--python", action="append", required=True,
                    help="a member's interpreter (its venv), in order; repeat")
    ap.add_argument("--label", action="append", required=True,
                    help="a member's implementation, for the report; one per --python")
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    if len(args.label) != len(args.python):
        ap.error("give one --label per --python")
    try:
        summary = asyncio.run(run_fn(args))
    except Failure as e:
        print(f"interop {title}: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop {title}: passed: {summary}")
    return 0


async def cleanup(members: List[Member], keyspace: str, admin: Any,
                  topic: Optional[str]) -> None:
    """Stops the members, drops the keyspace and deletes the topic (if one)."""
    for m in members:
        try:
            await m.stop()
        except Failure as e:
            print(f"interop: {e}", file=sys.stderr)
    cluster = Cluster([CASSANDRA.split(":")[0]], port=int(CASSANDRA.split(":")[1]))
    try:
        drop_keyspace(cluster.connect(), keyspace)
    finally:
        cluster.shutdown()
    if topic is None:
        return
    try:
        await admin.delete_topic(topic)
    except Exception as e:  # noqa: BLE001 - best effort cleanup
        print(f"interop: could not delete topic {topic}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(members_main(__doc__, "group move", run))
