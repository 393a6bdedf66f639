'use strict';
// The README's quick start, process exit after unsubscribe, ESM import, the type declarations.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync, spawnSync } = require('child_process');

const pkg = path.resolve(__dirname, '..');

function runScript(code, ext = '.js') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prosody-node-'));
  // Resolve the package by its name, as users do.
  fs.mkdirSync(path.join(dir, 'node_modules', '@prosody-events'), { recursive: true });
  fs.symlinkSync(pkg, path.join(dir, 'node_modules', '@prosody-events', 'prosody'));
  const file = path.join(dir, `script${ext}`);
  fs.writeFileSync(file, code);
  return spawnSync(process.execPath, [file], { cwd: dir, encoding: 'utf8', timeout: 120000 });
}

test('the README quick start runs as written', () => {
  const readme = fs.readFileSync(path.join(pkg, 'README.md'), 'utf8');
  const code = readme.split('## Quick start')[1].match(/```javascript\n([\s\S]*?)```/)[1];
  const r = runScript(code);
  assert.strictEqual(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /Received message: \{"topic":"my-topic"/);
  assert.match(r.stdout, /"content":"Hello, Kafka!"/);
});

test('the process exits after unsubscribe without an explicit exit', () => {
  const r = runScript(`
    const {AdminClient, ProsodyClient} = require('@prosody-events/prosody');
    (async () => {
      await new AdminClient({mock: true}).createTopic('exit-topic', 2);
      const c = new ProsodyClient({mock: true, groupId: 'g', sourceSystem: 's', subscribedTopics: 'exit-topic', probePort: null});
      let got; const seen = new Promise((r) => { got = r; });
      await c.subscribe({onMessage: async () => got()});
      await c.send('exit-topic', 'k', {x: 1});
      await seen;
      await c.unsubscribe();
      console.log('unsubscribed');
    })();
  `);
  // spawnSync's timeout kills a process that never exits (status null).
  assert.strictEqual(r.status, 0, `status ${r.status} signal ${r.signal}\n${r.stdout}${r.stderr}`);
  assert.match(r.stdout, /unsubscribed/);
});

test('ESM import', () => {
  const r = runScript(`
    import { ProsodyClient, Mode, permanent } from '@prosody-events/prosody';
    import prosody from '@prosody-events/prosody';
    console.log(typeof ProsodyClient, Mode.Pipeline, typeof permanent, prosody.ProsodyClient === ProsodyClient);
  `, '.mjs');
  assert.strictEqual(r.status, 0, r.stderr);
  assert.strictEqual(r.stdout.trim(), 'function pipeline function true');
});

test('index.d.ts type-checks the spec examples (tsc --noEmit)', (t) => {
  const tsc = path.join(pkg, 'node_modules', '.bin', 'tsc');
  if (!fs.existsSync(tsc)) {
    t.skip('typescript is not installed (npm install installs the dev dependencies)');
    return;
  }
  execFileSync(tsc, ['-p', path.join(__dirname, 'types', 'tsconfig.json')], { stdio: 'pipe' });
});

test('bindings.js exports the clients whichever file is required first', () => {
  const r = runScript(`
    const b = require('@prosody-events/prosody/bindings');
    const i = require('@prosody-events/prosody');
    console.log(typeof b.AdminClient, typeof b.ProsodyClient, b.ProsodyClient === i.ProsodyClient);
  `);
  assert.strictEqual(r.status, 0, r.stderr);
  assert.strictEqual(r.stdout.trim(), 'function function true');
});

test('@permanent as TypeScript 5 emits a decorator classifies at run time', (t) => {
  let ts;
  try {
    ts = require('typescript');
  } catch (e) {
    t.skip('typescript is not installed (npm install installs the dev dependencies)');
    return;
  }
  const source = `
    import { permanent, PermanentError, TransientError } from '@prosody-events/prosody';
    class Handler {
      @permanent(TypeError)
      async onMessage(ctx: unknown, msg: { payload: { fail: string } }): Promise<void> {
        if (msg.payload.fail === 'type') throw new TypeError('bad shape');
        throw new Error('flaky');
      }
    }
    (async () => {
      const h = new Handler();
      const kinds: string[] = [];
      for (const fail of ['type', 'other']) {
        try { await h.onMessage(null, { payload: { fail } }); } catch (e) {
          kinds.push(e instanceof PermanentError ? 'permanent' : e instanceof TransientError ? 'transient' : 'plain');
        }
      }
      console.log(kinds.join(','));
    })();
  `;
  const js = ts.transpileModule(source, { compilerOptions: { target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.CommonJS } }).outputText;
  const r = runScript(js);
  assert.strictEqual(r.status, 0, r.stderr);
  assert.strictEqual(r.stdout.trim(), 'permanent,plain');
});
