'use strict';
// Shared helpers. Two tiers, like the C suite: PROSODY_TEST_TIER=mock
// (default: embedded mock cluster, memory timers) or real (Kafka on
// PROSODY_TEST_BOOTSTRAP, Cassandra on PROSODY_TEST_CASSANDRA_NODES).
const crypto = require('crypto');
const { ProsodyClient, AdminClient } = require('..');
const { native } = require('../bindings');

const REAL = process.env.PROSODY_TEST_TIER === 'real';
const BOOTSTRAP = process.env.PROSODY_TEST_BOOTSTRAP || '127.0.0.1:9094';
const CASSANDRA = process.env.PROSODY_TEST_CASSANDRA_NODES || '127.0.0.1:9042';
const WAIT_MS = Number(process.env.PROSODY_TEST_WAIT_MS || 60000);

// No group in this suite has two members at once: in mock mode the cluster
// assigns a new group at once instead of waiting 3 s for more members (the
// real tier's broker has group.initial.rebalance.delay.ms=0 too). The
// setting is process-wide; `node --test` runs each file in a process of its
// own, and every file that joins a group requires this one. A test that
// starts members together must set the mock's 3000 ms back, or each later
// member waits for a rebalance.
if (!REAL) native.mockSetGroupInitialRebalanceDelay(0);

const unique = (p) => `${p}-${crypto.randomBytes(6).toString('hex')}`;

function baseOptions() {
  const o = { probePort: null, commitIntervalMs: 100, pollIntervalMs: 20, shutdownTimeoutMs: 10000,
              sourceSystem: 'node-tests' };
  if (REAL) Object.assign(o, { bootstrapServers: BOOTSTRAP, cassandraNodes: CASSANDRA,
                               cassandraKeyspace: 'prosody_nodetest' });
  else o.mock = true;
  return o;
}

const adminOptions = () => (REAL ? { bootstrapServers: BOOTSTRAP } : { mock: true });

// Collects what handlers saw; tests await conditions on it.
class Recorder {
  constructor() {
    this.events = [];
    this.waiters = [];
  }

  add(e) {
    this.events.push(e);
    this.waiters = this.waiters.filter((w) => !w.check());
  }

  waitFor(pred, what = 'condition', ms = WAIT_MS) {
    return new Promise((resolve, reject) => {
      const w = {
        check: () => {
          if (!pred(this.events)) return false;
          clearTimeout(w.timer);
          resolve();
          return true;
        },
      };
      if (w.check()) return;
      w.timer = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new Error(`timed out after ${ms} ms waiting for ${what}; saw ${this.events.length} events: ${
          JSON.stringify(this.events.slice(-5))}`));
      }, ms);
      this.waiters.push(w);
    });
  }

  waitCount(n) {
    return this.waitFor((ev) => ev.length >= n, `${n} events`);
  }
}

async function freshTopic(partitions = 4) {
  const name = unique('node-topic');
  await new AdminClient(adminOptions()).createTopic(name, partitions, 1);
  return name;
}

// Clients made by a test, unsubscribed at its end.
function clientFactory(t) {
  const made = [];
  t.after(async () => {
    for (const c of made) await c.unsubscribe();
  });
  return (over = {}) => {
    const c = new ProsodyClient({ ...baseOptions(), ...over });
    made.push(c);
    return c;
  };
}

// A logger that records [method, text] for each call.
function recordingLogger() {
  const lines = [];
  const logger = {};
  for (const m of ['error', 'warn', 'info', 'debug']) logger[m] = (text) => lines.push([m, text]);
  return { logger, lines };
}

// Waits until `pred` (may return a promise) holds, at most WAIT_MS.
async function waitUntil(pred, what) {
  const deadline = Date.now() + WAIT_MS;
  while (!(await pred())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

module.exports = { REAL, unique, baseOptions, adminOptions, Recorder, freshTopic, clientFactory, WAIT_MS,
                   recordingLogger, waitUntil };
