#!/usr/bin/env python3
"""One consumer, of either implementation, for tests/interop/wire_records.py:
run with the original's venv (PyPI prosody-events, whose client is made with
`await ProsodyClient.create(...)`) or with ours (`ProsodyClient(...)`); the
script tells them apart by that class method.

In low-latency mode, with a telemetry topic and a failure topic of its own,
it consumes --topic (the test wrote its four records) and handles each key
the same way on both sides:

  ok     schedules a timer 2 s ahead and sends {"from": "ok"} to --out-topic
         (key "sent-ok"); the timer succeeds
  bad    fails permanently: straight to the failure topic
  trans  fails transiently: retried once (max_retries=1), then to the
         failure topic
  tfail  schedules a timer 2 s ahead; the timer fails permanently

It writes one JSON line per event on standard output, flushed at once:
{"event": "subscribed"}, {"event": "timer", "key": K} for each timer
handled, and {"event": "stopped"} after SIGTERM (it then unsubscribes, shuts
down, and exits 0). It stays up until then, so that both producers' queued
records (telemetry is batched) go out while the test reads them back.
"""

import argparse
import asyncio
import datetime
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import traceback

from prosody import EventHandler, ProsodyClient
from prosody.errors import PermanentError, TransientError

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class Boom(PermanentError):
    pass


class Flaky(TransientError):
    pass


def in_two_seconds() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)


class Probe(EventHandler):
    def __init__(self, client, out_topic: str) -> None:
        self.client, self.out_topic = client, out_topic

    async def on_message(self, context, message):
        key = message.key
        if key == "bad":
            raise Boom("boom for bad")
        if key == "trans":
            raise Flaky("flaky for trans")
        if key in ("ok", "tfail"):
            await context.schedule(in_two_seconds())
        if key == "ok":
            await self.client.send(self.out_topic, "sent-ok", {"from": "ok"})

    async def on_excise(self, context, message):  # the original's API needs it
        pass

    async def on_timer(self, context, timer):
        emit({"event": "timer", "key": timer.key})
        if timer.key == "tfail":
            raise Boom("timer boom")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("bootstrap", "cassandra", "keyspace", "group", "topic", "out-topic",
                 "failure-topic", "telemetry-topic", "source-system"):
        ap.add_argument("--" + name, required=True)
    args = ap.parse_args()
    faulthandler.enable()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    options = dict(
        bootstrap_servers=args.bootstrap, group_id=args.group, subscribed_topics=args.topic,
        source_system=args.source_system, mode="low-latency", failure_topic=args.failure_topic,
        telemetry_topic=args.telemetry_topic, telemetry_enabled=True, max_retries=1,
        retry_base=0.05, cassandra_nodes=args.cassandra, cassandra_keyspace=args.keyspace,
        probe_port=None, shutdown_timeout=10.0)
    original = hasattr(ProsodyClient, "create")
    client = await ProsodyClient.create(**options) if original else ProsodyClient(**options)
    await client.subscribe(Probe(client, args.out_topic))
    emit({"event": "subscribed"})
    await stop.wait()
    await client.unsubscribe()
    if original:
        await client.shutdown()
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    try:
        rc = asyncio.run(main())
    except BaseException:  # noqa: BLE001 - reported, then the same exit as below
        traceback.print_exc()
        rc = 1
    # As tests/interop/original_consumer.py: the original (0.6.1) may abort
    # in the interpreter's finalization, after its shutdown has returned.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
