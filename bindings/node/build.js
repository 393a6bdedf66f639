'use strict';
// The install script. It takes the prebuilt addon when one fits this
// process (prebuilt.js; only in a package made by `make dist-node`) and
// loads in a child process; otherwise it builds the addon from source:
// libprosody (static, with CMake), then every src/*.c against it and the
// Node-API headers, into build/Release/prosody.node. No node-gyp: an N-API
// addon needs only the ABI-stable headers (the node-api-headers package, or
// the ones Node ships), and node-gyp's header download cannot work offline.
//
// libprosody's sources: libprosody/ in the package (`make dist-node` puts
// them there), else the repository this directory sits in.
// PROSODY_BUILD_FROM_SOURCE=1 skips the prebuilt addon;
// PROSODY_LIBPROSODY_BUILD=DIR links the libprosody.a of an existing CMake
// build directory instead of building one.
const { execFileSync, spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const prebuilt = require('./prebuilt');

const here = __dirname;
const out = path.join(here, 'build');
const run = (cmd, args) => execFileSync(cmd, args, { stdio: 'inherit' });
const pkgs = ['jansson', 'libuv', 'libmicrohttpd', 'libcurl'];
const SOURCE_NEEDS = 'a C compiler (cc), CMake, pkg-config and the -dev packages of jansson, ' +
  'libuv, libmicrohttpd, libcurl, OpenSSL, Cyrus SASL, zstd, lz4 and zlib';

function fail(message) {
  console.error(`prosody: ${message}`);
  process.exit(1);
}

function onPath(cmd) {
  if (cmd.includes('/')) return fs.existsSync(cmd);
  return (process.env.PATH || '').split(':').some((d) => {
    try {
      fs.accessSync(path.join(d || '.', cmd), fs.constants.X_OK);
      return true;
    } catch (e) {
      return false;
    }
  });
}

// The prebuilt addon, when one fits and loads here.
function usePrebuilt() {
  if (process.env.PROSODY_BUILD_FROM_SOURCE) return { reason: 'PROSODY_BUILD_FROM_SOURCE is set' };
  const fit = prebuilt.find(true);
  if (!fit.file) return fit;
  // Loading it here, at install time, turns a missing library or symbol
  // into an install error (or a build from source), not an import error.
  const r = spawnSync(process.execPath, ['-e', `require(${JSON.stringify(fit.file)})`],
                      { encoding: 'utf8' });
  if (r.status !== 0) {
    return { reason: `the prebuilt addon for ${prebuilt.describe(fit.meta)} does not load: ` +
                     (r.stderr || '').trim().split('\n').slice(0, 5).join(' ') };
  }
  console.log(`prosody: using the prebuilt addon for ${prebuilt.describe(fit.meta)}`);
  return fit;
}

const fit = usePrebuilt();
if (fit.file) process.exit(0);

// ---------------------------------------------------------------------------
// From source

const sources = fs.readdirSync(path.join(here, 'src')).filter((f) => f.endsWith('.c')).sort()
  .map((f) => path.join(here, 'src', f));
const root = [path.join(here, 'libprosody'), path.resolve(here, '..', '..')].find((d) =>
  fs.existsSync(path.join(d, 'CMakeLists.txt')) && fs.existsSync(path.join(d, 'include', 'prosody.h')));

// The Node-API version the sources ask for (#define NAPI_VERSION in a .c or .h).
const napiWanted = Math.max(0, ...fs.readdirSync(path.join(here, 'src'))
  .filter((f) => /\.[ch]$/.test(f)).map((f) => {
    const m = fs.readFileSync(path.join(here, 'src', f), 'utf8').match(/^#define NAPI_VERSION (\d+)/m);
    return m ? Number(m[1]) : 0;
  }));

const cc = process.env.CC || 'cc';
const given = process.env.PROSODY_LIBPROSODY_BUILD;
const missing = [cc, ...(given ? [] : ['cmake']), 'pkg-config'].filter((t) => !onPath(t));
const cannot = [];
if (!root) cannot.push('the package carries no libprosody sources');
if (missing.length) cannot.push(`${missing.join(', ')} not found on PATH`);
if (napiWanted && !prebuilt.atLeast(process.versions.napi || 0, napiWanted)) {
  cannot.push(`the addon needs Node-API ${napiWanted} (Node.js 18 or newer)`);
}
if (process.platform !== 'linux') cannot.push('only Linux is supported');
if (cannot.length) {
  fail(`cannot install @prosody-events/prosody on ${prebuilt.here(true).text}: ${fit.reason}, ` +
       `and it cannot be built from source here (${cannot.join('; ')}). Supported: the prebuilt ` +
       `addon for ${fit.supported || 'none'}; elsewhere on Linux a build from source, which needs ` +
       `${SOURCE_NEEDS}.`);
}
console.log(`prosody: ${fit.reason}; building the addon from source`);

function napiInclude() {
  try {
    return require('node-api-headers').include_dir;
  } catch (e) {
    for (const dir of [path.join(path.dirname(process.execPath), '..', 'include', 'node'),
                       '/usr/include/node']) {
      if (fs.existsSync(path.join(dir, 'node_api.h'))) return dir;
    }
    return fail('no Node-API headers (install node-api-headers)');
  }
}

function pkgConfig(flag) {
  try {
    return execFileSync('pkg-config', [flag, ...pkgs], { encoding: 'utf8' }).trim().split(/\s+/)
      .filter(Boolean);
  } catch (e) {
    return fail(`pkg-config ${flag} ${pkgs.join(' ')} failed; building from source needs ` +
                `${SOURCE_NEEDS} (scripts/deps.sh in the source tree installs them)`);
  }
}

let lib = given ? path.resolve(given) : path.join(out, 'libprosody');
if (!given) {
  const jobs = process.env.PROSODY_BUILD_JOBS || String(require('os').cpus().length || 2);
  run('cmake', ['-S', root, '-B', lib, '-DCMAKE_BUILD_TYPE=Release', '-DPROSODY_TESTS=OFF',
                '-DPROSODY_BENCH=OFF']);
  run('cmake', ['--build', lib, '--target', 'prosody_static', '-j', jobs]);
}
for (const need of ['libprosody.a', 'libprosody-static.libs']) {
  if (!fs.existsSync(path.join(lib, need))) fail(`${lib} has no ${need}`);
}
fs.mkdirSync(path.join(out, 'Release'), { recursive: true });
run(cc, [
  '-shared', '-fPIC', '-O2', '-g', '-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra',
  '-Wno-unused-parameter', '-Wno-missing-field-initializers', '-fvisibility=hidden',
  '-I', napiInclude(), '-I', path.join(root, 'include'), '-I', path.join(here, 'src'),
  ...pkgConfig('--cflags').filter((f) => f.startsWith('-I')),
  ...sources, path.join(lib, 'libprosody.a'),
  // librdkafka is inside libprosody.a; these are the system libraries of
  // both, as CMake wrote them for this build.
  '-Wl,--exclude-libs,ALL',
  ...fs.readFileSync(path.join(lib, 'libprosody-static.libs'), 'utf8').trim().split(/\s+/),
  '-o', path.join(out, 'Release', 'prosody.node'),
]);
console.log('prosody: built build/Release/prosody.node');
