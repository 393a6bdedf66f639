"""Prosody: Kafka consumer/producer with per-key ordering, durable per-key
timers and failure handling, over the C library libprosody.

See the package README for the quick start and the deviations from the
original package.
"""

import atexit

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
    ProsodyClient,
    flush_telemetry,
    shutdown_telemetry,
)
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
