'use strict';
// Builds the addon: libprosody (static, with CMake, from this source tree),
// then every src/*.c against it and the Node-API headers. No node-gyp: an
// N-API addon needs only the ABI-stable headers (the node-api-headers
// package, or the ones Node ships), and node-gyp's header download cannot
// work offline.
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const here = __dirname;
const root = path.resolve(here, '..', '..');
const out = path.join(here, 'build');
const lib = path.join(out, 'libprosody');
const run = (cmd, args) => execFileSync(cmd, args, { stdio: 'inherit' });

if (!fs.existsSync(path.join(root, 'CMakeLists.txt')) ||
    !fs.existsSync(path.join(root, 'include', 'prosody.h'))) {
  console.error(`prosody: the libprosody sources were not found at ${root}; ` +
                'install from the Prosody-C source tree (npm install ./bindings/node)');
  process.exit(1);
}

function napiInclude() {
  try {
    return require('node-api-headers').include_dir;
  } catch (e) {
    for (const dir of [path.join(path.dirname(process.execPath), '..', 'include', 'node'),
                       '/usr/include/node']) {
      if (fs.existsSync(path.join(dir, 'node_api.h'))) return dir;
    }
    throw new Error('prosody: no Node-API headers (install node-api-headers)');
  }
}

function pkgConfig(flag) {
  const pkgs = ['jansson', 'libuv', 'libmicrohttpd', 'libcurl'];
  try {
    return execFileSync('pkg-config', [flag, ...pkgs], { encoding: 'utf8' }).trim().split(/\s+/).filter(Boolean);
  } catch (e) {
    console.error(`prosody: pkg-config ${flag} ${pkgs.join(' ')} failed; install the system ` +
                  'libraries first (scripts/deps.sh in the source tree)');
    process.exit(1);
  }
}

const jobs = process.env.PROSODY_BUILD_JOBS || String(require('os').cpus().length || 2);
run('cmake', ['-S', root, '-B', lib, '-DCMAKE_BUILD_TYPE=Release', '-DPROSODY_TESTS=OFF',
              '-DPROSODY_BENCH=OFF']);
run('cmake', ['--build', lib, '--target', 'prosody_static', '-j', jobs]);
fs.mkdirSync(path.join(out, 'Release'), { recursive: true });
run(process.env.CC || 'cc', [
  '-shared', '-fPIC', '-O2', '-g', '-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra',
  '-Wno-unused-parameter', '-Wno-missing-field-initializers', '-fvisibility=hidden',
  '-I', napiInclude(), '-I', path.join(root, 'include'),
  ...pkgConfig('--cflags').filter((f) => f.startsWith('-I')),
  // Every C file of src/ (one per type; src/prosody_node.h lists them).
  ...fs.readdirSync(path.join(here, 'src')).filter((f) => f.endsWith('.c')).sort()
    .map((f) => path.join(here, 'src', f)),
  path.join(lib, 'libprosody.a'),
  // librdkafka is inside libprosody.a; these are the system libraries of
  // both, as CMake wrote them for this build.
  '-Wl,--exclude-libs,ALL',
  ...fs.readFileSync(path.join(lib, 'libprosody-static.libs'), 'utf8').trim().split(/\s+/),
  '-o', path.join(out, 'Release', 'prosody.node'),
]);
console.log('prosody: built build/Release/prosody.node');
