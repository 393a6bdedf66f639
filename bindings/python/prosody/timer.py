"""The timer a handler receives."""

from dataclasses import dataclass
from datetime import datetime

__all__ = ["Timer"]


@dataclass(frozen=True)
class Timer:
    """A fired timer, delivered to ``on_timer``: the key it belongs to and the
    (whole-second, aware UTC) time it was scheduled for."""

    key: str
    time: datetime
