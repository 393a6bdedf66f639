"""Helpers the native module calls (not part of the public API)."""

import contextvars
import logging
from typing import Any, Dict, Generator, List, Optional, Tuple

__all__ = ["ConsumerState", "Ready", "trace_headers", "handler_context", "forward_logs", "TRACE",
           "create_client", "shutdown_client"]

#: The `logging` level of libprosody's TRACE lines (below DEBUG), named
#: "TRACE" unless the application already named level 5.
TRACE = 5
if logging.getLevelName(TRACE) == f"Level {TRACE}":
    logging.addLevelName(TRACE, "TRACE")

# libprosody's levels (prosody_log_level_t) as `logging` levels.
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: TRACE}


def forward_logs(lines: List[Tuple[int, str, str]], dropped: int,
                 source_system: Optional[str]) -> None:
    """Logs a client's lines, (level, subsystem, message) as libprosody gave
    them, to the loggers ``prosody.<subsystem>``; each record carries the
    client's ``source_system``. ``dropped`` lines did not fit the queue."""
    extra = {"source_system": source_system}
    for level, subsystem, message in lines:
        logging.getLogger(f"prosody.{subsystem}").log(_LEVELS.get(level, logging.INFO),
                                                      message, extra=extra)
    if dropped:
        logging.getLogger("prosody").warning(
            "%d log line(s) dropped: the client logged faster than its event loop "
            "forwarded them", dropped, extra=extra)


class ConsumerState(str):
    """The consumer's state: a ``str`` that can also be awaited.

    ``await client.consumer_state()`` (the original package's form) and
    ``client.consumer_state() == "running"`` both work.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, str]:
        if False:  # pragma: no cover - makes this a generator
            yield None
        return str(self)


try:  # OpenTelemetry is optional: without it nothing is traced.
    from opentelemetry import context as _otel_context
    from opentelemetry import propagate as _otel_propagate
    from opentelemetry import trace as _otel_trace

    OTEL = True
except ImportError:  # pragma: no cover - depends on the environment
    OTEL = False


def trace_headers() -> Optional[Tuple[Optional[str], Optional[str], Optional[str]]]:
    """The current context as (traceparent, tracestate, baggage), or None."""
    if not OTEL:
        return None
    carrier: Dict[str, str] = {}
    _otel_propagate.inject(carrier)
    if not carrier:
        return None
    return (carrier.get("traceparent"), carrier.get("tracestate"), carrier.get("baggage"))


def handler_context(traceparent: Optional[str], tracestate: Optional[str],
                    baggage: Optional[str], follows_from: bool,
                    name: str, attributes: Dict[str, Any]) -> Optional[Tuple[contextvars.Context, Any]]:
    """A contextvars.Context in which a handler runs under a span named
    ``name``: a child of the record's trace context, or (``follows_from``)
    the root of a new trace with a link to it. Returns (context, span), or
    None when OpenTelemetry is not installed."""
    if not OTEL:
        return None
    carrier: Dict[str, str] = {}
    if traceparent:
        carrier["traceparent"] = traceparent
    if tracestate:
        carrier["tracestate"] = tracestate
    if baggage:
        carrier["baggage"] = baggage
    extracted = _otel_propagate.extract(carrier) if carrier else None
    tracer = _otel_trace.get_tracer("prosody")
    if follows_from:
        links: List[Any] = []
        if extracted is not None:
            parent = _otel_trace.get_current_span(extracted).get_span_context()
            if parent.is_valid:
                links.append(_otel_trace.Link(parent))
        span = tracer.start_span(name, context=_otel_context.Context(), links=links,
                                 kind=_otel_trace.SpanKind.CONSUMER, attributes=attributes)
    else:
        span = tracer.start_span(name, context=extracted,
                                 kind=_otel_trace.SpanKind.CONSUMER, attributes=attributes)
    run_in = contextvars.copy_context()
    token_ctx = _otel_trace.set_span_in_context(span, extracted if not follows_from else None)
    run_in.run(_otel_context.attach, token_ctx)
    return run_in, span


class Ready:
    """An awaitable that holds a value already known (no event loop needed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        if False:  # pragma: no cover - makes this a generator
            yield None
        return self.value

    def __repr__(self) -> str:
        return f"<prosody awaitable of {self.value!r}>"


async def run_after(loop: Any, first: Any, fn: Any) -> None:
    """Runs the blocking ``fn`` on the loop's executor once ``first`` (a
    subscribe still starting) has finished, whatever its outcome: an
    unsubscribe must not overtake the subscribe it stops."""
    if first is not None:
        try:
            await first
        except BaseException:  # noqa: BLE001 - its caller sees it
            pass
    await loop.run_in_executor(None, fn)


async def create_client(client: Any, options: Any) -> Any:
    """``ProsodyClient.create()``'s body: runs the construction, which may
    wait (the mock cluster's start, the logger), on the loop's executor,
    so the loop goes on meanwhile. Nothing happens before it is awaited."""
    import asyncio
    import functools

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, functools.partial(client.__init__, **(options or {})))
    return client


async def shutdown_client(client: Any, blocking: Any) -> None:
    """``shutdown()``'s body: stops the consumer (if subscribed), then shuts
    the client down on the loop's executor (it waits for the records still
    being sent)."""
    import asyncio

    await client.unsubscribe()
    await asyncio.get_running_loop().run_in_executor(None, blocking)
