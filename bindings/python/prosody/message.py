"""The record a handler receives."""

from dataclasses import dataclass
from datetime import datetime
from typing import Dict, List, Optional, Union

__all__ = ["JSONValue", "Message"]

JSONValue = Union[None, bool, int, float, str, List["JSONValue"], Dict[str, "JSONValue"]]


@dataclass(frozen=True)
class Message:
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
    payload: JSONValue
