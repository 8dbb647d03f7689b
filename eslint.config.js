'use strict';
// ESLint flat config: the recommended rules and a few more that catch real
// bugs (no style rules: layout is left to the authors).
const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  { ignores: ['target/', 'node_modules/', '.ci/', 'npm/', 'demo/out/'] },
  js.configs.recommended,
  {
    files: ['**/*.js'],
    languageOptions: { sourceType: 'commonjs', globals: globals.node },
  },
  {
    files: ['**/*.mjs'],
    languageOptions: { sourceType: 'module', globals: globals.node },
  },
  {
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // Sloppy mode turns mistakes into silent globals.
      strict: ['error', 'global'],
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'no-unused-vars': ['error', { args: 'after-used', argsIgnorePattern: '^_', caughtErrors: 'all', caughtErrorsIgnorePattern: '^_' }],
      'array-callback-return': 'error',
      'no-self-compare': 'error',
      'no-template-curly-in-string': 'error',
      'no-unmodified-loop-condition': 'error',
      'no-unreachable-loop': 'error',
      'no-constructor-return': 'error',
      'no-throw-literal': 'error',
      'no-var': 'error',
    },
  },
];
