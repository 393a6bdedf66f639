'use strict';
// The current API beside the 0.1 one: `await ProsodyClient.create()`, excise
// records, shutdown(), telemetry flush and shutdown, the loader option names,
// and what the way a client was built decides (README: "Two contracts").
// Cases of the original's own suite are named after its tests.
const test = require('node:test');
const assert = require('node:assert');
const prosody = require('..');
const { ProsodyClient, ConsumerState, ProsodyError } = prosody;
const { unique, Recorder, freshTopic, baseOptions } = require('./helpers');

const full = (rec) => ({
  onMessage: async (ctx, m) => rec.add({ kind: 'message', key: m.key, offset: m.offset, payload: m.payload }),
  onExcise: async (ctx, m) => rec.add({ kind: 'excise', key: m.key, offset: m.offset, topic: m.topic,
                                        partition: m.partition, timestamp: m.timestamp,
                                        hasPayload: 'payload' in m }),
  onTimer: async () => {},
});

async function produce(topic) {
  const p = await ProsodyClient.create({ ...baseOptions(), sourceSystem: unique('producer') });
  await p.send(topic, 'k', { n: 1 });
  await p.excise(topic, 'k');
  await p.send(topic, 'k', { n: 2 });
  await p.shutdown();
}

test('exports the telemetry and lifecycle APIs', () => {
  assert.strictEqual(typeof prosody.flushTelemetry, 'function');
  assert.strictEqual(typeof prosody.shutdownTelemetry, 'function');
  assert.strictEqual(typeof ProsodyClient.create, 'function');
  assert.strictEqual(ConsumerState.Shutdown, 'shut-down');
  // No exporter: a no-op (shutdownTelemetry is for good: not called here).
  prosody.flushTelemetry();
});

test('create() reports bad options by rejecting', async () => {
  await assert.rejects(ProsodyClient.create({ mock: true, noSuchOption: 1 }), /unknown option 'noSuchOption'/);
  await assert.rejects(ProsodyClient.create({ mock: true, loaderCacheSize: 1, deferCacheSize: 2 }),
                       /loaderCacheSize and deferCacheSize \(the old name of loaderCacheSize\)/);
});

test('create() runs off the event loop', async () => {
  // Made on libuv's pool: its promise settles in a later turn of the loop,
  // never within the microtasks of the call (as a construction on the JS
  // thread would).
  let settled = false;
  const made = ProsodyClient.create({ ...baseOptions() });
  made.then(() => { settled = true; }, () => { settled = true; });
  for (let i = 0; i < 10; i++) await Promise.resolve();
  assert.strictEqual(settled, false, 'create() settled within the microtasks of the call');
  const c = await made;
  assert.strictEqual(c.sourceSystem, 'node-tests');
  await c.shutdown();
});

for (const name of ['onMessage', 'onExcise', 'onTimer']) {
  test(`rejects a missing ${name} handler before native subscription`, async () => {
    // The original's test of the same name.
    const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: unique('t') });
    const handler = full(new Recorder());
    delete handler[name];
    await assert.rejects(c.subscribe(handler), { name: 'TypeError', message: `EventHandler.${name} must be a function` });
    assert.strictEqual(await c.consumerState(), ConsumerState.Configured);
    await c.shutdown();
  });
}

test('sends and receives an excise record, in its key order, offsets bigint', async () => {
  // The original's "sends and receives an excise record".
  const topic = await freshTopic(1);
  await produce(topic);
  const rec = new Recorder();
  const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe(full(rec));
  await rec.waitCount(3);
  assert.deepStrictEqual(rec.events.map((e) => e.kind), ['message', 'excise', 'message']);
  const x = rec.events[1];
  assert.strictEqual(x.offset, 1n);
  assert.strictEqual(typeof rec.events[0].offset, 'bigint');
  assert.strictEqual(x.topic, topic);
  assert.strictEqual(x.partition, 0);
  assert.ok(x.timestamp instanceof Date);
  assert.strictEqual(x.hasPayload, false);
  await c.shutdown();
});

test('a 0.1 client: onExcise optional, offsets numbers', async () => {
  const topic = await freshTopic(1);
  await produce(topic);
  const rec = new Recorder();
  const c = new ProsodyClient({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({ onMessage: async (ctx, m) => rec.add({ offset: m.offset, payload: m.payload }) });
  await rec.waitCount(2);
  assert.deepStrictEqual(rec.events, [{ offset: 0, payload: { n: 1 } }, { offset: 2, payload: { n: 2 } }]);
  await c.unsubscribe();
  // The same contract takes excise records when the handler has onExcise.
  const rec2 = new Recorder();
  const c2 = new ProsodyClient({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic });
  await c2.subscribe(full(rec2));
  await rec2.waitCount(3);
  assert.deepStrictEqual(rec2.events.map((e) => [e.kind, e.offset]), [['message', 0], ['excise', 1], ['message', 2]]);
  await c2.unsubscribe();
});

test('shutdown is shared, idempotent, and refuses later calls', async () => {
  const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: unique('t') });
  await c.subscribe(full(new Recorder()));
  const a = c.shutdown();
  assert.strictEqual(c.shutdown(), a);
  await a;
  await c.shutdown();
  assert.strictEqual(await c.consumerState(), ConsumerState.Shutdown);
  await assert.rejects(c.send('t', 'k', {}), (e) => e instanceof ProsodyError && /shut down/.test(e.message));
  await assert.rejects(c.excise('t', 'k'), (e) => e instanceof ProsodyError && /shut down/.test(e.message));
  await assert.rejects(c.subscribe(full(new Recorder())), /shut down/);
});

test('consumerState() rejects after a failed start under create(), reports it under the constructor', async (t) => {
  // A consumer that cannot start: timers outside mock mode need Cassandra.
  const opts = { bootstrapServers: '127.0.0.1:1', groupId: unique('g'), subscribedTopics: 'orders',
                 probePort: null, sourceSystem: unique('s'), logger: { error() {}, warn() {}, info() {}, debug() {} } };
  const c = await ProsodyClient.create(opts);
  await assert.rejects(c.subscribe(full(new Recorder())));
  await assert.rejects(c.consumerState(), /consumer configuration failed: .*cassandra_nodes/);
  await c.shutdown();
  const old = new ProsodyClient(opts);
  await assert.rejects(old.subscribe(full(new Recorder())));
  assert.strictEqual(await old.consumerState(), ConsumerState.ConfigurationFailed);
});

test('loader options and their old names', async () => {
  const c = await ProsodyClient.create({ mock: true, sourceSystem: 's', loaderCacheSize: 10,
                                        loaderSeekTimeoutMs: 5000, loaderDiscardThreshold: 3 });
  await c.shutdown();
  const old = new ProsodyClient({ mock: true, sourceSystem: 's', deferCacheSize: 10, deferSeekTimeoutMs: 5000,
                                  deferDiscardThreshold: 3 });
  await old.shutdown();
});

test('timers and excise records under create(): onExcise clears the key', async () => {
  // The original's timer tests run on create()'s clients; here an excise
  // record clears the key's timers, as its examples do.
  const topic = await freshTopic(1);
  await produce(topic);
  const rec = new Recorder();
  const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    async onMessage(ctx, m) {
      if (m.payload.n === 1) { // far off: it must be cleared, not fired
        await ctx.schedule(new Date(Date.now() + 300000));
        rec.add(['message', 1, (await ctx.scheduled()).length]);
      } else {
        await ctx.schedule(new Date());
        rec.add(['message', 2]);
      }
    },
    async onExcise(ctx, m) {
      await ctx.clearScheduled();
      rec.add(['excise', m.key, (await ctx.scheduled()).length]);
    },
    async onTimer(ctx, timer) {
      rec.add(['timer', timer.key]);
    },
  });
  await rec.waitFor((ev) => ev.some((e) => e[0] === 'timer'), 'the timer of the second message');
  assert.deepStrictEqual(rec.events.slice(0, 3), [['message', 1, 1], ['excise', 'k', 0], ['message', 2]]);
  await c.shutdown();
});
