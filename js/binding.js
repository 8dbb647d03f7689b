'use strict';
// The native addon (see ./native.js for where it is found). Loading it
// registers the calling thread: every worker that requires this package
// gets its own record slot.
module.exports = require('./native').loadAddon();
