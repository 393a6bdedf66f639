"""Keyed state: durable collections per consumer group and Kafka key.

Declare each collection when the client is made::

    cart = state.value("cart", ttl=timedelta(days=30))
    totals = state.map("totals")
    client = await ProsodyClient.create(..., state_collections=[cart, totals])

and bind it in a handler, for the key of the event being handled::

    async def on_message(self, context, message):
        totals = context.state(totals_def)
        await totals.set(message.payload["item"], message.payload["n"])

A handler's writes are buffered for its attempt (its reads see them): they
become durable with the event's success and vanish with its failure, so a
retry starts from the committed state. ``commit()`` makes one collection's
writes durable at once; ``rollback()`` drops those buffered since the last
commit. A handle is valid only during the invocation that opened it.

Values are JSON documents (``json.dumps`` / ``json.loads``); a top-level
``None`` cannot be stored (``NullValueError``): use ``clear()`` or
``remove()``. Collections of Kafka messages (``message_value``,
``message_map``, ``message_deque``) keep a ``Message`` this package gave a
handler (its own, or one read back from a message collection) by reference
(topic, partition, offset) and give it back loaded again from Kafka, equal
to what ``on_message`` received; a record Kafka no longer has is a
``PermanentStateError``.

Published state: a JSON collection registered with ``published=True`` (the
client needs the ``subsystem`` option) can be read by any client, of any
service sharing the store (in mock mode: the process), without consuming::

    carts = await client.state("checkout", state.value("cart"))
    cart = await carts.get("customer-42")

Every read names the Kafka key, sees committed state only and may be as old
as the read cache allows (the definition's ``read_cache``, else the
client's ``state_read_cache`` option, 5 s by default; ``False``: none).
"""

import asyncio
import collections
import enum
import json
import math
import operator
from dataclasses import dataclass
from datetime import timedelta
from typing import (Any, AsyncIterator, Awaitable, Callable, ClassVar, Dict, FrozenSet, Generic, List,
                    Literal, Optional, Sequence, Tuple, TypeVar, Union, overload)

from prosody.errors import NullValueError, PermanentStateError, TransientStateError
from prosody.message import Message

__all__ = [
    "Direction",
    "ValueDefinition",
    "MapDefinition",
    "DequeDefinition",
    "MessageValueDefinition",
    "MessageMapDefinition",
    "MessageDequeDefinition",
    "ValueState",
    "MapState",
    "DequeState",
    "PublishedValue",
    "PublishedMap",
    "PublishedDeque",
    "value",
    "map",
    "deque",
    "message_value",
    "message_map",
    "message_deque",
]

T = TypeVar("T")
V = TypeVar("V")
P = TypeVar("P")
D = TypeVar("D")

Ttl = Optional[Union[timedelta, int]]
ReadCache = Optional[Union[timedelta, float, Literal[False]]]

# prosody_state_kind_t, prosody_state_payload_t and prosody_state_op_t
# (include/prosody.h, "Keyed state").
_KINDS = {"value": 0, "map": 1, "deque": 2}
_PAYLOADS = {"json": 0, "message": 1}
_GET, _GET_MANY, _SET, _REMOVE, _CLEAR, _CONTAINS = 0, 1, 2, 3, 4, 5
_PUSH_BACK, _PUSH_FRONT, _POP_BACK, _POP_FRONT = 6, 7, 8, 9
_PEEK_BACK, _PEEK_FRONT, _LEN, _SCAN, _COMMIT, _ROLLBACK = 10, 11, 12, 13, 14, 15

#: Items per scan pull (libprosody's SCAN limit).
SCAN_CHUNK = 256
#: libprosody's longest TTL (20 years).
_MAX_TTL = 630720000
_INT64_MAX = 2**63 - 1
#: The largest deque capacity (the original's: an unsigned 32-bit count).
_MAX_CAPACITY = 2**32 - 1


class Direction(str, enum.Enum):
    """The order of a scan: map keys by their UTF-8 bytes, deque items from
    the front (``FORWARD``) or from the back (``BACKWARD``)."""

    FORWARD = "forward"
    BACKWARD = "backward"


# ---------------------------------------------------------------------------
# Definitions
# ---------------------------------------------------------------------------

def _check_read_cache(read_cache: Any) -> None:
    """``read_cache=True`` says nothing about how long: refused."""
    if read_cache is True:
        raise ValueError("read_cache=True is ambiguous; pass a duration, False, or None")


class _Definition:
    """What every definition shares: ``to_config()``, and ``None`` for the
    options its kind does not have (class attributes; the dataclasses below
    declare the fields of those it has)."""

    kind: ClassVar[str]
    payload: ClassVar[str]
    name: str
    ttl: Ttl
    read_uncommitted: Optional[bool]
    published: Optional[bool] = None
    read_cache: ReadCache = None
    keyset_limit: Optional[int] = None
    capacity: Optional[int] = None

    def to_config(self) -> Dict[str, Any]:
        """The definition as ``state_collections`` reads it."""
        ttl = self.ttl
        return {
            "name": self.name,
            "kind": self.kind,
            "payload": self.payload,
            "ttl_seconds": ttl.total_seconds() if isinstance(ttl, timedelta) else ttl,
            "read_uncommitted": self.read_uncommitted,
            "published": self.published,
            "read_cache": self.read_cache,
            "keyset_limit": self.keyset_limit,
            "capacity": self.capacity,
        }


@dataclass(frozen=True)
class _Named(_Definition):
    """The fields of every kind (a definition's fields start with these)."""

    name: str
    ttl: Ttl = None
    read_uncommitted: Optional[bool] = None


@dataclass(frozen=True)
class _Json(_Named):
    """The fields of the JSON kinds; ``read_cache=True`` is refused."""

    published: Optional[bool] = None
    read_cache: ReadCache = None

    def __post_init__(self) -> None:
        _check_read_cache(self.read_cache)


@dataclass(frozen=True)
class ValueDefinition(_Json, Generic[T]):
    """A collection holding one JSON document per key."""

    kind: ClassVar[str] = "value"
    payload: ClassVar[str] = "json"


@dataclass(frozen=True)
class MapDefinition(_Json, Generic[V]):
    """A collection holding a string-keyed map of JSON documents per key."""

    kind: ClassVar[str] = "map"
    payload: ClassVar[str] = "json"
    keyset_limit: Optional[int] = None


@dataclass(frozen=True)
class DequeDefinition(_Json, Generic[T]):
    """A collection holding a double-ended queue of JSON documents per key."""

    kind: ClassVar[str] = "deque"
    payload: ClassVar[str] = "json"
    capacity: Optional[int] = None


@dataclass(frozen=True)
class MessageValueDefinition(_Named, Generic[P]):
    """A collection holding one Kafka message per key."""

    kind: ClassVar[str] = "value"
    payload: ClassVar[str] = "message"


@dataclass(frozen=True)
class MessageMapDefinition(_Named, Generic[P]):
    """A collection holding a string-keyed map of Kafka messages per key."""

    kind: ClassVar[str] = "map"
    payload: ClassVar[str] = "message"
    keyset_limit: Optional[int] = None


@dataclass(frozen=True)
class MessageDequeDefinition(_Named, Generic[P]):
    """A collection holding a double-ended queue of Kafka messages per key."""

    kind: ClassVar[str] = "deque"
    payload: ClassVar[str] = "message"
    capacity: Optional[int] = None


def value(name: str, *, ttl: Ttl = None, read_uncommitted: Optional[bool] = None,
          published: Optional[bool] = None, read_cache: ReadCache = None) -> ValueDefinition[Any]:
    """A value collection: one JSON document per key."""
    return ValueDefinition(name, ttl, read_uncommitted, published, read_cache)


def map(name: str, *, ttl: Ttl = None, read_uncommitted: Optional[bool] = None,  # noqa: A001
        published: Optional[bool] = None, read_cache: ReadCache = None,
        keyset_limit: Optional[int] = None) -> MapDefinition[Any]:
    """A map collection: string keys (ordered by their UTF-8 bytes) to JSON
    documents, per key."""
    return MapDefinition(name, ttl, read_uncommitted, published, read_cache, keyset_limit)


def deque(name: str, *, ttl: Ttl = None, read_uncommitted: Optional[bool] = None,
          published: Optional[bool] = None, read_cache: ReadCache = None,
          capacity: Optional[int] = None) -> DequeDefinition[Any]:
    """A deque collection: JSON documents pushed and popped at both ends;
    ``capacity`` drops items from the other end past it."""
    return DequeDefinition(name, ttl, read_uncommitted, published, read_cache, capacity)


def message_value(name: str, *, ttl: Ttl = None,
                  read_uncommitted: Optional[bool] = None) -> MessageValueDefinition[Any]:
    """A message value collection: one Kafka message (a ``Message`` a handler
    was given) per key, kept by reference and loaded again on reads."""
    return MessageValueDefinition(name, ttl, read_uncommitted)


def message_map(name: str, *, ttl: Ttl = None, read_uncommitted: Optional[bool] = None,
                keyset_limit: Optional[int] = None) -> MessageMapDefinition[Any]:
    """A message map collection: string keys to Kafka messages, per key."""
    return MessageMapDefinition(name, ttl, read_uncommitted, keyset_limit)


def message_deque(name: str, *, ttl: Ttl = None, read_uncommitted: Optional[bool] = None,
                  capacity: Optional[int] = None) -> MessageDequeDefinition[Any]:
    """A message deque collection: Kafka messages pushed and popped at both
    ends; ``capacity`` drops items from the other end past it."""
    return MessageDequeDefinition(name, ttl, read_uncommitted, capacity)


# ---------------------------------------------------------------------------
# state_collections (called by the native module's option conversion)
# ---------------------------------------------------------------------------

def _whole(v: Any) -> Optional[int]:
    """``v`` as an int when it is a whole number (not a bool), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return int(v)
    return None


def _collection_configs(collections_: Any) -> List[Tuple[str, int, int, int, int, int, int, int]]:
    """``state_collections`` as libprosody's prosody_state_def_t fields:
    (name, kind, payload, ttl_s, read_uncommitted, published, keyset_limit,
    capacity). Converts types only; libprosody checks the rest (its
    messages are prefixed with ``state_collections[i].`` by the caller).
    Raises ValueError naming the entry and field."""
    if isinstance(collections_, (str, bytes, dict)) or not hasattr(collections_, "__iter__"):
        raise ValueError("state_collections: expected a sequence of state definitions "
                         f"(prosody.state.value/map/deque), got {type(collections_).__name__}")
    out = []
    for i, d in enumerate(collections_):
        where = f"state_collections[{i}]"
        to_config = getattr(d, "to_config", None)
        conf = to_config() if callable(to_config) else None
        if not isinstance(conf, dict):
            raise ValueError(f"{where}: to_config() must return a dict")
        for field in ("name", "kind", "payload"):
            if field not in conf:
                raise ValueError(f"{where}.{field}: missing")
        name, kind, payload = conf["name"], conf["kind"], conf["payload"]
        if not isinstance(name, str) or "\0" in name:
            raise ValueError(f"{where}.name: must be a non-empty string without NUL, "
                             f"got {name!r}")
        if kind not in _KINDS:
            raise ValueError(f'{where}.kind: expected "value", "map", or "deque", got {kind!r}')
        if payload not in _PAYLOADS:
            raise ValueError(f'{where}.payload: expected "json" or "message", got {payload!r}')
        ttl = conf.get("ttl_seconds")
        if ttl is None:
            ttl_s = 0
        else:
            ttl_s = _whole(ttl)  # type: ignore[assignment]
            if ttl_s is None or not 1 <= ttl_s <= _MAX_TTL:
                raise ValueError(f"{where}.ttl_seconds: must be a whole number of seconds in "
                                 f"1..={_MAX_TTL}, got {ttl!r}")
        flags = []
        for field in ("read_uncommitted", "published"):
            v = conf.get(field)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{where}.{field}: expected a bool, got {v!r}")
            flags.append(1 if v else 0)
        rc = conf.get("read_cache")
        if rc is True:
            raise ValueError(f"{where}.read_cache: True is ambiguous; pass a duration, "
                             "False, or None")
        if rc is not None and rc is not False:
            secs = rc.total_seconds() if isinstance(rc, timedelta) else rc
            if (isinstance(secs, bool) or not isinstance(secs, (int, float))
                    or not math.isfinite(secs) or secs < 0):
                raise ValueError(f"{where}.read_cache: expected a duration (timedelta or "
                                 f"seconds >= 0), False, or None, got {rc!r}")
        limits = []
        for field, lo, hi, unset in (("keyset_limit", 0, 4096, -1),
                                     ("capacity", 1, _MAX_CAPACITY, 0)):
            v = conf.get(field)
            if v is None:
                limits.append(unset)
                continue
            n = _whole(v)
            if n is None or n < lo or n > hi:
                raise ValueError(f"{where}.{field}: must be a whole number in {lo}..={hi}, "
                                 f"got {v!r}")
            limits.append(n)
        out.append((name, _KINDS[kind], _PAYLOADS[payload], ttl_s, flags[0], flags[1],
                    limits[0], limits[1]))
    return out


def _message_names(collections_: Any) -> FrozenSet[str]:
    """The names of the message collections of ``state_collections`` (None:
    none); called by the client once ``_collection_configs`` accepted
    them."""
    if collections_ is None:
        return frozenset()
    return frozenset(c[0] for c in _collection_configs(collections_)
                     if c[2] == _PAYLOADS["message"])


# ---------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------

_DEFINITIONS = (ValueDefinition, MapDefinition, DequeDefinition, MessageValueDefinition,
                MessageMapDefinition, MessageDequeDefinition)


def _bind(context: Any, definition: Any) -> Any:
    """``Context.state(definition)``: opens the collection for the key of
    the context's event (native ``_state_open``) and wraps the handle."""
    if not isinstance(definition, _DEFINITIONS):
        raise TransientStateError(
            "state: the definition must come from prosody.state (value, map, deque, "
            f"message_value, message_map, message_deque), got {type(definition).__name__}")
    name = definition.name
    if not isinstance(name, str) or not name or "\0" in name:
        raise TransientStateError(f"state: the definition's name must be a non-empty string, "
                                  f"got {name!r}")
    native, kind, payload = context._state_open(name)
    want = _KINDS[definition.kind]
    if kind != want or payload != _PAYLOADS[definition.payload]:
        kinds = {v: k for k, v in _KINDS.items()}
        payloads = {v: k for k, v in _PAYLOADS.items()}
        raise PermanentStateError(
            f'state: collection "{name}" is registered as a {payloads.get(payload, payload)} '
            f"{kinds.get(kind, kind)}, not a {definition.payload} {definition.kind}")
    if want == 0:
        return ValueState(_NativeValue(native, name, payload == _PAYLOADS["message"]))
    if want == 1:
        return MapState(_NativeMap(native, name, payload == _PAYLOADS["message"]))
    return DequeState(_NativeDeque(native, name, payload == _PAYLOADS["message"]))


def _delivered(value: Any) -> bool:
    """Whether ``value`` is a Message this package gave a handler (the
    native layer marks those; one made in Python has no ``_core``)."""
    return isinstance(value, Message) and getattr(value, "_core", None) is True


def _encode(value: Any, what: str, instead: str) -> str:
    if value is None:
        raise NullValueError(f"{what}: None cannot be stored; use {instead} to delete")
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        raise TransientStateError(f"{what}: the value has no JSON form: {e}") from e


def _decode(doc: Any) -> Any:
    """An item's document: JSON text is parsed; a message collection's item
    is a Message already (the native layer made it), or None."""
    return json.loads(doc) if isinstance(doc, str) else doc


def _ref(value: Any, what: str, name: str) -> Dict[str, Any]:
    """What a message collection's write passes for ``value``: the
    coordinates of a delivered Message; anything else is refused."""
    if not _delivered(value):
        if isinstance(value, Message):
            got = "a Message made in Python (not one Prosody delivered)"
        else:
            got = f"a {type(value).__name__}"
        raise TransientStateError(
            f"{what}: expected a Kafka message; a JSON value cannot be stored in a message "
            f'collection ("{name}" keeps messages a handler was given: its own message or one '
            f"read back from a message collection; got {got})")
    return {"ref_topic": value.topic, "ref_partition": value.partition,
            "ref_offset": value.offset}


def _map_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise TransientStateError(f"{what}: a map key must be a str, got {type(key).__name__}")
    if "\0" in key:
        raise TransientStateError(f"{what}: a map key cannot contain NUL (\\x00)")
    return key


def _direction(direction: Any) -> bool:
    """True for backward."""
    try:
        return Direction(direction) is Direction.BACKWARD
    except ValueError:
        raise TransientStateError(
            f'direction: expected Direction.FORWARD ("forward") or Direction.BACKWARD '
            f'("backward"), got {direction!r}') from None


def _token(direction: Any) -> Any:
    """A scan direction as the native layer takes it: a Direction's token,
    anything else as given (the native layer refuses what is neither
    ``"forward"`` nor ``"backward"``)."""
    return direction.value if isinstance(direction, Direction) else direction


def _first(items: List[Tuple[Any, Any]]) -> Any:
    """The document of a one-item answer (None when absent)."""
    return _decode(items[0][1]) if items and items[0][1] is not None else None


#: A scan's source of pages: ``pull(after)`` reads up to SCAN_CHUNK items
#: after the key or position ``after`` (None: from the start) and gives
#: ``(items, end)``: items as ``(key, document)``, ``end`` true at the end.
Pull = Callable[[Optional[str]], Awaitable[Tuple[List[Tuple[Any, Any]], int]]]


def _handle_pages(native: Any, backward: bool, keys_only: bool) -> Pull:
    """The pages of a handler's scan (native StateHandle.call)."""
    def pull(after: Optional[str]) -> Any:
        return native.call(_SCAN, after=after, limit=SCAN_CHUNK, backward=backward,
                           keys_only=keys_only)
    return pull


class _Scan(Generic[T]):
    """An asynchronous iterator over a scan, pulling chunks of up to 256
    items (each pull resumes after the last item's key or position); nothing
    is read before the first ``__anext__``. Concurrent ``__anext__`` calls
    are served one after the other; dropping the iterator early is
    harmless."""

    def __init__(self, pull: Pull, shape: str) -> None:
        self._pull = pull
        self._shape = shape  # "items", "keys" or "values"
        self._buf: Any = collections.deque()
        self._after: Optional[str] = None
        self._end = False
        self._lock: Optional[asyncio.Lock] = None

    def __aiter__(self) -> "_Scan[T]":
        return self

    async def __anext__(self) -> T:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while not self._buf:
                if self._end:
                    raise StopAsyncIteration
                items, end = await self._pull(self._after)
                if items:
                    self._after = items[-1][0]
                self._end = bool(end) or not items
                self._buf.extend(items)
            key, doc = self._buf.popleft()
            if self._shape == "keys":
                return key  # type: ignore[no-any-return]
            if self._shape == "values":
                return _decode(doc)  # type: ignore[no-any-return]
            return (key, _decode(doc))  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Ends the scan (later ``__anext__`` calls stop at once)."""
        self._end = True
        self._buf.clear()


# The layer under the handles. As in the original package, a handle
# (ValueState, MapState, DequeState) is a thin wrapper over a private
# "native" handle, ``handle._native``, whose methods carry the original's
# names (get, set, get_many, contains_key, remove, push_back, push_front,
# pop_back, pop_front, peek_back, peek_front, len, is_empty, clear, commit,
# rollback; scan(direction) and keys(direction) give async iterators at
# once, reading nothing before their first step). Here that layer is the
# classes below, over the C StateHandle's call(op, ...): they check and
# encode what is written and decode what is read.

class _Native:
    __slots__ = ("_handle", "name", "_message")

    def __init__(self, handle: Any, name: str, message: bool) -> None:
        self._handle = handle
        self.name = name
        self._message = message  # a message collection: items are Messages

    def _item(self, value: Any, what: str, instead: str) -> Dict[str, Any]:
        """A write's arguments for ``value``: its JSON text, or in a message
        collection the delivered message's coordinates."""
        if self._message:
            return _ref(value, what, self.name)
        if _delivered(value):
            raise TransientStateError(
                f'{what}: a Kafka message cannot be stored in a JSON collection ("{self.name}"); '
                "store its payload, or use a message collection (state.message_value, "
                "message_map, message_deque)")
        return {"json": _encode(value, what, instead)}

    async def _one(self, op: int, **args: Any) -> Any:
        items, _ = await self._handle.call(op, **args)
        return _first(items)

    def _scan(self, direction: Any, keys_only: bool, shape: str) -> "_Scan[Any]":
        return _Scan(_handle_pages(self._handle, _direction(direction), keys_only), shape)

    async def clear(self) -> None:
        await self._handle.call(_CLEAR)

    async def commit(self) -> None:
        await self._handle.call(_COMMIT)

    async def rollback(self) -> None:
        await self._handle.call(_ROLLBACK)


class _NativeValue(_Native):
    __slots__ = ()

    async def get(self) -> Any:
        return await self._one(_GET)

    async def set(self, value: Any) -> None:
        await self._handle.call(_SET, **self._item(value, "ValueState.set", "clear()"))


class _NativeMap(_Native):
    __slots__ = ()

    async def get(self, key: str) -> Any:
        return await self._one(_GET, key=_map_key(key, "MapState.get"))

    async def get_many(self, keys: Sequence[str]) -> List[Any]:
        keys = [_map_key(k, "MapState.get_many") for k in keys]
        items, _ = await self._handle.call(_GET_MANY, keys=keys)
        return [_decode(doc) for _, doc in items]

    async def contains_key(self, key: str) -> bool:
        _, n = await self._handle.call(_CONTAINS, key=_map_key(key, "MapState.contains"))
        return bool(n)

    async def set(self, key: str, value: Any) -> None:
        key = _map_key(key, "MapState.set")
        await self._handle.call(_SET, key=key, **self._item(value, "MapState.set", "remove(key)"))

    async def remove(self, key: str) -> None:
        await self._handle.call(_REMOVE, key=_map_key(key, "MapState.remove"))

    def scan(self, direction: Any) -> "_Scan[Tuple[str, Any]]":
        """The (key, value) pairs."""
        return self._scan(direction, False, "items")

    def keys(self, direction: Any) -> "_Scan[str]":
        """The keys (values are not read)."""
        return self._scan(direction, True, "keys")


class _NativeDeque(_Native):
    __slots__ = ()

    async def push_back(self, item: Any) -> None:
        await self._handle.call(_PUSH_BACK,
                                **self._item(item, "DequeState.append", "pop() or clear()"))

    async def push_front(self, item: Any) -> None:
        await self._handle.call(
            _PUSH_FRONT, **self._item(item, "DequeState.appendleft", "popleft() or clear()"))

    async def pop_back(self) -> Any:
        return await self._one(_POP_BACK)

    async def pop_front(self) -> Any:
        return await self._one(_POP_FRONT)

    async def peek_back(self) -> Any:
        return await self._one(_PEEK_BACK)

    async def peek_front(self) -> Any:
        return await self._one(_PEEK_FRONT)

    async def get(self, index: int) -> Any:
        _check_index(index, "DequeState.get")
        if not -_INT64_MAX <= index <= _INT64_MAX:
            return None
        return await self._one(_GET, index=operator.index(index))

    async def len(self) -> int:
        _, n = await self._handle.call(_LEN)
        return int(n)

    async def is_empty(self) -> bool:
        return await self.len() == 0

    def scan(self, direction: Any) -> "_Scan[Any]":
        """The items."""
        return self._scan(direction, False, "values")


def _check_index(index: Any, what: str) -> None:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{what}: index must be an int, got {type(index).__name__}")


class _StateScan(Generic[T]):
    """What a handle's (or a published reader's) scan method returns: the
    native scan's items, shaped (``"value"``: the value of each (key, value)
    pair; None: as they come). The native scan is the iterator ``source``,
    or the one ``await source()`` gives at the first step (a published
    reader's, opened lazily). ``aclose()`` closes it."""

    def __init__(self, source: Any, shape: Optional[str] = None) -> None:
        self._it: Any = None if callable(source) else source
        self._open: Any = source if callable(source) else None
        self._shape = shape
        self._closed = False

    def __aiter__(self) -> "_StateScan[T]":
        return self

    async def __anext__(self) -> T:
        if self._closed:
            raise StopAsyncIteration
        if self._it is None:
            self._it = await self._open()
        item = await self._it.__anext__()
        return item[1] if self._shape == "value" else item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Ends the scan and closes the native one."""
        self._closed = True
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()


class _Handle:
    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._native.name  # type: ignore[no-any-return]

    async def clear(self) -> None:
        """Removes everything the collection holds for this key."""
        await self._native.clear()

    async def commit(self) -> None:
        """Makes this collection's buffered writes durable now: a later
        failure of the handler does not undo them (a retry sees them)."""
        await self._native.commit()

    async def rollback(self) -> None:
        """Drops this collection's writes buffered since the last commit()
        (or since the attempt started)."""
        await self._native.rollback()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self._native, 'name', None)!r}>"


class ValueState(_Handle, Generic[T]):
    """A value collection bound to the current event's key."""

    __slots__ = ()

    async def get(self) -> Optional[T]:
        """The stored value, or None when absent."""
        return await self._native.get()  # type: ignore[no-any-return]

    async def set(self, value: T) -> None:
        """Stores ``value`` (JSON; not None: use clear()). In a message
        collection: a Message a handler was given."""
        await self._native.set(value)


class MapState(_Handle, Generic[V]):
    """A map collection (string keys) bound to the current event's key."""

    __slots__ = ()

    @overload
    async def get(self, key: str) -> Optional[V]: ...
    @overload
    async def get(self, key: str, default: D) -> Union[V, D]: ...

    async def get(self, key: str, default: Any = None) -> Any:
        """The value at ``key``, or ``default`` when absent."""
        found = await self._native.get(key)
        return default if found is None else found

    async def get_many(self, keys: Sequence[str]) -> List[Optional[V]]:
        """The values at ``keys``, in order (None where absent)."""
        return await self._native.get_many(list(keys))  # type: ignore[no-any-return]

    async def contains(self, key: str) -> bool:
        """Whether ``key`` is present (its value is not decoded)."""
        return bool(await self._native.contains_key(key))

    async def set(self, key: str, value: V) -> None:
        """Stores ``value`` (JSON; not None: use remove()) at ``key``. In a
        message collection: a Message a handler was given."""
        await self._native.set(key, value)

    async def remove(self, key: str) -> None:
        """Removes ``key`` (absent: nothing happens)."""
        await self._native.remove(key)

    def items(self, direction: Union[Direction, str] = Direction.FORWARD
              ) -> AsyncIterator[Tuple[str, V]]:
        """The (key, value) pairs in key order."""
        return _StateScan(self._native.scan(_token(direction)))

    def keys(self, direction: Union[Direction, str] = Direction.FORWARD) -> AsyncIterator[str]:
        """The keys in order (values are not decoded)."""
        return _StateScan(self._native.keys(_token(direction)))

    def values(self) -> AsyncIterator[V]:
        """The values in key order."""
        return _StateScan(self._native.scan(Direction.FORWARD.value), "value")

    def __aiter__(self) -> AsyncIterator[str]:
        return self.keys()


class DequeState(_Handle, Generic[T]):
    """A deque collection bound to the current event's key."""

    __slots__ = ()

    async def append(self, item: T) -> None:
        """Pushes ``item`` at the back (past the capacity, the front item
        is dropped)."""
        await self._native.push_back(item)

    async def appendleft(self, item: T) -> None:
        """Pushes ``item`` at the front (past the capacity, the back item
        is dropped)."""
        await self._native.push_front(item)

    async def pop(self) -> Optional[T]:
        """Removes and returns the back item (None when empty)."""
        return await self._native.pop_back()  # type: ignore[no-any-return]

    async def popleft(self) -> Optional[T]:
        """Removes and returns the front item (None when empty)."""
        return await self._native.pop_front()  # type: ignore[no-any-return]

    async def peek(self) -> Optional[T]:
        """The back item (None when empty)."""
        return await self._native.peek_back()  # type: ignore[no-any-return]

    async def peekleft(self) -> Optional[T]:
        """The front item (None when empty)."""
        return await self._native.peek_front()  # type: ignore[no-any-return]

    async def get(self, index: int) -> Optional[T]:
        """The item at ``index`` (negative counts from the back), or None
        out of range."""
        _check_index(index, "DequeState.get")
        return await self._native.get(index)  # type: ignore[no-any-return]

    async def size(self) -> int:
        """The number of items."""
        return await self._native.len()  # type: ignore[no-any-return]

    async def is_empty(self) -> bool:
        """Whether the deque has no item."""
        return bool(await self._native.is_empty())

    def values(self, direction: Union[Direction, str] = Direction.FORWARD) -> AsyncIterator[T]:
        """The items from the front (or from the back)."""
        return _StateScan(self._native.scan(_token(direction)))

    def __aiter__(self) -> AsyncIterator[T]:
        return self.values()


# The readers of published state live in prosody.published (which uses the
# scans above); they are this module's names too.
from prosody.published import PublishedDeque, PublishedMap, PublishedValue  # noqa: E402
