"""Published keyed state (``ProsodyClient.state``): one client owns and
publishes a value, a map and a deque (subsystem set, ``published=True``; its
handler writes on each message), and a second client in the same process,
with no subscription, reads them through ``await client.state(subsystem,
definition)``: every reader method of every kind, committed data only, the
read cache, unknown keys and subsystems, and the errors. Both tiers: the
memory store in mock mode, Cassandra in the real tier; the clients are
shared by the module's tests, each of which uses keys of its own."""

import asyncio
import time
from datetime import timedelta
from typing import Any, Awaitable, Callable, Dict, List

import pytest
import pytest_asyncio

import prosody
import prosody.published
from conftest import REAL, WAIT, Recorder, admin_options, base_options, unique
from prosody import (
    AdminClient,
    EventHandler,
    PermanentError,
    PermanentStateError,
    ProsodyClient,
    PublishedDeque,
    PublishedMap,
    PublishedValue,
    TransientStateError,
    state,
)
from prosody import prosody as native
from prosody.state import Direction

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

#: Unique per run: in Cassandra a publication's routes outlive the run.
SUB = unique("py-published-owner")
CART = state.value("cart", published=True)
TOTALS = state.map("totals", published=True)
LOG = state.deque("log", published=True)
PRIVATE = state.value("private")  # registered, not published

#: The reader's definitions: the owner's names; no read cache, so a change
#: is seen at once (the cache has tests of its own).
R_CART = state.value("cart", read_cache=False)
R_TOTALS = state.map("totals", read_cache=False)
R_LOG = state.deque("log", read_cache=False)

#: The options of a client made to be refused or dropped at once.
LONE = {"mock": True, "source_system": "py-published-tests"}


class Owner(EventHandler):
    """Runs the payload's commands on the event's key: ``set`` (the value),
    ``put`` (map entries), ``remove`` (a map key), ``push`` (deque items at
    the back), ``pushleft`` (at the front); then ``hold`` waits for the
    test's gate, and ``fail`` raises a PermanentError after the writes (so
    they are dropped and the event is not retried). Each attempt is
    recorded, (key, payload, "ok" | "failed")."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.gates: Dict[str, asyncio.Event] = {}

    async def on_message(self, context, message):
        p = message.payload
        if "set" in p:
            await context.state(CART).set(p["set"])
        m = context.state(TOTALS)
        for k, v in p.get("put", {}).items():
            await m.set(k, v)
        if "remove" in p:
            await m.remove(p["remove"])
        d = context.state(LOG)
        for item in p.get("push", []):
            await d.append(item)
        for item in p.get("pushleft", []):
            await d.appendleft(item)
        if "private" in p:
            await context.state(PRIVATE).set(p["private"])
        if "hold" in p:
            await self.rec.add((message.key, p, "holding"))
            await self.gates.setdefault(message.key, asyncio.Event()).wait()
        if p.get("fail"):
            await self.rec.add((message.key, p, "failed"))
            raise PermanentError("the handler failed after writing")
        await self.rec.add((message.key, p, "ok"))

    async def on_excise(self, context, message):
        pass

    async def on_timer(self, context, timer):
        pass


class World:
    """The owner (subscribed, publishing) and the reader (another client,
    not subscribed; it also sends the owner's messages)."""

    def __init__(self) -> None:
        self.rec = Recorder()
        self.owner_handler = Owner(self.rec)
        self.topic = unique("py-pub")
        self.owner: Any = None
        self.reader: Any = None
        self.made: List[Any] = []

    async def client(self, **options: Any) -> Any:
        c = await ProsodyClient.create(**dict(base_options(), source_system=unique("r"),
                                              **options))
        self.made.append(c)
        return c

    async def send(self, key: str, payload: Dict[str, Any]) -> None:
        await self.reader.send(self.topic, key, payload)

    async def handled(self, key: str, outcome: str = "ok", n: int = 1) -> None:
        """Waits until ``n`` attempts for ``key`` ended with ``outcome``."""
        await self.rec.wait_for(
            lambda ev: sum(1 for e in ev if e[0] == key and e[2] == outcome) >= n,
            what=f"{n} {outcome!r} attempt(s) for key {key!r}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world() -> Any:
    # The owner is alone in its group: the mock cluster assigns it at once
    # instead of waiting 3 s for more members (restored after: the cluster
    # is the process's), and it fetches promptly (the mock answers an empty
    # Fetch only when fetch.wait.max.ms is over, 500 ms by default, even if
    # a record arrives meanwhile), as test_keyed_state does.
    previous = native.mock_set_group_initial_rebalance_delay(0)
    w = World()
    await AdminClient(**admin_options()).create_topic(w.topic, partition_count=2)
    w.owner = await w.client(group_id=unique("g"), subscribed_topics=w.topic, subsystem=SUB,
                             state_collections=[CART, TOTALS, LOG, PRIVATE],
                             kafka_properties="fetch.wait.max.ms=20")
    await w.owner.subscribe(w.owner_handler)
    w.reader = await w.client()
    yield w
    for c in reversed(w.made):
        await c.shutdown()
    await AdminClient(**admin_options()).delete_topic(w.topic)
    native.mock_set_group_initial_rebalance_delay(previous)


async def eventually(read: Callable[[], Awaitable[Any]], want: Any, what: str) -> None:
    """Reads until the answer is ``want``: the owner's writes become
    durable when its event completes, a moment after the handler returns.
    Fails after WAIT seconds saying what was last read."""
    deadline = time.monotonic() + WAIT
    got = await read()
    while got != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {got!r} after {WAIT} s, expected {want!r}")
        await asyncio.sleep(0.01)
        got = await read()


async def collect(it: Any) -> List[Any]:
    return [x async for x in it]


# ---------------------------------------------------------------------------
# Reading each kind
# ---------------------------------------------------------------------------

async def test_value_reader(world):
    key = unique("v")
    cart = await world.reader.state(SUB, R_CART)
    assert isinstance(cart, PublishedValue)
    assert (cart.subsystem, cart.name) == (SUB, "cart")
    assert await cart.get(key) is None
    doc = {"items": [1, 2.5, "café", None, True], "nested": {"x": {}}}
    await world.send(key, {"set": doc})
    await eventually(lambda: cart.get(key), doc, "the published value")
    assert await cart.get(unique("nobody")) is None
    # Any client reads, the owner too.
    own = await world.owner.state(SUB, R_CART)
    assert await own.get(key) == doc


async def test_map_reader_every_method(world):
    key = unique("m")
    totals = await world.reader.state(SUB, R_TOTALS)
    assert isinstance(totals, PublishedMap)
    await world.send(key, {"put": {"b": 2, "café": {"x": [1]}, "a": 1, "c": 3, "zero": 0}})
    await world.send(key, {"remove": "c"})
    await eventually(lambda: collect(totals.keys(key)), ["a", "b", "café", "zero"],
                     "the published map's keys")
    assert await totals.get(key, "a") == 1
    assert await totals.get(key, "zero") == 0
    assert await totals.get(key, "c") is None
    assert await totals.get_many(key, ["b", "zz", "a", "b"]) == [2, None, 1, 2]
    assert await totals.contains(key, "café") is True
    assert await totals.contains(key, "c") is False
    assert await collect(totals.keys(key, Direction.BACKWARD)) == ["zero", "café", "b", "a"]
    items = [("a", 1), ("b", 2), ("café", {"x": [1]}), ("zero", 0)]
    assert await collect(totals.items(key)) == items
    assert await collect(totals.items(key, "backward")) == items[::-1]
    assert await collect(totals.values(key)) == [1, 2, {"x": [1]}, 0]
    # A key with no map: empty answers.
    nobody = unique("nobody")
    assert await totals.get(nobody, "a") is None
    assert await totals.get_many(nobody, ["a", "b"]) == [None, None]
    assert await totals.contains(nobody, "a") is False
    assert await collect(totals.items(nobody)) == []
    assert await collect(totals.keys(nobody, Direction.BACKWARD)) == []
    assert await collect(totals.values(nobody)) == []


async def test_deque_reader_every_method(world):
    key = unique("d")
    log = await world.reader.state(SUB, R_LOG)
    assert isinstance(log, PublishedDeque)
    await world.send(key, {"push": [1, "two", {"three": 3}], "pushleft": [0]})
    await eventually(lambda: log.size(key), 4, "the published deque's size")
    assert await log.is_empty(key) is False
    assert await log.get(key, 0) == 0
    assert await log.get(key, 2) == "two"
    assert await log.get(key, -1) == {"three": 3}
    assert await log.get(key, -4) == 0
    assert await log.get(key, 4) is None
    assert await log.get(key, -5) is None
    assert await log.get(key, 2**70) is None
    assert await log.peek(key) == {"three": 3}
    assert await log.peekleft(key) == 0
    assert await collect(log.values(key)) == [0, 1, "two", {"three": 3}]
    assert await collect(log.values(key, Direction.BACKWARD)) == [{"three": 3}, "two", 1, 0]
    with pytest.raises(TypeError, match="index must be an int"):
        await log.get(key, 1.0)  # type: ignore[arg-type]
    nobody = unique("nobody")
    assert await log.size(nobody) == 0
    assert await log.is_empty(nobody) is True
    assert await log.peek(nobody) is None
    assert await log.peekleft(nobody) is None
    assert await log.get(nobody, 0) is None
    assert await collect(log.values(nobody)) == []


async def test_scans_are_lazy_and_paged(world):
    # 300 entries: more than one page (256). The scans are made before
    # the data exists; nothing is read until the first pull.
    key = unique("p")
    totals = await world.reader.state(SUB, R_TOTALS)
    log = await world.reader.state(SUB, R_LOG)
    keys_scan = totals.keys(key)
    back_scan = totals.items(key, Direction.BACKWARD)
    deque_scan = log.values(key)
    entries = {f"k{i:03d}": i for i in range(300)}
    await world.send(key, {"put": entries, "push": list(range(300))})
    await eventually(lambda: log.size(key), 300, "the published deque's size")
    await eventually(lambda: totals.get(key, "k299"), 299, "the map's last entry")
    assert await collect(keys_scan) == sorted(entries)
    assert await collect(back_scan) == sorted(entries.items(), reverse=True)
    assert await collect(deque_scan) == list(range(300))
    assert await collect(log.values(key, "backward")) == list(range(299, -1, -1))
    # Breaking out early is harmless; a later scan starts afresh.
    async for k in totals.keys(key):
        assert k == "k000"
        break
    assert len(await collect(totals.values(key))) == 300


async def test_reads_from_another_event_loop(world):
    # Each future is settled on its own loop: reads from a second loop, in
    # another thread, run while this loop reads too.
    key = unique("l")
    await world.send(key, {"set": "x", "push": list(range(10))})
    cart = await world.reader.state(SUB, R_CART)
    await eventually(lambda: cart.get(key), "x", "the value")

    async def elsewhere() -> List[Any]:
        log = await world.reader.state(SUB, R_LOG)
        return [await cart.get(key), await log.size(key), await collect(log.values(key))]

    there = asyncio.get_running_loop().run_in_executor(None, asyncio.run, elsewhere())
    here = [cart.get(key) for _ in range(50)]
    got = await asyncio.gather(there, *here)
    assert got[0] == ["x", 10, list(range(10))]
    assert got[1:] == ["x"] * 50


# ---------------------------------------------------------------------------
# Committed data only
# ---------------------------------------------------------------------------

async def test_a_failed_attempt_leaves_nothing_visible(world):
    key = unique("f")
    cart = await world.reader.state(SUB, R_CART)
    totals = await world.reader.state(SUB, R_TOTALS)
    log = await world.reader.state(SUB, R_LOG)
    await world.send(key, {"set": "pending", "put": {"a": 1}, "push": [1], "fail": True})
    await world.handled(key, "failed")
    # The key's next event runs after the failed one is over: once its
    # write is visible, the failed one's would have been too.
    await world.send(key, {"put": {"marker": True}})
    await eventually(lambda: totals.get(key, "marker"), True, "the marker")
    assert await cart.get(key) is None
    assert await collect(totals.keys(key)) == ["marker"]
    assert await log.size(key) == 0


async def test_pending_writes_are_not_visible(world):
    key = unique("h")
    cart = await world.reader.state(SUB, R_CART)
    await world.send(key, {"set": "written", "hold": True})
    await world.rec.wait_for(lambda ev: any(e[0] == key and e[2] == "holding" for e in ev),
                             what="the handler to write and hold")
    assert await cart.get(key) is None
    world.owner_handler.gates.setdefault(key, asyncio.Event()).set()
    await eventually(lambda: cart.get(key), "written", "the value once the event succeeded")


async def test_an_unpublished_collection_is_not_readable(world):
    key = unique("u")
    await world.send(key, {"private": 1, "set": "public"})
    cart = await world.reader.state(SUB, R_CART)
    await eventually(lambda: cart.get(key), "public", "the published value")
    private = await world.reader.state(SUB, state.value("private", read_cache=False))
    with pytest.raises(TransientStateError, match="no publication rows"):
        await private.get(key)


# ---------------------------------------------------------------------------
# The read cache
# ---------------------------------------------------------------------------

async def test_read_cache_keeps_an_answer_until_it_expires(world):
    key = unique("c")
    ttl = 1.0
    fresh = await world.reader.state(SUB, R_CART)
    cached = await world.reader.state(SUB, state.value("cart", read_cache=timedelta(seconds=ttl)))
    await world.send(key, {"set": 1})
    await eventually(lambda: fresh.get(key), 1, "the first value")
    assert await cached.get(key) == 1
    cached_at = time.monotonic()
    await world.send(key, {"set": 2})
    await eventually(lambda: fresh.get(key), 2, "the second value (uncached)")
    assert time.monotonic() - cached_at < ttl, "too slow to check the cache: raise ttl"
    assert await cached.get(key) == 1, "the cached answer, within its time to live"
    await eventually(lambda: cached.get(key), 2, "the cached reader, once its answer expired")
    assert time.monotonic() - cached_at >= ttl * 0.9


async def test_client_read_cache_default_and_override(world):
    key = unique("o")
    # The client's state_read_cache is the default; a definition's wins.
    slow = await world.client(state_read_cache=timedelta(minutes=10))
    off = await world.client(state_read_cache=False)
    cached = await slow.state(SUB, state.value("cart"))
    override = await slow.state(SUB, state.value("cart", read_cache=False))
    uncached = await off.state(SUB, state.value("cart"))
    await world.send(key, {"set": "a"})
    await eventually(lambda: override.get(key), "a", "the first value")
    for r in (cached, uncached):
        assert await r.get(key) == "a"
    await world.send(key, {"set": "b"})
    await eventually(lambda: override.get(key), "b", "the second value (definition: no cache)")
    assert await uncached.get(key) == "b", "state_read_cache=False: read at once"
    assert await cached.get(key) == "a", "state_read_cache=10 min: still the cached answer"


async def test_state_read_cache_option_values():
    with pytest.raises(ValueError, match=r"^state_read_cache: True is ambiguous; use a duration "
                                         r"or False$"):
        ProsodyClient(**LONE, state_read_cache=True)
    with pytest.raises(ValueError, match="state_read_cache"):
        ProsodyClient(**LONE, state_read_cache="soon")
    with pytest.raises(ValueError, match="state_read_cache"):
        ProsodyClient(**LONE, state_read_cache=-1.0)
    with pytest.raises(TypeError, match="state_read_cache"):
        ProsodyClient(**LONE, state_read_cache=[1])
    for ok in (False, 0.5, 3, timedelta(seconds=30), "250ms", "none"):
        ProsodyClient(**LONE, state_read_cache=ok)


# ---------------------------------------------------------------------------
# Unknown subsystems, kinds and errors
# ---------------------------------------------------------------------------

async def test_a_subsystem_with_no_routes_is_transient(world):
    # As the original's readers: nobody publishes it (yet: the owner may
    # not have started), which a retry may see change.
    key = unique("n")
    await world.send(key, {"set": 1, "put": {"a": 1}, "push": [1]})
    cart = await world.reader.state(SUB, R_CART)
    await eventually(lambda: cart.get(key), 1, "the owner's value")
    other = unique("nobody")
    value = await world.reader.state(other, R_CART)
    totals = await world.reader.state(other, R_TOTALS)
    log = await world.reader.state(other, R_LOG)
    for read in (lambda: value.get(key), lambda: totals.get(key, "a"),
                 lambda: collect(totals.items(key)), lambda: log.size(key),
                 lambda: collect(log.values(key))):
        with pytest.raises(TransientStateError, match="no publication rows"):
            await read()


async def test_reading_as_another_kind_is_permanent(world):
    key = unique("k")
    await world.send(key, {"put": {"a": 1}})
    totals = await world.reader.state(SUB, R_TOTALS)
    await eventually(lambda: totals.get(key, "a"), 1, "the map entry")
    as_value = await world.reader.state(SUB, state.value("totals", read_cache=False))
    with pytest.raises(PermanentStateError, match="map"):
        await as_value.get(key)


async def test_a_message_definition_is_a_type_error(world):
    for definition in (state.message_value("m"), state.message_map("m"),
                       state.message_deque("m"), "cart", None):
        with pytest.raises(TypeError, match=r"^definition must be a JSON ValueDefinition, "
                                            r"MapDefinition, or DequeDefinition$"):
            await world.reader.state(SUB, definition)


async def test_caller_mistakes_are_transient(world):
    totals = await world.reader.state(SUB, R_TOTALS)
    with pytest.raises(TransientStateError, match="key must be a str"):
        await totals.get(3, "a")  # type: ignore[arg-type]
    with pytest.raises(TransientStateError, match="map key must be a str"):
        await totals.get("k", 3)  # type: ignore[arg-type]
    with pytest.raises(TransientStateError, match="forward"):
        totals.items("k", "sideways")
    with pytest.raises(TransientStateError):
        await world.reader.state(" ", R_CART)  # a blank subsystem
    with pytest.raises(TypeError, match="subsystem"):
        await world.reader.state(None, R_CART)  # type: ignore[arg-type]


async def test_an_empty_key_is_permanent(world):
    cart = await world.reader.state(SUB, R_CART)
    with pytest.raises(PermanentStateError):
        await cart.get("")


# ---------------------------------------------------------------------------
# Registration (the owner side)
# ---------------------------------------------------------------------------

class RawDef:
    def __init__(self, conf: Dict[str, Any]) -> None:
        self.conf = conf

    def to_config(self) -> Dict[str, Any]:
        return self.conf


async def test_a_published_message_collection_is_refused():
    raw = RawDef({"name": "m", "kind": "value", "payload": "message", "published": True})
    with pytest.raises(ValueError, match=r"^state_collections\[0\]\.published: only JSON "
                                         r"collections can be published"):
        ProsodyClient(**LONE, subsystem=SUB, state_collections=[raw])


async def test_a_published_collection_needs_the_subsystem():
    with pytest.raises(ValueError, match=r'published: collection "cart" is published, which '
                                         r"needs the option subsystem"):
        await ProsodyClient.create(**LONE, state_collections=[CART])
    ProsodyClient(**LONE, state_collections=[state.value("cart", published=False)])


async def test_client_state_dispatches_by_definition_type():
    calls: List[Any] = []

    class Fake:
        def _open(kind):  # noqa: N805 - a factory of fake natives
            async def open_(subsystem, name, read_cache=None):
                calls.append((kind, subsystem, name, read_cache))
                return kind
            return open_
        _published_value = staticmethod(_open("value"))
        _published_map = staticmethod(_open("map"))
        _published_deque = staticmethod(_open("deque"))

    v = await prosody.published._published(Fake(), "s", state.value("a"))
    m = await prosody.published._published(Fake(), "s", state.map("b", read_cache=False))
    d = await prosody.published._published(Fake(), "s", state.deque("c", read_cache=2.5))
    assert (type(v), type(m), type(d)) == (PublishedValue, PublishedMap, PublishedDeque)
    assert calls == [("value", "s", "a", None), ("map", "s", "b", False),
                     ("deque", "s", "c", 2.5)]


async def test_exports():
    for name in ("PublishedValue", "PublishedMap", "PublishedDeque"):
        cls = getattr(prosody.published, name)
        assert getattr(prosody, name) is cls and getattr(prosody.state, name) is cls
        assert name in prosody.__all__ and name in prosody.state.__all__
