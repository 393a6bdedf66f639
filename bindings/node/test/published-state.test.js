'use strict';
// Published keyed state (README "Published state"): one client owns and
// publishes collections (subsystem set, `published: true`, a handler
// writing on each message); other clients of the same process, with no
// group or subscription, read the committed state by Kafka key through
// `await client.state(subsystem, definition)`. Mock mode keeps it in
// memory, the real tier in Cassandra.
const { test, before, after } = require('node:test');
const assert = require('node:assert');
const {
  ProsodyClient, TransientError, TransientStateError, PermanentStateError, PublishedValue, PublishedMap, PublishedDeque,
  ValueState, MapState, DequeState, value, map, deque, messageValue,
} = require('..');
const { unique, freshTopic, baseOptions, waitUntil } = require('./helpers');

// The owner's collections and the readers' definitions of them.
const TOTAL = value('total', { published: true });
const ITEMS = map('items', { published: true });
const HISTORY = deque('history', { published: true });
// The number of the last message committed for a key (see write()).
const MARK = value('mark', { published: true });

class Planned extends TransientError {}

const SUBSYSTEM = unique('orders');
const pad = (i) => `k${String(i).padStart(3, '0')}`;

let owner; // the publishing client
let topic;
let fresh; // a reader client whose cache is off: it sees each commit at once
let marks; // fresh's reader of MARK
let seq = 0;
const failed = new Set(); // messages whose first attempt failed
const gates = new Map(); // message number -> { held, release }

async function collect(iter) {
  const out = [];
  for await (const x of iter) out.push(x);
  return out;
}

// The owner's handler: applies a message's ops in order, then records the
// message's number in MARK, in the same transaction.
async function onMessage(ctx, msg) {
  const { n, ops } = msg.payload;
  const v = ctx.state(TOTAL);
  const m = ctx.state(ITEMS);
  const d = ctx.state(HISTORY);
  for (const [op, a, b] of ops) {
    if (op === 'set') await v.set(a);
    else if (op === 'put') await m.set(a, b);
    else if (op === 'delete') await m.delete(a);
    else if (op === 'push') await d.push(a);
    else if (op === 'unshift') await d.unshift(a);
    else if (op === 'bulk') {
      for (let i = 0; i < a; i++) {
        await m.set(pad(i), i);
        await d.push(i);
      }
    } else if (op === 'fail-once' && !failed.has(n)) {
      failed.add(n);
      await v.set('dirty');
      await m.set(a, 'dirty');
      await d.push('dirty');
      throw new Planned('the first attempt fails after writing');
    } else if (op === 'hold') {
      await m.set(a, 'pending');
      const gate = gates.get(n);
      gate.held();
      await gate.released;
    }
  }
  await ctx.state(MARK).set(n);
}

// Sends one message of `ops` for `key` and waits until its writes are
// committed (a reader with no cache sees its number in MARK).
async function write(key, ...ops) {
  const n = ++seq;
  await owner.send(topic, key, { n, ops });
  await waitUntil(async () => (await marks.get(key)) === n, `message ${n} of key ${key} committed`);
  return n;
}

before(async () => {
  topic = await freshTopic(4); // keys spread over partitions: readers find each one's
  owner = new ProsodyClient({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic, subsystem: SUBSYSTEM,
                              stateCollections: [TOTAL, ITEMS, HISTORY, MARK], retryBaseMs: 10,
                              maxRetryDelayMs: 50, deferEnabled: false });
  await owner.subscribe({ onMessage });
  fresh = await ProsodyClient.create({ ...baseOptions(), stateReadCache: { disabled: true } });
  marks = await fresh.state(SUBSYSTEM, value('mark'));
});

after(async () => {
  await owner.unsubscribe();
  await fresh.shutdown();
});

test('definitions keep their published options; readers have the handles\' read methods', async () => {
  assert.deepStrictEqual(value('v', { published: true, readCache: { ttlMs: 250 } }),
                         { name: 'v', kind: 'value', payload: 'json', published: true, readCache: { ttlMs: 250 } });
  assert.deepStrictEqual(map('m', { readCache: false, keysetLimit: 3 }),
                         { name: 'm', kind: 'map', payload: 'json', readCache: false, keysetLimit: 3 });
  assert.deepStrictEqual(deque('d', { published: false, readCache: { disabled: true } }),
                         { name: 'd', kind: 'deque', payload: 'json', published: false, readCache: { disabled: true } });
  const methods = (C) => Object.getOwnPropertyNames(C.prototype)
    .filter((n) => n !== 'constructor' && !n.startsWith('_')).sort();
  assert.deepStrictEqual(methods(PublishedValue), ['get']);
  assert.deepStrictEqual(methods(PublishedMap), ['entries', 'get', 'getMany', 'has', 'keys', 'values']);
  assert.deepStrictEqual(methods(PublishedDeque), ['at', 'isEmpty', 'length', 'values']);
  for (const [Published, Handle] of [[PublishedValue, ValueState], [PublishedMap, MapState],
                                     [PublishedDeque, DequeState]]) {
    for (const m of methods(Published)) assert.ok(methods(Handle).includes(m), `${Handle.name}.${m}`);
  }
  const esm = await import('../index.mjs');
  for (const C of [PublishedValue, PublishedMap, PublishedDeque]) assert.strictEqual(esm[C.name], C, C.name);
});

test('a reader of each kind reads the committed state by Kafka key', async () => {
  await write('alice', ['set', { total: 42, currency: 'EUR' }], ['put', 'b', 2], ['put', 'café', { accent: true }],
              ['put', 'a', 1], ['put', 'z', 26], ['delete', 'z'], ['push', 'second'], ['push', 'third'],
              ['unshift', 'first']);
  await write('bob', ['set', 7], ['put', 'only', 'bob'], ['push', 'bob']);
  // A client made with the constructor, no group, no subscription.
  const reader = new ProsodyClient({ ...baseOptions(), stateReadCache: { disabled: true } });
  const v = await reader.state(SUBSYSTEM, value('total'));
  const m = await reader.state(SUBSYSTEM, map('items'));
  const d = await reader.state(SUBSYSTEM, deque('history'));
  assert.ok(v instanceof PublishedValue && m instanceof PublishedMap && d instanceof PublishedDeque);
  assert.deepStrictEqual([v.subsystem, v.name], [SUBSYSTEM, 'total']);

  assert.deepStrictEqual(await v.get('alice'), { total: 42, currency: 'EUR' });
  assert.strictEqual(await v.get('bob'), 7);
  // The owner's own definition serves a reader as well.
  assert.strictEqual(await (await reader.state(SUBSYSTEM, TOTAL)).get('bob'), 7);

  const entries = [['a', 1], ['b', 2], ['café', { accent: true }]];
  assert.deepStrictEqual(await m.get('alice', 'café'), { accent: true });
  assert.strictEqual(await m.get('alice', 'z'), null);
  assert.deepStrictEqual(await m.getMany('alice', ['a', 'missing', 'café', 'a']), [1, null, { accent: true }, 1]);
  assert.deepStrictEqual(await m.getMany('alice', []), []);
  assert.deepStrictEqual([await m.has('alice', 'b'), await m.has('alice', 'z'), await m.has('alice', 'cafe')],
                         [true, false, false]);
  assert.deepStrictEqual(await collect(m.entries('alice')), entries);
  assert.deepStrictEqual(await collect(m.entries('alice', 'backward')), [...entries].reverse());
  assert.deepStrictEqual(await collect(m.keys('alice')), ['a', 'b', 'café']);
  assert.deepStrictEqual(await collect(m.keys('alice', 'backward')), ['café', 'b', 'a']);
  assert.deepStrictEqual(await collect(m.values('alice')), [1, 2, { accent: true }]);
  assert.deepStrictEqual(await collect(m.values('alice', 'backward')), [{ accent: true }, 2, 1]);
  assert.deepStrictEqual(await collect(m.entries('bob')), [['only', 'bob']], 'each key its own collection');

  assert.strictEqual(await d.length('alice'), 3);
  assert.strictEqual(await d.isEmpty('alice'), false);
  assert.deepStrictEqual(
    [await d.at('alice', 0), await d.at('alice', -1), await d.at('alice', 1), await d.at('alice', -2),
     await d.at('alice', 3), await d.at('alice', -4)],
    ['first', 'third', 'second', 'second', null, null]);
  assert.deepStrictEqual(await collect(d.values('alice')), ['first', 'second', 'third']);
  assert.deepStrictEqual(await collect(d.values('alice', 'backward')), ['third', 'second', 'first']);
  assert.deepStrictEqual(await collect(d.values('bob')), ['bob']);
});

test('an unknown key reads as empty; a subsystem with no routes is a transient error, as in the original', async () => {
  await write('carol', ['set', 1], ['put', 'k', 1], ['push', 1]);
  const views = async (subsystem) => [await fresh.state(subsystem, value('total')),
                                      await fresh.state(subsystem, map('items')),
                                      await fresh.state(subsystem, deque('history'))];
  const key = 'nobody-wrote-this-key';
  const [v, m, d] = await views(SUBSYSTEM);
  assert.deepStrictEqual(
    [await v.get(key), await m.get(key, 'k'), await m.getMany(key, ['k', 'j']), await m.has(key, 'k'),
     await collect(m.entries(key)), await collect(m.keys(key, 'backward')), await collect(m.values(key)),
     await d.length(key), await d.isEmpty(key), await d.at(key, 0), await d.at(key, -1),
     await collect(d.values(key))],
    [null, null, [null, null], false, [], [], [], 0, true, null, null, []]);
  const [nv, nm, nd] = await views(unique('no-such-service'));
  for (const read of [() => nv.get('carol'), () => nm.has('carol', 'k'), () => nd.length('carol'),
                      () => collect(nm.entries('carol'))]) {
    await assert.rejects(read, (e) => e.name === 'TransientStateError' && /no publication rows/.test(e.message));
  }
});

test('readers see committed state only: never a running attempt\'s writes, nor a failed one\'s', async () => {
  await write('dave', ['set', 'committed'], ['put', 'kept', 1], ['push', 'kept']);
  const v = await fresh.state(SUBSYSTEM, value('total'));
  const m = await fresh.state(SUBSYSTEM, map('items'));
  const d = await fresh.state(SUBSYSTEM, deque('history'));
  const snapshot = async (key) => [await v.get(key), await collect(m.entries(key)), await collect(d.values(key))];

  // The first attempt writes to all three, then fails; the retry writes one entry.
  const retried = await write('dave', ['fail-once', 'dirty'], ['put', 'retried', 2]);
  assert.ok(failed.has(retried), 'the first attempt ran and failed');
  const committed = ['committed', [['kept', 1], ['retried', 2]], ['kept']];
  assert.deepStrictEqual(await snapshot('dave'), committed);

  // An attempt waiting with a write buffered: readers do not see it.
  let release;
  const gate = { held: null, released: new Promise((r) => { release = r; }) };
  const holding = new Promise((r) => { gate.held = r; });
  gates.set(seq + 1, gate); // the number write() gives the message
  const done = write('dave', ['hold', 'pending']);
  await holding;
  const during = await snapshot('dave');
  release();
  await done;
  assert.deepStrictEqual(during, committed);
  assert.strictEqual(await m.get('dave', 'pending'), 'pending', 'visible once the handler succeeded');
});

test('scans are lazy async iterators that page through large collections', async () => {
  await write('erin', ['bulk', 300]);
  const reader = await ProsodyClient.create({ ...baseOptions(), stateReadCache: { disabled: true } });
  const m = await reader.state(SUBSYSTEM, map('items'));
  const d = await reader.state(SUBSYSTEM, deque('history'));
  // Count the reads that reach the addon (its methods are read-only: shadowed).
  const native = reader._native;
  const publishedOp = native.publishedOp;
  let reads = 0;
  Object.defineProperty(native, 'publishedOp', {
    value: (...args) => {
      reads++;
      return publishedOp.apply(native, args);
    },
  });
  const it = m.entries('erin');
  assert.strictEqual(it[Symbol.asyncIterator](), it);
  assert.strictEqual(reads, 0, 'nothing is read before the first next()');
  assert.deepStrictEqual(await it.next(), { value: [pad(0), 0], done: false });
  assert.strictEqual(reads, 1);
  const rest = await collect(it);
  assert.strictEqual(reads, 2, 'two pages of at most 256');
  const all = Array.from({ length: 300 }, (_, i) => i);
  assert.deepStrictEqual(rest, all.slice(1).map((i) => [pad(i), i]));
  assert.deepStrictEqual(await collect(m.keys('erin', 'backward')), all.map(pad).reverse());
  assert.deepStrictEqual(await collect(d.values('erin')), all);
  assert.deepStrictEqual(await collect(d.values('erin', 'backward')), [...all].reverse());
  assert.strictEqual(await d.length('erin'), 300);
  assert.deepStrictEqual([await d.at('erin', 299), await d.at('erin', -300), await d.at('erin', 150)], [299, 0, 150]);
  // Leaving early closes the scan; concurrent next() calls never yield an item twice.
  const early = m.keys('erin');
  for await (const k of early) if (k === pad(10)) break;
  assert.deepStrictEqual(await early.next(), { value: undefined, done: true });
  const iter = d.values('erin');
  const got = await Promise.all(Array.from({ length: 300 }, () => iter.next()));
  assert.deepStrictEqual(got.map((x) => x.value), all);
  assert.deepStrictEqual(await iter.next(), { value: undefined, done: true });
  await reader.shutdown();
});

test('the read cache: off sees a change at once; a ttl keeps the old answer until it expires', async () => {
  await write('frank', ['set', 'v1']);
  // A client whose readers keep answers a minute, and one whose readers keep none.
  const longLived = await ProsodyClient.create({ ...baseOptions(), stateReadCache: { ttlMs: 60000 } });
  const uncached = await ProsodyClient.create({ ...baseOptions(), stateReadCache: { disabled: true } });
  const SHORT_MS = 3000;
  const readers = {
    inherited: await longLived.state(SUBSYSTEM, value('total')), // the client's minute
    off: await longLived.state(SUBSYSTEM, value('total', { readCache: false })),
    disabled: await longLived.state(SUBSYSTEM, value('total', { readCache: { disabled: true } })),
    short: await longLived.state(SUBSYSTEM, value('total', { readCache: { ttlMs: SHORT_MS } })),
    clientOff: await uncached.state(SUBSYSTEM, value('total')),
    ownMinute: await uncached.state(SUBSYSTEM, value('total', { readCache: { ttlMs: 60000 } })),
  };
  assert.strictEqual(readers.off, await longLived.state(SUBSYSTEM, value('total', { readCache: false })),
                     'the same subsystem, definition and cache give the same reader');
  assert.notStrictEqual(readers.off, readers.inherited);
  const t0 = performance.now();
  for (const [name, r] of Object.entries(readers)) assert.strictEqual(await r.get('frank'), 'v1', name);

  await owner.send(topic, 'frank', { n: ++seq, ops: [['set', 'v2']] });
  await waitUntil(async () => (await readers.off.get('frank')) === 'v2', 'readCache false to see the change');
  const seen = performance.now() - t0;
  assert.ok(seen < SHORT_MS, `the change took ${Math.round(seen)} ms to commit: too slow for this test`);
  assert.strictEqual(await readers.disabled.get('frank'), 'v2');
  assert.strictEqual(await readers.clientOff.get('frank'), 'v2', 'stateReadCache disabled: no cache');
  assert.strictEqual(await readers.inherited.get('frank'), 'v1', 'stateReadCache ttlMs: the old answer');
  assert.strictEqual(await readers.ownMinute.get('frank'), 'v1', 'the definition\'s readCache wins');
  assert.strictEqual(await readers.short.get('frank'), 'v1');
  await waitUntil(async () => (await readers.short.get('frank')) === 'v2', 'the short ttl to expire');
  const expired = performance.now() - t0;
  assert.ok(expired >= SHORT_MS, `the answer was kept ${Math.round(expired)} ms, less than its ${SHORT_MS} ms`);
  await longLived.shutdown();
  await uncached.shutdown();
});

test('reader errors: a definition that is not JSON, bad arguments, another kind', async () => {
  await write('gina', ['set', 1], ['put', 'k', 1], ['push', 1]);
  for (const def of [messageValue('total'), { name: 'total', kind: 'value', payload: 'json' }, null, 'total',
                     { ...value('total') }]) {
    await assert.rejects(fresh.state(SUBSYSTEM, def),
                         { name: 'TypeError', message: 'definition must be a JSON value, map, or deque definition' },
                         String(def));
  }
  const m = await fresh.state(SUBSYSTEM, map('items'));
  const d = await fresh.state(SUBSYSTEM, deque('history'));
  const attempts = [
    () => m.get(7, 'k'), () => m.get('gina', 7), () => m.getMany('gina', 'k'), () => d.at('gina', 1.5),
    () => d.length(undefined), () => m.entries('gina', 'sideways').next(), () => m.get('gi\0na', 'k'),
    () => fresh.state(42, value('total')), () => fresh.state('   ', value('total')),
  ];
  const errors = [];
  for (const a of attempts) errors.push(await Promise.resolve().then(a).then(() => 'resolved', (e) => e));
  for (const e of errors) assert.ok(e instanceof TransientStateError, String(e));
  assert.match(errors[0].message, /^get: the Kafka key of published "items" must be a string, got 7$/);
  assert.match(errors[1].message, /^get: a key of map "items" must be a string, got 7$/);
  assert.match(errors[3].message, /^at: index must be a safe integer, got 1\.5$/);
  assert.match(errors[5].message, /"forward" or "backward", got "sideways"/);
  assert.match(errors[6].message, /NUL/);
  // A reader whose kind is not the published one.
  const wrong = await fresh.state(SUBSYSTEM, map('total'));
  const e = await wrong.get('gina', 'k').then(() => 'resolved', (x) => x);
  assert.ok(e instanceof PermanentStateError, String(e));
  assert.match(e.message, /value/);
  assert.match(e.message, /map/);
  // A bad readCache.
  await assert.rejects(fresh.state(SUBSYSTEM, value('total', { readCache: { ttlMs: -1 } })),
                       { name: 'RangeError',
                         message: 'state: definition "total".readCache.ttlMs: expected milliseconds (a number >= 0), ' +
                                  'got -1' });
  await assert.rejects(fresh.state(SUBSYSTEM, value('total', { readCache: { ttlMs: 1, disabled: true } })),
                       /readCache: cannot set both ttlMs and disabled/);
});

test('configuration: published collections need a subsystem and JSON; stateReadCache', async () => {
  const bad = [
    [{ stateCollections: [value('p', { published: true })] },
     'published: collection "p" is published, which needs the option subsystem (PROSODY_SUBSYSTEM): the name ' +
     'readers give to find it'],
    [{ subsystem: 's', stateCollections: [{ name: 'm', kind: 'value', payload: 'message', published: true }] },
     'stateCollections[0].published: only JSON collections can be published ("m" holds messages)'],
    [{ stateReadCache: { ttlMs: 5, disabled: true } }, 'stateReadCache: cannot set both ttlMs and disabled'],
    [{ stateReadCache: { ttlMs: 0 } }, /^option stateReadCache: .*state_read_cache.*out of range/],
    [{ stateReadCache: 'soon' }, /^option stateReadCache: .*state_read_cache/],
    [{ stateReadCache: { ttl: 5 } }, "stateReadCache: unknown field 'ttl' (ttlMs, disabled)"],
    [{ stateReadCache: 5000 }, 'stateReadCache: expected { ttlMs?: number, disabled?: boolean }, got 5000'],
    [{ stateCollections: [value('r', { readCache: { ttlMs: -1 } })] },
     'stateCollections[0].readCache.ttlMs: expected milliseconds (a number >= 0), got -1'],
    [{ stateCollections: [value('r', { readCache: true })] },
     'stateCollections[0].readCache: expected { ttlMs?: number, disabled?: boolean }, got true'],
  ];
  for (const [over, message] of bad) {
    const options = { ...baseOptions(), groupId: 'g', subscribedTopics: 't', ...over };
    const matches = (e) => e instanceof Error &&
      (typeof message === 'string' ? e.message === message : message.test(e.message));
    assert.throws(() => new ProsodyClient(options), matches, String(message));
    await assert.rejects(ProsodyClient.create(options), matches, String(message));
  }
  // Libprosody's errors are its configuration errors: a RangeError with the code.
  assert.throws(() => new ProsodyClient({ ...baseOptions(), stateCollections: [value('p', { published: true })] }),
                (e) => e instanceof RangeError && e.code === 'PROSODY_ERR_CONFIG');
  assert.throws(() => messageValue('m', { published: true }), /unknown option 'published'/);
  // Accepted: each form of stateReadCache, published collections with a subsystem.
  for (const stateReadCache of [{ ttlMs: 250 }, { disabled: true }, { disabled: false }, {}, '2s', 'none', null]) {
    new ProsodyClient({ ...baseOptions(), stateReadCache });
  }
  const ok = await ProsodyClient.create({ ...baseOptions(), subsystem: 'svc', stateCollections: [
    value('a', { published: true, readCache: false }), map('b', { published: true, readCache: { ttlMs: 10 } }),
    deque('c', { published: true, readCache: { disabled: true } })] });
  await ok.shutdown();
});
