import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { type GuardedServer, startGuardedServer } from '../support/guard.js';
import { rstar } from '../support/helpers.js';

type Result = { reason: string; stdout?: string | null; stderr?: string | null };

async function runAll(url: string, solutions: string[]): Promise<Result[]> {
  const response = await fetch(`${url}/run/batch`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      type: 'batch',
      submissions: solutions.map((solution) => ({ type: 'python', solution })),
    }),
  });
  return ((await response.json()) as { results: Result[] }).results;
}

// Which executor ran it (a module's address: each executor is an interpreter of its own, under
// ASLR, and its forks share its addresses) and a set of strings' order; the sleep keeps the two
// light executors of --workers 4 busy so both answer some of the calls.
const SET_ORDER = 'import sys, time\ntime.sleep(0.2)\nprint(id(sys), list({str(i) for i in range(40)}))';

/** The set orders each executor printed. */
async function ordersByExecutor(url: string): Promise<Set<string>[]> {
  const results = await runAll(url, Array(8).fill(SET_ORDER));
  const orders = new Map<string, Set<string>>();
  for (const r of results) {
    assert.equal(r.reason, '', r.stderr ?? '');
    const [executor, order] = (r.stdout ?? '').trim().split(/ (.*)/s);
    orders.set(executor, (orders.get(executor) ?? new Set()).add(order));
  }
  assert.equal(orders.size, 2, 'both light executors answered');
  return [...orders.values()];
}

describe('sandbox-serve --hash-seed: reproducible executors', () => {
  let fixed: GuardedServer;
  let random: GuardedServer;
  before(async () => {
    [fixed, random] = await Promise.all([
      startGuardedServer(['--workers', '4', '--timeout', '5']),
      startGuardedServer(['--workers', '4', '--timeout', '5', '--hash-seed', 'random']),
    ]);
  });
  after(async () => {
    await Promise.all([fixed.stop(), random.stop()]);
  });

  test('by default every call on every worker orders a set of strings alike, and /health says so', async () => {
    const orders = await ordersByExecutor(fixed.url);
    const all = new Set(orders.flatMap((s) => [...s]));
    assert.equal(all.size, 1, [...all].join('\n'));
    const health = (await (await fetch(`${fixed.url}/health`)).json()) as Record<string, unknown>;
    assert.equal(health.hash_seed, 0);
    assert.equal(health.timeout_s, 5);
  });

  test('--hash-seed random leaves each executor its own order', async () => {
    const [a, b] = await ordersByExecutor(random.url);
    assert.notDeepEqual(a, b);
    const health = (await (await fetch(`${random.url}/health`)).json()) as Record<string, unknown>;
    assert.equal(health.hash_seed, 'random');
  });

  test("sympy's own generator is reseeded per call (it repeated between calls of one executor)", async () => {
    const draw = 'import sympy\nprint(sympy.randprime(2, 10**15), sympy.core.random.randint(0, 10**9))';
    const outs = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const [r] = await runAll(fixed.url, [draw]);
      assert.equal(r.reason, '', r.stderr ?? '');
      outs.add(r.stdout ?? '');
    }
    assert.equal(outs.size, 3, [...outs].join(''));
  });

  test('a --hash-seed that is neither a number nor random is a usage error', async () => {
    const r = await rstar(['sandbox-serve', '--hash-seed', 'x1']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--hash-seed.*integer in \[0, 4294967295\] or random/);
  });
});
