"""Published keyed state: readers of collections that a service publishes
(``ProsodyClient.state(subsystem, definition)``; see ``prosody.state``,
whose names these are too).

A collection registered with ``published=True`` by a client with the
``subsystem`` option can be read by any client (of any service sharing the
store; in mock mode, of the process) without consuming. Every read names the
Kafka key, sees committed state only, and may be as old as the reader's
read cache allows.
"""

import operator
from typing import Any, AsyncIterator, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

from prosody.errors import TransientStateError
from prosody.state import (_INT64_MAX, SCAN_CHUNK, DequeDefinition, Direction, MapDefinition, Pull,
                           ValueDefinition, _check_index, _decode, _direction, _first, _map_key,
                           _Scan, _StateScan, _token)

__all__ = ["PublishedValue", "PublishedMap", "PublishedDeque"]

T = TypeVar("T")
V = TypeVar("V")

def _kafka_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise TransientStateError(f"{what}: the key must be a str (a Kafka key), "
                                  f"got {type(key).__name__}")
    if "\0" in key:
        raise TransientStateError(f"{what}: the key cannot contain NUL (\\x00)")
    return key


class _NativePublished:
    """The layer under a published reader (``reader._native``), as in the
    original package: methods of the original's names (get, get_many,
    contains_key, len, is_empty, peek_front, peek_back; ``await scan(key,
    direction)`` and ``await keys(key, direction)`` give async iterators)
    over the C reader, whose answers are ``(items, number)`` pages. ``what``
    is the reader's class name, for messages."""

    __slots__ = ("_reader", "_what", "subsystem", "name")

    def __init__(self, reader: Any, what: str, subsystem: str, name: str) -> None:
        self._reader = reader
        self._what = what
        self.subsystem = subsystem
        self.name = name

    def _key(self, key: Any, method: str) -> str:
        return _kafka_key(key, f"{self._what}.{method}")

    async def get(self, key: str, *at: Any) -> Any:
        key = self._key(key, "get")
        if at and self._what == "PublishedMap":
            items, _ = await self._reader.get(key, _map_key(at[0], f"{self._what}.get"))
        elif at:
            _check_index(at[0], f"{self._what}.get")
            if not -_INT64_MAX <= at[0] <= _INT64_MAX:
                return None
            items, _ = await self._reader.get(key, operator.index(at[0]))
        else:
            items, _ = await self._reader.get(key)
        return _first(items)

    async def get_many(self, key: str, map_keys: Sequence[str]) -> List[Any]:
        keys = [_map_key(k, f"{self._what}.get_many") for k in map_keys]
        items, _ = await self._reader.get_many(self._key(key, "get_many"), keys)
        return [_decode(doc) for _, doc in items]

    async def contains_key(self, key: str, map_key: str) -> bool:
        _, n = await self._reader.contains_key(self._key(key, "contains"),
                                               _map_key(map_key, f"{self._what}.contains"))
        return bool(n)

    async def len(self, key: str) -> int:
        _, n = await self._reader.len(self._key(key, "size"))
        return int(n)

    async def is_empty(self, key: str) -> bool:
        _, n = await self._reader.is_empty(self._key(key, "is_empty"))
        return int(n) == 0

    async def peek_back(self, key: str) -> Any:
        items, _ = await self._reader.peek_back(self._key(key, "peek"))
        return _first(items)

    async def peek_front(self, key: str) -> Any:
        items, _ = await self._reader.peek_front(self._key(key, "peekleft"))
        return _first(items)

    def _pages(self, key: str, direction: Any, keys_only: bool) -> Pull:
        token = Direction.BACKWARD.value if _direction(direction) else Direction.FORWARD.value
        scan = self._reader.keys if keys_only else self._reader.scan

        def pull(after: Optional[str]) -> Any:
            return scan(key, token, after=after, limit=SCAN_CHUNK)
        return pull

    async def scan(self, key: str, direction: Any) -> "_Scan[Any]":
        """A map's (key, value) pairs or a deque's items."""
        shape = "items" if self._what == "PublishedMap" else "values"
        return _Scan(self._pages(self._key(key, "scan"), direction, False), shape)

    async def keys(self, key: str, direction: Any) -> "_Scan[str]":
        """A map's keys (values are not read)."""
        return _Scan(self._pages(self._key(key, "keys"), direction, True), "keys")


class _Published:
    """A reader of a collection another service (or this one) publishes:
    every read names the Kafka key, sees committed state only, and may be
    as old as the reader's read cache allows."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def subsystem(self) -> str:
        """The publishing service's subsystem."""
        return self._native.subsystem  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._native.name  # type: ignore[no-any-return]

    def _scan(self, what: str, method: str, key: str, direction: Any,
              shape: Optional[str] = None) -> Any:
        """A scan opened at its first step (nothing is read before); a bad
        key or direction is refused at once."""
        _kafka_key(key, f"{type(self).__name__}.{what}")
        _direction(direction)

        def open_() -> Any:
            return getattr(self._native, method)(key, _token(direction))
        return _StateScan(open_, shape)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {getattr(self._native, 'subsystem', None)!r}/"
                f"{getattr(self._native, 'name', None)!r}>")


class PublishedValue(_Published, Generic[T]):
    """A reader of a published value collection."""

    __slots__ = ()

    async def get(self, key: str) -> Optional[T]:
        """``key``'s value, or None when absent."""
        return await self._native.get(key)  # type: ignore[no-any-return]


class PublishedMap(_Published, Generic[V]):
    """A reader of a published map collection."""

    __slots__ = ()

    async def get(self, key: str, map_key: str) -> Optional[V]:
        """The value at ``map_key`` in ``key``'s map, or None when absent."""
        return await self._native.get(key, map_key)  # type: ignore[no-any-return]

    async def get_many(self, key: str, map_keys: Sequence[str]) -> List[Optional[V]]:
        """The values at ``map_keys`` in ``key``'s map, in order (None where
        absent)."""
        return await self._native.get_many(key, list(map_keys))  # type: ignore[no-any-return]

    async def contains(self, key: str, map_key: str) -> bool:
        """Whether ``key``'s map has ``map_key`` (its value is not decoded)."""
        return bool(await self._native.contains_key(key, map_key))

    def items(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
              ) -> AsyncIterator[Tuple[str, V]]:
        """The (map key, value) pairs of ``key``'s map in key order."""
        return self._scan("items", "scan", key, direction)  # type: ignore[no-any-return]

    def keys(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
             ) -> AsyncIterator[str]:
        """The map keys of ``key``'s map in order (values are not decoded)."""
        return self._scan("keys", "keys", key, direction)  # type: ignore[no-any-return]

    def values(self, key: str) -> AsyncIterator[V]:
        """The values of ``key``'s map in key order."""
        return self._scan(  # type: ignore[no-any-return]
            "values", "scan", key, Direction.FORWARD, "value")


class PublishedDeque(_Published, Generic[T]):
    """A reader of a published deque collection."""

    __slots__ = ()

    async def get(self, key: str, index: int) -> Optional[T]:
        """The item at ``index`` of ``key``'s deque (negative counts from the
        back), or None out of range. A negative index is resolved against
        the deque's size, read first (both reads go through the read
        cache)."""
        _check_index(index, "PublishedDeque.get")
        if index < 0:
            index += await self._native.len(key)
            if index < 0:
                return None
        return await self._native.get(key, index)  # type: ignore[no-any-return]

    async def size(self, key: str) -> int:
        """The number of items in ``key``'s deque."""
        return int(await self._native.len(key))

    async def is_empty(self, key: str) -> bool:
        """Whether ``key``'s deque has no item."""
        return bool(await self._native.is_empty(key))

    async def peek(self, key: str) -> Optional[T]:
        """The back item of ``key``'s deque (None when empty)."""
        return await self._native.peek_back(key)  # type: ignore[no-any-return]

    async def peekleft(self, key: str) -> Optional[T]:
        """The front item of ``key``'s deque (None when empty)."""
        return await self._native.peek_front(key)  # type: ignore[no-any-return]

    def values(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
               ) -> AsyncIterator[T]:
        """The items of ``key``'s deque from the front (or from the back)."""
        return self._scan("values", "scan", key, direction)  # type: ignore[no-any-return]


async def _published(client: Any, subsystem: Any, definition: Any) -> Any:
    """``ProsodyClient.state(subsystem, definition)``: opens a reader of the
    collection with the client's ``_published_value``, ``_map`` or
    ``_deque`` and wraps what it gives."""
    cls: Any
    if isinstance(definition, ValueDefinition):
        open_, cls = client._published_value, PublishedValue
    elif isinstance(definition, MapDefinition):
        open_, cls = client._published_map, PublishedMap
    elif isinstance(definition, DequeDefinition):
        open_, cls = client._published_deque, PublishedDeque
    else:
        raise TypeError("definition must be a JSON ValueDefinition, MapDefinition, or "
                        "DequeDefinition")
    if not isinstance(subsystem, str):
        raise TypeError(f"subsystem: expected a str, got {type(subsystem).__name__}")
    return cls(await open_(subsystem, definition.name, read_cache=definition.read_cache))


async def _open_native(native_client: Any, what: str, subsystem: str, name: str,
                       read_cache: Any) -> _NativePublished:
    """``ProsodyClient._published_value`` (``_map``, ``_deque``): the native
    client's C reader (``what`` names the kind), under the layer the
    readers call."""
    method = {"PublishedValue": "_published_value", "PublishedMap": "_published_map",
              "PublishedDeque": "_published_deque"}[what]
    reader = await getattr(native_client, method)(subsystem, name, read_cache=read_cache)
    return _NativePublished(reader, what, subsystem, name)
