#!/usr/bin/env python3
"""A consumer of the ORIGINAL Rust-based Prosody package (PyPI
prosody-events 0.6.1, pinned by scripts/interop-tests.sh) whose handler
carries out timer operations, run as a subprocess by tests/interop/timers.py
with the original's own venv.

It joins group --group on --topic with Cassandra keyspace --keyspace. Each
record's payload is {"op": OP, ...} for the record's key:
  {"op": "schedule", "times": [epoch s, ...]}  schedules each time
  {"op": "unschedule", "time": epoch s}        unschedules it
  {"op": "list"}                               only reports, as every op does:
and after the op it prints {"event": "done", "key": K, "op": OP, "scheduled":
[epoch s, ...]} (its scheduled(), ascending). A fired timer prints {"event":
"timer", "key": K, "time": epoch s, "at": wall clock s}. Also
{"event": "subscribed"}, {"event": "partitions", "count": N} on each change,
and {"event": "stopped"} after SIGTERM, then exit 0. One JSON object per
line on standard output, flushed; logs on standard error.
"""

import argparse
import asyncio
import datetime
import json
import os
import signal
import sys
import threading
import time
import traceback

from original_compat import call, make_client

from prosody import EventHandler

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def at(epoch_s: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc)


class Timers(EventHandler):
    async def on_message(self, context, message):
        p = message.payload
        if p["op"] == "schedule":
            for t in p["times"]:
                await context.schedule(at(t))
        elif p["op"] == "unschedule":
            await context.unschedule(at(p["time"]))
        times = sorted(int(t.timestamp()) for t in await context.scheduled())
        emit({"event": "done", "key": message.key, "op": p["op"], "scheduled": times})

    async def on_excise(self, context, message):
        pass

    async def on_timer(self, context, timer):
        emit({"event": "timer", "key": timer.key, "time": int(timer.time.timestamp()),
              "at": time.time()})


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--cassandra", required=True)
    ap.add_argument("--keyspace", required=True)
    args = ap.parse_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = await make_client(bootstrap_servers=args.bootstrap, group_id=args.group,
                               subscribed_topics=args.topic, cassandra_nodes=args.cassandra,
                               cassandra_keyspace=args.keyspace, probe_port=None,
                               telemetry_enabled=False, shutdown_timeout=10.0)
    await call(client, "subscribe", Timers())
    emit({"event": "subscribed"})
    last = None
    while not stop.is_set():
        count = await call(client, "assigned_partition_count")
        if count != last:
            emit({"event": "partitions", "count": count})
            last = count
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass
    await call(client, "unsubscribe")
    await call(client, "shutdown")
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    try:
        rc = asyncio.run(main())
    except BaseException:  # noqa: BLE001 - reported, then exit 1
        traceback.print_exc()
        rc = 1
    # As original_consumer.py: skip the interpreter's finalization, which
    # 0.6.1 sometimes aborts in.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
