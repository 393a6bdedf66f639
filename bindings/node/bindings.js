'use strict';
// The native module's exports, as the original package's layout has them:
// ProsodyClient and AdminClient (the public classes, defined in index.js
// over the addon) and the raw addon as `native`.
const native = require('./build/Release/prosody.node');

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
