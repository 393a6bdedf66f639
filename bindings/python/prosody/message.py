"""The record a handler receives."""

from dataclasses import dataclass
from datetime import datetime
from typing import Dict, Generic, List, Optional, TypeVar, Union

__all__ = ["ExciseMessage", "JSONValue", "Message"]

JSONValue = Union[None, bool, int, float, str, List["JSONValue"], Dict[str, "JSONValue"]]

#: The payload's type (``Message[dict]``); not checked at run time. For type
#: checkers (message.pyi) it defaults to JSONValue, so a bare ``Message`` is
#: ``Message[JSONValue]``.
P = TypeVar("P")


@dataclass(frozen=True)
class Message(Generic[P]):
    """A Kafka record as Prosody delivers it to ``on_message``.

    ``payload`` is the record's JSON value decoded into Python objects
    (dict, list, str, int, float, bool, None). ``timestamp`` is an aware UTC
    datetime (``None`` only for a record without a timestamp).
    """

    topic: str
    partition: int
    offset: int
    timestamp: Optional[datetime]
    key: str
    payload: P


@dataclass(frozen=True)
class ExciseMessage:
    """An excise record as Prosody delivers it to ``on_excise``: a Kafka
    record with a key and no value (a tombstone), such as
    ``ProsodyClient.excise()`` sends. It asks the handler to delete what it
    keeps for the key; it has no ``payload``.
    """

    topic: str
    partition: int
    offset: int
    timestamp: Optional[datetime]
    key: str
