'use strict';
// The native module's exports (the original package's layout has them here):
// the public AdminClient and ProsodyClient (defined in index.js over the
// addon), plus the raw addon as `native`.
const native = require('./build/Release/prosody.node');

module.exports = { native };
// index.js adds ProsodyClient and AdminClient once defined (it requires
// this file first); require order keeps both modules complete for users.
