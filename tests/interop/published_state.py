#!/usr/bin/env python3
"""Interop: published keyed state, owned by one implementation and read by
the other (the original Rust-based Prosody and ours), through the one
keyspace they share (the original's keyed_state_publication,
keyed_state_identity and keyed_state_cell).

Run by scripts/interop-tests.sh with OUR package's venv, once per direction
(original owns and ours reads, then ours owns and the original reads), each
with a topic (3 partitions), a group and a subsystem of its own (routes
outlive a run in Cassandra) in one keyspace for the run. The owner is
member.py --publish SUBSYSTEM (a value "count", a map "seqs", a deque "log"
per key, published), run with its implementation's venv; the reader is
published_reader.py, run with the other's: a client that subscribes to
nothing and reads with `await client.state(subsystem, definition)`, no read
cache. Per direction:

  1. WRITES records per key (KEYS keys) that each add one to "count", put
     "s<seq>" = seq into "seqs" and append seq to "log"; once the owner
     reported every key, the reader reads each key (and one nobody wrote)
     until it sees exactly what was written: the value, the map forward and
     backward, get_many and contains (with a map key never written), the
     deque both ways, its size, emptiness, first, last, peek and peekleft;
     then one key whose one record wrote BULK entries and items (scans of
     several pages);
  2. committed only: a write whose handler then holds (until the test
     releases it) is not visible while it holds, and is once it returned; a
     write whose handler then fails (a PermanentError: dropped, not retried)
     is never visible, and the key's next write is;
  3. the errors: a collection read as another kind and an empty key are a
     PermanentStateError, a subsystem nobody publishes a TransientStateError.

Every wait is bounded (PROSODY_INTEROP_WAIT s, default 120); "until it sees"
polls the store (nothing announces a commit to another process). Exit 0 when
both directions passed; the keyspace and topics are dropped either way.
"""

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from group_move import (BOOTSTRAP, CASSANDRA, HERE, WAIT, Failure, Member, cleanup)
from prosody import AdminClient, ProsodyClient

KEYS = 5
WRITES = 3
HOLD_SEQ, FAIL_SEQ, AFTER_FAIL_SEQ = 50, 60, 61
NEVER = "s9999"  # a map key nobody writes
BULK = 600  # kbulk's entries and items: over two of a scan's pages (ours: 256)


def want(seqs: List[int]) -> Dict[str, Any]:
    """What the reader's "read" answers for a key whose writes were `seqs`."""
    names = sorted(f"s{s:04d}" for s in seqs)
    by_name = {f"s{s:04d}": s for s in seqs}
    return {
        "ok": True, "count": len(seqs) or None, "seqs": [[n, by_name[n]] for n in names],
        "seqs_back": names[::-1], "get_many": [by_name[n] for n in names] + [None],
        "contains": [True] * len(names) + [False], "log": seqs, "log_back": seqs[::-1],
        "size": len(seqs), "empty": not seqs, "first": seqs[0] if seqs else None,
        "last": seqs[-1] if seqs else None, "peek": seqs[-1] if seqs else None,
        "peekleft": seqs[0] if seqs else None,
    }


def diff(got: Dict[str, Any], wanted: Dict[str, Any]) -> str:
    if not got.get("ok"):
        return f"{got.get('error')}: {got.get('message')}"
    def short(x: Any) -> str:
        r = repr(x)
        return r if len(r) <= 80 else r[:60] + f"... ({len(r)} chars)"

    return ", ".join(f"{k} {short(got.get(k))} (want {short(v)})" for k, v in wanted.items()
                     if got.get(k) != v)


class Reader:
    """One published_reader.py process: a command per line in, an answer out."""

    def __init__(self, name: str, python: str) -> None:
        self.name, self.python = name, python
        self.proc: Optional[asyncio.subprocess.Process] = None

    async def start(self, keyspace: str, subsystem: str, group: str, log: Path) -> None:
        with open(log, "ab") as f:
            self.proc = await asyncio.create_subprocess_exec(
                self.python, str(HERE / "published_reader.py"), "--bootstrap", BOOTSTRAP,
                "--cassandra", CASSANDRA, "--keyspace", keyspace, "--subsystem", subsystem,
                "--group", group, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=f)
        if (await self._line("its client")).get("event") != "ready":
            raise Failure(f"{self.name}: no ready line")

    async def _line(self, what: str) -> Dict[str, Any]:
        assert self.proc and self.proc.stdout
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT)
        except asyncio.TimeoutError:
            raise Failure(f"{self.name}: timed out after {WAIT:.0f} s waiting for {what}") \
                from None
        if not line:
            raise Failure(f"{self.name} exited while the test waited for {what}")
        return json.loads(line)

    async def ask(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self._line(f"the answer to {cmd}")

    async def read(self, key: str, seqs: List[int], **extra: Any) -> Dict[str, Any]:
        return await self.ask({"op": "read", "key": key, "map_keys":
                               sorted(f"s{s:04d}" for s in seqs) + [NEVER], **extra})

    async def until(self, key: str, seqs: List[int]) -> float:
        """Reads `key` until it answers what `seqs` wrote (bounded); the
        seconds that took."""
        t0 = time.monotonic()
        wanted = want(seqs)
        while True:
            got = await self.read(key, seqs)
            d = diff(got, wanted)
            if not d:
                return time.monotonic() - t0
            if time.monotonic() - t0 > WAIT:
                raise Failure(f"{self.name} {key}: after {WAIT:.0f} s still {d}")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        assert self.proc.stdin
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), WAIT)
        except asyncio.TimeoutError:
            self.proc.kill()
            raise Failure(f"{self.name} did not exit within {WAIT:.0f} s") from None
        if self.proc.returncode != 0:
            raise Failure(f"{self.name} exited {self.proc.returncode}")


def handled(m: Member, key: str, seq: int, ok: bool) -> bool:
    return any(e["event"] == "message" and e["key"] == key and e["seq"] == seq and e["ok"] == ok
               for e in m.events)


async def direction(owner: Member, reader: Reader, keyspace: str, suffix: str, log: Path,
                    admin: Any, producer: Any) -> str:
    """One direction: `owner` publishes, `reader` reads; its summary."""
    tag = f"{owner.name.split(':')[-1]}-{suffix}"
    topic = group = subsystem = f"interop-pub-{tag}"
    await admin.create_topic(topic, partition_count=3, replication_factor=1)
    try:
        await owner.start(group, topic, keyspace, log, ("--publish", subsystem))
        await owner.wait_for(lambda: any(e["event"] == "subscribed" for e in owner.events),
                             "its subscription")
        await reader.start(keyspace, subsystem, f"interop-pub-reader-{tag}", log)
        # Not checked, reported: what a read gives before the owner wrote
        # anything ("empty": the owner recorded its routes when it
        # subscribed; a TransientStateError: not yet).
        got = await reader.read("k00", [])
        before = "empty" if not diff(got, want([])) else f"{got.get('error')}: {got.get('message')}"

        async def send(key: str, seq: int, **extra: Any) -> None:
            await producer.send(topic, key, {"key": key, "seq": seq, "batch": owner.name,
                                             "state": "write", **extra})

        # 1. Every write visible, every reader method.
        written: Dict[str, List[int]] = {f"k{k:02d}": [] for k in range(KEYS)}
        for key, seqs in written.items():
            for seq in range(WRITES):
                await send(key, seq)
                seqs.append(seq)
            await producer.send(topic, key, {"key": key, "seq": 99, "batch": owner.name,
                                             "state": "report"})
        await owner.wait_for(lambda: len({e["key"] for e in owner.events
                                          if e["event"] == "state"}) == KEYS,
                             "its reports")
        for e in owner.events:
            if e["event"] == "state" and e["log"] != written[e["key"]]:
                raise Failure(f"{owner.name} {e['key']}: its own log {e['log']}")
        lag = max([await reader.until(key, seqs) for key, seqs in written.items()] +
                  [await reader.until("knobody", [])])
        # One key with more entries and items than a scan's page.
        bulk = list(range(BULK))
        await send("kbulk", 0, items=bulk)
        await owner.wait_for(lambda: handled(owner, "kbulk", 0, True), "its bulk write")
        await reader.until("kbulk", bulk)

        # 2a. A pending write is not visible; once its handler returned, it is.
        key = "k00"
        hold_file = log.parent / f"published-hold-{tag}"
        await send(key, HOLD_SEQ, hold_file=str(hold_file))
        await owner.wait_for(lambda: any(e["event"] == "holding" and e["seq"] == HOLD_SEQ
                                         for e in owner.events), "its holding write")
        for _ in range(3):
            d = diff(await reader.read(key, written[key]), want(written[key]))
            if d:
                raise Failure(f"{reader.name} {key} while the owner's write {HOLD_SEQ} was "
                              f"pending: {d}")
        hold_file.touch()
        await owner.wait_for(lambda: handled(owner, key, HOLD_SEQ, True), "its held write")
        hold_file.unlink()
        written[key].append(HOLD_SEQ)
        await reader.until(key, written[key])

        # 2b. A failed attempt's writes are never visible; the next write is.
        key = "k01"
        await send(key, FAIL_SEQ, fail="permanent")
        await owner.wait_for(lambda: handled(owner, key, FAIL_SEQ, False), "its failed write")
        d = diff(await reader.read(key, written[key]), want(written[key]))
        if d:
            raise Failure(f"{reader.name} {key} after the owner's write {FAIL_SEQ} failed: {d}")
        await send(key, AFTER_FAIL_SEQ)
        await owner.wait_for(lambda: handled(owner, key, AFTER_FAIL_SEQ, True), "its next write")
        written[key].append(AFTER_FAIL_SEQ)
        await reader.until(key, written[key])

        # 3. The errors.
        got = await reader.ask({"op": "as", "key": "k02", "name": "count", "kind": "map"})
        if got.get("error") != "PermanentStateError":
            raise Failure(f"{reader.name}: the value \"count\" read as a map answered {got}")
        got = await reader.read("k02", written["k02"], subsystem=f"interop-pub-none-{suffix}")
        if got.get("error") != "TransientStateError":
            raise Failure(f"{reader.name}: a subsystem nobody publishes answered {got}")
        got = await reader.read("", [])
        if got.get("error") != "PermanentStateError":
            raise Failure(f"{reader.name}: an empty key answered {got}")

        await reader.stop()
        await owner.stop()
        return (f"{owner.name} owned, {reader.name} read: before any write: {before}; "
                f"{KEYS} keys x {WRITES} writes (and a "
                f"key nobody wrote, and one of {BULK}) read in full by every method, at most {lag:.2f} s after the "
                f"owner reported; a held write invisible until it returned; a failed write "
                f"never visible")
    finally:
        try:
            await reader.stop()
        except Failure as e:
            print(f"interop: {e}", file=sys.stderr)
        try:
            await admin.delete_topic(topic)
        except Exception as e:  # noqa: BLE001 - best effort cleanup
            print(f"interop: could not delete topic {topic}: {e}", file=sys.stderr)


async def run(args: argparse.Namespace) -> str:
    suffix = uuid.uuid4().hex[:10]
    keyspace = f"interop_pub_{suffix}"
    log = Path(args.log_dir) / f"published-state-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    admin = AdminClient(bootstrap_servers=BOOTSTRAP)
    producer = ProsodyClient(bootstrap_servers=BOOTSTRAP, source_system="interop-pub",
                             probe_port=None, telemetry_enabled=False)
    owners = [Member("0:original", args.original_python), Member("1:ours", args.ours_python)]
    readers = [Reader("0:ours", args.ours_python), Reader("1:original", args.original_python)]
    t0 = time.monotonic()
    summaries = []
    try:
        for owner, reader in zip(owners, readers):
            summaries.append(await direction(owner, reader, keyspace, suffix, log, admin,
                                             producer))
        return "; ".join(summaries) + f"; wall {time.monotonic() - t0:.1f} s"
    finally:
        await cleanup(owners, keyspace, admin, None)  # each direction deleted its topic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original-python", required=True, help="the original's venv's python")
    ap.add_argument("--ours-python", required=True, help="our venv's python")
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    try:
        summary = asyncio.run(run(args))
    except Failure as e:
        print(f"interop published state: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop published state: passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
