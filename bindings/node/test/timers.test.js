'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { ProsodyError } = require('..');
const { unique, Recorder, freshTopic, clientFactory } = require('./helpers');

const whole = (ms) => Math.floor(ms / 1000) * 1000;

test('timer calls: schedule, scheduled, unschedule, clearAndSchedule, clearScheduled', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  const base = whole(Date.now()) + 3600 * 1000;
  const at = (s) => new Date(base + s * 1000);
  await c.subscribe({
    onMessage: async (ctx) => {
      await ctx.schedule(at(10));
      await ctx.schedule(at(20));
      await ctx.schedule(at(30));
      await ctx.schedule(at(20));
      const first = await ctx.scheduled();
      await ctx.unschedule(at(20));
      const second = await ctx.scheduled();
      await ctx.clearAndSchedule(at(40));
      const third = await ctx.scheduled();
      await ctx.clearScheduled();
      const fourth = await ctx.scheduled();
      rec.add([first, second, third, fourth].map((l) => l.map((d) => d.getTime())));
    },
    onTimer: async () => {},
  });
  await c.send(topic, 'timer-calls', {});
  await rec.waitCount(1);
  const ms = (...s) => s.map((x) => at(x).getTime());
  assert.deepStrictEqual(rec.events[0], [ms(10, 20, 30), ms(10, 30), ms(40), []]);
});

test('a timer fires with its key and whole-second time', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx, msg) => {
      const due = whole(Date.now()) + 2000;
      await ctx.schedule(new Date(due + 400)); // rounds to the nearest second
      rec.add(['scheduled', msg.key, due]);
    },
    onTimer: async (ctx, timer) => {
      rec.add(['fired', timer.key, timer.time.getTime(), (await ctx.scheduled()).length]);
    },
  });
  await c.send(topic, 'timer-fire', {});
  await rec.waitFor((ev) => ev.some((e) => e[0] === 'fired'), 'the timer');
  const scheduled = rec.events.find((e) => e[0] === 'scheduled');
  const fired = rec.events.find((e) => e[0] === 'fired');
  assert.strictEqual(fired[1], 'timer-fire');
  assert.strictEqual(fired[2], scheduled[2]);
  assert.strictEqual(fired[3], 0);
  assert.ok(Date.now() >= fired[2]);
});

test('bad times and stale contexts are refused', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  let kept;
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx) => {
      kept = ctx;
      const errors = [];
      for (const bad of [new Date(NaN), '2030-01-01', 5]) {
        try {
          await ctx.schedule(bad);
        } catch (e) {
          errors.push(e instanceof TypeError);
        }
      }
      rec.add(errors);
    },
    onTimer: async () => {},
  });
  await c.send(topic, 'k', {});
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events[0], [true, true, true]);
  await new Promise((r) => setImmediate(r));
  assert.strictEqual(kept.shouldCancel, true);
  await assert.rejects(kept.schedule(new Date()), (e) => e instanceof ProsodyError && /stale/.test(e.message));
});

test('a handler without onTimer cannot schedule', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx) => {
      try {
        await ctx.schedule(new Date());
      } catch (e) {
        rec.add(e.message);
      }
    },
  });
  await c.send(topic, 'k', {});
  await rec.waitCount(1);
  assert.match(rec.events[0], /onTimer|on_timer/);
});
