#!/usr/bin/env python3
"""Interop: keyed state moves with its consumer group between the original
Rust-based Prosody and ours, through the one keyspace they share (the
original's keyed_state_cell and keyed_state_identity).

Run by scripts/interop-tests.sh with OUR package's venv. Members are
tests/interop/member.py with --state (a value "count", a map "seqs", a deque
"log" per key), run with the venv of each implementation (--python, in
order; e.g. original, ours, original), one after the other, in one group.
Member i gets round i: per key, WRITES records that each add one to "count",
put "s<seq>" = seq into "seqs" and append seq to "log", then one record that
reports the key's three collections. Member i stops once it reported every
key, and member i+1 takes the group over.

Checks: every report shows the writes of its round and of every round
before it, whoever made them: "count" is their number, "seqs" holds each
once in key order, "log" holds them in the order written, and its size
agrees. So each implementation reads what the other committed, in the
original's layout, and its own writes land where the other reads them.
Every wait is bounded (PROSODY_INTEROP_WAIT s, default 120); exit 0 when it
passed; the keyspace and topic are dropped either way.
"""

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

from group_move import BOOTSTRAP, Failure, Member, cleanup, members_main
from prosody import AdminClient, ProsodyClient

KEYS = 6
WRITES = 3


def reports(m: Member, seq: int) -> Dict[str, Dict[str, Any]]:
    """The member's reports of round `seq`, by key."""
    return {e["key"]: e for e in m.events if e["event"] == "state" and e.get("round") == seq}


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    topic, group, keyspace = (f"interop-state-{suffix}", f"interop-state-{suffix}",
                              f"interop_state_{suffix}")
    log = Path(args.log_dir) / f"keyed-state-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.create_topic(topic, partition_count=2, replication_factor=1)
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-state",
                             probe_port=None, telemetry_enabled=False)
    members = [Member(f"{i}:{label}", python)
               for i, (label, python) in enumerate(zip(args.label, args.python))]
    written: Dict[str, List[int]] = {f"k{k:02d}": [] for k in range(KEYS)}
    problems: List[str] = []
    t0 = time.monotonic()
    try:
        for rnd, member in enumerate(members):
            await member.start(group, topic, keyspace, log, ("--state",))
            await member.wait_for(lambda m=member: any(e["event"] == "subscribed"
                                                       for e in m.events), "its subscription")
            for key, seqs in written.items():
                for w in range(WRITES):
                    seq = rnd * 100 + w
                    await producer.send(topic, key, {"key": key, "seq": seq,
                                                     "batch": member.name, "state": "write"})
                    seqs.append(seq)
                await producer.send(topic, key, {"key": key, "seq": rnd * 100 + 99,
                                                 "batch": member.name, "state": "report",
                                                 "round": rnd})
            await member.wait_for(lambda m=member, r=rnd: len(reports(m, r)) == KEYS,
                                  f"its reports of round {rnd}")
            await member.stop()
            for key, e in sorted(reports(member, rnd).items()):
                want = written[key]
                got_seqs = [v for _, v in e["seqs"]]
                if e["count"] != len(want):
                    problems.append(f"{member.name} {key}: count {e['count']}, want {len(want)}")
                if [k for k, _ in e["seqs"]] != sorted(f"s{s:04d}" for s in want) or \
                        sorted(got_seqs) != sorted(want):
                    problems.append(f"{member.name} {key}: seqs {e['seqs']}, want {want}")
                if e["log"] != want or e["size"] != len(want):
                    problems.append(f"{member.name} {key}: log {e['log']} (size {e['size']}), "
                                    f"want {want}")
            if problems:
                raise Failure("; ".join(problems[:6]))
        return (f"members {' -> '.join(m.name for m in members)}: {KEYS} keys, "
                f"{WRITES} writes per key and member; every report held every write before it, "
                f"whoever wrote it; wall {time.monotonic() - t0:.1f} s")
    finally:
        await cleanup(members, keyspace, admin, topic)


if __name__ == "__main__":
    sys.exit(members_main(__doc__, "keyed state", run))
