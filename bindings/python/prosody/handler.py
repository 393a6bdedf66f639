"""The handler interface users implement."""

from abc import ABC, abstractmethod

from prosody.context import Context
from prosody.message import ExciseMessage, Message
from prosody.timer import Timer

__all__ = ["EventHandler"]


class EventHandler(ABC):
    """Implement ``on_message`` (and ``on_timer`` when the handler schedules
    timers, ``on_excise`` for excise records) as coroutines.

    For one key, events run one at a time and in order; different keys run
    concurrently, at most ``max_concurrency`` at once. Every call runs on the
    event loop that was running when ``subscribe()`` was called. Returning
    normally means success; an exception is a failure, transient unless it
    is a ``PermanentError`` (see ``prosody.permanent``).

    ``EventHandler[P]`` and ``EventHandler[P, R]`` may be written for the
    payload and result types; they are not checked at run time.
    """

    def __class_getitem__(cls, params: object) -> type:
        return cls

    @abstractmethod
    async def on_message(self, context: Context, message: Message) -> None:
        """Handles one record."""

    async def on_excise(self, context: Context, message: ExciseMessage) -> None:
        """Handles an excise record: a record with a key and no value (a
        tombstone), which asks to delete what the handler keeps for the key.
        Prosody itself deletes nothing (timers included). It runs in the
        key's order, with the results and retries of ``on_message``.

        A client made by ``await ProsodyClient.create()`` requires a handler
        that overrides it (``subscribe()`` raises ``TypeError`` otherwise).
        For a client made by ``ProsodyClient(...)`` (the 0.2 contract) a
        handler that does not override it does not receive excise records:
        they are committed past, as before excise records existed."""
        raise NotImplementedError("on_excise is not implemented by this handler")

    async def on_timer(self, context: Context, timer: Timer) -> None:
        """Handles a fired timer. A handler that does not override it does
        not use timers: the client then needs no timer store (no Cassandra
        outside mock mode), and scheduling raises."""
        raise NotImplementedError("on_timer is not implemented by this handler")
