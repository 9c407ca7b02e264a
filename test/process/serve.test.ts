import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { spawnServer, startServer, writeReadyFile } from '../../src/process/serve.js';

/** A child running `script` under node. */
const node = (script: string) => ({ command: process.execPath, args: ['-e', script] });

/** An HTTP server on a free port that prints its `listening on` line in two writes, 100 ms apart. */
const SPLIT_LINE = `
const server = require('node:http').createServer((req, res) => res.end('ok'));
server.listen(0, '127.0.0.1', () => {
  const line = 'listening on http://127.0.0.1:' + server.address().port + '\\n';
  process.stderr.write('warming up\\n' + line.slice(0, 25));
  setTimeout(() => process.stderr.write(line.slice(25)), 100);
});`;

describe('spawnServer / startServer: spawn a child and wait until it listens', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar-serve-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('resolves with the URL of the listening line, read whole, and stops with SIGTERM', async () => {
    const server = await startServer({ name: 'split', ...node(SPLIT_LINE) });
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(await (await fetch(server.url)).text(), 'ok');
    assert.match(server.output(), /^warming up\n/);
    assert.deepEqual(await server.stop(), { code: null, signal: 'SIGTERM' });
    assert.equal(await server.stop(), await server.stop(), 'stop() is idempotent');
  });

  test('a child that exits before it is ready: rejects naming it, with the tail of its stderr', async () => {
    await assert.rejects(
      startServer({ name: 'broken', ...node("console.error('no config.json here'); process.exit(3)") }),
      /^Error: broken exited \(3\) before it was ready:\nno config\.json here$/,
    );
  });

  test('a child that never gets ready: rejects after the timeout and is stopped', async () => {
    const server = spawnServer({ name: 'slow', ...node('setInterval(() => {}, 1000)'), readyTimeoutMs: 300 });
    await assert.rejects(server.ready, /^Error: slow not ready after 0\.3 s$/);
    assert.deepEqual(await server.exited, { code: null, signal: 'SIGTERM' });
  });

  test('stop(): SIGKILL when SIGTERM is ignored for killAfterMs', async () => {
    const server = await startServer({
      name: 'stubborn',
      ...node(
        "process.on('SIGTERM', () => {}); console.error('listening on http://x'); setInterval(() => {}, 1000)",
      ),
      killAfterMs: 200,
    });
    assert.equal(server.url, 'http://x');
    const t0 = performance.now();
    assert.deepEqual(await server.stop(), { code: null, signal: 'SIGKILL' });
    assert.ok(performance.now() - t0 >= 150);
  });

  test('a custom ready line on stdout; a command that does not exist', async () => {
    const server = await startServer({
      name: 'custom',
      ...node("console.log('* Ready to accept connections tcp'); setInterval(() => {}, 1000)"),
      ready: /Ready to accept connections/,
      readyOn: 'stdout',
    });
    assert.equal(server.url, 'Ready to accept connections');
    await server.stop();
    await assert.rejects(
      startServer({ name: 'missing', command: join(dir, 'no-such-server'), args: [] }),
      /^Error: missing: .*ENOENT/,
    );
  });

  test('writeReadyFile: the URL and a newline, renamed into place', () => {
    const file = join(dir, 'ready');
    writeReadyFile(file, 'http://127.0.0.1:1234');
    assert.equal(readFileSync(file, 'utf8'), 'http://127.0.0.1:1234\n');
    assert.deepEqual(readdirSync(dir), ['ready'], 'no partial file left');
    assert.throws(
      () => writeReadyFile(join(dir, 'no', 'such', 'dir'), 'x'),
      /^Error: --ready-file .*: ENOENT$/,
    );
  });
});
