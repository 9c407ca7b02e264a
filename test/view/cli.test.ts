// Catches: a RUN that is no run folder served anyway (or a stack trace instead of one line naming
// it); a non-loopback bind without a token; a token-protected server answering without it; a
// loopback server answering a request for another host (DNS rebinding).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { startView } from '../support/browser.js';
import { rstar } from '../support/helpers.js';
import { writeRun } from '../support/view-run.js';

const dir = mkdtempSync(join(tmpdir(), 'rstar-view-cli-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function get(
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; cookie?: string }> {
  return new Promise((resolve, reject) => {
    request(url, { headers }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, cookie: res.headers['set-cookie']?.[0] }));
    })
      .on('error', reject)
      .end();
  });
}

test('a RUN that is not a run folder fails, named, exit 1', async () => {
  const missing = await rstar(['view', join(dir, 'nope')]);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /nope: not a run folder/);
  mkdirSync(join(dir, 'empty'));
  const empty = await rstar(['view', join(dir, 'empty')]);
  assert.equal(empty.code, 1);
  assert.match(empty.stderr, /empty: no run records found/);
  const bind = await rstar(['view', '--host', '0.0.0.0', join(dir, 'empty')]);
  assert.equal(bind.code, 2);
  assert.match(bind.stderr, /requires --view-token/);
});

test('with --view-token every route wants the token; without, only loopback hosts are answered', async () => {
  writeRun(join(dir, 'run'), { steps: 2, problems: 2, n: 4, keep: 2 }, { evals: false });
  const locked = await startView([join(dir, 'run'), '--view-token', 's3cret', '--no-index-cache']);
  try {
    const base = locked.url.replace(/\?.*$/, '');
    assert.match(locked.url, /\?token=s3cret$/);
    assert.equal((await get(`${base}api/runs`)).status, 401);
    assert.equal((await get(`${base}api/runs`, { authorization: 'Bearer wrong' })).status, 401);
    assert.equal((await get(`${base}api/runs`, { authorization: 'Bearer s3cret' })).status, 200);
    const page = await get(locked.url);
    assert.equal(page.status, 200);
    assert.match(page.cookie ?? '', /^rstar_view=s3cret; HttpOnly; SameSite=Strict/);
    assert.equal((await get(`${base}api/runs`, { cookie: 'rstar_view=s3cret' })).status, 200);
  } finally {
    await locked.stop();
  }
  const open = await startView([join(dir, 'run'), '--no-index-cache']);
  try {
    assert.equal((await get(`${open.url}api/runs`)).status, 200);
    assert.equal((await get(`${open.url}api/runs`, { host: 'attacker.example:80' })).status, 403);
  } finally {
    await open.stop();
  }
});
