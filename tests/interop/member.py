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
gets "s<seq>" = seq, deque "log" appends seq) or "report" (prints the
key's three collections as {"event": "state", "key", "count", "seqs":
[[k, v], ...] in key order, "log": [...] front to back}).

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
import traceback
from datetime import datetime, timezone

from original_compat import call, make_client
from prosody import EventHandler

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    """One line per event; the original may call handlers from several threads."""
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def state_definitions() -> list:
    """The collections --state registers (the same names and kinds in both
    implementations, as a group moving between them needs)."""
    from prosody import deque, map, value  # both: keyed state, prosody-events >= 0.4

    return [value("count"), map("seqs"), deque("log")]


async def on_state(context, message, defs: list) -> None:
    count, seqs, log = (context.state(d) for d in defs)
    key, p = message.key, message.payload
    if p["state"] == "write":
        await count.set((await count.get() or 0) + 1)
        await seqs.set(f"s{p['seq']:04d}", p["seq"])
        await log.append(p["seq"])
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
    args = ap.parse_args()
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
        **({"state_collections": state_definitions()} if args.state else {}),
        **{k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)},
    )
    await call(client, "subscribe", Reporting(state_definitions() if args.state else []))
    emit({"event": "subscribed"})
    watcher = asyncio.create_task(watch_partitions(client, stop))
    await stop.wait()
    await watcher
    await call(client, "unsubscribe")
    await call(client, "shutdown")
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    try:
        rc = asyncio.run(main())
    except BaseException:  # noqa: BLE001 - reported, then the same exit as below
        traceback.print_exc()
        rc = 1
    # Ends the process without the interpreter's finalization, whatever
    # happened: in about one exit of three, 0.6.1 aborts there (SIGABRT, also
    # in a script that only subscribes, unsubscribes and shuts down, with no
    # test around it): a tokio thread of its extension completes an asyncio
    # future while Python finalizes, Python's take_gil ends that thread with
    # pthread_exit, and the forced unwind through Rust frames aborts. Its
    # unsubscribe and shutdown have returned by then (reported as
    # "stopped"), so the test's subject is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
