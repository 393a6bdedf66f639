"""Timers through the Context: memory store (mock tier), Cassandra (real)."""

import asyncio
import datetime

import pytest

from conftest import unique
from prosody import EventHandler, ProsodyError

UTC = datetime.timezone.utc


def whole(dt: datetime.datetime) -> datetime.datetime:
    return dt.replace(microsecond=0)


class TimerHandler(EventHandler):
    """Runs the payload's `do` script against the context, records results."""

    def __init__(self, recorder):
        self.recorder = recorder

    async def on_message(self, context, message):
        base = whole(datetime.datetime.now(UTC)) + datetime.timedelta(hours=1)
        at = lambda s: base + datetime.timedelta(seconds=s)  # noqa: E731
        do = message.payload["do"]
        try:
            if do == "calls":
                await context.schedule(at(10))
                await context.schedule(at(20))
                await context.schedule(at(30))
                await context.schedule(at(20))  # the same second: one timer
                first = await context.scheduled()
                await context.unschedule(at(20))
                second = await context.scheduled()
                await context.clear_and_schedule(at(40))
                third = await context.scheduled()
                await context.clear_scheduled()
                fourth = await context.scheduled()
                await self.recorder.add(("calls", [first, second, third, fourth], at))
            elif do == "fire":
                due = whole(datetime.datetime.now(UTC)) + datetime.timedelta(seconds=2)
                # Sub-second parts are rounded to the nearest second.
                await context.schedule(due + datetime.timedelta(milliseconds=400))
                await self.recorder.add(("scheduled", message.key, due))
            elif do == "naive":
                try:
                    await context.schedule(datetime.datetime.now())
                    await self.recorder.add(("naive", "accepted"))
                except ValueError as e:
                    await self.recorder.add(("naive", str(e)))
        except Exception as e:  # noqa: BLE001 - reported to the test
            await self.recorder.add(("error", repr(e)))

    async def on_timer(self, context, timer):
        await self.recorder.add(("fired", timer.key, timer.time, await context.scheduled()))


async def test_timer_calls(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(TimerHandler(recorder))
    await c.send(topic, "timer-calls", {"do": "calls"})
    await recorder.wait_count(1)
    kind, results, at = recorder.events[0]
    assert kind == "calls", recorder.events
    first, second, third, fourth = results
    assert first == [at(10), at(20), at(30)]
    assert second == [at(10), at(30)]
    assert third == [at(40)]
    assert fourth == []
    assert all(t.tzinfo is not None for t in first)


async def test_timer_fires_with_key_and_time(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(TimerHandler(recorder))
    await c.send(topic, "timer-fire", {"do": "fire"})
    await recorder.wait_for(lambda ev: any(e[0] == "fired" for e in ev), what="the timer")
    scheduled = next(e for e in recorder.events if e[0] == "scheduled")
    fired = next(e for e in recorder.events if e[0] == "fired")
    assert fired[1] == "timer-fire"
    assert fired[2] == scheduled[2]  # 400 ms rounds down to the second
    assert fired[3] == []  # the firing timer is not listed as scheduled
    assert datetime.datetime.now(UTC) >= fired[2]


async def test_naive_datetime_refused(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(TimerHandler(recorder))
    await c.send(topic, "timer-naive", {"do": "naive"})
    await recorder.wait_count(1)
    assert recorder.events[0][0] == "naive"
    assert "naive datetime" in recorder.events[0][1]


async def test_context_after_handler_finished_is_refused(clients, topic, recorder):
    kept = []

    class Keeps(EventHandler):
        async def on_message(self, context, message):
            kept.append(context)
            await recorder.add(message.key)

        async def on_timer(self, context, timer):
            pass

    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(Keeps())
    await c.send(topic, "k", {})
    await recorder.wait_count(1)
    await asyncio.sleep(0)  # let the task's done callback complete it
    ctx = kept[0]
    assert ctx.should_cancel() is True  # its invocation is over
    with pytest.raises(ProsodyError, match="stale"):
        await ctx.schedule(datetime.datetime.now(UTC))


async def test_handler_without_on_timer_cannot_schedule(clients, topic, recorder):
    class NoTimers(EventHandler):
        async def on_message(self, context, message):
            try:
                await context.schedule(datetime.datetime.now(UTC))
            except ProsodyError as e:
                await recorder.add(str(e))

    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(NoTimers())
    await c.send(topic, "k", {})
    await recorder.wait_count(1)
    assert "on_timer" in recorder.events[0]
