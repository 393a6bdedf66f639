'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { unique, Recorder, freshTopic, clientFactory } = require('./helpers');

function waitsForCancel(rec, started) {
  return {
    onMessage: async (ctx, msg, signal) => {
      const before = [ctx.shouldCancel, signal.aborted];
      started();
      await ctx.onCancel();
      rec.add([msg.key, before, ctx.shouldCancel, signal.aborted]);
    },
  };
}

test('unsubscribe aborts the signal of a running handler and resolves once it settled', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  let started;
  const running = new Promise((r) => { started = r; });
  const c = make({ groupId: unique('g'), subscribedTopics: topic, shutdownTimeoutMs: 2000 });
  await c.subscribe(waitsForCancel(rec, started));
  await c.send(topic, 'stuck', {});
  await running;
  const t0 = Date.now();
  await c.unsubscribe();
  const took = Date.now() - t0;
  assert.deepStrictEqual(rec.events, [['stuck', [false, false], true, true]]);
  assert.ok(took >= 1000 && took < 10000, `took ${took} ms`); // cancellation at 80%
  assert.strictEqual(await c.consumerState(), 'configured');
});

test('a timeout aborts the signal', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const c = make({ groupId: unique('g'), subscribedTopics: topic, timeoutMs: 500, mode: 'best-effort' });
  await c.subscribe(waitsForCancel(rec, () => {}));
  await c.send(topic, 'slow', {});
  await rec.waitCount(1);
  assert.deepStrictEqual(rec.events[0], ['slow', [false, false], true, true]);
});

test('onCancel resolves when the handler finished, the signal stays unaborted', async (t) => {
  const make = clientFactory(t);
  const topic = await freshTopic();
  const rec = new Recorder();
  const kept = [];
  const c = make({ groupId: unique('g'), subscribedTopics: topic });
  await c.subscribe({
    onMessage: async (ctx, msg, signal) => {
      kept.push([ctx.onCancel(), signal]);
      rec.add(msg.key);
    },
  });
  await c.send(topic, 'quick', {});
  await rec.waitCount(1);
  await kept[0][0]; // resolves: its handler has finished
  assert.strictEqual(kept[0][1].aborted, false);
});
