"""The result types of subsystem requests, as the original's current API
names them (``prosody.request``, re-exported from ``prosody``).

A request asks named subsystems to answer a record and gives one
``Outcome`` per subsystem: ``Success(value)`` with the responder's JSON
result, or ``Failure(error)`` where ``error`` is one of the
``ResponseError`` kinds. Every kind has a ``message``: ``HandlerError``
carries the responder's error text; the other three a fixed class-level one.

Prosody-C does not serve requests yet: ``ProsodyClient.request()`` and
``request_excise()`` raise ``NotImplementedError``. These types are here so
that programs and tests written against the original import, annotate and
match on them.

Differences from the original:

* ``Outcome`` is a generic ``Union`` alias, not a ``TypeAliasType`` (which
  needs Python 3.12, or ``typing_extensions``, not a dependency here), so
  ``Outcome[dict]`` works at run time on every Python this package supports
  (3.8 and newer) and type checkers read it as the original's alias.
  ``Outcome[dict]`` is therefore the union ``Union[Success[dict], Failure]``
  itself, and ``Outcome`` has no ``__name__`` or ``__value__``.
* The dataclasses declare their ``__slots__`` themselves, since
  ``dataclass(slots=True)`` needs 3.10: instances have no ``__dict__``, as
  the original's. Being frozen, they are copied and pickled through their
  constructor (``__reduce__``).
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Generic, Tuple, TypeVar, Union

__all__ = [
    "Failure",
    "FormatMismatch",
    "HandlerError",
    "MalformedResponse",
    "Outcome",
    "ResponseError",
    "Success",
    "Timeout",
]

T = TypeVar("T")


@dataclass(frozen=True)
class HandlerError:
    """The responder's handler failed: ``message`` is its error's text."""

    __slots__ = ("message",)
    message: str


@dataclass(frozen=True)
class Timeout:
    """No response arrived before the request's deadline."""

    __slots__ = ()
    message: ClassVar[str] = "no response arrived before the deadline"


@dataclass(frozen=True)
class FormatMismatch:
    """The responder answered in another format than the requester reads."""

    __slots__ = ()
    message: ClassVar[str] = "the responder answered in another format"


@dataclass(frozen=True)
class MalformedResponse:
    """The response did not decode."""

    __slots__ = ()
    message: ClassVar[str] = "the response did not decode"


ResponseError = Union[HandlerError, Timeout, FormatMismatch, MalformedResponse]


@dataclass(frozen=True)
class Success(Generic[T]):
    """A subsystem answered: ``value`` is its handler's result."""

    __slots__ = ("value",)
    value: T


@dataclass(frozen=True)
class Failure:
    """A subsystem gave no usable answer: ``error`` says why."""

    __slots__ = ("error",)
    error: ResponseError


#: One subsystem's outcome: ``Outcome[dict]`` is ``Union[Success[dict], Failure]``.
Outcome = Union[Success[T], Failure]


def _reduce(self: Any) -> Tuple[Callable[..., Any], Tuple[Any, ...]]:
    # copy and pickle restore slots with setattr, which a frozen instance
    # refuses; they rebuild it through its constructor instead.
    return type(self), tuple(getattr(self, f.name) for f in fields(self))


for _cls in (HandlerError, Timeout, FormatMismatch, MalformedResponse, Success, Failure):
    setattr(_cls, "__reduce__", _reduce)
del _cls
