'use strict';
const test = require('node:test');
const assert = require('node:assert');
const otel = require('@opentelemetry/api');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { AsyncLocalStorageContextManager } = (() => {
  try { return require('@opentelemetry/context-async-hooks'); } catch (e) { return {}; }
})();
const { unique, Recorder, freshTopic, clientFactory } = require('./helpers');

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider();
provider.addSpanProcessor(new SimpleSpanProcessor(exporter));
provider.register(AsyncLocalStorageContextManager ? { contextManager: new AsyncLocalStorageContextManager() } : {});

for (const spans of ['child', 'follows_from']) {
  test(`handler span linked to the sender (${spans})`, async (t) => {
    exporter.reset();
    const make = clientFactory(t);
    const topic = await freshTopic();
    const rec = new Recorder();
    const c = make({ groupId: unique('g'), subscribedTopics: topic, messageSpans: spans });
    await c.subscribe({
      onMessage: async (ctx, msg) => {
        // Synchronously inside the handler the receive span is active.
        const active = otel.trace.getSpan(otel.context.active());
        rec.add(active ? active.spanContext() : null);
      },
    });
    const tracer = otel.trace.getTracer('test');
    const sender = tracer.startSpan('producer-work');
    await otel.context.with(otel.trace.setSpan(otel.context.active(), sender),
                            () => c.send(topic, 'traced', { x: 1 }));
    sender.end();
    await rec.waitCount(1);
    await new Promise((r) => setImmediate(r));
    const receive = exporter.getFinishedSpans().filter((s) => s.name === 'prosody.receive');
    assert.strictEqual(receive.length, 1);
    const r = receive[0];
    assert.strictEqual(r.attributes['messaging.destination.name'], topic);
    assert.strictEqual(r.attributes['messaging.kafka.message.key'], 'traced');
    assert.strictEqual(rec.events[0].spanId, r.spanContext().spanId);
    const s = sender.spanContext();
    if (spans === 'child') {
      assert.strictEqual(r.spanContext().traceId, s.traceId);
      assert.strictEqual(r.parentSpanId, s.spanId);
    } else {
      assert.notStrictEqual(r.spanContext().traceId, s.traceId);
      assert.deepStrictEqual(r.links.map((l) => l.context.spanId), [s.spanId]);
    }
  });
}

// With OTLP export on, libprosody makes its own send and receive spans (to a
// closed port here: dropped, but their contexts exist), and the package's
// span is a child of the core's receive span, which already applied
// messageSpans: never linked by the package itself.
for (const spans of ['child', 'follows_from']) {
  test(`handler span under the core's span (${spans})`, async (t) => {
    exporter.reset();
    const make = clientFactory(t);
    const topic = await freshTopic();
    const rec = new Recorder();
    const c = make({ groupId: unique('g'), subscribedTopics: topic, messageSpans: spans,
                     otelExporterOtlpEndpoint: 'http://127.0.0.1:1' });
    await c.subscribe({ onMessage: async () => { rec.add(true); } });
    const tracer = otel.trace.getTracer('test');
    const sender = tracer.startSpan('producer-work');
    await otel.context.with(otel.trace.setSpan(otel.context.active(), sender),
                            () => c.send(topic, 'traced', { x: 1 }));
    sender.end();
    await rec.waitCount(1);
    await new Promise((r) => setImmediate(r));
    const r = exporter.getFinishedSpans().filter((s) => s.name === 'prosody.receive')[0];
    const s = sender.spanContext();
    assert.deepStrictEqual(r.links, []);
    assert.ok(r.parentSpanId, 'a child of the core span');
    assert.notStrictEqual(r.parentSpanId, s.spanId);
    if (spans === 'child') assert.strictEqual(r.spanContext().traceId, s.traceId);
    else assert.notStrictEqual(r.spanContext().traceId, s.traceId);
  });
}
