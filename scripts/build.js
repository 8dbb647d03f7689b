'use strict';
// Builds the addon and the reader CLI from source with cargo (release mode)
// and places the addon where index.js loads it.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
execFileSync('cargo', ['build', '--release', '--workspace', '--locked'], { cwd: root, stdio: 'inherit' });
const targetDir = process.env.CARGO_TARGET_DIR ? path.resolve(root, process.env.CARGO_TARGET_DIR) : path.join(root, 'target');
// Copy, then rename over the old file: running processes keep the inode
// they mapped instead of seeing its pages rewritten under them.
const addon = path.join(root, 'otel-thread-ctx.node');
const staging = `${addon}.${process.pid}.tmp`;
fs.copyFileSync(path.join(targetDir, 'release', 'libotel_thread_ctx.so'), staging);
fs.renameSync(staging, addon);
