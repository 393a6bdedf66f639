'use strict';
// Keyed state (README "Keyed state"): collections registered with
// stateCollections, opened with context.state() in a handler, read and
// written through promises; an attempt's writes are durable only when its
// handler succeeds. Mock mode keeps the state in memory, the real tier in
// Cassandra.
const test = require('node:test');
const assert = require('node:assert');
const {
  ProsodyClient, AdminClient, TransientError, PermanentError, TransientStateError, PermanentStateError, isStateError,
  value, map, deque, messageValue, messageMap, messageDeque,
} = require('..');
const { native } = require('../bindings');
const { REAL, unique, Recorder, freshTopic, clientFactory, baseOptions, adminOptions } = require('./helpers');

test('the mock group delay helper checks its argument and returns the value it replaced', { skip: REAL }, () => {
  assert.strictEqual(native.mockSetGroupInitialRebalanceDelay(250), 0); // 0 since helpers.js
  for (const bad of [-1, 300001, 1.5, NaN]) {
    assert.throws(() => native.mockSetGroupInitialRebalanceDelay(bad),
                  (e) => e instanceof RangeError && /whole milliseconds in 0\.\.=300000/.test(e.message), String(bad));
  }
  for (const bad of ['0', undefined]) {
    assert.throws(() => native.mockSetGroupInitialRebalanceDelay(bad), TypeError, String(bad));
  }
  assert.strictEqual(native.mockSetGroupInitialRebalanceDelay(0), 250);
});

// A failure a test plans: the attempt fails (and is retried); any other
// error a body throws is recorded, so a broken assertion fails the test
// instead of retrying the event for ever.
class Planned extends TransientError {}

// Runs bodies[i] for the i-th message of one key and returns what each
// returned (or {error} for what one threw), in order.
async function run(t, stateCollections, bodies, over = {}) {
  const make = clientFactory(t);
  const topic = await freshTopic(1);
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, stateCollections, retryBaseMs: 10,
                   maxRetryDelayMs: 50, deferEnabled: false, ...over });
  await c.subscribe({
    onMessage: async (ctx, msg) => {
      let r;
      try {
        r = await bodies[msg.payload.step](ctx, msg);
      } catch (e) {
        if (e instanceof Planned) throw e;
        r = { error: e };
      }
      rec.add([msg.payload.step, r]);
    },
  });
  for (let step = 0; step < bodies.length; step++) await c.send(topic, over.key || 'user-1', { step });
  await rec.waitCount(bodies.length);
  return rec.events.sort((a, b) => a[0] - b[0]).map((e) => {
    if (e[1] && e[1].error) throw e[1].error;
    return e[1];
  });
}

async function collect(iter) {
  const out = [];
  for await (const x of iter) out.push(x);
  return out;
}

const COUNTER = value('counter');
const PROFILE = map('profile');
const QUEUE = deque('queue');

test('definitions are frozen objects carrying the options that were given', () => {
  const v = value('v', { ttlSeconds: 60 });
  assert.deepStrictEqual(v, { name: 'v', kind: 'value', payload: 'json', ttlSeconds: 60 });
  assert.ok(Object.isFrozen(v));
  assert.deepStrictEqual(map('m', { keysetLimit: 0, readUncommitted: true }),
                         { name: 'm', kind: 'map', payload: 'json', readUncommitted: true, keysetLimit: 0 });
  assert.deepStrictEqual(deque('d', { capacity: 3 }), { name: 'd', kind: 'deque', payload: 'json', capacity: 3 });
  assert.deepStrictEqual(messageValue('mv'), { name: 'mv', kind: 'value', payload: 'message' });
  assert.deepStrictEqual(messageMap('mm', { keysetLimit: 5 }),
                         { name: 'mm', kind: 'map', payload: 'message', keysetLimit: 5 });
  assert.deepStrictEqual(messageDeque('md', { capacity: 2 }),
                         { name: 'md', kind: 'deque', payload: 'message', capacity: 2 });
  // keysetLimit and capacity are kept on every kind (as the original's constructors keep them):
  // registration refuses them on the wrong one ('stateCollections is validated at construction').
  assert.deepStrictEqual(value('v', { capacity: 3 }), { name: 'v', kind: 'value', payload: 'json', capacity: 3 });
  assert.throws(() => value('v', { size: 3 }), /unknown option 'size' for a value/);
  assert.throws(() => messageValue('mv', { published: true }), /unknown option 'published' for a message value/);
});

test('a value: absent, set, read back in the attempt and by the next message, cleared', async (t) => {
  const seen = await run(t, [COUNTER], [
    async (ctx) => {
      const v = ctx.state(COUNTER);
      assert.strictEqual(ctx.state(COUNTER), v, 'one handle per definition within the event');
      const before = await v.get();
      await v.set({ n: 1, tags: ['a', null], nested: { ok: true } });
      return [before, await v.get()];
    },
    async (ctx) => {
      const v = ctx.state(COUNTER);
      const committed = await v.get();
      await v.set(0); // falsy values are values
      const zero = await v.get();
      await v.clear();
      return [committed, zero, await v.get()];
    },
    async (ctx) => ctx.state(COUNTER).get(),
  ]);
  assert.deepStrictEqual(seen[0], [null, { n: 1, tags: ['a', null], nested: { ok: true } }]);
  assert.deepStrictEqual(seen[1], [{ n: 1, tags: ['a', null], nested: { ok: true } }, 0, null]);
  assert.strictEqual(seen[2], null);
});

test('a map: set, delete, has, getMany and scans in key order, both ways', async (t) => {
  const seen = await run(t, [PROFILE], [
    async (ctx) => {
      const m = ctx.state(PROFILE);
      for (const [k, v] of [['b', 2], ['café', { accent: true }], ['a', 1], ['z', 26]]) await m.set(k, v);
      await m.delete('z');
      await m.delete('never-there');
    },
    async (ctx) => {
      const m = ctx.state(PROFILE);
      return {
        forward: await collect(m.entries()),
        backward: await collect(m.entries('backward')),
        keys: await collect(m.keys()),
        keysBack: await collect(m.keys('backward')),
        values: await collect(m.values()),
        iterated: await collect(m),
        many: await m.getMany(['a', 'missing', 'café', 'a']),
        none: await m.getMany([]),
        has: [await m.has('café'), await m.has('z'), await m.has('cafe')],
        get: [await m.get('café'), await m.get('z')],
      };
    },
    async (ctx) => {
      const m = ctx.state(PROFILE);
      await m.clear();
      return [await collect(m.keys()), await m.has('a')];
    },
  ]);
  const entries = [['a', 1], ['b', 2], ['café', { accent: true }]];
  assert.deepStrictEqual(seen[1].forward, entries);
  assert.deepStrictEqual(seen[1].backward, [...entries].reverse());
  assert.deepStrictEqual(seen[1].keys, ['a', 'b', 'café']);
  assert.deepStrictEqual(seen[1].keysBack, ['café', 'b', 'a']);
  assert.deepStrictEqual(seen[1].values, [1, 2, { accent: true }]);
  assert.deepStrictEqual(seen[1].iterated, entries);
  assert.deepStrictEqual(seen[1].many, [1, null, { accent: true }, 1]);
  assert.deepStrictEqual(seen[1].none, []);
  assert.deepStrictEqual(seen[1].has, [true, false, false]);
  assert.deepStrictEqual(seen[1].get, [{ accent: true }, null]);
  assert.deepStrictEqual(seen[2], [[], false]);
});

test('a deque: push, unshift, pop, shift, at, length, isEmpty, values', async (t) => {
  const seen = await run(t, [QUEUE], [
    async (ctx) => {
      const d = ctx.state(QUEUE);
      const empty = [await d.isEmpty(), await d.length(), await d.pop(), await d.shift(), await d.at(0)];
      await d.push('b');
      await d.push('c');
      await d.unshift('a');
      await d.push('d');
      return empty;
    },
    async (ctx) => {
      const d = ctx.state(QUEUE);
      const r = {
        at: [await d.at(0), await d.at(-1), await d.at(1), await d.at(-2), await d.at(4), await d.at(-5),
             await d.at(2 ** 32), await d.at(-(2 ** 32))], // beyond 32 bits: out of range, never wrapped
        length: await d.length(),
        values: await collect(d.values()),
        backward: await collect(d.values('backward')),
        iterated: await collect(d),
      };
      r.popped = [await d.pop(), await d.shift()];
      r.after = [await collect(d), await d.length(), await d.isEmpty()];
      return r;
    },
    async (ctx) => {
      const d = ctx.state(QUEUE);
      const left = await collect(d);
      await d.clear();
      return [left, await d.isEmpty(), await d.at(-1)];
    },
  ]);
  assert.deepStrictEqual(seen[0], [true, 0, null, null, null]);
  assert.deepStrictEqual(seen[1].at, ['a', 'd', 'b', 'c', null, null, null, null]);
  assert.strictEqual(seen[1].length, 4);
  assert.deepStrictEqual(seen[1].values, ['a', 'b', 'c', 'd']);
  assert.deepStrictEqual(seen[1].backward, ['d', 'c', 'b', 'a']);
  assert.deepStrictEqual(seen[1].iterated, ['a', 'b', 'c', 'd']);
  assert.deepStrictEqual(seen[1].popped, ['d', 'a']);
  assert.deepStrictEqual(seen[1].after, [['b', 'c'], 2, false]);
  assert.deepStrictEqual(seen[2], [['b', 'c'], true, null]);
});

test('a deque with a capacity drops from the other end', async (t) => {
  const LAST3 = deque('last3', { capacity: 3 });
  const [r] = await run(t, [LAST3], [
    async (ctx) => {
      const d = ctx.state(LAST3);
      for (let i = 1; i <= 5; i++) await d.push(i);
      const back = [await collect(d), await d.length()];
      await d.unshift(0);
      return [...back, await collect(d)];
    },
  ]);
  assert.deepStrictEqual(r, [[3, 4, 5], 3, [0, 3, 4]]);
});

test('scans pull in chunks: 300 entries and items, both ways, and early exits', async (t) => {
  const BIG = map('big');
  const LONG = deque('long');
  const pad = (i) => `k${String(i).padStart(3, '0')}`;
  const seen = await run(t, [BIG, LONG], [
    async (ctx) => {
      const m = ctx.state(BIG);
      const d = ctx.state(LONG);
      for (let i = 0; i < 300; i++) {
        await m.set(pad(i), i);
        await d.push(i);
      }
    },
    async (ctx) => {
      const m = ctx.state(BIG);
      const d = ctx.state(LONG);
      const r = {
        keys: await collect(m.keys()),
        back: await collect(m.entries('backward')),
        items: await collect(d.values()),
        itemsBack: await collect(d.values('backward')),
      };
      // Breaking out early closes the scan; a closed scan is done.
      const it = m.entries();
      for await (const [k] of it) if (k === pad(260)) break;
      r.afterBreak = await it.next();
      // Concurrent next() calls are served in order, no item twice.
      const iter = d.values();
      const got = await Promise.all(Array.from({ length: 300 }, () => iter.next()));
      r.concurrent = got.map((x) => x.value);
      r.end = await iter.next();
      return r;
    },
  ]);
  const r = seen[1];
  const all = Array.from({ length: 300 }, (_, i) => i);
  assert.deepStrictEqual(r.keys, all.map(pad));
  assert.deepStrictEqual(r.back, all.map((i) => [pad(i), i]).reverse());
  assert.deepStrictEqual(r.items, all);
  assert.deepStrictEqual(r.itemsBack, [...all].reverse());
  assert.deepStrictEqual(r.afterBreak, { value: undefined, done: true });
  assert.deepStrictEqual(r.concurrent, all);
  assert.deepStrictEqual(r.end, { value: undefined, done: true });
});

test('a failed attempt\'s writes vanish: the retry sees the committed state', async (t) => {
  let attempts = 0;
  const seen = await run(t, [COUNTER, PROFILE], [
    async (ctx) => { await ctx.state(COUNTER).set('committed'); },
    async (ctx) => {
      const v = ctx.state(COUNTER);
      const m = ctx.state(PROFILE);
      attempts++;
      const before = [await v.get(), await m.get('x')];
      if (attempts === 1) {
        await v.set('dirty');
        await m.set('x', 'dirty');
        assert.strictEqual(await v.get(), 'dirty'); // read-your-writes
        throw new Planned('fail the first attempt');
      }
      await v.set('second');
      return before;
    },
    async (ctx) => ctx.state(COUNTER).get(),
  ]);
  assert.strictEqual(attempts, 2);
  assert.deepStrictEqual(seen[1], ['committed', null]);
  assert.strictEqual(seen[2], 'second');
});

test('commit() keeps the writes before it when the attempt later fails', async (t) => {
  let attempts = 0;
  const seen = await run(t, [COUNTER, PROFILE], [
    async (ctx) => {
      const v = ctx.state(COUNTER);
      const m = ctx.state(PROFILE);
      attempts++;
      if (attempts === 1) {
        await v.set('floor');
        await m.set('a', 1);
        await v.commit();
        await m.commit();
        await v.set('above the floor');
        await m.set('b', 2);
        throw new Planned('fail after the commit');
      }
      return [await v.get(), await collect(m.entries())];
    },
  ]);
  assert.deepStrictEqual(seen[0], ['floor', [['a', 1]]]);
});

test('rollback() drops the writes since the last commit, for its collection only', async (t) => {
  const seen = await run(t, [COUNTER, QUEUE], [
    async (ctx) => {
      const v = ctx.state(COUNTER);
      const d = ctx.state(QUEUE);
      await v.set('kept');
      await v.commit();
      await v.set('dropped');
      await d.push('other collection');
      await v.rollback();
      return [await v.get(), await d.length()];
    },
    async (ctx) => [await ctx.state(COUNTER).get(), await collect(ctx.state(QUEUE))],
  ]);
  assert.deepStrictEqual(seen[0], ['kept', 1]);
  assert.deepStrictEqual(seen[1], ['kept', ['other collection']]);
});

test('a handle used after its handler finished is a TransientStateError', async (t) => {
  let leaked;
  let leakedCtx;
  let leakedScan;
  const seen = await run(t, [COUNTER, PROFILE], [
    async (ctx) => {
      leaked = ctx.state(COUNTER);
      leakedCtx = ctx;
      leakedScan = ctx.state(PROFILE).keys();
      await leaked.set(1);
    },
    async (ctx) => {
      const errors = [];
      for (const call of [() => leaked.get(), () => leaked.set(2), () => leakedScan.next()]) {
        errors.push(await call().then(() => 'resolved', (e) => e));
      }
      // A scan whose pull failed is over: later next() calls end it quietly.
      const afterFailure = await leakedScan.next();
      try {
        leakedCtx.state(COUNTER);
      } catch (e) {
        errors.push(e);
      }
      return [errors, await ctx.state(COUNTER).get(), afterFailure];
    },
  ]);
  const [errors, current, afterFailure] = seen[1];
  assert.deepStrictEqual(afterFailure, { value: undefined, done: true });
  assert.strictEqual(errors.length, 4);
  for (const e of errors) {
    assert.ok(e instanceof TransientStateError && e instanceof TransientError, String(e));
    assert.ok(isStateError(e));
  }
  assert.match(errors[0].message, /after its handler finished/);
  assert.strictEqual(current, 1, 'the leaked set did not write');
});

test('an unregistered name or another kind is a PermanentStateError; a foreign object a transient one', async (t) => {
  const [r] = await run(t, [COUNTER], [
    async (ctx) => {
      const out = [];
      for (const def of [value('nobody-registered-this'), map('counter'), messageValue('counter'),
                         { name: 'counter', kind: 'value', payload: 'json' }]) {
        try {
          ctx.state(def);
          out.push('opened');
        } catch (e) {
          out.push(e);
        }
      }
      return out;
    },
  ]);
  for (const e of r.slice(0, 3)) {
    assert.ok(e instanceof PermanentStateError && e instanceof PermanentError, String(e));
    assert.ok(e.isPermanent && isStateError(e));
  }
  assert.match(r[0].message, /no collection "nobody-registered-this" is registered/);
  assert.match(r[1].message, /registered as a value, not a map/);
  assert.ok(r[3] instanceof TransientStateError);
  assert.match(r[3].message, /definition must come from a Prosody state definition constructor/);
});

test('writes without a JSON form, and bad arguments, are TransientStateErrors; nothing is stored', async (t) => {
  const cyclic = {};
  cyclic.self = cyclic;
  const [r] = await run(t, [COUNTER, PROFILE, QUEUE], [
    async (ctx) => {
      const v = ctx.state(COUNTER);
      const m = ctx.state(PROFILE);
      const d = ctx.state(QUEUE);
      await v.set('untouched');
      const attempts = [
        () => v.set(null), () => v.set(undefined), () => v.set(() => 1), () => v.set(Symbol('s')),
        () => v.set(10n), () => v.set(cyclic), () => v.set({ big: 1n }),
        () => m.set('k', null), () => m.set(7, 'v'), () => m.get(undefined), () => m.getMany('a'),
        () => d.push(null), () => d.unshift(undefined), () => d.at(1.5), () => d.at(2 ** 53), () => d.at('0'),
        () => m.entries('sideways').next(),
      ];
      const errors = [];
      for (const a of attempts) errors.push(await Promise.resolve().then(a).then(() => 'resolved', (e) => e));
      return [errors, await v.get(), await m.has('k'), await d.length()];
    },
  ]);
  const [errors, stored, has, length] = r;
  for (const e of errors) assert.ok(e instanceof TransientStateError, String(e));
  assert.match(errors[0].message, /^set: cannot store null in "counter"; .*clear\(\)/);
  assert.match(errors[8].message, /^set: a key of map "profile" must be a string, got 7$/);
  assert.match(errors[13].message, /^at: index must be a safe integer, got 1\.5$/);
  assert.match(errors[16].message, /"forward" or "backward", got "sideways"/);
  assert.deepStrictEqual([stored, has, length], ['untouched', false, 0]);
});

test('ProsodyClient.create() registers collections; the constructor too', async (t) => {
  const topic = await freshTopic(1);
  const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic,
                                         stateCollections: [COUNTER, deque('recent', { capacity: 2 })] });
  t.after(() => c.shutdown());
  const rec = new Recorder();
  await c.subscribe({
    onMessage: async (ctx) => {
      const d = ctx.state(deque('recent', { capacity: 2 }));
      await d.push(1);
      rec.add(await d.length());
    },
    onExcise: async () => {},
    onTimer: async () => {},
  });
  await c.send(topic, 'k', {});
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events, [1]);
});

test('stateCollections is validated at construction', async () => {
  const bad = [
    [[{ name: 'x', kind: 'list', payload: 'json' }], 'stateCollections[0].kind: expected "value", "map", or "deque", got "list"'],
    [[COUNTER, { name: 'y', kind: 'value', payload: 'xml' }], 'stateCollections[1].payload: expected "json" or "message", got "xml"'],
    [[value('t', { ttlSeconds: 1.5 })], 'stateCollections[0].ttlSeconds: must be a whole number in 1..=630720000, got 1.5'],
    [[value('t', { ttlSeconds: -1 })], 'stateCollections[0].ttlSeconds: must be a whole number in 1..=630720000, got -1'],
    [[value('t', { ttlSeconds: NaN })], 'stateCollections[0].ttlSeconds: must be a whole number in 1..=630720000, got NaN'],
    [[value('t', { ttlSeconds: Infinity })], 'stateCollections[0].ttlSeconds: must be a whole number in 1..=630720000, got Infinity'],
    [[map('m', { keysetLimit: 4097 })], 'stateCollections[0].keysetLimit: must be a whole number in 0..=4096, got 4097'],
    [[map('m', { keysetLimit: 0.5 })], 'stateCollections[0].keysetLimit: must be a whole number in 0..=4096, got 0.5'],
    [[{ name: 'd', kind: 'deque', payload: 'json', keysetLimit: 3 }], 'stateCollections[0].keysetLimit: only valid for map collections'],
    [[{ name: 'm', kind: 'map', payload: 'json', capacity: 3 }], 'stateCollections[0].capacity: only valid for deque collections'],
    [[COUNTER, value('v', { keysetLimit: 5 })], 'stateCollections[1].keysetLimit: only valid for map collections'],
    [[messageMap('mm', { capacity: 2 })], 'stateCollections[0].capacity: only valid for deque collections'],
    [[deque('d', { keysetLimit: 2 })], 'stateCollections[0].keysetLimit: only valid for map collections'],
    [[deque('d', { capacity: 0 })], 'stateCollections[0].capacity: must be a whole number in 1..=4294967295, got 0'],
    [[COUNTER, value('counter')], 'stateCollections[1].name: collection "counter" is registered twice'],
    [[value('p', { published: true })], 'published: collection "p" is published, which needs the option subsystem ' +
     '(PROSODY_SUBSYSTEM): the name readers give to find it'],
    [[{ name: '', kind: 'value', payload: 'json' }], 'stateCollections[0].name: expected a non-empty string, got ""'],
  ];
  for (const [stateCollections, message] of bad) {
    const options = { ...baseOptions(), groupId: 'g', subscribedTopics: 't', stateCollections };
    await assert.rejects(ProsodyClient.create(options), (e) => e instanceof Error && e.message === message,
                         message);
    assert.throws(() => new ProsodyClient(options), (e) => e.message === message, message);
  }
  // The canonical set is accepted.
  const ok = await ProsodyClient.create({
    ...baseOptions(),
    stateCollections: [value('a', { ttlSeconds: 86400, readUncommitted: true }), map('b', { keysetLimit: 0 }),
                       deque('c', { capacity: 1 }), { name: 'd', kind: 'map', payload: 'json', keysetLimit: 4096 },
                       messageValue('e'), messageMap('f', { keysetLimit: 3 }), messageDeque('g', { capacity: 2 })],
  });
  await ok.shutdown();
});

test('a readUncommitted collection keeps a failed attempt\'s writes', async (t) => {
  const DIRECT = value('direct', { readUncommitted: true });
  let attempts = 0;
  const [r] = await run(t, [DIRECT, COUNTER], [
    async (ctx) => {
      attempts++;
      const seen = [await ctx.state(DIRECT).get(), await ctx.state(COUNTER).get()];
      if (attempts === 1) {
        await ctx.state(DIRECT).set('written through');
        await ctx.state(COUNTER).set('buffered');
        throw new Planned('fail after writing both');
      }
      return seen;
    },
  ]);
  assert.deepStrictEqual(r, ['written through', null]);
});

// Message collections: they keep a delivered message (its coordinates) and
// give it back loaded again from Kafka, as handlers receive messages.
const LAST = messageValue('last');
const BY_NAME = messageMap('by-name');
const LOG = messageDeque('log');

// A Message's fields, for comparing what a handler got with what a
// collection gave back.
const fields = (m) => ({ ...m });

test('message collections give back the handler\'s own message in a later event of the key', async (t) => {
  const [first, second, third] = await run(t, [LAST, BY_NAME, LOG], [
    async (ctx, msg) => {
      await ctx.state(LAST).set(msg);
      await ctx.state(BY_NAME).set('first', msg);
      await ctx.state(LOG).push(msg);
      return fields(msg);
    },
    async (ctx, msg) => {
      const m = ctx.state(BY_NAME);
      const d = ctx.state(LOG);
      const last = await ctx.state(LAST).get();
      await ctx.state(LAST).set(msg);
      await m.set('again', last); // one read back is a delivered message too
      await d.unshift(msg);
      return {
        msg: fields(msg), last: fields(last), get: fields(await m.get('first')),
        many: (await m.getMany(['first', 'none', 'again'])).map((x) => x && fields(x)),
        entries: (await collect(m.entries('backward'))).map(([k, x]) => [k, fields(x)]),
        values: (await collect(m.values())).map(fields),
        front: fields(await d.at(0)), back: fields(await d.at(-1)), second: fields(await d.at(1)),
        beyond: await d.at(2), all: (await collect(d.values())).map(fields), length: await d.length(),
      };
    },
    async (ctx) => {
      const d = ctx.state(LOG);
      return { last: fields(await ctx.state(LAST).get()), popped: fields(await d.pop()),
               shifted: fields(await d.shift()), empty: await d.pop() };
    },
  ]);
  assert.deepStrictEqual(first.payload, { step: 0 });
  assert.strictEqual(typeof first.offset, 'number', 'the constructor\'s contract: offsets are numbers');
  assert.ok(first.timestamp instanceof Date && first.key === 'user-1');
  const { msg } = second;
  assert.deepStrictEqual(second.last, first);
  assert.deepStrictEqual(second.get, first);
  assert.deepStrictEqual(second.many, [first, null, first]);
  assert.deepStrictEqual(second.entries, [['first', first], ['again', first]]);
  assert.deepStrictEqual(second.values, [first, first]);
  assert.deepStrictEqual([second.front, second.back, second.second, second.beyond], [msg, first, first, null]);
  assert.deepStrictEqual([second.all, second.length], [[msg, first], 2]);
  assert.deepStrictEqual(third, { last: msg, popped: first, shifted: msg, empty: null });
});

test('under create() a message read back has a bigint offset, like the handler\'s', async (t) => {
  const topic = await freshTopic(1);
  const c = await ProsodyClient.create({ ...baseOptions(), groupId: unique('g'), subscribedTopics: topic,
                                         stateCollections: [LAST] });
  t.after(() => c.shutdown());
  const rec = new Recorder();
  await c.subscribe({
    async onMessage(ctx, msg) {
      rec.add([fields(msg), await ctx.state(LAST).get()].map((m) => m && fields(m)));
      await ctx.state(LAST).set(msg);
    },
    async onExcise() {},
    async onTimer() {},
  });
  await c.send(topic, 'k', { n: 1 });
  await rec.waitCount(1);
  await c.send(topic, 'k', { n: 2 });
  await rec.waitCount(2);
  const [[first, none], [, back]] = rec.events;
  assert.strictEqual(none, null);
  assert.strictEqual(first.offset, 0n);
  assert.deepStrictEqual(back, first);
});

test('has() and keys() of a message map do not load the records; get() does', async (t) => {
  const topic = await freshTopic(1);
  const make = clientFactory(t);
  const c = make({ groupId: unique('g'), subscribedTopics: topic, stateCollections: [BY_NAME],
                   loaderSeekTimeoutMs: 500, deferEnabled: false, maxRetries: 0 });
  const rec = new Recorder();
  await c.subscribe({
    async onMessage(ctx, msg) {
      const m = ctx.state(BY_NAME);
      if (msg.payload.step === 0) {
        await m.set('kept', msg);
        rec.add('stored');
        return;
      }
      // The record is gone with its topic: what reads only the store works.
      await new AdminClient(adminOptions()).deleteTopic(topic);
      const out = [await m.has('kept'), await collect(m.keys())];
      out.push(await m.get('kept').then(() => 'loaded', (e) => e));
      rec.add(out);
    },
  });
  await c.send(topic, 'k', { step: 0 });
  await rec.waitCount(1);
  await c.send(topic, 'k', { step: 1 });
  await rec.waitCount(2);
  const [has, keys, failed] = rec.events[1];
  assert.deepStrictEqual([has, keys], [true, ['kept']]);
  // Not there in time: transient (a record Kafka says is gone would be permanent).
  assert.ok(failed instanceof TransientStateError, String(failed));
  assert.match(failed.message, /loading the record .* of "by-name" failed/);
});

test('a message collection takes only delivered messages; a JSON collection refuses them', async (t) => {
  const [r] = await run(t, [COUNTER, PROFILE, QUEUE, LAST, BY_NAME, LOG], [
    async (ctx, msg) => {
      const attempts = [
        () => ctx.state(LAST).set({ ...msg }), () => ctx.state(LAST).set(msg.payload),
        () => ctx.state(BY_NAME).set('k', 'text'), () => ctx.state(LOG).push(null), () => ctx.state(LOG).unshift(7),
        () => ctx.state(COUNTER).set(msg), () => ctx.state(PROFILE).set('k', msg), () => ctx.state(QUEUE).push(msg),
      ];
      const errors = [];
      for (const a of attempts) errors.push(await Promise.resolve().then(a).then(() => 'resolved', (e) => e));
      return [errors, await ctx.state(LAST).get(), await ctx.state(BY_NAME).has('k'), await ctx.state(LOG).length(),
              await ctx.state(COUNTER).get(), await ctx.state(PROFILE).has('k'), await ctx.state(QUEUE).length()];
    },
  ]);
  const [errors, ...stored] = r;
  for (const e of errors) assert.ok(e instanceof TransientStateError, String(e));
  const methods = ['set', 'set', 'set', 'push', 'unshift'];
  errors.slice(0, 5).forEach((e, i) => assert.match(e.message, new RegExp(
    `^${methods[i]}: expected a Kafka message; a JSON value cannot be stored in a message collection \\(`)));
  for (const e of errors.slice(5)) assert.match(e.message, /^(set|push): a Kafka message cannot be stored in a JSON collection/);
  assert.deepStrictEqual(stored, [null, false, 0, null, false, 0]);
});

test('the ES module entry exports the same keyed-state objects', async () => {
  const esm = await import('../index.mjs');
  const cjs = require('..');
  for (const name of ['value', 'map', 'deque', 'messageValue', 'messageMap', 'messageDeque', 'TransientStateError',
                      'PermanentStateError', 'isStateError', 'ValueState', 'MapState', 'DequeState']) {
    assert.strictEqual(typeof cjs[name], 'function', name);
    assert.strictEqual(esm[name], cjs[name], name);
  }
  const e = new TransientStateError('x');
  assert.ok(isStateError(e) && !isStateError(new TransientError('x')) && !isStateError(null));
  assert.strictEqual(e.name, 'TransientStateError');
  assert.strictEqual(new PermanentStateError('y').isPermanent, true);
});

test('a timer of the key sees the state its message committed', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic(1);
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, stateCollections: [COUNTER] });
  await c.subscribe({
    onMessage: async (ctx) => {
      await ctx.state(COUNTER).set({ from: 'message' });
      await ctx.schedule(new Date(Date.now() + 1000));
    },
    onTimer: async (ctx, timer) => {
      const v = ctx.state(COUNTER);
      rec.add([timer.key, await v.get()]);
      await v.clear();
    },
  });
  await c.send(topic, 'timer-key', {});
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events, [['timer-key', { from: 'message' }]]);
});

test('a rethrown PermanentStateError discards the event; a TransientStateError retries it', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic(1);
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, stateCollections: [COUNTER], retryBaseMs: 10,
                   maxRetryDelayMs: 50, deferEnabled: false });
  const attempts = { permanent: 0, transient: 0 };
  await c.subscribe({
    onMessage: async (ctx, msg) => {
      const step = msg.payload.step;
      if (step === 'permanent') {
        attempts.permanent++;
        ctx.state(value('not-registered')); // throws PermanentStateError
      } else if (step === 'transient') {
        if (++attempts.transient === 1) await ctx.state(COUNTER).set(null); // rejects: TransientStateError
      }
      rec.add(step);
    },
  });
  for (const step of ['permanent', 'transient', 'last']) await c.send(topic, 'k', { step });
  await rec.waitFor((ev) => ev.includes('last'), 'the last message');
  assert.deepStrictEqual(rec.events, ['transient', 'last']);
  assert.deepStrictEqual(attempts, { permanent: 1, transient: 2 });
});

test('return() waits for the next() calls before it and closes the scan', async (t) => {
  const [r] = await run(t, [PROFILE], [
    async (ctx) => {
      const m = ctx.state(PROFILE);
      for (const k of ['a', 'b', 'c']) await m.set(k, k.toUpperCase());
      const it = m.keys();
      const calls = [it.next(), it.next(), it.return('closed'), it.next()];
      return Promise.all(calls);
    },
  ]);
  assert.deepStrictEqual(r, [{ value: 'a', done: false }, { value: 'b', done: false },
                             { value: 'closed', done: true }, { value: undefined, done: true }]);
});
