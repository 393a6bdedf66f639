'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { AdminClient, ProsodyClient, ProsodyError } = require('..');
const { unique, Recorder, adminOptions, baseOptions, REAL } = require('./helpers');

test('create (positional and options forms), use and delete', async () => {
  const admin = REAL ? new AdminClient(adminOptions().bootstrapServers) : new AdminClient(adminOptions());
  const name = unique('node-admin');
  await admin.createTopic(name, 3, 1);
  const rec = new Recorder();
  const c = new ProsodyClient({ ...baseOptions(), groupId: unique('g'), subscribedTopics: name });
  await c.subscribe({ onMessage: async (ctx, msg) => rec.add(msg.partition) });
  for (let i = 0; i < 30; i++) await c.send(name, `k${i}`, { i });
  await rec.waitCount(30);
  assert.strictEqual(await c.assignedPartitionCount(), 3);
  assert.ok(rec.events.every((p) => p >= 0 && p < 3));
  await c.unsubscribe();
  await assert.rejects(admin.createTopic(name, 3), (e) => e instanceof ProsodyError || e.code === 'PROSODY_ERR_TOPIC_EXISTS');
  await assert.rejects(admin.createTopic(name, 3), new RegExp(name));
  await admin.deleteTopic(name);
  const other = unique('node-admin-opts');
  await admin.createTopic(other, { partitionCount: 2, replicationFactor: 1, cleanupPolicy: 'delete',
                                   retention: 7 * 24 * 3600 * 1000 });
  await admin.deleteTopic(other);
});

test('errors name the topic and the bad argument', async () => {
  const admin = new AdminClient(adminOptions());
  const missing = unique('node-missing');
  await assert.rejects(admin.deleteTopic(missing), (e) => e.code === 'PROSODY_ERR_UNKNOWN_TOPIC' &&
    e.message.includes(missing));
  await assert.rejects(admin.createTopic(unique('t'), { cleanupPolicy: 'shred' }), /cleanup_policy|cleanupPolicy/);
  await assert.rejects(admin.createTopic(unique('t'), 0), RangeError);
  await assert.rejects(admin.createTopic(unique('t'), 1.5), TypeError);
  await assert.rejects(admin.createTopic('bad topic name!'), /topic/);
});
