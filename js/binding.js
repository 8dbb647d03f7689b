'use strict';
// Loads the native addon built by `npm install` (scripts/build.js). Loading
// it registers the calling thread: every worker that requires this package
// gets its own record slot.
const path = require('node:path');

module.exports = require(path.join(__dirname, '..', 'otel-thread-ctx.node'));
