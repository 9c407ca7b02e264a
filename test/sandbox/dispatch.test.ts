// Catches: an executor left idle while calls it can run wait (the light/heavy split with 2 workers).
import assert from 'node:assert/strict';
import { availableParallelism } from 'node:os';
import { after, before, describe, test } from 'node:test';
import { type GuardedServer, startGuardedServer } from '../support/guard.js';

type Result = { reason: string; stdout?: string | null };

async function run(url: string, solution: string): Promise<{ result: Result; ms: number }> {
  const t0 = performance.now();
  const response = await fetch(`${url}/run`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ type: 'python', solution }),
  });
  return { result: (await response.json()) as Result, ms: performance.now() - t0 };
}

describe('dispatch with one light and one heavy executor (--workers 2)', () => {
  let server: GuardedServer;
  before(async () => {
    server = await startGuardedServer(['--workers', '2', '--tool-timeout', '10']);
    // The heavy executor's first sympy call warms it up.
    await run(server.url, 'import sympy\nprint(sympy.Integer(1))');
  });
  after(async () => {
    assert.deepEqual(await server.stop(), [], 'SIGTERM leaves no process behind');
  });

  test('a heavy call and a light one behind a busy light executor run at once on the heavy executor', async () => {
    const SLEEP_MS = 4000;
    // The light executor is busy for 4 s; a light call then queues ahead of a heavy one.
    const busy = run(server.url, `import time\ntime.sleep(${SLEEP_MS / 1000})\nprint("slept")`);
    await new Promise((r) => setTimeout(r, 300));
    const light = run(server.url, 'print(6 * 7)');
    await new Promise((r) => setTimeout(r, 50));
    const heavy = run(server.url, 'import sympy\nprint(sympy.factorint(360))');
    const [b, l, h] = await Promise.all([busy, light, heavy]);
    assert.equal(b.result.stdout, 'slept\n');
    assert.equal(h.result.stdout, '{2: 3, 3: 2, 5: 1}\n');
    assert.equal(l.result.stdout, '42\n');
    // Both would otherwise wait for the sleeping call (the older light call held the heavy one back).
    assert.ok(h.ms < SLEEP_MS / 2, `heavy call took ${h.ms.toFixed(0)} ms`);
    // The light call goes to the heavy executor only while a core is free.
    if (availableParallelism() >= 2) assert.ok(l.ms < SLEEP_MS / 2, `light call took ${l.ms.toFixed(0)} ms`);
  });
});
