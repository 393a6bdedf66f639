#!/usr/bin/env python3
"""A consumer of the ORIGINAL Rust-based Prosody package (PyPI
prosody-events 0.6.1, pinned by scripts/interop-tests.sh) for
tests/interop/defer_dedup.py, run with the original's own venv: pipeline
mode (the default) with its deferral and deduplication on (their defaults),
on the keyspace the test names.

Its handler fails every message of a key in --fail-keys (an exception: a
transient failure, so the original defers it) and handles the others. It
writes one JSON object per line to standard output, flushed at once:

  {"event": "subscribed"}
  {"event": "attempt", "key": K, "seq": S}   the handler was called
  {"event": "message", "key": K, "seq": S}   ... and handled it
  {"event": "stopped"}                      after SIGTERM/SIGINT (then exit 0)

Its own logs go to standard error.
"""

import argparse
import asyncio
import faulthandler
import logging
import signal
import sys

from original_compat import call, make_client, run_then_exit
from member import emit
from prosody import EventHandler


class Failing(EventHandler):
    def __init__(self, fail_keys: set) -> None:
        self.fail_keys = fail_keys

    async def on_message(self, context, message):
        key, seq = message.key, message.payload["seq"]
        emit({"event": "attempt", "key": key, "seq": seq})
        if key in self.fail_keys:
            raise RuntimeError(f"{key} fails (the test's transient failure)")
        emit({"event": "message", "key": key, "seq": seq})

    async def on_excise(self, context, message):
        emit({"event": "excise", "key": message.key})

    async def on_timer(self, context, timer):
        emit({"event": "timer", "key": timer.key})


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--cassandra", required=True)
    ap.add_argument("--keyspace", required=True)
    ap.add_argument("--fail-keys", default="")
    args = ap.parse_args()
    faulthandler.enable()
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
        cassandra_nodes=args.cassandra,
        cassandra_keyspace=args.keyspace,
        probe_port=None,
        telemetry_enabled=False,
        shutdown_timeout=10.0,
    )
    await call(client, "subscribe", Failing(set(filter(None, args.fail_keys.split(",")))))
    emit({"event": "subscribed"})
    await stop.wait()
    await call(client, "unsubscribe")
    await call(client, "shutdown")
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no interpreter finalization (0.6.1 may abort there)
