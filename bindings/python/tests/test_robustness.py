"""Careless or hostile input through the package (issue 34): each test names
what it guards against, and fails without the fix it came with."""

import asyncio
import logging
import sys
from typing import Any, Callable, List

import pytest

from conftest import WAIT, admin_options, base_options, unique
from prosody import AdminClient, EventHandler, ProsodyClient


class FailureLog(logging.Handler):
    """Collects the engine's handler-failure lines (forwarded on the loop
    thread) and wakes whoever waits for one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "handler failure" in text:
            self.lines.append(text)
            self.changed.set()

    async def wait_for(self, pred: Callable[[List[str]], bool], what: str) -> None:
        async def until() -> None:
            while not pred(self.lines):
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(until(), WAIT)
        except asyncio.TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; saw {self.lines[-3:]!r}") from None


@pytest.fixture
def failures():
    log = FailureLog()
    logger = logging.getLogger("prosody.engine")
    logger.addHandler(log)
    yield log
    logger.removeHandler(log)


def attempt_at_least(key: str, n: int) -> Callable[[List[str]], bool]:
    # The client's log may fold repeated lines: not every attempt has one.
    def pred(lines: List[str]) -> bool:
        for line in lines:
            if f'key "{key}"' in line and "attempt " in line:
                if int(line.split("attempt ", 1)[1].split(",", 1)[0]) >= n:
                    return True
        return False
    return pred


RETRY_FAST = dict(retry_base=0.01, max_retry_delay=0.02, defer_enabled=False)


async def test_generator_handler_fails_its_event(clients, topic, failures):
    ran: List[str] = []

    class AsyncGen(EventHandler):
        async def on_message(self, context, message):  # type: ignore[override]
            ran.append(message.key)
            yield

    class SyncGen(EventHandler):
        def on_message(self, context, message):  # type: ignore[override]
            ran.append(message.key)
            yield

    # Pipeline mode retries a transient failure: a second attempt shows the
    # first was not taken as a success (and so not committed).
    a = clients(group_id=unique("g"), subscribed_topics=topic, **RETRY_FAST)
    await a.subscribe(AsyncGen())
    await a.send(topic, "async-gen", {})
    await failures.wait_for(attempt_at_least("async-gen", 2), "a retried async generator")
    await a.unsubscribe()
    b = clients(group_id=unique("g"), subscribed_topics=topic, **RETRY_FAST)
    await b.subscribe(SyncGen())
    await b.send(topic, "sync-gen", {})
    await failures.wait_for(attempt_at_least("sync-gen", 2), "a retried generator")
    await b.unsubscribe()

    def first(key: str) -> str:
        return next(line for line in failures.lines if f'key "{key}"' in line)

    assert "transient handler failure" in first("async-gen")
    assert "AsyncGen.on_message returned an async generator (async_generator)" in first("async-gen")
    assert "SyncGen.on_message returned a generator (generator)" in first("sync-gen")
    assert ran == []


def test_an_option_holding_a_nul_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^option group_id: .*NUL.* at index 3"):
        ProsodyClient(**base_options(), group_id="app\x00-other-team")
    with pytest.raises(ValueError, match=r"^option subscribed_topics: .*NUL"):
        ProsodyClient(**base_options(), subscribed_topics=["a", "b\x00c"])
    with pytest.raises(ValueError, match=r"^option bootstrap_servers: .*NUL"):
        AdminClient(bootstrap_servers="localhost:9092\x00,other:9092")


def test_a_too_large_integer_is_out_of_range_with_the_bounds():
    for big in (10**30, -(10**30)):
        with pytest.raises(ValueError, match=r"out of range; expected an integer from 1 to 65536"):
            ProsodyClient(**base_options(), max_concurrency=big)


class WaitsForCancel(EventHandler):
    def __init__(self, started: asyncio.Event, seen: List[Any]) -> None:
        self.started = started
        self.seen = seen

    async def on_message(self, context, message):
        self.started.set()
        await context.on_cancel()
        self.seen.append(message.key)


async def test_concurrent_unsubscribes_share_the_first(clients, topic):
    started, seen = asyncio.Event(), []
    c = clients(group_id=unique("g"), subscribed_topics=topic, shutdown_timeout=2)
    await c.subscribe(WaitsForCancel(started, seen))
    await c.send(topic, "stuck", {})
    await asyncio.wait_for(started.wait(), WAIT)

    async def stop() -> str:
        await c.unsubscribe()
        return c.consumer_state()

    states = await asyncio.wait_for(asyncio.gather(stop(), stop()), WAIT)
    # Neither returned early, and the handler saw its cancellation (it
    # was left waiting, its task leaked, when the second call detached).
    assert states == ["configured", "configured"]
    assert seen == ["stuck"]


async def test_on_cancel_completes_once_the_handler_finished(clients, topic, recorder):
    kept: List[Any] = []

    class Quick(EventHandler):
        async def on_message(self, context, message):
            kept.append((context, context.on_cancel()))
            await recorder.add(message.key)

    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(Quick())
    await c.send(topic, "quick", {})
    await recorder.wait_count(1)
    context, during = kept[0]
    # Resolved as the handler finished (as in the Node package), and a call
    # after that completes at once, subscribed or not.
    await asyncio.wait_for(during, WAIT)
    assert context.should_cancel()
    await asyncio.wait_for(context.on_cancel(), WAIT)
    await c.unsubscribe()
    await asyncio.wait_for(context.on_cancel(), WAIT)


class Recording(EventHandler):
    def __init__(self, keys: List[str], arrived: asyncio.Event) -> None:
        self.keys = keys
        self.arrived = arrived

    async def on_message(self, context, message):
        self.keys.append(message.key)
        self.arrived.set()


def consumer_options(topic: str, group: str) -> Any:
    return dict(base_options(), group_id=group, subscribed_topics=topic,
                source_system="python-tests")


def test_a_client_whose_loop_closed_can_be_stopped_and_loses_nothing():
    topic, group = unique("py-topic"), unique("g")
    keys: List[str] = []
    client: List[ProsodyClient] = []

    async def first_run() -> None:
        await AdminClient(**admin_options()).create_topic(topic, partition_count=1)
        arrived = asyncio.Event()
        c = ProsodyClient(**consumer_options(topic, group))
        client.append(c)
        await c.subscribe(Recording(keys, arrived))
        await c.send(topic, "first", {})
        await asyncio.wait_for(arrived.wait(), WAIT)
        # Ends without unsubscribe: the loop of subscribe() closes.

    async def second_run() -> None:
        c = client[0]
        await c.send(topic, "second", {})  # no handler can run for it now
        with pytest.warns(RuntimeWarning, match="subscribed on an event loop that is now closed"):
            await asyncio.wait_for(c.unsubscribe(), WAIT)
        assert c.consumer_state() == "configured"
        # Subscribed again, on this loop: "second" was not committed.
        arrived = asyncio.Event()
        await c.subscribe(Recording(keys, arrived))
        while "second" not in keys:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), WAIT)
        await c.unsubscribe()

    asyncio.run(first_run())
    asyncio.run(second_run())
    assert keys == ["first", "second"]


@pytest.mark.parametrize("stop", [SystemExit, KeyboardInterrupt])
def test_system_exit_in_a_synchronous_handler_is_reraised(stop):
    topic, group = unique("py-topic"), unique("g")
    attempts: List[str] = []
    client: List[ProsodyClient] = []

    class Stops(EventHandler):
        def on_message(self, context, message):  # type: ignore[override]
            attempts.append(message.key)
            if len(attempts) > 1:
                retried.set()  # the bug: taken as a transient failure
                return
            raise stop(3) if stop is SystemExit else stop()

    async def main() -> None:
        global retried
        retried = asyncio.Event()
        await AdminClient(**admin_options()).create_topic(topic, partition_count=1)
        c = ProsodyClient(**consumer_options(topic, group), **RETRY_FAST)
        client.append(c)
        await c.subscribe(Stops())
        await c.send(topic, "k", {})
        await asyncio.wait_for(retried.wait(), WAIT)

    with pytest.raises(stop):
        asyncio.run(main())
    assert attempts == ["k"]

    async def cleanup() -> None:
        with pytest.warns(RuntimeWarning):
            await client[0].unsubscribe()

    asyncio.run(cleanup())


retried: asyncio.Event
