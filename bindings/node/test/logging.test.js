'use strict';
// Logging: a client's lines reach its `logger` option (console-compatible:
// error/warn/info/debug, each called with "prosody::<subsystem>: <message>"),
// at the client's own `log` level, on the JavaScript thread.
const test = require('node:test');
const assert = require('node:assert');
const { ProsodyClient, TransientError } = require('..');
const { unique, freshTopic, clientFactory, recordingLogger, waitUntil } = require('./helpers');

// Nothing listens on port 1: the producer's connection attempts warn.
const unreachable = (sourceSystem, log, logger) => new ProsodyClient({
  bootstrapServers: '127.0.0.1:1', sendTimeoutMs: 500, probePort: null, sourceSystem, log, logger,
});

test('two clients each log to their own logger at their own level', async () => {
  const loud = recordingLogger();
  const quiet = recordingLogger();
  const loudName = unique('log-debug');
  const quietName = unique('log-warn');
  const a = unreachable(loudName, 'debug', loud.logger);
  // The creation's lines are given before the constructor returns.
  assert.ok(loud.lines.some(([m, t]) => m === 'debug' && t.startsWith('prosody::client: client ready') &&
                                        t.includes(loudName)), JSON.stringify(loud.lines));
  const b = unreachable(quietName, 'warn', quiet.logger);
  for (const c of [a, b]) await assert.rejects(c.send('t', 'k', { x: 1 }), TransientError);
  const warned = (r) => r.lines.some(([m, t]) => m === 'warn' && /^prosody::(producer|kafka): /.test(t));
  await waitUntil(() => warned(loud) && warned(quiet), 'a warning on each logger');
  // The warn client: warnings and errors only, none of the other's lines.
  assert.ok(quiet.lines.every(([m]) => m === 'warn' || m === 'error'), JSON.stringify(quiet.lines));
  assert.ok(!quiet.lines.some(([, t]) => t.includes(loudName)));
  assert.ok(!loud.lines.some(([, t]) => t.includes(quietName)));
  for (const [, t] of [...loud.lines, ...quiet.lines]) assert.match(t, /^prosody::[a-z]+: ./);
});

test('consumer lines, the last ones before unsubscribe() settles', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic(1);
  const { logger, lines } = recordingLogger();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, log: 'info', logger });
  await c.subscribe({ onMessage: async () => {} });
  await waitUntil(() => lines.some(([, s]) => s.startsWith('prosody::engine: assigned 1 partition')),
                  'the assignment line');
  assert.ok(lines.some(([m, s]) => m === 'info' && s.startsWith('prosody::engine: assigned')));
  await c.unsubscribe();
  const stopped = lines.filter(([, s]) => s.startsWith('prosody::engine: consumer stopped'));
  assert.strictEqual(stopped.length, 1, JSON.stringify(lines));
  assert.strictEqual(stopped[0][0], 'info');
  assert.ok(!lines.some(([m]) => m === 'debug'));
});

test('the logger option is checked; console is a logger', () => {
  for (const bad of [{}, { error() {}, warn() {}, info() {} }, 'console', 42]) {
    assert.throws(() => new ProsodyClient({ mock: true, probePort: null, sourceSystem: 's', logger: bad }),
                  (e) => e instanceof TypeError && /option logger/.test(e.message));
  }
  // null/undefined: libprosody writes to stderr, as without the option.
  new ProsodyClient({ mock: true, probePort: null, sourceSystem: 's', logger: null });
  new ProsodyClient({ mock: true, probePort: null, sourceSystem: 's', logger: console, log: 'warn' });
  // The level stays libprosody's option, validated by its table.
  assert.throws(() => new ProsodyClient({ mock: true, sourceSystem: 's', logger: console, log: 'loud' }), RangeError);
});
