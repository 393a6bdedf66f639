'use strict';
// Careless or hostile input through the package (issue 34): each test names
// what it guards against, and fails without the fix it came with.
const test = require('node:test');
const assert = require('node:assert');
const { ProsodyClient, AdminClient } = require('..');
const { unique, Recorder, freshTopic, clientFactory, baseOptions } = require('./helpers');

// A logger whose `warn` lines about handler failures go to `rec`, so a test
// can wait for the failure of an event as it waits for an event.
function failureLogger(rec) {
  const ignore = () => {};
  return {
    error: ignore, info: ignore, debug: ignore,
    warn: (text) => { if (text.includes('handler failure')) rec.add(text); },
  };
}

// A failure line of `key` for an attempt at least `attempt` (the client's
// log may fold repeated lines, so not every attempt has one).
const failureOf = (key, attempt) => (lines) => lines.some((l) => typeof l === 'string' && l.includes(`key "${key}"`) &&
  Number((/attempt (\d+),/.exec(l) || [])[1]) >= attempt);

test('a generator handler fails its event (transient, naming the handler) and never succeeds', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  let ran = 0;
  class AsyncGen {
    async *onMessage() { // eslint-disable-line require-yield
      ran++;
    }
  }
  const plainGen = {
    * onMessage() { // eslint-disable-line require-yield
      ran++;
    },
  };
  // Pipeline mode retries a transient failure: a second attempt shows the
  // first was not taken as a success (and so not committed).
  const a = make({ groupId: unique('g'), subscribedTopics: topic, retryBaseMs: 10, maxRetryDelayMs: 20,
                   deferEnabled: false, logger: failureLogger(rec) });
  await a.subscribe(new AsyncGen());
  await a.send(topic, 'async-gen', {});
  await rec.waitFor(failureOf('async-gen', 2), 'the async generator handler\'s second failed attempt');
  await a.unsubscribe();
  const topic2 = await freshTopic();
  const b = make({ groupId: unique('g'), subscribedTopics: topic2, retryBaseMs: 10, maxRetryDelayMs: 20,
                   deferEnabled: false, logger: failureLogger(rec) });
  await b.subscribe(plainGen);
  await b.send(topic2, 'sync-gen', {});
  await rec.waitFor(failureOf('sync-gen', 2), 'the generator handler\'s second failed attempt');
  await b.unsubscribe();
  const first = (key) => rec.events.find((l) => l.includes(`key "${key}"`));
  assert.match(first('async-gen'), /transient handler failure .*AsyncGen\.onMessage returned an async generator/);
  assert.match(first('sync-gen'), /transient handler failure .*handler\.onMessage returned a generator/);
  assert.strictEqual(ran, 0);
});

test('a key or topic with a NUL byte is refused, not cut short', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const c = make();
  await assert.rejects(c.send(topic, 'user\0alice', {}),
                       (e) => e instanceof RangeError && /key must not contain a NUL/.test(e.message));
  await assert.rejects(c.send(`${topic}\0typo`, 'k', {}),
                       (e) => e instanceof RangeError && /topic must not contain a NUL/.test(e.message));
  await assert.rejects(new AdminClient({ mock: true }).createTopic(`${topic}\0x`, 1, 1), /name must not contain a NUL/);
  // The keys that were cut to "user" before: refused, not sent.
  const rec = new Recorder();
  const r = make({ groupId: unique('g'), subscribedTopics: topic });
  await r.subscribe({ onMessage: async (ctx, msg) => rec.add(msg.key) });
  await assert.rejects(c.send(topic, 'user\0bob', {}), RangeError);
  await c.send(topic, 'user', {});
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events, ['user']);
});

test('an option holding a NUL is refused, naming the option', () => {
  assert.throws(() => new ProsodyClient({ ...baseOptions(), groupId: 'app\0-other-team' }),
                (e) => e instanceof RangeError && /^option groupId: .*NUL/.test(e.message));
  assert.throws(() => new ProsodyClient({ ...baseOptions(), subscribedTopics: ['a', 'b\0c'] }),
                (e) => e instanceof RangeError && /^option subscribedTopics: .*NUL/.test(e.message));
  assert.throws(() => new AdminClient({ bootstrapServers: 'localhost:9092\0,other:9092' }),
                (e) => e instanceof RangeError && /^option bootstrapServers: .*NUL/.test(e.message));
});

test('any thrown value is a transient failure, described as well as it can be', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const nameless = new Error('boom');
  Object.defineProperty(nameless, 'name', { get() { throw new Error('no name for you'); } });
  const trap = () => { throw new Error('trapped'); };
  const hostile = new Proxy({}, { get: trap, getPrototypeOf: trap, has: trap, ownKeys: trap });
  // key -> what its first attempt throws; `sync` ones throw from a plain
  // function, the others reject.
  const throws = {
    'no-proto': Object.create(null),
    'no-proto-sync': Object.create(null),
    'bad-name': nameless,
    proxy: hostile,
    'proxy-sync': hostile,
  };
  const attempts = new Map();
  let unhandled = 0;
  const onUnhandled = () => { unhandled++; };
  process.on('unhandledRejection', onUnhandled);
  t.after(() => process.off('unhandledRejection', onUnhandled));
  const c = make({ groupId: unique('g'), subscribedTopics: topic, retryBaseMs: 10, maxRetryDelayMs: 20,
                   deferEnabled: false, logger: failureLogger(rec) });
  await c.subscribe({
    onMessage(ctx, msg) {
      const n = (attempts.get(msg.key) || 0) + 1;
      attempts.set(msg.key, n);
      if (n === 1 && msg.key.endsWith('-sync')) throw throws[msg.key];
      return (async () => {
        if (n === 1) throw throws[msg.key];
        rec.add(['ok', msg.key]);
      })();
    },
  });
  for (const key of Object.keys(throws)) await c.send(topic, key, {});
  await rec.waitFor((ev) => Object.keys(throws).every((k) => ev.some((e) => e[0] === 'ok' && e[1] === k)),
                    'every key handled on its second attempt');
  for (const key of Object.keys(throws)) assert.strictEqual(attempts.get(key), 2, key);
  const line = (key) => rec.events.find((l) => typeof l === 'string' && l.includes(`key "${key}"`));
  assert.match(line('no-proto'), /transient handler failure .*thrown: \[object Object\]/);
  assert.match(line('bad-name'), /transient handler failure .*thrown: \[object Error\]/);
  assert.match(line('proxy'), /transient handler failure .*thrown: /);
  assert.strictEqual(unhandled, 0);
});

test('a thenable whose then throws fails the event (transient) and crashes nothing', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const attempts = new Map();
  const firstReturns = {
    'then-throws': { then() { throw new Error('boom in then'); } },
    'then-getter-throws': { get then() { throw new Error('boom in the getter'); } },
  };
  const c = make({ groupId: unique('g'), subscribedTopics: topic, retryBaseMs: 10, maxRetryDelayMs: 20,
                   deferEnabled: false, logger: failureLogger(rec) });
  await c.subscribe({
    onMessage(ctx, msg) {
      const n = (attempts.get(msg.key) || 0) + 1;
      attempts.set(msg.key, n);
      if (n === 1) return firstReturns[msg.key];
      rec.add(['ok', msg.key]);
      return undefined;
    },
  });
  for (const key of Object.keys(firstReturns)) await c.send(topic, key, {});
  await rec.waitFor((ev) => Object.keys(firstReturns).every((k) => ev.some((e) => e[0] === 'ok' && e[1] === k)),
                    'both keys handled on their second attempt');
  const line = (key) => rec.events.find((l) => typeof l === 'string' && l.includes(`key "${key}"`));
  assert.match(line('then-throws'), /transient handler failure .*Error: boom in then/);
  assert.match(line('then-getter-throws'), /transient handler failure .*Error: boom in the getter/);
});

test('timer calls without a time are refused and leave the key\'s timers alone', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const at = new Date(Math.floor(Date.now() / 1000) * 1000 + 3600 * 1000);
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx) => {
      await ctx.schedule(at);
      const refused = [];
      for (const call of [() => ctx.clearAndSchedule(undefined), () => ctx.schedule(), () => ctx.unschedule(),
        () => ctx.schedule(null), () => ctx.schedule(new Date(NaN))]) {
        try {
          await call();
          refused.push('accepted');
        } catch (e) {
          refused.push(`${e.name}: ${e.message}`);
        }
      }
      rec.add([refused, (await ctx.scheduled()).map((d) => d.getTime())]);
    },
    onTimer: async () => {},
  });
  await c.send(topic, 'k', {});
  await rec.waitCount(1);
  const [refused, scheduled] = rec.events[0];
  assert.deepStrictEqual(refused, [
    'TypeError: clearAndSchedule: expected a Date, got undefined',
    'TypeError: schedule: expected a Date, got undefined',
    'TypeError: unschedule: expected a Date, got undefined',
    'TypeError: schedule: expected a Date, got null',
    'TypeError: schedule: expected a valid Date, got an Invalid Date',
  ]);
  assert.deepStrictEqual(scheduled, [at.getTime()]);
});

test('option messages: NaN says NaN, a too-large integer is out of range with the bounds', () => {
  assert.throws(() => new ProsodyClient({ ...baseOptions(), commitIntervalMs: NaN }),
                (e) => e instanceof TypeError && /^option commitIntervalMs: .*got NaN$/.test(e.message));
  assert.throws(() => new ProsodyClient({ ...baseOptions(), maxConcurrency: NaN }), /got NaN$/);
  for (const big of [1e21, 2 ** 64, -(2 ** 64)]) {
    assert.throws(() => new ProsodyClient({ ...baseOptions(), maxConcurrency: big }),
                  (e) => e instanceof RangeError &&
                    /^option maxConcurrency: .*out of range; expected an integer from 1 to 65536/.test(e.message),
                  String(big));
  }
  assert.throws(() => new ProsodyClient({ ...baseOptions(), commitIntervalMs: 1e300 }),
                (e) => e instanceof RangeError && /duration too large/.test(e.message));
});
