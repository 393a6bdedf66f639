'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { ProsodyClient, PermanentError, TransientError, ProsodyTransientError, permanent, transient } = require('..');
const { unique, Recorder, freshTopic, clientFactory } = require('./helpers');

const recording = (rec) => ({ onMessage: async (ctx, msg) => rec.add(msg) });

test('send and receive payloads', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe(recording(rec));
  assert.strictEqual(await c.consumerState(), 'running');
  const payloads = [{ content: 'Hello, Kafka!', n: 1, f: 2.5, ok: true, none: null,
    nested: { list: [1, 'two', [3.5]], empty: {} } }, [1, 2, 3], 'just a string', 42, 1.25, null, false,
  { unicode: 'héllo ✓ 日本' }];
  const before = Date.now() - 5000;
  for (const [i, p] of payloads.entries()) await c.send(topic, `key-${i}`, p);
  await rec.waitCount(payloads.length);
  const byKey = new Map(rec.events.map((m) => [m.key, m]));
  for (const [i, p] of payloads.entries()) {
    const m = byKey.get(`key-${i}`);
    assert.deepStrictEqual(m.payload, p);
    assert.strictEqual(m.topic, topic);
    assert.ok(m.partition >= 0 && m.partition < 4);
    assert.ok(m.offset >= 0);
    assert.ok(m.timestamp instanceof Date && m.timestamp.getTime() > before);
  }
});

test('send errors', async (t) => {
  const make = clientFactory(t);
  const c = make();
  const cyclic = {};
  cyclic.self = cyclic;
  await assert.rejects(c.send('t', 'k', cyclic), TypeError);
  await assert.rejects(c.send('', 'k', {}), /topic/);
  await assert.rejects(c.send('t', undefined, {}), TypeError);
  const ac = new AbortController();
  ac.abort();
  await assert.rejects(c.send('t', 'k', {}, ac.signal), /abort/i);
});

test('send to an unreachable broker fails transiently', async () => {
  const c = new ProsodyClient({ bootstrapServers: '127.0.0.1:1', sendTimeoutMs: 500, probePort: null,
                                sourceSystem: 'node-tests' });
  await assert.rejects(c.send('t', 'k', { x: 1 }), (e) => e instanceof ProsodyTransientError &&
    e instanceof TransientError && e.code === 'PROSODY_ERR_TIMEOUT');
});

test('per-key order across 100 keys', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, maxConcurrency: 16 });
  await c.subscribe(recording(rec));
  const sends = [];
  for (let s = 0; s < 10; s++) for (let k = 0; k < 100; k++) sends.push(c.send(topic, `k${k}`, { seq: s }));
  await Promise.all(sends);
  await rec.waitCount(1000);
  const seen = new Map();
  for (const m of rec.events) {
    if (!seen.has(m.key)) seen.set(m.key, []);
    seen.get(m.key).push(m.payload.seq);
  }
  assert.strictEqual(seen.size, 100);
  for (const [key, seqs] of seen) assert.deepStrictEqual(seqs, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], key);
});

test('different keys run concurrently', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  let release;
  const both = new Promise((r) => { release = r; });
  const started = new Set();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx, msg) => {
      started.add(msg.key);
      if (started.size === 2) release();
      await both; // finishes only if the other key's handler runs meanwhile
      rec.add(msg.key);
    },
  });
  await c.send(topic, 'alpha', {});
  await c.send(topic, 'beta', {});
  await rec.waitCount(2);
  assert.deepStrictEqual(rec.events.sort(), ['alpha', 'beta']);
});

test('own source system is skipped', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const group = unique('g');
  const c = make({ groupId: group, subscribedTopics: topic, sourceSystem: group });
  const other = make({ sourceSystem: 'someone-else' });
  await c.subscribe(recording(rec));
  // One key, so one partition: were 'mine' not skipped, it would be handled
  // before 'theirs', which comes after it.
  await c.send(topic, 'k', { from: 'mine' });
  await other.send(topic, 'k', { from: 'theirs' });
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events.map((m) => m.payload), [{ from: 'theirs' }]);
});

function flaky(rec, raiseFor) {
  const attempts = new Map();
  return {
    attempts,
    onMessage: async (ctx, msg) => {
      const id = msg.payload.id;
      attempts.set(id, (attempts.get(id) || 0) + 1);
      const e = raiseFor(msg, attempts.get(id));
      if (e) {
        rec.add(['failed', id]);
        throw e;
      }
      rec.add(['ok', id]);
    },
  };
}

const has = (ev, s, id) => ev.some(([a, b]) => a === s && b === id);

for (const mode of ['pipeline', 'low-latency', 'best-effort']) {
  test(`permanent failure is not retried (${mode})`, async (t) => {
    const make = clientFactory(t);
    const topic = await freshTopic();
    const rec = new Recorder();
    const h = flaky(rec, (m) => (m.payload.id === 1 ? new PermanentError('bad record') : null));
    const extra = mode === 'low-latency' ? { failureTopic: unique('dlq') } : {};
    const c = make({ groupId: unique('g'), subscribedTopics: topic, mode, retryBaseMs: 10, maxRetries: 2,
                     deferEnabled: false, ...extra });
    await c.subscribe(h);
    await c.send(topic, 'same', { id: 1 });
    await c.send(topic, 'same', { id: 2 });
    await rec.waitFor((ev) => has(ev, 'ok', 2), 'the record after the failing one');
    assert.strictEqual(h.attempts.get(1), 1);
  });
}

test('transient failure retried until success in pipeline, key order kept', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const h = flaky(rec, (m, n) => (n < 3 ? new Error('not yet') : null));
  const c = make({ groupId: unique('g'), subscribedTopics: topic, retryBaseMs: 10, maxRetryDelayMs: 50,
                   deferEnabled: false });
  await c.subscribe(h);
  await c.send(topic, 'k', { id: 7 });
  await c.send(topic, 'k', { id: 8 });
  await rec.waitFor((ev) => has(ev, 'ok', 8));
  assert.strictEqual(h.attempts.get(7), 3);
  assert.deepStrictEqual(rec.events.filter(([s]) => s === 'ok').map(([, i]) => i), [7, 8]);
});

test('low-latency sends to the failure topic after maxRetries', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const dlq = unique('dlq');
  const rec = new Recorder();
  const dead = new Recorder();
  const h = flaky(rec, (m) => (m.payload.id === 1 ? new Error('down') : null));
  const c = make({ groupId: unique('g'), subscribedTopics: topic, mode: 'low-latency', failureTopic: dlq,
                   maxRetries: 2, retryBaseMs: 10, maxRetryDelayMs: 50 });
  const d = make({ groupId: unique('dlq-reader'), subscribedTopics: dlq });
  await c.subscribe(h);
  await d.subscribe(recording(dead));
  await c.send(topic, 'k', { id: 1 });
  await c.send(topic, 'k', { id: 2 });
  await rec.waitFor((ev) => has(ev, 'ok', 2));
  assert.strictEqual(h.attempts.get(1), 3);
  await dead.waitCount(1);
  assert.strictEqual(dead.events[0].key, 'k');
  assert.deepStrictEqual(dead.events[0].payload, { id: 1 });
});

test('best-effort skips a transient failure', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const h = flaky(rec, (m) => (m.payload.id === 1 ? new TransientError('flaky') : null));
  const c = make({ groupId: unique('g'), subscribedTopics: topic, mode: 'best-effort' });
  await c.subscribe(h);
  await c.send(topic, 'k', { id: 1 });
  await c.send(topic, 'k', { id: 2 });
  await rec.waitFor((ev) => has(ev, 'ok', 2));
  assert.strictEqual(h.attempts.get(1), 1);
});

test('decorators classify exceptions (as TypeScript 5 emits them, and as wrappers)', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const attempts = new Map();
  async function onMessage(ctx, msg) {
    const id = msg.payload.id;
    attempts.set(id, (attempts.get(id) || 0) + 1);
    rec.add(id);
    if (id === 1 && attempts.get(1) === 1) throw new RangeError('unclassified: transient');
    if (id === 2) throw new TypeError('classified permanent');
  }
  // What TypeScript 5 / Babel (2023-05) call for `@permanent(TypeError) onMessage() {}`.
  const decorated = permanent(TypeError, SyntaxError)(onMessage, { kind: 'method', name: 'onMessage' });
  const c = make({ groupId: unique('g'), subscribedTopics: topic, retryBaseMs: 10, deferEnabled: false });
  await c.subscribe({ onMessage: decorated });
  for (const id of [1, 2, 3]) await c.send(topic, 'k', { id });
  await rec.waitFor((ev) => ev.includes(3));
  assert.strictEqual(attempts.get(1), 2);
  assert.strictEqual(attempts.get(2), 1);

  const wrapped = transient(RangeError)(async () => { throw new RangeError('x'); });
  await assert.rejects(wrapped(), (e) => e instanceof TransientError && e.cause instanceof RangeError);
  assert.throws(() => permanent('not a class'), TypeError);
});

test('subscribe twice, resubscribe, unsubscribe right after a bare subscribe', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  c.subscribe(recording(rec)); // not awaited, as in the quick start
  assert.throws(() => c.subscribe(recording(rec)), /already subscribed/);
  await c.unsubscribe();
  assert.strictEqual(await c.consumerState(), 'configured');
  await c.subscribe(recording(rec));
  await c.send(topic, 'after', {});
  await rec.waitCount(1);
});
