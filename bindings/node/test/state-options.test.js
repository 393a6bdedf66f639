'use strict';
// The original's client-level keyed-state options (stateCacheDir,
// stateOwnedCacheSize, stateReadCacheSize, stateRecoveryDelaySeconds):
// accepted in its forms, refused naming the option otherwise.
const { test } = require('node:test');
const assert = require('node:assert');
const { ProsodyClient } = require('..');

const make = (options) => new ProsodyClient({ mock: true, groupId: 'g', ...options });

test('accepts the original forms', async () => {
  for (const options of [
    { stateOwnedCacheSize: '64 MiB', stateReadCacheSize: '500 MB', stateCacheDir: '/tmp/prosody-state',
      stateRecoveryDelaySeconds: 30 },
    { stateReadCacheSize: 4096 },
  ]) {
    const client = make(options);
    await client.shutdown?.();
  }
});

test('refuses sizes that are not a positive number of bytes', () => {
  for (const option of ['stateOwnedCacheSize', 'stateReadCacheSize']) {
    for (const bad of ['0', '-1 MiB', 'nonsense', -1, 1.5]) {
      assert.throws(() => make({ [option]: bad }), (e) => e.message.includes(option.includes('Owned')
        ? 'state_owned_cache_size' : 'state_read_cache_size') || e.message.includes(option), `${option}=${bad}`);
    }
  }
});

test('refuses a recovery delay that is not whole seconds of at least 1', () => {
  for (const bad of [1.5, 0, -30, Number.NaN]) {
    assert.throws(() => make({ stateRecoveryDelaySeconds: bad }),
      (e) => /stateRecoveryDelaySeconds|state_recovery_delay/.test(e.message), `${bad}`);
  }
});

test('a recovery delay given as a number is checked as whole seconds, as the original checks it', async () => {
  // A fraction is not rounded or turned into microseconds, and NaN or
  // Infinity is not a type error: each is the same RangeError, before any
  // client exists, from the constructor and from create().
  for (const bad of [2.5, 0.5, -1, 0, Number.NaN, Infinity, -Infinity, 365 * 86400 + 1]) {
    const message = `option stateRecoveryDelaySeconds: must be a whole number in 1..=31536000, got ${bad}`;
    assert.throws(() => make({ stateRecoveryDelaySeconds: bad }),
      (e) => e instanceof RangeError && e.message === message, `${bad}`);
    await assert.rejects(ProsodyClient.create({ mock: true, groupId: 'g', stateRecoveryDelaySeconds: bad }),
      (e) => e instanceof RangeError && e.message === message, `${bad}`);
  }
  for (const good of [1, 365 * 86400]) await make({ stateRecoveryDelaySeconds: good }).shutdown();
});
