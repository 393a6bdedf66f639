"""Prosody: Kafka consumer/producer with per-key ordering, durable per-key
timers and failure handling, over the C library libprosody.

See the package README for the quick start and the deviations from the
original package.
"""

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
from prosody.message import JSONValue, Message
from prosody.timer import Timer
from prosody.prosody import AdminClient, ProsodyClient
from prosody.context import Context
from prosody.handler import EventHandler

__all__ = [
    "AdminClient",
    "Context",
    "EventHandler",
    "EventHandlerError",
    "JSONValue",
    "Message",
    "PermanentError",
    "ProsodyClient",
    "ProsodyError",
    "ProsodyPermanentError",
    "ProsodyTransientError",
    "Timer",
    "TransientError",
    "permanent",
    "transient",
]

__version__ = "0.2.0"
