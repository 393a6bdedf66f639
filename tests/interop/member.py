#!/usr/bin/env python3
"""One consumer group member, run as a subprocess by the interop programs
with the venv of the implementation under test: the ORIGINAL Rust-based
Prosody package (PyPI prosody-events, pinned by scripts/interop-tests.sh) or
ours (both import as `prosody`, so they never share an interpreter).

What its handler does is driven by each record's payload, so that both
implementations behave alike: {"key", "seq", "batch"} always; "timer_at"
(epoch seconds): schedule a timer for the key then; "fail_until" (epoch
seconds): raise (a transient error: deferred, then retried) until then;
"state": "write" (with --state: the key's value "count" += 1, map "seqs"
gets "s<seq>" = seq, deque "log" appends seq; with "items": [N, ...], as
many writes, one per N, in one record) or "report" (prints the
key's three collections as {"event": "state", "key", "count", "seqs":
[[k, v], ...] in key order, "log": [...] front to back}); with a write,
"hold_file" (a path): after writing, report {"event": "holding", "key",
"seq"} and return only once that file exists (so its writes are pending
meanwhile), and "fail": "permanent": raise a PermanentError after writing
(the attempt's writes are dropped, the record is not retried).
--publish SUBSYSTEM is --state with the three collections published
(published=True) and the client's subsystem set, for readers in other
processes (published_state.py).

It joins consumer group --group on --topic and writes one JSON object per
line to standard output, flushed at once, for the test to wait on:

  {"event": "subscribed"}
  {"event": "partitions", "count": N}    whenever its assigned partition count changes
  {"event": "message", "key": K, "seq": S, "batch": B, "partition": P, "offset": O,
   "ok": true|false, "at": T}           each attempt; ok false: it raised
  {"event": "timer", "key": K, "time": T0, "at": T}    a timer fired (T0: its time)
  {"event": "stopped"}                   after SIGTERM/SIGINT: unsubscribed and shut down;
                                         it then exits 0 (see the end of this file)

Its own logs go to standard error. It runs both the seed API (0.2.0) and the
current one (0.6.1, where the client is made with `await
ProsodyClient.create(...)`, `subscribe` is a coroutine, and a handler must
define `on_excise` too): see original_compat.py.
"""

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone

from original_compat import call, make_client, run_then_exit
from prosody import EventHandler

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    """One line per event; the original may call handlers from several threads."""
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def state_definitions(published: bool = False) -> list:
    """The collections --state registers (the same names and kinds in both
    implementations, as a group moving between them needs); published: those
    --publish registers."""
    from prosody import deque, map, value  # both: keyed state, prosody-events >= 0.4

    opts = {"published": True} if published else {}  # published: >= 0.5
    return [value("count", **opts), map("seqs", **opts), deque("log", **opts)]


async def hold(key: str, seq: int, path: str) -> None:
    """Reports that the record's writes are pending, then waits (bounded)
    until the test creates `path`."""
    emit({"event": "holding", "key": key, "seq": seq})
    deadline = time.monotonic() + float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        await asyncio.sleep(0.05)


async def on_state(context, message, defs: list) -> None:
    count, seqs, log = (context.state(d) for d in defs)
    key, p = message.key, message.payload
    if p["state"] == "write":
        items = p.get("items", [p["seq"]])
        await count.set((await count.get() or 0) + len(items))
        for item in items:
            await seqs.set(f"s{item:04d}", item)
            await log.append(item)
        if p.get("hold_file"):
            await hold(key, p["seq"], p["hold_file"])
        if p.get("fail") == "permanent":
            from prosody import PermanentError

            emit({"event": "message", "key": key, "seq": p["seq"], "batch": p["batch"],
                  "partition": message.partition, "offset": message.offset, "ok": False,
                  "at": time.time()})
            raise PermanentError(f"failing {key} {p['seq']} after writing")
        return
    emit({"event": "state", "key": key, "round": p.get("round"), "count": await count.get(),
          "seqs": [[k, v] async for k, v in seqs.items()],
          "log": [v async for v in log.values()], "size": await log.size()})


class Reporting(EventHandler):
    def __init__(self, defs: list) -> None:
        self.defs = defs

    async def on_message(self, context, message):
        p = message.payload
        now = time.time()
        if p.get("state") is not None:
            await on_state(context, message, self.defs)
        if p.get("timer_at") is not None:
            await context.schedule(datetime.fromtimestamp(p["timer_at"], timezone.utc))
        ok = now >= p.get("fail_until", 0)
        emit({"event": "message", "key": message.key, "seq": p["seq"], "batch": p["batch"],
              "partition": message.partition, "offset": message.offset, "ok": ok, "at": now})
        if not ok:
            raise RuntimeError(f"failing {message.key} until {p['fail_until']}")

    async def on_excise(self, context, message):
        emit({"event": "excise", "key": message.key})

    async def on_timer(self, context, timer):
        emit({"event": "timer", "key": timer.key, "time": timer.time.timestamp(),
              "at": time.time()})


async def watch_partitions(client, stop: asyncio.Event) -> None:
    """Reports each change of the assigned partition count (the original has no
    rebalance callback in its Python API, so this polls its own counter)."""
    last = None
    while not stop.is_set():
        count = await call(client, "assigned_partition_count")
        if count is None:  # 0.2.0 cannot tell
            return
        if count != last:
            emit({"event": "partitions", "count": count})
            last = count
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--cassandra", required=True)
    ap.add_argument("--keyspace", required=True)
    ap.add_argument("--option", action="append", default=[], metavar="NAME=JSON",
                    help="another client option, its value as JSON (repeatable)")
    ap.add_argument("--state", action="store_true",
                    help="register the keyed-state collections of state_definitions()")
    ap.add_argument("--publish", metavar="SUBSYSTEM",
                    help="--state, the collections published, the client's subsystem SUBSYSTEM")
    args = ap.parse_args()
    args.state = args.state or args.publish is not None
    defs = state_definitions(args.publish is not None) if args.state else []
    faulthandler.enable()  # a crash prints the Python stacks to the log
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    client = await make_client(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        subscribed_topics=args.topic,
        # The keyspace the test names (it may be ours: one layout for both).
        cassandra_nodes=args.cassandra,
        cassandra_keyspace=args.keyspace,
        # No probe server (the option's None disables it), so no port to share.
        probe_port=None,
        telemetry_enabled=False,
        shutdown_timeout=10.0,
        **({"state_collections": defs} if args.state else {}),
        **({"subsystem": args.publish} if args.publish is not None else {}),
        **{k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)},
    )
    await call(client, "subscribe", Reporting(defs))
    emit({"event": "subscribed"})
    watcher = asyncio.create_task(watch_partitions(client, stop))
    await stop.wait()
    await watcher
    await call(client, "unsubscribe")
    await call(client, "shutdown")
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no interpreter finalization (0.6.1 may abort there)
