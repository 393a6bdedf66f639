"""A subscribe() that nobody awaits, as in the specification's examples:
when the consumer cannot start, the failure is logged at ERROR through the
``prosody`` loggers and ``consumer_state()`` says "configuration-failed";
a probe port already in use leaves the consumer running."""

import asyncio
import gc
import logging
import socket
import time

import pytest

from conftest import WAIT, unique
from prosody import EventHandler, ProsodyClient


class WithTimers(EventHandler):
    async def on_message(self, context, message):
        pass

    async def on_timer(self, context, timer):
        pass


async def wait_for(pred, what):
    deadline = time.monotonic() + WAIT
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def errors_of(caplog, logger):
    return [r for r in caplog.records if r.name == logger and r.levelno == logging.ERROR]


async def test_a_subscribe_not_awaited_that_fails_is_logged_and_reported(caplog):
    caplog.set_level(logging.INFO, logger="prosody")
    # Timers outside mock mode need Cassandra; no cassandra_nodes is given.
    c = ProsodyClient(bootstrap_servers="127.0.0.1:1", group_id=unique("g"),
                      subscribed_topics="orders", probe_port=None, source_system=unique("s"))
    assert c.consumer_state() == "configured"
    c.subscribe(WithTimers())  # not awaited, as the spec's examples do
    await wait_for(lambda: errors_of(caplog, "prosody.consumer"),
                   "an ERROR record of prosody.consumer")
    [record] = errors_of(caplog, "prosody.consumer")
    assert "did not start" in record.getMessage() and "cassandra_nodes" in record.getMessage()
    await wait_for(lambda: c.consumer_state() == "configuration-failed",
                   "consumer_state() == 'configuration-failed'")
    assert await c.consumer_state() == "configuration-failed"
    # The failure was said once, by our ERROR record: collecting the
    # subscribe's future adds no "exception was never retrieved".
    gc.collect()
    await asyncio.sleep(0)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_an_awaited_subscribe_that_fails_still_raises():
    c = ProsodyClient(bootstrap_servers="127.0.0.1:1", group_id=unique("g"),
                      subscribed_topics="orders", probe_port=None, source_system=unique("s"))
    with pytest.raises(ValueError, match="cassandra_nodes"):
        await c.subscribe(WithTimers())
    assert c.consumer_state() == "configuration-failed"


async def test_a_taken_probe_port_leaves_the_consumer_running(caplog, clients, topic):
    caplog.set_level(logging.INFO, logger="prosody")
    with socket.socket() as taken:  # as uvicorn's or Django's server would
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        c = clients(group_id=unique("g"), subscribed_topics=topic, probe_port=port)
        await c.subscribe(WithTimers())
        assert c.consumer_state() == "running"
        assert c.probe_port is None
        await wait_for(lambda: errors_of(caplog, "prosody.probe"), "an ERROR record of prosody.probe")
        message = errors_of(caplog, "prosody.probe")[0].getMessage()
        assert str(port) in message and "without /readyz" in message
        await c.unsubscribe()
