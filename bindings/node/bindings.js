'use strict';
// The native module's exports, as the original package's layout has them:
// ProsodyClient and AdminClient (the public classes, defined in index.js
// over the addon) and the raw addon as `native`.
const fs = require('fs');
const path = require('path');
const prebuilt = require('./prebuilt');

// The addon: the one built here from source (build/Release/, by the install
// script when no prebuilt one fits, and in a checkout), else the prebuilt
// one that fits this process (prebuilt.js).
function load() {
  const built = path.join(__dirname, 'build', 'Release', 'prosody.node');
  if (fs.existsSync(built)) return require(built);
  const fit = prebuilt.find(false);
  if (!fit.file) {
    throw new Error(`prosody: no addon to load: ${fit.reason}. Reinstall the package on a ` +
                    'supported platform, or with a C compiler and CMake to build it from source');
  }
  try {
    return require(fit.file);
  } catch (e) {
    throw new Error(`prosody: the prebuilt addon for ${prebuilt.describe(fit.meta)} does not ` +
                    `load in ${prebuilt.here(true).text}: ${e.message}`);
  }
}

const native = load();

module.exports = { native };
// index.js requires this file first and sets the two classes here once it
// has defined them; requiring this file first works too.
const index = require('./index');

// (hasOwnProperty: reading a missing export of a module still loading makes
// Node warn about the circular dependency.)
if (Object.prototype.hasOwnProperty.call(index, 'ProsodyClient')) {
  module.exports.ProsodyClient = index.ProsodyClient;
  module.exports.AdminClient = index.AdminClient;
}
