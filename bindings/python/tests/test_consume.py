"""Sending and consuming: payloads, per-key order, concurrency, failures."""

import asyncio
import datetime
from collections import defaultdict

import pytest

from conftest import REAL, unique
from prosody import (EventHandler, Message, PermanentError, ProsodyClient,
                     ProsodyTransientError, TransientError, permanent, transient)


class Recording(EventHandler):
    def __init__(self, recorder):
        self.recorder = recorder

    async def on_message(self, context, message):
        await self.recorder.add(message)


async def test_send_and_receive_payloads(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic, source_system="sender")
    await c.subscribe(Recording(recorder))
    assert c.consumer_state() == "running"
    payloads = [{"content": "Hello, Kafka!", "n": 1, "f": 2.5, "ok": True, "none": None,
                 "nested": {"list": [1, "two", [3.0]], "empty": {}}},
                [1, 2, 3], "just a string", 42, 1.25, None, False, {"unicode": "héllo ✓ 日本"}]
    before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
    for i, p in enumerate(payloads):
        await c.send(topic, f"key-{i}", p)
    await recorder.wait_count(len(payloads))
    by_key = {m.key: m for m in recorder.events}
    for i, p in enumerate(payloads):
        m = by_key[f"key-{i}"]
        assert isinstance(m, Message)
        assert m.payload == p
        assert m.topic == topic
        assert 0 <= m.partition < 4
        assert m.offset >= 0
        assert m.timestamp.tzinfo is not None and m.timestamp > before
    with pytest.raises(Exception):  # frozen
        m.key = "other"  # type: ignore[misc]


async def test_send_errors(clients, topic):
    c = clients()
    with pytest.raises(TypeError):
        await c.send(topic, "k", {"not json": object()})
    with pytest.raises(ValueError, match="topic"):
        await c.send("", "k", {})
    with pytest.raises(TypeError):
        await c.send(topic, None, {})  # type: ignore[arg-type]


async def test_send_to_unreachable_broker_fails_transiently():
    c = ProsodyClient(bootstrap_servers="127.0.0.1:1", send_timeout=0.5, probe_port=None,
                      source_system="python-tests")
    with pytest.raises(ProsodyTransientError) as info:
        await c.send("t", "k", {"x": 1})
    assert info.value.code == "PROSODY_ERR_TIMEOUT"
    assert isinstance(info.value, TransientError) and isinstance(info.value, RuntimeError)


async def test_per_key_order_across_100_keys(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic, max_concurrency=16)
    await c.subscribe(Recording(recorder))
    per_key = 10
    sends = [c.send(topic, f"k{k:03d}", {"key": k, "seq": s})
             for s in range(per_key) for k in range(100)]
    # Sends of one key are issued in order, so they land in order.
    await asyncio.gather(*sends)
    await recorder.wait_count(100 * per_key)
    seen = defaultdict(list)
    for m in recorder.events:
        seen[m.key].append(m.payload["seq"])
    assert len(seen) == 100
    for key, seqs in seen.items():
        assert seqs == list(range(per_key)), key


async def test_different_keys_run_concurrently(clients, topic, recorder):
    both = asyncio.Event()
    started = set()

    class Waits(EventHandler):
        async def on_message(self, context, message):
            started.add(message.key)
            if len(started) == 2:
                both.set()
            # Each handler waits until the other key's handler has started:
            # this finishes only if the two run at the same time.
            await asyncio.wait_for(both.wait(), 30)
            await recorder.add(message.key)

    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(Waits())
    await c.send(topic, "alpha", {})
    await c.send(topic, "beta", {})
    await recorder.wait_count(2)
    assert sorted(recorder.events) == ["alpha", "beta"]


async def test_own_source_system_is_skipped(clients, topic, recorder):
    group = unique("g")
    c = clients(group_id=group, subscribed_topics=topic, source_system=group)
    other = clients(source_system="someone-else")
    await c.subscribe(Recording(recorder))
    # One key, so one partition: were "mine" not skipped, it would be
    # handled before "theirs", which comes after it.
    await c.send(topic, "k", {"from": "mine"})
    await other.send(topic, "k", {"from": "theirs"})
    await recorder.wait_count(1)
    assert [m.payload for m in recorder.events] == [{"from": "theirs"}]


class Flaky(EventHandler):
    """Fails the key `bad` according to `raise_for`, records attempts."""

    def __init__(self, recorder, raise_for):
        self.recorder = recorder
        self.raise_for = raise_for
        self.attempts = defaultdict(int)

    async def on_message(self, context, message):
        self.attempts[message.payload["id"]] += 1
        exc = self.raise_for(message, self.attempts[message.payload["id"]])
        if exc is not None:
            await self.recorder.add(("failed", message.payload["id"]))
            raise exc
        await self.recorder.add(("ok", message.payload["id"]))


def ids(recorder, status):
    return [i for s, i in recorder.events if s == status]


@pytest.mark.parametrize("mode", ["pipeline", "low-latency", "best-effort"])
async def test_permanent_failure_is_not_retried(clients, topic, recorder, mode):
    extra = {"failure_topic": unique("dlq")} if mode == "low-latency" else {}
    h = Flaky(recorder, lambda m, n: PermanentError("bad record") if m.payload["id"] == 1 else None)
    c = clients(group_id=unique("g"), subscribed_topics=topic, mode=mode, retry_base=0.01,
                max_retries=2, defer_enabled=False, **extra)
    await c.subscribe(h)
    for i in (1, 2):
        await c.send(topic, "same-key", {"id": i})
    await recorder.wait_for(lambda ev: ("ok", 2) in ev, what="the record after the failing one")
    assert h.attempts[1] == 1  # never retried


async def test_transient_failure_retried_until_success_in_pipeline(clients, topic, recorder):
    h = Flaky(recorder, lambda m, n: ValueError("not yet") if n < 3 else None)
    c = clients(group_id=unique("g"), subscribed_topics=topic, retry_base=0.01,
                max_retry_delay=0.05, defer_enabled=False)
    await c.subscribe(h)
    await c.send(topic, "k", {"id": 7})
    await c.send(topic, "k", {"id": 8})
    await recorder.wait_for(lambda ev: ("ok", 8) in ev)
    assert h.attempts[7] == 3
    assert ids(recorder, "ok") == [7, 8]  # key order holds through retries


async def test_low_latency_sends_to_failure_topic_after_max_retries(clients, topic, recorder):
    dlq = unique("dlq")
    h = Flaky(recorder, lambda m, n: RuntimeError("down") if m.payload["id"] == 1 else None)
    c = clients(group_id=unique("g"), subscribed_topics=topic, mode="low-latency",
                failure_topic=dlq, max_retries=2, retry_base=0.01, max_retry_delay=0.05)
    dead = []
    got_dead = asyncio.Event()

    class DeadLetters(EventHandler):
        async def on_message(self, context, message):
            dead.append(message)
            got_dead.set()

    d = clients(group_id=unique("dlq-reader"), subscribed_topics=dlq)
    await c.subscribe(h)
    await d.subscribe(DeadLetters())
    await c.send(topic, "k", {"id": 1})
    await c.send(topic, "k", {"id": 2})
    await recorder.wait_for(lambda ev: ("ok", 2) in ev)
    assert h.attempts[1] == 3  # the first attempt and max_retries retries
    await asyncio.wait_for(got_dead.wait(), 60)
    assert dead[0].key == "k" and dead[0].payload == {"id": 1}


async def test_best_effort_skips_a_transient_failure(clients, topic, recorder):
    h = Flaky(recorder, lambda m, n: TransientError("flaky") if m.payload["id"] == 1 else None)
    c = clients(group_id=unique("g"), subscribed_topics=topic, mode="best-effort")
    await c.subscribe(h)
    await c.send(topic, "k", {"id": 1})
    await c.send(topic, "k", {"id": 2})
    await recorder.wait_for(lambda ev: ("ok", 2) in ev)
    assert h.attempts[1] == 1


async def test_decorators_classify_exceptions(clients, topic, recorder):
    class Decorated(EventHandler):
        def __init__(self):
            self.attempts = defaultdict(int)

        @permanent(KeyError, AttributeError)
        async def on_message(self, context, message):
            self.attempts[message.payload["id"]] += 1
            await recorder.add(message.payload["id"])
            if message.payload["id"] == 1 and self.attempts[1] == 1:
                raise ZeroDivisionError("unclassified: transient")
            if message.payload["id"] == 2:
                raise KeyError("classified permanent")

    h = Decorated()
    c = clients(group_id=unique("g"), subscribed_topics=topic, retry_base=0.01,
                defer_enabled=False)
    await c.subscribe(h)
    for i in (1, 2, 3):
        await c.send(topic, "k", {"id": i})
    await recorder.wait_for(lambda ev: 3 in ev)
    assert h.attempts[1] == 2  # transient: retried once, then succeeded
    assert h.attempts[2] == 1  # permanent: not retried


def test_decorator_forms():
    @transient(ValueError)
    def sync_fn():
        raise ValueError("x")

    with pytest.raises(TransientError) as info:
        sync_fn()
    assert isinstance(info.value.__cause__, ValueError)
    assert not info.value.is_permanent

    @permanent()
    async def coro():
        raise OSError("any")

    with pytest.raises(PermanentError):
        asyncio.run(coro())
    with pytest.raises(TypeError):
        permanent("not a type")  # type: ignore[arg-type]


async def test_sync_handler_methods_work_too(clients, topic, recorder):
    class Plain(EventHandler):
        def on_message(self, context, message):  # type: ignore[override]
            # Runs on the loop thread, like the coroutines.
            asyncio.ensure_future(recorder.add(message.key))

    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(Plain())
    await c.send(topic, "k", {})
    await recorder.wait_count(1)
    assert recorder.events == ["k"]


async def test_subscribe_twice_and_resubscribe(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(Recording(recorder))
    with pytest.raises(RuntimeError, match="already subscribed"):
        c.subscribe(Recording(recorder))
    await c.unsubscribe()
    assert c.consumer_state() == "configured"
    await c.subscribe(Recording(recorder))
    await c.send(topic, "after", {"x": 1})
    await recorder.wait_count(1)


async def test_unsubscribe_right_after_a_bare_subscribe(clients, topic, recorder):
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    c.subscribe(Recording(recorder))  # not awaited, as in the spec's quick start
    await c.unsubscribe()  # waits for the subscribe to start, then stops it
    assert c.consumer_state() == "configured"
    await c.subscribe(Recording(recorder))
    await c.send(topic, "k", {})
    await recorder.wait_count(1)
