#!/usr/bin/env node
// Runs every compiled test file under dist/test with node's test runner.
// Usage: node scripts/run-tests.js [substring ...]  (only files whose path contains one of them)
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : path.endsWith('.test.js') ? [path] : [];
  });
}

// tsc never deletes output, so a test moved or deleted in test/ leaves its old .js behind: skip those.
const hasSource = (f) => existsSync(f.replace(/^dist[\\/]/, '').replace(/\.js$/, '.ts'));

const filters = process.argv.slice(2);
const files = walk('dist/test')
  .filter(hasSource)
  .filter((f) => filters.length === 0 || filters.some((s) => f.includes(s)))
  .sort();
if (files.length === 0) {
  console.error('no test files matched');
  process.exit(1);
}
const concurrency = process.env.RSTAR_TEST_CONCURRENCY ?? '2';
const result = spawnSync(
  process.execPath,
  ['--test', `--test-concurrency=${concurrency}`, '--test-reporter=spec', ...files],
  { stdio: 'inherit' },
);
process.exit(result.status ?? 1);
