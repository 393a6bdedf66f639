"""Logging: a client's lines reach the standard `logging` module, as records
of the loggers ``prosody.<subsystem>``, at the client's own `log` level."""

import asyncio
import gc
import logging
import time

import pytest

from conftest import WAIT, admin_options, base_options, unique, wait_assigned
from prosody import AdminClient, EventHandler, ProsodyClient, TransientError
from prosody._support import TRACE, forward_logs


def records_of(caplog, source_system):
    return [r for r in caplog.records
            if r.name.startswith("prosody.") and getattr(r, "source_system", None) == source_system]


async def wait_records(caplog, pred, what):
    deadline = time.monotonic() + WAIT
    while not pred():
        if time.monotonic() > deadline:
            seen = [(r.name, r.levelname, r.getMessage()) for r in caplog.records[-10:]]
            raise AssertionError(f"timed out waiting for {what}; last records: {seen!r}")
        await asyncio.sleep(0.02)


def unreachable(source_system, level):
    # Nothing listens on port 1: the producer's connection attempts warn
    # (libprosody's `producer` lines and librdkafka's own, `kafka`).
    return ProsodyClient(bootstrap_servers="127.0.0.1:1", send_timeout=0.5, probe_port=None,
                         source_system=source_system, log=level)


async def test_two_clients_each_log_at_their_own_level(caplog):
    caplog.set_level(TRACE, logger="prosody")
    loud_name, quiet_name = unique("log-debug"), unique("log-warn")
    loud, quiet = unreachable(loud_name, "debug"), unreachable(quiet_name, "warn")
    for c in (loud, quiet):
        with pytest.raises(TransientError):
            await c.send("t", "k", {"x": 1})

    def warned(name):
        return any(r.levelno == logging.WARNING for r in records_of(caplog, name))

    await wait_records(caplog, lambda: warned(loud_name) and warned(quiet_name),
                       "a warning of each client")
    loud_records, quiet_records = records_of(caplog, loud_name), records_of(caplog, quiet_name)
    # The debug client: its creation's line (logged on this very thread,
    # forwarded when the constructor returned) and its producer's warnings.
    ready = [r for r in loud_records if r.name == "prosody.client" and "client ready" in r.getMessage()]
    assert ready and ready[0].levelno == logging.DEBUG and ready[0].levelname == "DEBUG"
    assert loud_name in ready[0].getMessage()
    assert {r.name for r in loud_records if r.levelno == logging.WARNING} & {"prosody.producer",
                                                                               "prosody.kafka"}
    # The warn client: warnings, nothing below, and none of the other's lines.
    assert quiet_records and all(r.levelno >= logging.WARNING for r in quiet_records), \
        [(r.name, r.levelname, r.getMessage()) for r in quiet_records if r.levelno < logging.WARNING]
    assert not any(loud_name in r.getMessage() for r in quiet_records)
    assert not any(quiet_name in r.getMessage() for r in loud_records)
    # Every record names its subsystem in the logger and its client.
    for r in loud_records + quiet_records:
        assert r.name.split(".", 1)[1] in {"client", "producer", "kafka", "engine", "telemetry", "otel"}


class Ok(EventHandler):
    async def on_message(self, context, message):
        pass


async def test_consumer_lines_arrive_by_the_end_of_unsubscribe(caplog, clients, topic):
    caplog.set_level(logging.INFO, logger="prosody")
    name = unique("log-consumer")
    c = clients(group_id=unique("g"), subscribed_topics=topic, source_system=name, log="info")
    await c.subscribe(Ok())
    await wait_assigned(c)
    await wait_records(caplog, lambda: any("assigned" in r.getMessage()
                                           for r in records_of(caplog, name)),
                       "the assignment line")
    assigned = [r for r in records_of(caplog, name) if "assigned" in r.getMessage()]
    assert assigned[0].name == "prosody.engine" and assigned[0].levelno == logging.INFO
    await c.unsubscribe()
    # The engine's last line, logged while it stopped, is drained before
    # unsubscribe() returns.
    stopped = [r for r in records_of(caplog, name) if "consumer stopped" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].name == "prosody.engine"
    assert not any(r.levelno < logging.INFO for r in records_of(caplog, name))


def test_lines_logged_while_a_client_closes_are_forwarded(caplog):
    caplog.set_level(logging.INFO, logger="prosody")
    name, topic = unique("log-closing"), unique("py-topic")

    async def start():
        await AdminClient(**admin_options()).create_topic(topic, partition_count=1)
        c = ProsodyClient(**{**base_options(), "group_id": unique("g"), "subscribed_topics": topic,
                             "source_system": name, "log": "info"})
        await c.subscribe(Ok())
        await wait_assigned(c)
        return c

    # The loop ends with the client still subscribed: dropping it stops the
    # consumer inside prosody_client_destroy, whose last line must still
    # reach `logging` (drained as the client is deallocated).
    c = asyncio.run(start())
    assert not [r for r in records_of(caplog, name) if "consumer stopped" in r.getMessage()]
    del c
    gc.collect()
    stopped = [r for r in records_of(caplog, name) if "consumer stopped" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].name == "prosody.engine"

    async def cleanup():
        await AdminClient(**admin_options()).delete_topic(topic)

    asyncio.run(cleanup())


def test_levels_and_drops_map_to_logging(caplog):
    caplog.set_level(TRACE, logger="prosody")
    forward_logs([(1, "engine", "e %s"), (2, "kafka", "w"), (3, "client", "i"),
                  (4, "producer", "d"), (5, "engine", "t")], 3, "src")
    got = [(r.name, r.levelno, r.getMessage(), r.source_system) for r in caplog.records]
    assert got == [("prosody.engine", logging.ERROR, "e %s", "src"),
                   ("prosody.kafka", logging.WARNING, "w", "src"),
                   ("prosody.client", logging.INFO, "i", "src"),
                   ("prosody.producer", logging.DEBUG, "d", "src"),
                   ("prosody.engine", TRACE, "t", "src"),
                   ("prosody", logging.WARNING,
                    "3 log line(s) dropped: the client logged faster than its event loop "
                    "forwarded them", "src")]
    assert logging.getLevelName(TRACE) == "TRACE"
