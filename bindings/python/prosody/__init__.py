"""Prosody: Kafka consumer/producer with per-key ordering, durable per-key
timers and failure handling, over the C library libprosody.

See the package README for the quick start and the deviations from the
original package.
"""

import atexit
from typing import TYPE_CHECKING, Any

from prosody.errors import (
    EventHandlerError,
    NullValueError,
    PermanentError,
    PermanentStateError,
    ProsodyError,
    ProsodyPermanentError,
    ProsodyTransientError,
    StateError,
    TransientError,
    TransientStateError,
    permanent,
    transient,
)
from prosody.message import ExciseMessage, JSONValue, Message
from prosody.timer import Timer
from prosody.prosody import (
    AdminClient,
    flush_telemetry,
    shutdown_telemetry,
)
from prosody.prosody import ProsodyClient as _NativeProsodyClient
from prosody.context import Context
from prosody.handler import EventHandler
from prosody.request import (
    Failure,
    FormatMismatch,
    HandlerError,
    MalformedResponse,
    Outcome,
    ResponseError,
    Success,
    Timeout,
)
from prosody import state
from prosody.state import (
    DequeDefinition,
    DequeState,
    Direction,
    MapDefinition,
    MapState,
    MessageDequeDefinition,
    MessageMapDefinition,
    MessageValueDefinition,
    PublishedDeque,
    PublishedMap,
    PublishedValue,
    ValueDefinition,
    ValueState,
)

if TYPE_CHECKING:  # type checkers read the native class's stub (prosody.pyi)
    from prosody.prosody import ProsodyClient
else:
    from prosody.published import _open_native, _published

    class ProsodyClient:
        """A Kafka producer and consumer (prosody/prosody.pyi documents the
        methods). As in the original package, this class wraps the native
        client, ``_NativeProsodyClient`` (``prosody.prosody.ProsodyClient``),
        which it keeps as ``_native`` and to which it hands every attribute
        it does not define; published state (``state()``) is opened here.

        ``await ProsodyClient.create(**options)`` builds it with the current
        API's contract, ``ProsodyClient(**options)`` with the 0.2 one (see
        the package README)."""

        __slots__ = ("_native", "__weakref__")

        def __init__(self, *args: Any, **options: Any) -> None:
            self._native = _NativeProsodyClient(*args, **options)

        @classmethod
        def create(cls, *args: Any, **configuration: Any) -> Any:
            """An awaitable of a client built with ``configuration`` off the
            event loop; nothing happens before it is awaited."""
            if args:  # the native create() says why not
                _NativeProsodyClient.create(*args, **configuration)

            async def build() -> "ProsodyClient":
                client = cls.__new__(cls)
                client._native = await _NativeProsodyClient.create(**configuration)
                return client
            return build()

        def __getattr__(self, name: str) -> Any:
            if name == "_native":  # not built (object.__new__): no recursion
                raise AttributeError(name)
            return getattr(self._native, name)

        async def state(self, subsystem: str, definition: Any) -> Any:
            """A reader of the collection ``definition`` (a JSON value, map or
            deque definition) as published by ``subsystem``; reads take the
            Kafka key."""
            return await _published(self, subsystem, definition)

        async def _published_value(self, subsystem: str, name: str, read_cache: Any = None) -> Any:
            return await _open_native(self._native, "PublishedValue", subsystem, name, read_cache)

        async def _published_map(self, subsystem: str, name: str, read_cache: Any = None) -> Any:
            return await _open_native(self._native, "PublishedMap", subsystem, name, read_cache)

        async def _published_deque(self, subsystem: str, name: str, read_cache: Any = None) -> Any:
            return await _open_native(self._native, "PublishedDeque", subsystem, name, read_cache)

        def __repr__(self) -> str:
            native = getattr(self, "_native", None)
            return f"<prosody.ProsodyClient {native!r}>"


# The factories too, as the original has them (`from prosody import map`).
# They stay out of __all__: a star import would hide the builtin map().
from prosody.state import deque as deque  # noqa: E402
from prosody.state import map as map  # noqa: E402,A004
from prosody.state import message_deque as message_deque  # noqa: E402
from prosody.state import message_map as message_map  # noqa: E402
from prosody.state import message_value as message_value  # noqa: E402
from prosody.state import value as value  # noqa: E402

__all__ = [
    "AdminClient",
    "Context",
    "DequeDefinition",
    "DequeState",
    "Direction",
    "EventHandler",
    "EventHandlerError",
    "ExciseMessage",
    "Failure",
    "FormatMismatch",
    "HandlerError",
    "JSONValue",
    "MalformedResponse",
    "MapDefinition",
    "MapState",
    "Message",
    "MessageDequeDefinition",
    "MessageMapDefinition",
    "MessageValueDefinition",
    "NullValueError",
    "Outcome",
    "PermanentError",
    "PermanentStateError",
    "ProsodyClient",
    "ProsodyError",
    "ProsodyPermanentError",
    "ProsodyTransientError",
    "PublishedDeque",
    "PublishedMap",
    "PublishedValue",
    "ResponseError",
    "StateError",
    "Success",
    "Timeout",
    "Timer",
    "TransientError",
    "TransientStateError",
    "ValueDefinition",
    "ValueState",
    "flush_telemetry",
    "permanent",
    "shutdown_telemetry",
    "state",
    "transient",
]

# Spans still queued at exit are exported, as the original does.
atexit.register(shutdown_telemetry)

__version__ = "0.2.0"
