'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { ProsodyClient, AdminClient, Mode, ConsumerState } = require('..');
const bindingsExports = require('../bindings');

const mock = (o = {}) => new ProsodyClient({ mock: true, sourceSystem: 's', ...o });

test('exports', () => {
  assert.deepStrictEqual(Mode, { Pipeline: 'pipeline', LowLatency: 'low-latency', BestEffort: 'best-effort' });
  assert.strictEqual(ConsumerState.Running, 'running');
  assert.strictEqual(bindingsExports.ProsodyClient, ProsodyClient);
  assert.strictEqual(bindingsExports.AdminClient, AdminClient);
});

test('every option accepts null and undefined', () => {
  const names = ['bootstrapServers', 'groupId', 'subscribedTopics', 'allowedEvents', 'maxConcurrency',
    'maxUncommitted', 'timeoutMs', 'commitIntervalMs', 'pollIntervalMs', 'shutdownTimeoutMs',
    'stallThresholdMs', 'failureTopic', 'idempotenceCacheSize', 'idempotenceVersion', 'idempotenceTtlS',
    'slabSizeMs', 'messageSpans', 'timerSpans', 'sendTimeoutMs', 'maxRetries', 'retryBaseMs',
    'maxRetryDelayMs', 'deferEnabled', 'deferBaseMs', 'deferMaxDelayMs', 'deferFailureThreshold',
    'deferFailureWindowMs', 'deferCacheSize', 'deferSeekTimeoutMs', 'deferDiscardThreshold',
    'monopolizationEnabled', 'monopolizationThreshold', 'monopolizationWindowMs',
    'monopolizationCacheSize', 'schedulerFailureWeight', 'schedulerMaxWaitMs', 'schedulerWaitWeight',
    'schedulerCacheSize', 'telemetryEnabled', 'telemetryTopic', 'cassandraNodes', 'cassandraKeyspace',
    'cassandraUser', 'cassandraPassword', 'cassandraDatacenter', 'cassandraRack',
    'cassandraRetentionSeconds', 'probePort'];
  mock(Object.fromEntries(names.map((n) => [n, null])));
  mock(Object.fromEntries(names.map((n) => [n, undefined])));
});

test('unknown option throws naming it', () => {
  assert.throws(() => mock({ maxConcurency: 4 }), /maxConcurency/);
  assert.throws(() => mock({ timeout: 5 }), /unknown option 'timeout'/);
});

test('wrong types throw TypeError naming the option and the accepted form', () => {
  assert.throws(() => mock({ maxConcurrency: 1.5 }), (e) => e instanceof TypeError && /maxConcurrency/.test(e.message) && /integer/.test(e.message));
  assert.throws(() => mock({ mock: 1 }), (e) => e instanceof TypeError && /mock/.test(e.message));
  assert.throws(() => mock({ retryBaseMs: [1] }), (e) => e instanceof TypeError && /retryBaseMs/.test(e.message));
  assert.throws(() => mock({ subscribedTopics: ['a', 3] }), (e) => e instanceof TypeError && /subscribedTopics/.test(e.message));
  assert.throws(() => mock({ groupId: 5 }), (e) => e instanceof TypeError && /groupId/.test(e.message));
  assert.throws(() => new ProsodyClient('localhost:9092'), TypeError);
});

test('bad values throw synchronously naming the option', () => {
  for (const [name, value] of [['maxConcurrency', 0], ['mode', 'fastest'], ['retryBaseMs', -5],
    ['pollIntervalMs', 'soon'], ['bootstrapServers', 'no-port-here'], ['defererFailure', 1],
    ['probePort', 70000], ['messageSpans', 'sideways'], ['timerSpans', 'sideways']]) {
    assert.throws(() => mock({ [name]: value }), (e) => e.message.includes(name) ||
      e.message.includes(name.replace(/Ms$/, '').replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)),
    `${name}=${value}`);
  }
  assert.throws(() => mock({ messageSpans: 'sideways' }), /follows_from/);
  assert.throws(() => mock({ retryBaseMs: 10000, maxRetryDelayMs: 1000 }), /max_retry_delay/);
});

test('durations in milliseconds, seconds options, text forms and lists', async () => {
  mock({ retryBaseMs: 2, maxRetryDelayMs: 300000, timeoutMs: 250.5, stallThresholdMs: '90s',
         idempotenceTtlS: 604800, cassandraRetentionSeconds: 86400.5, sendTimeoutMs: 1500 });
  const a = mock({ groupId: 'g', subscribedTopics: 'a, b' });
  const b = mock({ groupId: 'g', subscribedTopics: ['a', 'b'], allowedEvents: ['user.', 'account.'] });
  assert.strictEqual(await a.consumerState(), 'configured');
  assert.strictEqual(await b.consumerState(), 'configured');
});

test('environment fallback', async () => {
  process.env.PROSODY_GROUP_ID = 'from-env';
  process.env.PROSODY_SUBSCRIBED_TOPICS = 't1';
  try {
    const c = new ProsodyClient({ mock: true });
    assert.strictEqual(await c.consumerState(), 'configured');
    assert.strictEqual(c.sourceSystem, 'from-env');
    assert.strictEqual(new ProsodyClient({ mock: true, groupId: 'explicit' }).sourceSystem, 'explicit');
    process.env.PROSODY_MAX_CONCURRENCY = 'zero';
    assert.throws(() => new ProsodyClient({ mock: true }), /PROSODY_MAX_CONCURRENCY/);
  } finally {
    delete process.env.PROSODY_GROUP_ID;
    delete process.env.PROSODY_SUBSCRIBED_TOPICS;
    delete process.env.PROSODY_MAX_CONCURRENCY;
  }
});

test('state, source system, probe port, unsubscribe when idle', async () => {
  const c = mock({ sourceSystem: 'src' });
  assert.strictEqual(c.sourceSystem, 'src');
  assert.strictEqual(await c.consumerState(), 'unconfigured');
  assert.strictEqual(c.probePort, null);
  assert.strictEqual(await c.assignedPartitionCount(), 0);
  assert.strictEqual(await c.isStalled(), false);
  assert.throws(() => c.subscribe({ onMessage: async () => {} }), /groupId/);
  assert.throws(() => c.subscribe({}), TypeError);
  await c.unsubscribe();
});

test('admin options validated', () => {
  assert.throws(() => new AdminClient('::nonsense::'), /bootstrap_servers|bootstrapServers/);
  assert.throws(() => new AdminClient({ bootstrapServers: 5 }), TypeError);
});

test('OTEL_EXPORTER_OTLP_PROTOCOL never breaks a client: an unknown value is one warning', () => {
  // Containers set the variable for every process, with values of other SDKs.
  const saved = process.env.OTEL_EXPORTER_OTLP_PROTOCOL;
  try {
    for (const [value, warned] of [['grpc', false], ['http/json', false], ['http/protobuf', false],
      ['bogus', true], ['grpc/2', true]]) {
      process.env.OTEL_EXPORTER_OTLP_PROTOCOL = value;
      const said = [];
      const logger = { error() {}, warn: (m) => said.push(m), info() {}, debug() {} };
      mock({ otelExporterOtlpEndpoint: 'http://127.0.0.1:1', logger });
      new AdminClient({ mock: true });
      const lines = said.filter((m) => m.includes('OTEL_EXPORTER_OTLP_PROTOCOL'));
      assert.strictEqual(lines.length, warned ? 1 : 0, `${value}: ${JSON.stringify(said)}`);
      if (warned) assert.match(lines[0], /^prosody::config: .*one of http\/protobuf, http\/json, grpc/);
    }
  } finally {
    if (saved === undefined) delete process.env.OTEL_EXPORTER_OTLP_PROTOCOL;
    else process.env.OTEL_EXPORTER_OTLP_PROTOCOL = saved;
  }
});
