# Types of prosody.message for type checkers: as message.py, with the
# payload's type variable defaulting to JSONValue (PEP 696), so that a bare
# `Message` is `Message[JSONValue]` (typing_extensions is read by type
# checkers only; the package does not need it at run time).
from dataclasses import dataclass
from datetime import datetime
from typing import Dict, Generic, List, Optional, Union

from typing_extensions import TypeVar

__all__ = ["ExciseMessage", "JSONValue", "Message"]

JSONValue = Union[None, bool, int, float, str, List["JSONValue"], Dict[str, "JSONValue"]]

P = TypeVar("P", default=JSONValue)

@dataclass(frozen=True)
class Message(Generic[P]):
    topic: str
    partition: int
    offset: int
    timestamp: Optional[datetime]
    key: str
    payload: P

@dataclass(frozen=True)
class ExciseMessage:
    topic: str
    partition: int
    offset: int
    timestamp: Optional[datetime]
    key: str
