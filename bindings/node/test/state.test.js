'use strict';
// What the host is told when the consumer cannot start (an error line on
// the logger, ConsumerState.ConfigurationFailed), that a taken probe port
// leaves the consumer running, and that a handler may have only onTimer
// (the specification makes both methods optional).
const test = require('node:test');
const assert = require('node:assert');
const http = require('node:http');
const net = require('node:net');
const { ProsodyClient, ConsumerState } = require('..');
const { unique, Recorder, freshTopic, clientFactory, recordingLogger, waitUntil } = require('./helpers');

function get(port, path) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

test('a consumer that cannot start logs an error and reports ConfigurationFailed', async () => {
  const { logger, lines } = recordingLogger();
  // Timers outside mock mode need Cassandra; no cassandraNodes is given.
  const c = new ProsodyClient({ bootstrapServers: '127.0.0.1:1', groupId: unique('g'), subscribedTopics: 'orders',
                                probePort: null, sourceSystem: 'node-tests', logger });
  assert.strictEqual(await c.consumerState(), ConsumerState.Configured);
  await assert.rejects(c.subscribe({ onMessage: async () => {}, onTimer: async () => {} }),
                       (e) => e instanceof RangeError && /cassandra_nodes/.test(e.message));
  assert.strictEqual(await c.consumerState(), ConsumerState.ConfigurationFailed);
  // Given to the logger before the promise settled.
  const errors = lines.filter(([m, t]) => m === 'error' && t.startsWith('prosody::consumer: '));
  assert.strictEqual(errors.length, 1, JSON.stringify(lines));
  assert.match(errors[0][1], /did not start: .*cassandra_nodes/);
});

test('a taken probe port leaves the consumer running, with an error line', async (t) => {
  const taken = net.createServer(); // as another HTTP server of the app would
  await new Promise((r) => taken.listen(0, '0.0.0.0', r));
  t.after(() => taken.close());
  const port = taken.address().port;
  const { logger, lines } = recordingLogger();
  const make = clientFactory(t);
  const c = make({ groupId: unique('g'), subscribedTopics: await freshTopic(1), probePort: port, logger });
  await c.subscribe({ onMessage: async () => {} });
  assert.strictEqual(await c.consumerState(), ConsumerState.Running);
  assert.strictEqual(c.probePort, null);
  await waitUntil(() => lines.some(([m, s]) => m === 'error' && s.startsWith('prosody::probe: ')),
                  'the probe server\'s error line');
  const [, text] = lines.find(([m, s]) => m === 'error' && s.startsWith('prosody::probe: '));
  assert.ok(text.includes(String(port)) && text.includes('without /readyz'), text);
});

test('a handler with only onTimer is accepted; its messages are committed unhandled', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic(1);
  const group = unique('g');
  const timersOnly = make({ groupId: group, subscribedTopics: topic, probePort: 0 });
  await timersOnly.subscribe({ onTimer: async () => {} });
  for (let i = 0; i < 5; i++) await timersOnly.send(topic, `k${i}`, { i });
  // Each message is a success at once, without crossing to JavaScript.
  const successes = async () => {
    const m = /prosody_handler_calls_total\{kind="message",result="success"\} (\d+)/
      .exec(await get(timersOnly.probePort, '/metrics'));
    return m && Number(m[1]) >= 5;
  };
  await waitUntil(successes, 'five messages completed');
  await timersOnly.unsubscribe();
  // Committed: the group's next member sees only what comes after them.
  const rec = new Recorder();
  const next = make({ groupId: group, subscribedTopics: topic });
  await next.subscribe({ onMessage: async (ctx, msg) => rec.add(msg.key) });
  await next.send(topic, 'after', { i: 5 });
  await rec.waitFor((ev) => ev.includes('after'), 'the record sent after');
  assert.deepStrictEqual(rec.events, ['after']);
});

test('subscribe() checks the handler\'s methods', (t) => {
  const make = clientFactory(t);
  const c = make({ groupId: unique('g'), subscribedTopics: 'orders' });
  assert.throws(() => c.subscribe({}), (e) => e instanceof TypeError && /onMessage or an onTimer/.test(e.message));
  assert.throws(() => c.subscribe(null), TypeError);
  assert.throws(() => c.subscribe({ onMessage: 'run' }),
                (e) => e instanceof TypeError && /handler\.onMessage must be a function/.test(e.message));
  assert.throws(() => c.subscribe({ onMessage: async () => {}, onTimer: 1 }),
                (e) => e instanceof TypeError && /handler\.onTimer must be a function/.test(e.message));
});
