"""The handler interface users implement."""

from abc import ABC, abstractmethod

from prosody.context import Context
from prosody.message import Message
from prosody.timer import Timer

__all__ = ["EventHandler"]


class EventHandler(ABC):
    """Implement ``on_message`` (and ``on_timer`` when the handler schedules
    timers) as coroutines.

    For one key, events run one at a time and in order; different keys run
    concurrently, at most ``max_concurrency`` at once. Every call runs on the
    event loop that was running when ``subscribe()`` was called. Returning
    normally means success; an exception is a failure, transient unless it
    is a ``PermanentError`` (see ``prosody.permanent``).
    """

    @abstractmethod
    async def on_message(self, context: Context, message: Message) -> None:
        """Handles one record."""

    async def on_timer(self, context: Context, timer: Timer) -> None:
        """Handles a fired timer. A handler that does not override it does
        not use timers: the client then needs no timer store (no Cassandra
        outside mock mode), and scheduling raises."""
        raise NotImplementedError("on_timer is not implemented by this handler")
