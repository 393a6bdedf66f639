'use strict';
// Which prebuilt addon fits this process. A package made by `make dist-node`
// carries prebuilds/PLATFORM-ARCH/ with prosody.node, the shared libraries it
// needs beyond glibc (found through its $ORIGIN run path) and prebuild.json,
// which says what it was built for: platform, arch, libc, the oldest glibc
// it runs on (the newest symbol version it references) and the Node-API
// version of its sources. It fits a process on the same platform and arch,
// with a glibc at least that new, whose Node-API is at least that version.
const fs = require('fs');
const path = require('path');

const dir = path.join(__dirname, 'prebuilds');

function atLeast(have, want) {
  const a = String(have).split('.').map(Number);
  const b = String(want).split('.').map(Number);
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const x = a[i] || 0;
    const y = b[i] || 0;
    if (x !== y) return x > y;
  }
  return true;
}

// The running glibc's version, or undefined (musl, another OS). Building
// the diagnostic report takes some 20 ms: only the install script asks.
function glibc() {
  const report = process.report && process.report.getReport();
  return report && report.header ? report.header.glibcVersionRuntime : undefined;
}

function describe(m) {
  return `${m.platform}-${m.arch} with ${m.libc} >= ${m.glibc} and Node-API >= ${m.napi}`;
}

// Every prebuilt addon the package carries: [{file, meta}].
function all() {
  let names = [];
  try {
    names = fs.readdirSync(dir);
  } catch (e) {
    return [];
  }
  return names.sort().flatMap((name) => {
    const file = path.join(dir, name, 'prosody.node');
    const json = path.join(dir, name, 'prebuild.json');
    if (!fs.existsSync(file) || !fs.existsSync(json)) return [];
    return [{ file, meta: JSON.parse(fs.readFileSync(json, 'utf8')) }];
  });
}

// What this process is, in the terms of prebuild.json.
function here(withLibc) {
  const napi = Number(process.versions.napi || 0);
  const g = withLibc ? glibc() : undefined;
  const libc = withLibc ? (g ? `glibc ${g}` : 'no glibc') : '';
  return {
    napi,
    glibc: g,
    text: `${process.platform}-${process.arch}${libc ? ` (${libc})` : ''}, Node.js ` +
          `${process.versions.node} with Node-API ${napi}`,
  };
}

// The prebuilt addon that fits, or why none does:
// {file, meta} or {reason, supported}. checkLibc compares glibc versions too.
function find(checkLibc) {
  const have = here(checkLibc);
  const prebuilt = all();
  const supported = prebuilt.map((p) => describe(p.meta)).join('; ') || 'none';
  for (const p of prebuilt) {
    const m = p.meta;
    if (m.platform !== process.platform || m.arch !== process.arch) continue;
    if (!atLeast(have.napi, m.napi)) continue;
    if (checkLibc && (!have.glibc || !atLeast(have.glibc, m.glibc))) continue;
    return p;
  }
  return {
    reason: prebuilt.length ? `none of the prebuilt addons (${supported}) fits ${have.text}`
      : 'the package carries no prebuilt addon',
    supported,
    here: have.text,
  };
}

module.exports = { find, describe, atLeast, here };
