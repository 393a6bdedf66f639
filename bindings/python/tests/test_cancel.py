"""Cancellation: should_cancel() and on_cancel() on unsubscribe and timeout."""

import asyncio

from conftest import unique
from prosody import EventHandler


class WaitsForCancel(EventHandler):
    def __init__(self, recorder, started):
        self.recorder = recorder
        self.started = started

    async def on_message(self, context, message):
        before = context.should_cancel()
        self.started.set()
        await context.on_cancel()
        await self.recorder.add((message.key, before, context.should_cancel()))


async def test_unsubscribe_cancels_running_handler(clients, topic, recorder):
    started = asyncio.Event()
    c = clients(group_id=unique("g"), subscribed_topics=topic, shutdown_timeout=2)
    await c.subscribe(WaitsForCancel(recorder, started))
    await c.send(topic, "stuck", {})
    await asyncio.wait_for(started.wait(), 60)
    t0 = asyncio.get_running_loop().time()
    await c.unsubscribe()
    took = asyncio.get_running_loop().time() - t0
    assert recorder.events == [("stuck", False, True)]
    # Cancellation comes at 80% of shutdown_timeout, not at once.
    assert 1.0 <= took < 10
    assert c.consumer_state() == "configured"


async def test_timeout_cancels_handler(clients, topic, recorder):
    started = asyncio.Event()
    c = clients(group_id=unique("g"), subscribed_topics=topic, timeout=0.5,
                mode="best-effort")
    await c.subscribe(WaitsForCancel(recorder, started))
    await c.send(topic, "slow", {})
    await recorder.wait_count(1)
    assert recorder.events[0] == ("slow", False, True)
