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
                           ValueDefinition, _decode, _direction, _map_key, _Scan)

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


def _first(items: List[Tuple[Any, Any]]) -> Any:
    """The document of a one-item answer (None when absent)."""
    return _decode(items[0][1]) if items and items[0][1] is not None else None


class _Published:
    """A reader of a collection another service (or this one) publishes:
    every read names the Kafka key, sees committed state only, and may be
    as old as the reader's read cache allows."""

    __slots__ = ("_native", "_subsystem", "_name")

    def __init__(self, native: Any, subsystem: str, name: str) -> None:
        self._native = native
        self._subsystem = subsystem
        self._name = name

    @property
    def subsystem(self) -> str:
        """The publishing service's subsystem."""
        return self._subsystem

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._name

    def _pages(self, key: str, direction: Union[Direction, str], keys_only: bool) -> Pull:
        """The pages of a scan of ``key``'s collection."""
        token = Direction.BACKWARD.value if _direction(direction) else Direction.FORWARD.value
        scan = self._native.keys if keys_only else self._native.scan

        def pull(after: Optional[str]) -> Any:
            return scan(key, token, after=after, limit=SCAN_CHUNK)
        return pull

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._subsystem!r}/{self._name!r}>"


class PublishedValue(_Published, Generic[T]):
    """A reader of a published value collection."""

    __slots__ = ()

    async def get(self, key: str) -> Optional[T]:
        """``key``'s value, or None when absent."""
        items, _ = await self._native.get(_kafka_key(key, "PublishedValue.get"))
        return _first(items)  # type: ignore[no-any-return]


class PublishedMap(_Published, Generic[V]):
    """A reader of a published map collection."""

    __slots__ = ()

    async def get(self, key: str, map_key: str) -> Optional[V]:
        """The value at ``map_key`` in ``key``'s map, or None when absent."""
        items, _ = await self._native.get(_kafka_key(key, "PublishedMap.get"),
                                          _map_key(map_key, "PublishedMap.get"))
        return _first(items)  # type: ignore[no-any-return]

    async def get_many(self, key: str, map_keys: Sequence[str]) -> List[Optional[V]]:
        """The values at ``map_keys`` in ``key``'s map, in order (None where
        absent)."""
        keys = [_map_key(k, "PublishedMap.get_many") for k in map_keys]
        items, _ = await self._native.get_many(_kafka_key(key, "PublishedMap.get_many"), keys)
        return [_decode(doc) for _, doc in items]

    async def contains(self, key: str, map_key: str) -> bool:
        """Whether ``key``'s map has ``map_key`` (its value is not decoded)."""
        _, n = await self._native.contains_key(_kafka_key(key, "PublishedMap.contains"),
                                               _map_key(map_key, "PublishedMap.contains"))
        return bool(n)

    def items(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
              ) -> AsyncIterator[Tuple[str, V]]:
        """The (map key, value) pairs of ``key``'s map in key order."""
        return _Scan(self._pages(_kafka_key(key, "PublishedMap.items"), direction, False),
                     "items")

    def keys(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
             ) -> AsyncIterator[str]:
        """The map keys of ``key``'s map in order (values are not decoded)."""
        return _Scan(self._pages(_kafka_key(key, "PublishedMap.keys"), direction, True), "keys")

    def values(self, key: str) -> AsyncIterator[V]:
        """The values of ``key``'s map in key order."""
        return _Scan(self._pages(_kafka_key(key, "PublishedMap.values"), Direction.FORWARD,
                                 False), "values")


class PublishedDeque(_Published, Generic[T]):
    """A reader of a published deque collection."""

    __slots__ = ()

    async def get(self, key: str, index: int) -> Optional[T]:
        """The item at ``index`` of ``key``'s deque (negative counts from the
        back), or None out of range."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"PublishedDeque.get: index must be an int, "
                            f"got {type(index).__name__}")
        key = _kafka_key(key, "PublishedDeque.get")
        index = operator.index(index)
        if not -_INT64_MAX <= index <= _INT64_MAX:
            return None
        items, _ = await self._native.get(key, index)
        return _first(items)  # type: ignore[no-any-return]

    async def size(self, key: str) -> int:
        """The number of items in ``key``'s deque."""
        _, n = await self._native.len(_kafka_key(key, "PublishedDeque.size"))
        return int(n)

    async def is_empty(self, key: str) -> bool:
        """Whether ``key``'s deque has no item."""
        _, n = await self._native.is_empty(_kafka_key(key, "PublishedDeque.is_empty"))
        return int(n) == 0

    async def peek(self, key: str) -> Optional[T]:
        """The back item of ``key``'s deque (None when empty)."""
        items, _ = await self._native.peek_back(_kafka_key(key, "PublishedDeque.peek"))
        return _first(items)  # type: ignore[no-any-return]

    async def peekleft(self, key: str) -> Optional[T]:
        """The front item of ``key``'s deque (None when empty)."""
        items, _ = await self._native.peek_front(_kafka_key(key, "PublishedDeque.peekleft"))
        return _first(items)  # type: ignore[no-any-return]

    def values(self, key: str, direction: Union[Direction, str] = Direction.FORWARD
               ) -> AsyncIterator[T]:
        """The items of ``key``'s deque from the front (or from the back)."""
        return _Scan(self._pages(_kafka_key(key, "PublishedDeque.values"), direction, False),
                     "values")


async def _published(client: Any, subsystem: Any, definition: Any) -> Any:
    """``ProsodyClient.state(subsystem, definition)``: opens a reader of the
    collection (the client's native ``_published_value``, ``_map`` or
    ``_deque``) and wraps it."""
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
    native = await open_(subsystem, definition.name, read_cache=definition.read_cache)
    return cls(native, subsystem, definition.name)
