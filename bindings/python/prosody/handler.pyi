# Types of prosody.handler for type checkers: as handler.py, with
# EventHandler generic over the payload type P and the result type Response
# (both defaulting to JSONValue, PEP 696: a bare `EventHandler` is
# `EventHandler[JSONValue, JSONValue]`), as in the original's current API.
# A handler's result is ignored here (it answers requests in the original).
from abc import ABC, abstractmethod
from typing import Generic

from typing_extensions import TypeVar

from prosody.context import Context
from prosody.message import ExciseMessage, JSONValue, Message
from prosody.timer import Timer

__all__ = ["EventHandler"]

P = TypeVar("P", default=JSONValue)
Response = TypeVar("Response", default=JSONValue)

class EventHandler(ABC, Generic[P, Response]):
    @abstractmethod
    async def on_message(self, context: Context, message: Message[P]) -> Response: ...
    async def on_excise(self, context: Context, message: ExciseMessage) -> Response: ...
    async def on_timer(self, context: Context, timer: Timer) -> None: ...
