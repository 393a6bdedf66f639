"""Prosody: Kafka consumer/producer with per-key ordering, durable per-key
timers and failure handling, over the C library libprosody.

See the package README for the quick start and the deviations from the
original package.
"""

import atexit

from prosody.errors import (
    EventHandlerError,
    PermanentError,
    ProsodyError,
    ProsodyPermanentError,
    ProsodyTransientError,
    TransientError,
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

__all__ = [
    "AdminClient",
    "Context",
    "EventHandler",
    "EventHandlerError",
    "ExciseMessage",
    "JSONValue",
    "Message",
    "PermanentError",
    "ProsodyClient",
    "ProsodyError",
    "ProsodyPermanentError",
    "ProsodyTransientError",
    "Timer",
    "TransientError",
    "flush_telemetry",
    "permanent",
    "shutdown_telemetry",
    "transient",
]

# Spans still queued at exit are exported, as the original does.
atexit.register(shutdown_telemetry)

__version__ = "0.2.0"
