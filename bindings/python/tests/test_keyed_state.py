"""Keyed state (``prosody.state``, ``Context.state``): values, maps and
deques read and write as documented; an attempt's writes become durable
with its success and vanish with its failure; commit() and rollback();
handles are fenced to their attempt; errors are classified; bad
definitions are refused at create. Runs in both tiers (mock: the memory
store). Cases of the original's suite carry its test names."""

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import math
from datetime import timedelta
from typing import Any, Awaitable, Callable, Dict, List, Tuple

import pytest

import prosody
from conftest import REAL, WAIT, Recorder, admin_options, base_options, unique
from prosody import (
    AdminClient,
    EventHandler,
    Message,
    NullValueError,
    PermanentError,
    PermanentStateError,
    ProsodyClient,
    StateError,
    TransientError,
    TransientStateError,
    state,
)
from prosody import prosody as native
from prosody.state import Direction

CART = state.value("cart")
TOTALS = state.map("totals", keyset_limit=256)
BACKLOG = state.deque("backlog")
BOUNDED = state.deque("bounded", capacity=3)
COUNT = state.value("count")
DIRECT = state.value("direct", read_uncommitted=True)
DEFS = [CART, TOTALS, BACKLOG, BOUNDED, COUNT, DIRECT]

Script = Callable[[Any, int], Awaitable[Any]]

#: The message of the event a script runs for (each handler runs in a task
#: of its own, so each sees its own).
MESSAGE: "contextvars.ContextVar[Message]" = contextvars.ContextVar("MESSAGE")


class Scripted(EventHandler):
    """Runs the script the payload names (``{"do": name}``) with the context
    and the attempt number (1 on the first delivery of that record);
    records ("ok", name, attempt, result) or ("raised", name, attempt,
    exception) and re-raises, so the event fails as the exception says."""

    def __init__(self, rec: Recorder, scripts: Dict[str, Script]) -> None:
        self.rec = rec
        self.scripts = scripts
        self.attempts: Dict[Tuple[int, int], int] = collections.Counter()

    async def on_message(self, context, message):
        do = message.payload["do"]
        self.attempts[message.partition, message.offset] += 1
        attempt = self.attempts[message.partition, message.offset]
        MESSAGE.set(message)
        try:
            result = await self.scripts[do](context, attempt)
        except Exception as e:
            await self.rec.add(("raised", do, attempt, e))
            raise
        await self.rec.add(("ok", do, attempt, result))

    async def on_excise(self, context, message):
        pass

    async def on_timer(self, context, timer):
        pass


class Harness:
    """A topic, a producer and a consumer with ``state_collections``."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.made: List[ProsodyClient] = []
        self.topic = ""
        self.producer: Any = None

    async def start(self, scripts: Dict[str, Script], defs: Any = None, **options: Any) -> None:
        self.topic = unique("py-state")
        await AdminClient(**admin_options()).create_topic(self.topic, 2)
        self.producer = await ProsodyClient.create(**base_options(),
                                                   source_system=unique("producer"))
        self.made.append(self.producer)
        consumer = await ProsodyClient.create(
            **base_options(), group_id=unique("g"), subscribed_topics=self.topic,
            state_collections=DEFS if defs is None else defs, **options)
        self.made.append(consumer)
        await consumer.subscribe(Scripted(self.rec, scripts))

    async def run(self, do: str, key: str = "k") -> Any:
        """Sends ``{"do": do}`` with ``key`` and returns the script's result
        once an attempt succeeded."""
        await self.producer.send(self.topic, key, {"do": do})
        return await self.result(do)

    async def result(self, do: str) -> Any:
        """The result of script ``do`` once an attempt succeeded."""
        await self.rec.wait_for(lambda ev: any(e[0] == "ok" and e[1] == do for e in ev),
                                what=f"script {do!r} to succeed")
        return next(e[3] for e in self.rec.events if e[0] == "ok" and e[1] == do)

    def raised(self, do: str) -> List[Tuple[int, BaseException]]:
        return [(e[2], e[3]) for e in self.rec.events if e[0] == "raised" and e[1] == do]

    async def close(self) -> None:
        for c in reversed(self.made):
            await c.shutdown()
        with contextlib.suppress(Exception):
            await AdminClient(**admin_options()).delete_topic(self.topic)


@pytest.mark.skipif(REAL, reason="about the embedded mock cluster")
def test_mock_group_delay_helper_checks_and_reports_previous():
    # conftest's _prompt_group_join has set 0.
    assert native.mock_set_group_initial_rebalance_delay(0.25) == 0.0
    for bad in (-0.001, 300.001, math.nan, True):
        with pytest.raises(ValueError, match=r"expected seconds in 0\.\.=300, got "):
            native.mock_set_group_initial_rebalance_delay(bad)
    with pytest.raises(TypeError):
        native.mock_set_group_initial_rebalance_delay("0")  # type: ignore[arg-type]
    assert native.mock_set_group_initial_rebalance_delay(0) == 0.25


@pytest.fixture
async def harness(recorder: Recorder) -> Any:
    h = Harness(recorder)
    yield h
    await h.close()


# ---------------------------------------------------------------------------
# Values, maps, deques
# ---------------------------------------------------------------------------

async def test_value_roundtrip_and_absent(harness):
    doc = {"items": [1, 2.5, "café", None, True], "nested": {"x": {}}}

    async def write(ctx, attempt):
        v = ctx.state(CART)
        before = await v.get()
        await v.set(doc)
        return before, await v.get()

    async def read(ctx, attempt):
        return await ctx.state(CART).get()

    async def falsy(ctx, attempt):
        v = ctx.state(CART)
        await v.set(0)
        zero = await v.get()
        await v.clear()
        return zero, await v.get()

    await harness.start({"write": write, "read": read, "falsy": falsy, "again": read})
    before, after = await harness.run("write")
    assert before is None
    assert after == doc
    assert await harness.run("read") == doc
    assert await harness.run("falsy") == (0, None)
    assert await harness.run("again") is None


async def test_map_set_remove_scan_order_getmany(harness):
    async def scan(m):
        return {
            "keys": [k async for k in m.keys()],
            "backward": [k async for k in m.keys(Direction.BACKWARD)],
            "items": [kv async for kv in m.items()],
            "items_backward": [kv async for kv in m.items("backward")],
            "values": [v async for v in m.values()],
            "iter": [k async for k in m],
            "get_many": await m.get_many(["b", "zz", "a", "b"]),
            "contains": (await m.contains("café"), await m.contains("c")),
            "get": (await m.get("a"), await m.get("c"), await m.get("c", "dflt"),
                    await m.get("zero", "dflt")),
        }

    async def write(ctx, attempt):
        m = ctx.state(TOTALS)
        await m.set("b", 2)
        await m.set("café", {"x": [1, 2]})
        await m.set("a", 1)
        await m.set("c", 3)
        await m.set("zero", 0)
        await m.remove("c")
        await m.remove("never-there")
        return await scan(m)

    async def read(ctx, attempt):
        return await scan(ctx.state(TOTALS))

    async def clear(ctx, attempt):
        m = ctx.state(TOTALS)
        await m.clear()
        return [k async for k in m.keys()]

    await harness.start({"write": write, "read": read, "clear": clear, "after": read})
    want = {
        "keys": ["a", "b", "café", "zero"],
        "backward": ["zero", "café", "b", "a"],
        "items": [("a", 1), ("b", 2), ("café", {"x": [1, 2]}), ("zero", 0)],
        "items_backward": [("zero", 0), ("café", {"x": [1, 2]}), ("b", 2), ("a", 1)],
        "values": [1, 2, {"x": [1, 2]}, 0],
        "iter": ["a", "b", "café", "zero"],
        "get_many": [2, None, 1, 2],
        "contains": (True, False),
        "get": (1, None, "dflt", 0),
    }
    # Read in the writing attempt (its buffer) and in the next (the store).
    assert await harness.run("write") == want
    assert await harness.run("read") == want
    assert await harness.run("clear") == []
    assert (await harness.run("after"))["keys"] == []


async def test_deque_push_len_get_pop_scan_and_empty(harness):
    async def look(d):
        return {
            "size": await d.size(),
            "empty": await d.is_empty(),
            "values": [v async for v in d.values()],
            "backward": [v async for v in d.values(Direction.BACKWARD)],
            "iter": [v async for v in d],
            "at": [await d.get(i) for i in (0, 1, 2, 3, -1, -3, -4)],
            "peeks": (await d.peekleft(), await d.peek()),
        }

    async def write(ctx, attempt):
        d = ctx.state(BACKLOG)
        empty = (await d.size(), await d.is_empty(), await d.pop(), await d.popleft(),
                 await d.peek(), await d.peekleft(), [v async for v in d])
        await d.append("m")
        await d.append({"n": [1]})
        await d.appendleft("l")
        return empty, await look(d)

    async def pops(ctx, attempt):
        d = ctx.state(BACKLOG)
        first = await look(d)
        popped = (await d.pop(), await d.popleft())
        return first, popped, await look(d)

    async def drain(ctx, attempt):
        d = ctx.state(BACKLOG)
        got = (await d.pop(), await d.pop())
        return got, await look(d)

    await harness.start({"write": write, "pops": pops, "drain": drain})
    want = {"size": 3, "empty": False, "values": ["l", "m", {"n": [1]}],
            "backward": [{"n": [1]}, "m", "l"], "iter": ["l", "m", {"n": [1]}],
            "at": ["l", "m", {"n": [1]}, None, {"n": [1]}, "l", None],
            "peeks": ("l", {"n": [1]})}
    empty, written = await harness.run("write")
    assert empty == (0, True, None, None, None, None, [])
    assert written == want
    first, popped, after = await harness.run("pops")
    assert first == want
    assert popped == ({"n": [1]}, "l")
    assert after == {"size": 1, "empty": False, "values": ["m"], "backward": ["m"],
                     "iter": ["m"], "at": ["m", None, None, None, "m", None, None],
                     "peeks": ("m", "m")}
    got, drained = await harness.run("drain")
    assert got == ("m", None)
    assert drained["size"] == 0 and drained["empty"] and drained["values"] == []


async def test_deque_peek_and_capacity(harness):
    async def push(ctx, attempt):
        d = ctx.state(BOUNDED)
        for i in range(5):
            await d.append(i)
        back = [v async for v in d]
        await d.appendleft("front")
        return back, [v async for v in d], await d.size()

    async def read(ctx, attempt):
        d = ctx.state(BOUNDED)
        return [v async for v in d], await d.peekleft(), await d.peek()

    await harness.start({"push": push, "read": read})
    back, front, size = await harness.run("push")
    # Past the capacity a push at the back drops from the front, and a push
    # at the front drops from the back.
    assert back == [2, 3, 4]
    assert front == ["front", 2, 3]
    assert size == 3
    assert await harness.run("read") == (["front", 2, 3], "front", 3)


async def test_deque_index_type_and_negative_index(harness):
    async def script(ctx, attempt):
        d = ctx.state(BACKLOG)
        for x in ("a", "b", "c"):
            await d.append(x)
        errors = []
        for bad in (1.5, "0", None):
            try:
                await d.get(bad)
            except TypeError as e:
                errors.append(str(e))
        return ([await d.get(i) for i in (-1, -2, -3, -4, 2, 3, 2**70, -2**70)], errors)

    await harness.start({"s": script})
    got, errors = await harness.run("s")
    assert got == ["c", "b", "a", None, "c", None, None, None]
    assert len(errors) == 3 and all("index must be an int" in e for e in errors)


async def test_scan_ordered_distinct_across_chunk_boundary(harness):
    n = 300  # more than one pull of 256

    async def fill(ctx, attempt):
        m, d = ctx.state(TOTALS), ctx.state(BACKLOG)
        for i in range(n):
            await m.set(f"k{i:04d}", i)
            await d.append(i)
        return ([k async for k in m.keys()], [v async for v in d],
                [v async for v in d.values(Direction.BACKWARD)])

    async def read(ctx, attempt):
        m, d = ctx.state(TOTALS), ctx.state(BACKLOG)
        return ([kv async for kv in m.items()], [k async for k in m.keys("backward")],
                [v async for v in d], [v async for v in d.values(Direction.BACKWARD)])

    await harness.start({"fill": fill, "read": read})
    keys = [f"k{i:04d}" for i in range(n)]
    buffered_keys, buffered_items, buffered_back = await harness.run("fill")
    assert buffered_keys == keys
    assert buffered_items == list(range(n))
    assert buffered_back == list(reversed(range(n)))
    items, backward, values, values_back = await harness.run("read")
    assert items == [(k, i) for i, k in enumerate(keys)]
    assert backward == list(reversed(keys))
    assert values == list(range(n))
    assert values_back == list(reversed(range(n)))


async def test_concurrent_anext_serialize_ordered_distinct(harness):
    n = 300

    async def script(ctx, attempt):
        m = ctx.state(TOTALS)
        for i in range(n):
            await m.set(f"k{i:04d}", i)
        it = m.keys()
        got = await asyncio.gather(*(it.__anext__() for _ in range(n)))
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
        return got

    await harness.start({"s": script})
    assert await harness.run("s") == [f"k{i:04d}" for i in range(n)]


async def test_cancel_pull_then_followup(harness):
    async def script(ctx, attempt):
        m = ctx.state(TOTALS)
        for k in ("a", "b", "c"):
            await m.set(k, k.upper())
        it = m.items()
        pull = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0)  # the pull is under way (its call was made)
        pull.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pull
        # A cancelled pull loses nothing: the scan goes on from the start.
        rest = [kv async for kv in it]
        return rest, await m.get("b")

    await harness.start({"s": script})
    assert await harness.run("s") == ([("a", "A"), ("b", "B"), ("c", "C")], "B")


async def test_break_without_aclosing_is_harmless(harness):
    async def script(ctx, attempt):
        m = ctx.state(TOTALS)
        for i in range(10):
            await m.set(f"k{i}", i)
        first = []
        async for k in m.keys():
            first.append(k)
            if len(first) == 3:
                break
        it = m.items()
        async for kv in it:
            break
        await it.aclose()
        await it.aclose()  # closing twice is harmless
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
        await m.set("after", 1)
        return first, await m.get("after"), len([k async for k in m])

    await harness.start({"s": script})
    assert await harness.run("s") == (["k0", "k1", "k2"], 1, 11)


# ---------------------------------------------------------------------------
# Transactions
# ---------------------------------------------------------------------------

async def test_failed_attempt_writes_vanish_and_retry_sees_committed(harness):
    async def bump(ctx, attempt):
        v = ctx.state(COUNT)
        n = (await v.get() or 0) + 1
        await v.set(n)
        assert await v.get() == n  # read-your-writes
        if attempt == 1:
            raise TransientError("fail once after the write")
        return n

    await harness.start({"bump1": bump, "bump2": bump, "bump3": bump})
    # Each message fails once after writing: the retry starts from the
    # committed count, so each success adds exactly one.
    assert await harness.run("bump1") == 1
    assert await harness.run("bump2") == 2
    assert await harness.run("bump3") == 3
    assert [a for a, _ in harness.raised("bump2")] == [1]


async def test_read_uncommitted_writes_through(harness):
    async def script(ctx, attempt):
        d, v = ctx.state(DIRECT), ctx.state(CART)
        seen = (await d.get(), await v.get())
        if attempt == 1:
            await d.set("direct")
            await v.set("buffered")
            raise TransientError("fail after the writes")
        return seen

    await harness.start({"s": script})
    # The read_uncommitted collection's write outlived the failed attempt;
    # the default collection's did not.
    assert await harness.run("s") == ("direct", None)


async def test_blocked_handler_does_not_block_other_key(harness):
    release, blocked = asyncio.Event(), asyncio.Event()

    async def block(ctx, attempt):
        v = ctx.state(CART)
        await v.set("a")
        blocked.set()
        await asyncio.wait_for(release.wait(), WAIT)
        return await v.get()

    async def free(ctx, attempt):
        v = ctx.state(CART)
        before = await v.get()
        await v.set("b")
        during = blocked.is_set() and not release.is_set()
        release.set()
        return during, before, await v.get()

    await harness.start({"block": block, "free": free})
    await harness.producer.send(harness.topic, "key-a", {"do": "block"})
    await asyncio.wait_for(blocked.wait(), WAIT)
    # Another key's handler runs meanwhile, and sees its own state only.
    assert await harness.run("free", key="key-b") == (True, None, "b")
    assert await harness.result("block") == "a"


async def test_commit_floor_survives_failed_attempt(harness):
    async def script(ctx, attempt):
        v, m = ctx.state(CART), ctx.state(TOTALS)
        seen = (await v.get(), await m.get("x"))
        if attempt == 1:
            await v.set("committed")
            await m.set("x", 1)
            await v.commit()  # the value only: the map stays buffered
            await v.set("lost")
            raise TransientError("fail after the commit")
        return seen

    async def read(ctx, attempt):
        return await ctx.state(CART).get(), await ctx.state(TOTALS).get("x")

    await harness.start({"s": script, "read": read})
    # The retry sees the committed value but not the map's buffered write
    # nor the write after the commit.
    assert await harness.run("s") == ("committed", None)
    assert await harness.run("read") == ("committed", None)


async def test_rollback_discards_uncommitted(harness):
    async def script(ctx, attempt):
        v, m = ctx.state(CART), ctx.state(TOTALS)
        await v.set(1)
        await v.commit()
        await v.set(2)
        await m.set("kept", True)
        await v.rollback()
        return await v.get(), await m.get("kept")

    async def read(ctx, attempt):
        return await ctx.state(CART).get(), await ctx.state(TOTALS).get("kept")

    await harness.start({"s": script, "read": read})
    assert await harness.run("s") == (1, True)
    assert await harness.run("read") == (1, True)


async def test_map_commit_floor_survives_rollback(harness):
    async def script(ctx, attempt):
        m = ctx.state(TOTALS)
        await m.set("a", 1)
        await m.commit()
        await m.set("b", 2)
        await m.remove("a")
        await m.rollback()
        return [kv async for kv in m.items()]

    await harness.start({"s": script})
    assert await harness.run("s") == [("a", 1)]


# ---------------------------------------------------------------------------
# Fencing and errors
# ---------------------------------------------------------------------------

async def test_leaked_handle_after_attempt_rejects_transient(harness):
    # The original's test_leaked_handle_after_failed_attempt_rejects_transient,
    # test_leaked_handle_after_successful_handler_rejects,
    # test_post_handler_iteration_is_terminated and
    # test_leaked_context_cannot_bind_after_failed_attempt, in one consumer.
    leaked: Dict[str, Any] = {}

    async def leak(ctx, attempt):
        v, m = ctx.state(CART), ctx.state(TOTALS)
        await m.set("a", 1)
        leaked.update(value=v, scan=m.keys(), context=ctx)
        if attempt == 1:
            leaked["failed"] = v
            raise TransientError("fail the first attempt")
        return None

    async def use(ctx, attempt):
        out = []
        for what, call in (
                ("failed attempt's handle", lambda: leaked["failed"].get()),
                ("successful attempt's handle", lambda: leaked["value"].set(1)),
                ("scan after its attempt", lambda: leaked["scan"].__anext__()),
                ("context after its attempt", lambda: _bind(leaked["context"]))):
            try:
                await call()
                out.append((what, "accepted"))
            except TransientStateError as e:
                out.append((what, "transient", str(e)))
        return out, await ctx.state(CART).get()

    async def _bind(context):
        context.state(CART)

    await harness.start({"leak": leak, "use": use})
    await harness.run("leak")
    out, value = await harness.run("use")
    assert [o[:2] for o in out] == [
        ("failed attempt's handle", "transient"),
        ("successful attempt's handle", "transient"),
        ("scan after its attempt", "transient"),
        ("context after its attempt", "transient")]
    assert all("valid only during" in o[2] for o in out), out
    assert value is None  # the leaked write never happened


async def test_unregistered_name_is_permanent(harness):
    async def script(ctx, attempt):
        errors = []
        for d in (state.value("nope"), state.map("cart"), state.message_value("cart"),
                  state.value("last"), state.message_map("last")):
            try:
                ctx.state(d)
            except PermanentStateError as e:
                errors.append(str(e))
        return errors

    await harness.start({"s": script}, DEFS + [state.message_value("last")])
    nope, wrong_kind, wrong_payload, json_of_message, map_of_value = await harness.run("s")
    assert '"nope"' in nope and "registered" in nope
    assert wrong_kind.endswith('"cart" is registered as a json value, not a json map')
    assert wrong_payload.endswith('"cart" is registered as a json value, not a message value')
    assert json_of_message.endswith('"last" is registered as a message value, not a json value')
    assert map_of_value.endswith('"last" is registered as a message value, not a message map')


async def test_malformed_definition_at_vend_is_transient(harness):
    async def script(ctx, attempt):
        errors = []
        for d in ("cart", {"name": "cart", "kind": "value"}, state.value("")):
            try:
                ctx.state(d)
            except TransientStateError as e:
                errors.append(str(e))
        return errors

    await harness.start({"s": script})
    errors = await harness.run("s")
    assert len(errors) == 3 and "definition" in errors[0] and "name" in errors[2]


async def test_bad_direction_token_is_transient(harness):
    async def script(ctx, attempt):
        with pytest.raises(TransientStateError, match="forward.*backward"):
            ctx.state(TOTALS).keys("sideways")
        with pytest.raises(TransientStateError, match="forward.*backward"):
            ctx.state(BACKLOG).values(1)  # type: ignore[arg-type]
        # The layer under the handle checks the token itself.
        with pytest.raises(TransientStateError, match="forward.*backward"):
            ctx.state(TOTALS)._native.scan("sideways")
        return True

    await harness.start({"s": script})
    assert await harness.run("s") is True


async def test_null_write_rejects_transient_store_untouched(harness):
    async def script(ctx, attempt):
        v, m, d = ctx.state(CART), ctx.state(TOTALS), ctx.state(BACKLOG)
        await v.set("kept")
        await m.set("k", "kept")
        errors = []
        for call in (lambda: v.set(None), lambda: m.set("k", None),
                     lambda: d.append(None), lambda: d.appendleft(None)):
            try:
                await call()
            except NullValueError as e:
                assert isinstance(e, TransientStateError) and isinstance(e, ValueError)
                errors.append(str(e))
        return errors, await v.get(), await m.get("k"), await d.size()

    async def read(ctx, attempt):
        return await ctx.state(CART).get(), await ctx.state(TOTALS).get("k")

    await harness.start({"s": script, "read": read})
    errors, v, m, size = await harness.run("s")
    assert len(errors) == 4
    assert "clear()" in errors[0] and "remove(key)" in errors[1]
    assert (v, m, size) == ("kept", "kept", 0)
    assert await harness.run("read") == ("kept", "kept")


@pytest.mark.parametrize("bad", [object(), lambda: 1, float("nan"), {1j: 2}],
                         ids=["object", "lambda", "nan", "complex-key"])
async def test_unrepresentable_write_rejects_transient(harness, bad):
    async def script(ctx, attempt):
        v = ctx.state(CART)
        await v.set("kept")
        try:
            await v.set(bad)
        except TransientStateError as e:
            return "no JSON form" in str(e), await v.get()
        return "accepted", None

    await harness.start({"s": script})
    assert await harness.run("s") == (True, "kept")


async def test_rethrown_permanent_state_error_no_retry(harness):
    async def unregistered(ctx, attempt):
        ctx.state(state.value("nope"))

    async def next_one(ctx, attempt):
        return "ran"

    await harness.start({"perm": unregistered, "next": next_one})
    await harness.producer.send(harness.topic, "k", {"do": "perm"})
    # The same key's next record runs only after the failed one was given
    # up: a permanent error is not retried.
    assert await harness.run("next") == "ran"
    raised = harness.raised("perm")
    assert [a for a, _ in raised] == [1]
    assert isinstance(raised[0][1], PermanentStateError)


async def test_rethrown_transient_state_error_retries(harness):
    async def leaky(ctx, attempt):
        v = ctx.state(CART)
        if attempt == 1:
            await v.set(None)
        return attempt

    await harness.start({"t": leaky})
    assert await harness.run("t") == 2
    assert [type(e) for _, e in harness.raised("t")] == [NullValueError]


# ---------------------------------------------------------------------------
# Message collections
# ---------------------------------------------------------------------------

LAST = state.message_value("last")
BY_NAME = state.message_map("by-name")
LOG = state.message_deque("log")
MESSAGES = [LAST, BY_NAME, LOG]


async def collect(it: Any) -> List[Any]:
    return [x async for x in it]


def same(a: Any, b: Any) -> bool:
    """``a`` is a Message as the handler got ``b``: the same class, equal
    fields (topic, partition, offset, timestamp, key, payload)."""
    return type(a) is Message and type(b) is Message and a == b


async def test_message_collections_give_back_the_handlers_message(harness):
    async def store(ctx, attempt):
        msg = MESSAGE.get()
        await ctx.state(LAST).set(msg)
        await ctx.state(BY_NAME).set("first", msg)
        await ctx.state(LOG).append(msg)
        return msg

    async def read(ctx, attempt):
        msg, m, d = MESSAGE.get(), ctx.state(BY_NAME), ctx.state(LOG)
        last = await ctx.state(LAST).get()
        await ctx.state(LAST).set(msg)
        await m.set("again", last)  # one read back is a delivered message too
        await d.appendleft(msg)
        return {
            "msg": msg, "last": last, "get": await m.get("first"),
            "default": await m.get("none", "absent"),
            "many": await m.get_many(["first", "none", "again"]),
            "items": await collect(m.items(Direction.BACKWARD)),
            "values": await collect(m.values()),
            "keys": await collect(m.keys()), "contains": await m.contains("again"),
            "at": [await d.get(0), await d.get(-1), await d.get(1), await d.get(2)],
            "peeks": [await d.peekleft(), await d.peek()],
            "all": await collect(d.values()), "size": await d.size(),
        }

    async def drain(ctx, attempt):
        d = ctx.state(LOG)
        return [await ctx.state(LAST).get(), await d.pop(), await d.popleft(), await d.pop()]

    await harness.start({"store": store, "read": read, "drain": drain}, DEFS + MESSAGES)
    first = await harness.run("store")
    r = await harness.run("read")
    msg = r["msg"]
    assert first.payload == {"do": "store"} and first.key == "k" and first.timestamp
    assert msg.offset > first.offset and msg.partition == first.partition
    assert same(r["last"], first) and same(r["get"], first)
    assert r["default"] == "absent"
    assert r["many"][1] is None and same(r["many"][0], first) and same(r["many"][2], first)
    assert [k for k, _ in r["items"]] == ["first", "again"]
    assert all(same(v, first) for _, v in r["items"])
    assert len(r["values"]) == 2 and all(same(v, first) for v in r["values"])
    assert r["keys"] == ["again", "first"] and r["contains"] is True
    assert same(r["at"][0], msg) and same(r["at"][1], first) and same(r["at"][2], first)
    assert r["at"][3] is None
    assert same(r["peeks"][0], msg) and same(r["peeks"][1], first)
    assert len(r["all"]) == 2 and same(r["all"][0], msg) and same(r["all"][1], first)
    assert r["size"] == 2
    last, popped, shifted, empty = await harness.run("drain")
    assert same(last, msg) and same(popped, first) and same(shifted, msg) and empty is None


async def test_message_map_contains_and_keys_do_not_load_records(harness):
    async def store(ctx, attempt):
        await ctx.state(BY_NAME).set("kept", MESSAGE.get())

    async def gone(ctx, attempt):
        # The record goes with its topic: what reads only the store works.
        await AdminClient(**admin_options()).delete_topic(harness.topic)
        m = ctx.state(BY_NAME)
        out: List[Any] = [await m.contains("kept"), await collect(m.keys())]
        try:
            out.append(await m.get("kept"))
        except StateError as e:
            out.append(e)
        return out

    await harness.start({"store": store, "gone": gone}, MESSAGES,
                        loader_seek_timeout=0.5, defer_enabled=False)
    await harness.run("store")
    contains, keys, failed = await harness.run("gone")
    assert contains is True and keys == ["kept"]
    assert isinstance(failed, StateError), failed
    assert 'loading the record' in str(failed) and '"by-name"' in str(failed), failed


async def test_message_collections_take_only_delivered_messages(harness):
    async def script(ctx, attempt):
        msg = MESSAGE.get()
        built = Message(msg.topic, msg.partition, msg.offset, msg.timestamp, msg.key,
                        msg.payload)
        writes = [
            lambda: ctx.state(LAST).set(built),
            lambda: ctx.state(LAST).set(dataclasses.replace(msg)),
            lambda: ctx.state(LAST).set(msg.payload),
            lambda: ctx.state(BY_NAME).set("k", "text"),
            lambda: ctx.state(LOG).append(None),
            lambda: ctx.state(LOG).appendleft(7),
            lambda: ctx.state(CART).set(msg),
            lambda: ctx.state(TOTALS).set("k", msg),
            lambda: ctx.state(BACKLOG).appendleft(msg),
        ]
        errors = []
        for w in writes:
            try:
                await w()
                errors.append("stored")
            except Exception as e:  # noqa: BLE001 (recorded, asserted below)
                errors.append(e)
        stored = [await ctx.state(LAST).get(), await ctx.state(BY_NAME).contains("k"),
                  await ctx.state(LOG).size(), await ctx.state(CART).get(),
                  await ctx.state(TOTALS).contains("k"), await ctx.state(BACKLOG).size()]
        return errors, stored

    await harness.start({"s": script}, DEFS + MESSAGES)
    errors, stored = await harness.run("s")
    assert all(type(e) is TransientStateError for e in errors), errors
    built, replaced = str(errors[0]), str(errors[1])
    assert "expected a Kafka message; a JSON value cannot be stored in a message collection" \
        in built and "made in Python" in built and '"last"' in built
    assert "made in Python" in replaced
    for e in errors[2:6]:
        assert "expected a Kafka message; a JSON value cannot be stored in a message " \
            "collection" in str(e)
    for e, what, name in zip(errors[6:], ("ValueState.set", "MapState.set",
                                          "DequeState.appendleft"),
                             ("cart", "totals", "backlog")):
        assert str(e).startswith(f'{what}: a Kafka message cannot be stored in a JSON '
                                 f'collection ("{name}")'), e
    assert stored == [None, False, 0, None, False, 0]


# ---------------------------------------------------------------------------
# Definitions and validation (no consumer)
# ---------------------------------------------------------------------------

def test_definitions_and_to_config():
    v = state.value("v", ttl=timedelta(days=1), read_uncommitted=True)
    assert v == state.ValueDefinition("v", timedelta(days=1), True)
    assert (v.kind, v.payload, v.keyset_limit, v.capacity) == ("value", "json", None, None)
    assert v.to_config() == {"name": "v", "kind": "value", "payload": "json",
                             "ttl_seconds": 86400.0, "read_uncommitted": True,
                             "published": None, "read_cache": None, "keyset_limit": None,
                             "capacity": None}
    m = state.map("m", ttl=60, keyset_limit=0)
    assert (m.kind, m.payload, m.to_config()["ttl_seconds"], m.to_config()["keyset_limit"]) \
        == ("map", "json", 60, 0)
    d = state.deque("d", capacity=3)
    assert (d.kind, d.capacity, d.keyset_limit) == ("deque", 3, None)
    mv, mm, md = state.message_value("a"), state.message_map("b"), state.message_deque("c")
    assert [(x.kind, x.payload) for x in (mv, mm, md)] == [
        ("value", "message"), ("map", "message"), ("deque", "message")]
    assert mv.published is None and mv.read_cache is None
    assert [f.name for f in dataclasses.fields(state.DequeDefinition)] == [
        "name", "ttl", "read_uncommitted", "published", "read_cache", "capacity"]
    assert [f.name for f in dataclasses.fields(state.MessageMapDefinition)] == [
        "name", "ttl", "read_uncommitted", "keyset_limit"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.name = "w"  # type: ignore[misc]
    with pytest.raises(ValueError, match="read_cache=True is ambiguous"):
        state.value("x", read_cache=True)  # type: ignore[arg-type]
    assert Direction("forward") is Direction.FORWARD and Direction.BACKWARD == "backward"
    assert state.ValueDefinition[int] is not None
    # Re-exported from prosody, factories included (the original's imports).
    assert (prosody.value, prosody.map, prosody.deque, prosody.message_map) == (
        state.value, state.map, state.deque, state.message_map)
    assert prosody.MapState is state.MapState and prosody.Direction is Direction


def test_error_classes():
    assert issubclass(prosody.NullValueError, TransientStateError)
    assert issubclass(NullValueError, ValueError)
    assert issubclass(PermanentStateError, StateError) and issubclass(
        PermanentStateError, PermanentError)
    assert issubclass(TransientStateError, StateError) and issubclass(
        TransientStateError, TransientError)
    assert PermanentStateError("x").is_permanent and not NullValueError("x").is_permanent
    assert prosody.errors.StateError is StateError


class RawDef:
    def __init__(self, conf: Any) -> None:
        self.conf = conf

    def to_config(self) -> Any:
        return self.conf


def raw(**over: Any) -> RawDef:
    conf: Dict[str, Any] = {"name": "x", "kind": "value", "payload": "json"}
    conf.update(over)
    return RawDef({k: v for k, v in conf.items() if v is not ...})


def options() -> Dict[str, Any]:
    return dict(base_options(), source_system=unique("s"))


async def refused(collections_: List[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        c = await ProsodyClient.create(**options(), state_collections=collections_)
        await c.shutdown()


async def accepted(collections_: List[Any]) -> None:
    c = await ProsodyClient.create(**options(), state_collections=collections_)
    await c.shutdown()


async def test_rejects_ttl_negative():
    await refused([CART, state.value("t", ttl=-1)],
                  r"^state_collections\[1\]\.ttl_seconds: must be a whole number of seconds")
    await refused([state.value("t", ttl=timedelta(seconds=-5))],
                  r"state_collections\[0\]\.ttl_seconds")
    await refused([state.value("t", ttl=0)], r"state_collections\[0\]\.ttl_seconds")


@pytest.mark.parametrize("ttl", [1.5, timedelta(milliseconds=1500), math.nan, math.inf,
                                 -math.inf, True])
async def test_rejects_ttl_fractional_or_nonfinite(ttl):
    await refused([raw(ttl_seconds=ttl.total_seconds() if isinstance(ttl, timedelta) else ttl)],
                  r"state_collections\[0\]\.ttl_seconds: must be a whole number of seconds")


async def test_rejects_ttl_beyond_twenty_years():
    await refused([state.value("t", ttl=630720001)], r"state_collections\[0\]\.ttl_seconds")
    await accepted([state.value("t", ttl=timedelta(days=30)), state.value("u", ttl=630720000)])


@pytest.mark.parametrize("limit", [1.5, -1, 4097, "8", True])
async def test_rejects_keyset_non_whole(limit):
    await refused([raw(kind="map", keyset_limit=limit)],
                  r"^state_collections\[0\]\.keyset_limit: must be a whole number in 0\.\.=4096")


async def test_accepts_keyset_zero():
    await accepted([state.map("m", keyset_limit=0), state.map("n", keyset_limit=4096)])


async def test_rejects_keyset_on_non_map():
    await refused([raw(keyset_limit=5)],
                  r"^state_collections\[0\]\.keyset_limit: only valid for map collections")
    await refused([raw(kind="deque", keyset_limit=5)], "only valid for map collections")


async def test_accepts_deque_capacity():
    await accepted([state.deque("d", capacity=1), state.deque("e", capacity=2.0)])


async def test_rejects_capacity_zero():
    await refused([state.deque("d", capacity=0)],
                  r"^state_collections\[0\]\.capacity: must be a whole number in 1\.\.=")


async def test_capacity_is_an_unsigned_32_bit_count():
    # As in the original: a deque holds at most 2**32 - 1 items.
    await accepted([state.deque("d", capacity=2**32 - 1)])
    await refused([state.deque("d", capacity=2**32)],
                  r"^state_collections\[0\]\.capacity: must be a whole number in "
                  r"1\.\.=4294967295, got 4294967296")


@pytest.mark.parametrize("capacity", [1.5, math.inf, "3", -3])
async def test_rejects_capacity_non_whole(capacity):
    await refused([raw(kind="deque", capacity=capacity)],
                  r"state_collections\[0\]\.capacity: must be a whole number")


async def test_rejects_capacity_on_non_deque():
    await refused([raw(kind="map", capacity=3)],
                  r"^state_collections\[0\]\.capacity: only valid for deque collections")


async def test_rejects_unknown_kind():
    await refused([raw(kind="list")],
                  r"""^state_collections\[0\]\.kind: expected "value", "map", or "deque", """
                  r"got 'list'")


async def test_rejects_unknown_payload():
    await refused([raw(payload="avro")],
                  r"""^state_collections\[0\]\.payload: expected "json" or "message", """
                  r"got 'avro'")


async def test_rejects_malformed_entries():
    await refused([RawDef([("name", "x")])], r"^state_collections\[0\]: to_config\(\) must "
                                             r"return a dict$")
    await refused(["cart"], r"^state_collections\[0\]: to_config\(\) must return a dict$")
    for field in ("name", "kind", "payload"):
        await refused([raw(**{field: ...})], rf"^state_collections\[0\]\.{field}: missing$")
    await refused([state.value("")], r"^state_collections\[0\]\.name: must be a non-empty")
    await refused([raw(name=3)], r"^state_collections\[0\]\.name: must be a non-empty")
    await refused([CART, state.map("cart")],
                  r'^state_collections\[1\]\.name: collection "cart" is registered twice')
    await refused([raw(read_uncommitted="yes")], r"state_collections\[0\]\.read_uncommitted")
    await refused([raw(read_cache=True)], r"state_collections\[0\]\.read_cache: True is "
                                          r"ambiguous")
    await refused(CART, r"^state_collections: expected a sequence")  # type: ignore[arg-type]


async def test_accepts_canonical_collection_set():
    await accepted([
        state.value("cart", ttl=timedelta(days=30), read_uncommitted=False,
                    read_cache=timedelta(seconds=5)),
        state.map("totals", keyset_limit=256, read_cache=False),
        state.deque("backlog"),
        state.deque("bounded", capacity=3, read_uncommitted=True),
        raw(name="raw", kind="map", ttl_seconds=3600.0, keyset_limit=128.0, read_cache=2.5),
        state.message_value("mv", ttl=60), state.message_map("mm", keyset_limit=3),
        state.message_deque("md", capacity=2),
    ])
    # The constructor takes them too.
    c = ProsodyClient(**options(), state_collections=(CART,))
    await c.shutdown()
