"""Error classes of the handler contract and of the client's own calls.

A handler signals how its failure should be treated by the exception it
raises: ``PermanentError`` (retrying will not help: the event is skipped, or
sent to the failure topic in low-latency mode) or anything else, which is
transient (retried as the mode says). The ``@permanent`` and ``@transient``
decorators classify other exception types without touching the handler's
code.

Errors of the client's own calls (``send``, timer calls, admin calls) are
``ProsodyError`` subclasses of ``RuntimeError``: ``ProsodyTransientError``
(may succeed when retried; also a ``TransientError``, so one that escapes a
handler is retried) and ``ProsodyPermanentError`` (also a ``PermanentError``).
Bad arguments and options raise ``ValueError`` or ``TypeError``.

Keyed state (``Context.state``) fails with ``StateError`` subclasses:
``PermanentStateError`` (a deploy mistake, such as an unregistered
collection: rethrown from a handler, the event is not retried) and
``TransientStateError`` (store failures, and every caller mistake: a handle
used after its attempt, a value with no JSON form; rethrown, the event is
retried, so the mistake stays visible). ``NullValueError``, a transient one,
refuses a ``None`` write.
"""

import functools
import inspect
from abc import ABC, abstractmethod
from typing import Any, Callable, Tuple, Type, TypeVar

__all__ = [
    "EventHandlerError",
    "TransientError",
    "PermanentError",
    "ProsodyError",
    "ProsodyTransientError",
    "ProsodyPermanentError",
    "StateError",
    "PermanentStateError",
    "TransientStateError",
    "NullValueError",
    "permanent",
    "transient",
]


class EventHandlerError(Exception, ABC):
    """Base of the exceptions that tell Prosody how to treat a failure."""

    @property
    @abstractmethod
    def is_permanent(self) -> bool:
        """True when retrying the event cannot succeed."""


class TransientError(EventHandlerError):
    """A failure that may go away when the event is retried."""

    @property
    def is_permanent(self) -> bool:
        return False


class PermanentError(EventHandlerError):
    """A failure that retrying will not fix."""

    @property
    def is_permanent(self) -> bool:
        return True


class ProsodyError(RuntimeError):
    """An error reported by libprosody for one of the client's calls.

    ``code`` is the C error's name (e.g. ``"PROSODY_ERR_TIMEOUT"``).
    """

    def __init__(self, message: str, code: str = "PROSODY_ERR_UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class ProsodyTransientError(ProsodyError, TransientError):
    """A client call failed in a way that may succeed when retried."""


class ProsodyPermanentError(ProsodyError, PermanentError):
    """A client call failed in a way that retrying will not fix."""


class StateError(Exception):
    """Any keyed-state failure (catch-all; see the subclasses)."""


class PermanentStateError(StateError, PermanentError):
    """A keyed-state failure that retrying cannot fix: an unregistered
    collection, or one opened as another kind than it was registered."""


class TransientStateError(StateError, TransientError):
    """A keyed-state failure that may pass on a retry: the store failed or
    timed out, or the caller made a mistake (a handle used after its
    attempt, a value with no JSON form, a bad argument)."""


class NullValueError(TransientStateError, ValueError):
    """``None`` cannot be stored: delete with ``clear()`` or ``remove()``."""


F = TypeVar("F", bound=Callable[..., Any])


def _classifier(error_class: Type[EventHandlerError],
                exception_types: Tuple[Type[BaseException], ...]) -> Callable[[F], F]:
    for t in exception_types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"{error_class.__name__.lower().replace('error', '')} "
                            f"expects exception classes, got {t!r}")
    catch = exception_types or (Exception,)

    def convert(exc: BaseException) -> BaseException:
        if isinstance(exc, EventHandlerError) or not isinstance(exc, catch):
            return exc
        wrapped = error_class(f"{type(exc).__name__}: {exc}")
        wrapped.__cause__ = exc
        return wrapped

    def decorator(func: F) -> F:
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await func(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - reclassified below
                    converted = convert(exc)
                    if converted is exc:
                        raise
                    raise converted from exc
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reclassified below
                converted = convert(exc)
                if converted is exc:
                    raise
                raise converted from exc
        return sync_wrapper  # type: ignore[return-value]

    return decorator


def permanent(*exception_types: Type[BaseException]) -> Callable[[F], F]:
    """Treat the listed exception types (all, when none is listed) raised by
    the decorated handler as permanent failures."""
    return _classifier(PermanentError, exception_types)


def transient(*exception_types: Type[BaseException]) -> Callable[[F], F]:
    """Treat the listed exception types (all, when none is listed) raised by
    the decorated handler as transient failures (the default for anything
    unclassified; useful to override a broader ``@permanent``)."""
    return _classifier(TransientError, exception_types)
