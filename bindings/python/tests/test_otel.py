"""OpenTelemetry: the handler runs under the sender's trace (W3C headers)."""

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from conftest import unique  # noqa: E402
from prosody import EventHandler  # noqa: E402

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(p)
    yield p


class SeesSpan(EventHandler):
    def __init__(self, recorder):
        self.recorder = recorder

    async def on_message(self, context, message):
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("user-work") as span:
            await self.recorder.add((message.key, span.get_span_context(),
                                     span.parent.span_id if span.parent else None))


@pytest.mark.parametrize("spans", ["child", "follows_from"])
async def test_handler_span_links_to_sender(clients, topic, recorder, spans):
    EXPORTER.clear()
    c = clients(group_id=unique("g"), subscribed_topics=topic, message_spans=spans)
    await c.subscribe(SeesSpan(recorder))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("producer-work") as sender:
        await c.send(topic, "traced", {"x": 1})
    sender_ctx = sender.get_span_context()
    await recorder.wait_count(1)
    await asyncio.sleep(0)  # the receive span ends in the task's done callback
    key, user_ctx, user_parent = recorder.events[0]
    receive = [s for s in EXPORTER.get_finished_spans() if s.name == "prosody.receive"]
    assert len(receive) == 1
    receive = receive[0]
    assert receive.attributes["messaging.destination.name"] == topic
    assert receive.attributes["messaging.kafka.message.key"] == "traced"
    # The user's span is a child of the receive span in both modes.
    assert user_parent == receive.context.span_id
    assert user_ctx.trace_id == receive.context.trace_id
    if spans == "child":
        assert receive.context.trace_id == sender_ctx.trace_id
        assert receive.parent.span_id == sender_ctx.span_id
    else:
        assert receive.context.trace_id != sender_ctx.trace_id
        assert [link.context.span_id for link in receive.links] == [sender_ctx.span_id]


async def test_send_without_span_has_no_trace(clients, topic, recorder):
    EXPORTER.clear()
    c = clients(group_id=unique("g"), subscribed_topics=topic)
    await c.subscribe(SeesSpan(recorder))
    await c.send(topic, "untraced", {"x": 1})
    await recorder.wait_count(1)
    await asyncio.sleep(0)
    receive = [s for s in EXPORTER.get_finished_spans() if s.name == "prosody.receive"][0]
    assert receive.parent is None


@pytest.mark.parametrize("spans", ["child", "follows_from"])
async def test_handler_span_under_core_span(clients, topic, recorder, spans):
    """With OTLP export on, libprosody makes its own `send` and `receive`
    spans (here to a closed port: they are dropped, but their contexts
    exist), and the package's span is a child of the core's `receive` span,
    which already applied message_spans."""
    EXPORTER.clear()
    c = clients(group_id=unique("g"), subscribed_topics=topic, message_spans=spans,
                otel_exporter_otlp_endpoint="http://127.0.0.1:1")
    await c.subscribe(SeesSpan(recorder))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("producer-work") as sender:
        await c.send(topic, "traced", {"x": 1})
    sender_ctx = sender.get_span_context()
    await recorder.wait_count(1)
    await asyncio.sleep(0)
    receive = [s for s in EXPORTER.get_finished_spans() if s.name == "prosody.receive"][0]
    # Never linked by the package itself: the core's span did that.
    assert list(receive.links) == []
    assert receive.parent is not None
    # Its parent is the core's receive span, not the sender's span: the
    # core's send and receive spans stand between them.
    assert receive.parent.span_id != sender_ctx.span_id
    if spans == "child":
        assert receive.context.trace_id == sender_ctx.trace_id
    else:
        assert receive.context.trace_id != sender_ctx.trace_id
