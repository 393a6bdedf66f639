"""The layer under the public classes, as the original package has it.

The original's handles (ValueState, MapState, DequeState), published readers
and ProsodyClient are thin wrappers over a private native object kept as
``_native``, and its own tests drive the wrappers with fakes of that object.
These tests pin the same contract here, with fakes of our own: which native
method each public method calls, with what, and what it makes of the answer.
No client is needed, except where a handle's native layer is checked live.
"""

import contextlib
from typing import Any, List, Tuple

import pytest

import prosody
from prosody import (DequeState, Direction, MapState, Message, ProsodyClient, PublishedDeque,
                     PublishedMap, PublishedValue, TransientStateError, ValueState, state)


class Items:
    """A native scan: an async iterator over ``items`` that records being
    closed."""

    def __init__(self, items: List[Any]) -> None:
        self.items = list(items)
        self.closed = False

    def __aiter__(self) -> "Items":
        return self

    async def __anext__(self) -> Any:
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class Native:
    """A native handle that logs each call as (method, args) and answers
    from ``answers`` (method -> value; None otherwise). Its scan and keys
    are plain methods giving an iterator at once, as the native ones do."""

    def __init__(self, **answers: Any) -> None:
        self.log: List[Tuple[str, Tuple[Any, ...]]] = []
        self.answers = answers
        self.opened: List[Items] = []

    def scan(self, direction: str) -> Items:
        self.log.append(("scan", (direction,)))
        self.opened.append(Items(self.answers.get("scan", [])))
        return self.opened[-1]

    def keys(self, direction: str) -> Items:
        self.log.append(("keys", (direction,)))
        self.opened.append(Items(self.answers.get("keys", [])))
        return self.opened[-1]

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any) -> Any:
            self.log.append((method, args))
            return self.answers.get(method)
        return call


async def drain(it: Any) -> List[Any]:
    return [x async for x in it]


async def test_value_handle_calls_the_native_methods_of_its_name():
    n = Native(get={"n": 1})
    v = ValueState(n)
    assert await v.get() == {"n": 1}
    await v.set([1, 2])
    await v.clear()
    await v.commit()
    await v.rollback()
    assert n.log == [("get", ()), ("set", ([1, 2],)), ("clear", ()), ("commit", ()),
                     ("rollback", ())]


async def test_map_handle_calls_the_native_methods_and_shapes_scans():
    n = Native(get_many=[1, None], contains_key=True,
               scan=[("a", 1), ("b", 2)], keys=["a", "b"])
    m = MapState(n)
    await m.get("k")
    assert await m.get_many(("a", "z")) == [1, None]
    assert await m.contains("a") is True
    await m.set("k", {"x": 0})
    await m.remove("k")
    assert n.log == [("get", ("k",)), ("get_many", (["a", "z"],)), ("contains_key", ("a",)),
                     ("set", ("k", {"x": 0})), ("remove", ("k",))]
    n.log.clear()
    assert await drain(m.items(Direction.BACKWARD)) == [("a", 1), ("b", 2)]
    assert await drain(m.keys()) == ["a", "b"]
    assert await drain(m.values()) == [1, 2]  # the pairs' values
    assert await drain(m) == ["a", "b"]  # iterating a map gives its keys
    # Directions reach the native layer as their tokens.
    assert n.log == [("scan", ("backward",)), ("keys", ("forward",)), ("scan", ("forward",)),
                     ("keys", ("forward",))]


async def test_map_get_gives_the_default_only_when_absent():
    for stored in (0, False, "", [], {}):
        assert await MapState(Native(get=stored)).get("k", "default") == stored
    assert await MapState(Native(get=None)).get("k", "default") == "default"
    assert await MapState(Native(get=None)).get("k") is None


async def test_deque_handle_maps_its_methods_to_the_native_ends():
    n = Native(len=4, is_empty=False, pop_back="b", pop_front="f", scan=[3, 2])
    d = DequeState(n)
    await d.append("x")
    await d.appendleft("y")
    assert await d.pop() == "b"
    assert await d.popleft() == "f"
    await d.peek()
    await d.peekleft()
    await d.get(-2)
    assert await d.size() == 4
    assert await d.is_empty() is False
    assert await drain(d.values(Direction.BACKWARD)) == [3, 2]
    assert n.log == [("push_back", ("x",)), ("push_front", ("y",)), ("pop_back", ()),
                     ("pop_front", ()), ("peek_back", ()), ("peek_front", ()), ("get", (-2,)),
                     ("len", ()), ("is_empty", ()), ("scan", ("backward",))]
    with pytest.raises(TypeError, match="index must be an int"):
        await d.get("1")  # type: ignore[arg-type]


async def test_closing_a_handle_scan_closes_the_native_scan():
    n = Native(scan=[1, 2, 3])
    async with contextlib.aclosing(DequeState(n).values()) as it:
        assert await it.__anext__() == 1
    assert n.opened[0].closed
    assert await drain(it) == []  # a closed scan stays ended


class PublishedNative:
    """A native published reader: coroutine methods, of which scan and
    keys give an iterator once awaited (counted in ``opens``)."""

    def __init__(self) -> None:
        self.opens: List[Tuple[str, str, str]] = []

    async def scan(self, key: str, direction: str) -> Items:
        self.opens.append(("scan", key, direction))
        return Items([("a", 1), ("b", 2)] if direction == "forward" else [9, 8])

    async def keys(self, key: str, direction: str) -> Items:
        self.opens.append(("keys", key, direction))
        return Items(["b", "a"])

    async def contains_key(self, key: str, map_key: str) -> bool:
        return (key, map_key) == ("k", "a")

    async def len(self, key: str) -> int:
        return 2

    async def is_empty(self, key: str) -> bool:
        return False

    async def peek_back(self, key: str) -> int:
        return 8

    async def peek_front(self, key: str) -> int:
        return 9

    async def get(self, key: str, index: int) -> Any:
        # Only a resolved (non-negative) index may reach the native read.
        assert index >= 0
        return [9, 8][index] if index < 2 else None


async def test_published_scans_open_at_their_first_step():
    n = PublishedNative()
    pm, pd = PublishedMap(n), PublishedDeque(n)
    scans = [pm.items("k"), pm.keys("k", Direction.BACKWARD), pm.values("k"),
             pd.values("k", Direction.BACKWARD)]
    assert n.opens == []  # nothing is read before the first step
    assert [await drain(s) for s in scans] == [[("a", 1), ("b", 2)], ["b", "a"], [1, 2], [9, 8]]
    assert n.opens == [("scan", "k", "forward"), ("keys", "k", "backward"),
                       ("scan", "k", "forward"), ("scan", "k", "backward")]
    with pytest.raises(TransientStateError, match="forward"):
        pm.items("k", "sideways")  # a bad direction is refused at the call


async def test_published_deque_resolves_a_negative_index_against_its_size():
    pd = PublishedDeque(PublishedNative())
    assert [await pd.get("k", i) for i in (0, 1, 2, -1, -2, -3)] == [9, 8, None, 8, 9, None]
    assert (await pd.size("k"), await pd.is_empty("k")) == (2, False)
    assert (await pd.peek("k"), await pd.peekleft("k")) == (8, 9)
    assert await PublishedMap(PublishedNative()).contains("k", "a") is True


async def test_client_state_wraps_what_the_client_opens():
    class Client:
        def __getattr__(self, method: str) -> Any:
            async def open_(*args: Any, **kw: Any) -> Any:
                return (method, args, kw)
            return open_

    for definition, cls, method in ((state.value("v", read_cache=False), PublishedValue,
                                     "_published_value"),
                                    (state.map("m", read_cache=1.5), PublishedMap,
                                     "_published_map"),
                                    (state.deque("d"), PublishedDeque, "_published_deque")):
        reader = await ProsodyClient.state(Client(), "svc", definition)  # type: ignore[arg-type]
        assert type(reader) is cls
        assert reader._native == (method, ("svc", definition.name),
                                  {"read_cache": definition.read_cache})


async def test_create_builds_the_native_client_when_awaited(monkeypatch):
    built: List[Any] = []
    made = object()

    class FakeNative:
        @staticmethod
        def create(**options: Any) -> Any:
            built.append(options)

            async def finish() -> Any:
                return made
            return finish()

    monkeypatch.setattr(prosody, "_NativeProsodyClient", FakeNative)
    pending = ProsodyClient.create(group_id="g")
    assert built == []  # looked up and called only when awaited
    client = await pending
    assert isinstance(client, ProsodyClient) and client._native is made
    assert built == [{"group_id": "g"}]


def test_a_client_without_native_has_no_attributes():
    client = object.__new__(ProsodyClient)
    with pytest.raises(AttributeError):
        client.source_system
    with pytest.raises(AttributeError):
        client.no_such_thing


def test_the_client_hands_other_attributes_to_the_native_one():
    client = ProsodyClient(mock=True, source_system="layer-test", probe_port=None)
    assert isinstance(client._native, prosody._NativeProsodyClient)
    assert client.source_system == "layer-test" and client.probe_port is None
    assert client.consumer_state() == "unconfigured"


def test_message_takes_a_payload_type():
    assert Message[dict] is not None
    m: Message[dict] = Message("t", 1, 2, None, "k", {"a": 1})
    assert (m.topic, m.partition, m.offset, m.key, m.payload) == ("t", 1, 2, "k", {"a": 1})
