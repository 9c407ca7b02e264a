import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { SubmissionResult } from '../../src/records/sandbox.js';
import { deterministic, GroupToolCache, samplesPerProblem } from '../../src/rollout/tool-cache.js';

const result = (stdout: string): SubmissionResult => ({
  sub_id: '',
  success: true,
  run_success: true,
  cost: 0,
  reason: '',
  stdout,
  stderr: '',
});

/** An execute() that counts its runs and answers after a tick (so calls overlap in flight). */
function counter(answer = 'ok\n') {
  const c = {
    runs: 0,
    execute: () => {
      c.runs++;
      return new Promise<SubmissionResult>((r) => setTimeout(() => r(result(answer)), 5));
    },
  };
  return c;
}

/** The programs `deterministic` judges otherwise than `expected` (none, when it is right). */
const misjudged = (expected: boolean, codes: string[]) =>
  codes.filter((code) => deterministic(code) !== expected);

describe('tool cache: which code may print something else when run again', () => {
  it('trusts plain arithmetic, sympy and stdin programs', () => {
    const codes = [
      'print(6 // 2)',
      'import math\nprint(math.comb(10, 3))',
      'import sympy as sp\nx = sp.symbols("x")\nprint(sp.solve(x**2 - 4, x))',
      'print(sum(map(int, input().split())))',
      'from itertools import permutations\nprint(len(list(permutations(range(5)))))',
    ];
    assert.deepEqual(misjudged(true, codes), []);
  });

  it('runs randomness, clocks, the process, the machine and ways around the check every time', () => {
    const codes = [
      'import random\nprint(random.random())',
      'from random import randint\nprint(randint(1, 6))',
      'import numpy as np\nprint(np.random.rand())',
      'import sympy\nprint(sympy.randprime(1, 100))',
      'import time\nprint(time.time())',
      'from datetime import datetime\nprint(datetime.now())',
      'from time import perf_counter\nprint(perf_counter())',
      'import os\nprint(os.getpid())',
      'print(id(object()))',
      'print(hash("a"))',
      'print(open("/proc/self/stat").read())',
      'import secrets\nprint(secrets.token_hex())',
      'import uuid\nprint(uuid.uuid4())',
      'exec("import ran" + "dom")',
      'print(eval("1"))',
      '__import__("ti" + "me")',
      'import threading\nprint(threading.get_ident())',
    ];
    assert.deepEqual(misjudged(false, codes), []);
  });
});

describe('GroupToolCache', () => {
  it("runs a group's identical calls once, also while the first is in flight", async () => {
    const cache = new GroupToolCache(samplesPerProblem([{ problem: { id: 'p' } }, { problem: { id: 'p' } }]));
    const c = counter('3\n');
    const [a, b] = await Promise.all([
      cache.run('p', 'print(3)', '', c.execute),
      cache.run('p', 'print(3)', '', c.execute),
    ]);
    assert.equal(c.runs, 1);
    assert.equal(a.stdout, '3\n');
    assert.deepEqual(b, a);
    assert.equal(cache.hits, 1);
  });

  it('keys on the code and the stdin within one problem', async () => {
    const cache = new GroupToolCache(
      new Map([
        ['p', 4],
        ['q', 4],
      ]),
    );
    const c = counter();
    await cache.run('p', 'print(input())', '1', c.execute);
    await cache.run('p', 'print(input())', '2', c.execute);
    await cache.run('p', 'print(input()) ', '1', c.execute);
    await cache.run('q', 'print(input())', '1', c.execute);
    assert.equal(c.runs, 4);
    await cache.run('q', 'print(input())', '1', c.execute);
    assert.equal(c.runs, 4);
  });

  it('always runs code that may vary, and a problem it was not told of', async () => {
    const cache = new GroupToolCache(new Map([['p', 3]]));
    const c = counter();
    for (let i = 0; i < 3; i++) await cache.run('p', 'import random\nprint(random.random())', '', c.execute);
    await cache.run('other', 'print(1)', '', c.execute);
    await cache.run('other', 'print(1)', '', c.execute);
    assert.equal(c.runs, 5);
    assert.equal(cache.hits, 0);
  });

  it('runs a call again after its run failed (the service, not the program)', async () => {
    const cache = new GroupToolCache(new Map([['p', 3]]));
    let runs = 0;
    const failing = () => {
      runs++;
      return Promise.reject(new Error('sandbox unreachable'));
    };
    await assert.rejects(cache.run('p', 'print(1)', '', failing), /unreachable/);
    const c = counter();
    const r = await cache.run('p', 'print(1)', '', c.execute);
    assert.equal(runs, 1);
    assert.equal(c.runs, 1);
    assert.equal(r.stdout, 'ok\n');
  });

  it('forgets a group with its last sample: what it holds is bounded by the problems in flight', async () => {
    const cache = new GroupToolCache(new Map([['p', 2]]));
    const c = counter();
    await cache.run('p', 'print(1)', '', c.execute);
    cache.finished('p');
    await cache.run('p', 'print(1)', '', c.execute);
    assert.equal(c.runs, 1);
    cache.finished('p');
    await cache.run('p', 'print(1)', '', c.execute);
    assert.equal(c.runs, 2);
  });
});
