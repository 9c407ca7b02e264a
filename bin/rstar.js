#!/usr/bin/env node
// Entry point: the compiled CLI lives in dist/ (built by `npm ci` through `prepare`).
import { main } from '../dist/src/cli.js';

main(process.argv.slice(2));
