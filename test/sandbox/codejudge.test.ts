// code-judge's own test suite (github.com/0xWJ/code-judge, tests/test_main.py), re-expressed:
// each test below checks over real HTTP against a real `sandbox-serve` what the code-judge test
// of the same name checks against code-judge. Its C++ submissions are out of scope here (this
// service runs Python only): they answer `invalid_input`, so the mixed batches of `test_batch`
// differ from code-judge in exactly those entries, and the C++-only tests have no counterpart.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { type GuardedServer, startGuardedServer } from '../support/guard.js';

type Answer = {
  sub_id: string | number | null;
  success: boolean;
  run_success: boolean;
  cost: number;
  reason: string;
  stdout?: string | null;
  stderr?: string | null;
};

/** The service's time limit here (code-judge's default is 10 s; its tests sleep exactly that). */
const LIMIT = 1;
const KINDS = ['judge', 'run'] as const;
const BATCHES = ['batch', 'long-batch'] as const;

const echo = (input: string, expected: string) => ({
  type: 'python',
  solution: 'print(input())',
  input,
  expected_output: expected,
});
const cpp = (solution: string, expected: string) => ({ type: 'cpp', solution, expected_output: expected });

async function postTo(url: string, path: string, body: unknown) {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 200);
  return (await response.json()) as Answer & { results: Answer[] };
}

/** Calls at, just past, far past and well under the limit, side by side, a few rounds. */
async function checkBoundary(url: string, rounds: number) {
  const sleep = (s: number) => ({ type: 'python', solution: `import time\ntime.sleep(${s})\nprint("done")` });
  for (let round = 0; round < rounds; round += 1) {
    const [batch, over, below] = await Promise.all([
      postTo(url, '/run/batch', { type: 'batch', submissions: [sleep(LIMIT), sleep(LIMIT + 0.001)] }),
      postTo(url, '/run', sleep(LIMIT + 5)),
      postTo(url, '/run', sleep(LIMIT * 0.5)),
    ]);
    for (const r of [...batch.results, over]) {
      assert.equal(r.reason, 'worker_timeout', JSON.stringify(r));
      assert.equal(r.run_success, false);
      assert.equal(r.stdout, 'Suicide from timeout.\n');
      assert.ok(r.cost >= LIMIT, `cost ${r.cost}`);
    }
    assert.equal(below.reason, '', JSON.stringify(below));
    assert.equal(below.stdout, 'done\n');
    assert.ok(below.cost < LIMIT);
  }
}

describe('code-judge tests/test_main.py, against sandbox-serve', () => {
  let server: GuardedServer;
  const post = (path: string, body: unknown) => postTo(server.url, path, body);
  /** A /judge answer has code-judge's JudgeResult fields only; a /run answer has the output too. */
  const checkShape = (kind: string, answer: Answer) =>
    assert.deepEqual(
      Object.keys(answer).sort(),
      kind === 'judge'
        ? ['cost', 'reason', 'run_success', 'sub_id', 'success']
        : ['cost', 'reason', 'run_success', 'stderr', 'stdout', 'sub_id', 'success'],
    );

  before(async () => {
    server = await startGuardedServer(['--workers', '2', '--tool-timeout', String(LIMIT)]);
  });
  after(async () => {
    assert.deepEqual(await server.stop(), [], 'SIGTERM leaves no process behind');
  });

  for (const kind of KINDS) {
    test(`test_python (${kind}): stdin echoed, output matches`, async () => {
      const r = await post(`/${kind}`, echo('a', 'a'));
      checkShape(kind, r);
      assert.equal(r.success, true);
      assert.equal(r.run_success, true);
    });

    test(`test_python_timeout (${kind}): sleep(limit) is worker_timeout, every time`, async () => {
      // code-judge's alarm fires at its limit before a sleep of exactly that length returns; the
      // race would show as an occasional run_success here, so the boundary case runs repeatedly.
      const calls = Array.from({ length: 4 }, () =>
        post(`/${kind}`, {
          type: 'python',
          solution: `from time import sleep\nsleep(${LIMIT})`,
          input: 'a',
          expected_output: 'a',
        }),
      );
      for (const r of await Promise.all(calls)) {
        checkShape(kind, r);
        assert.equal(r.success, false, JSON.stringify(r));
        assert.equal(r.run_success, false, JSON.stringify(r));
        assert.equal(r.reason, 'worker_timeout');
        assert.ok(r.cost >= LIMIT && r.cost < LIMIT + 1, `cost ${r.cost}`);
        if (kind === 'run') assert.equal(r.stdout?.trim(), 'Suicide from timeout.');
      }
    });

    test(`test_python_fail (${kind}): ran, output differs`, async () => {
      const r = await post(`/${kind}`, echo('a', 'b'));
      assert.equal(r.success, false);
      assert.equal(r.run_success, true);
    });

    test(`test_python_missing_input (${kind}): input() at EOF fails the run`, async () => {
      const r = await post(`/${kind}`, echo('', 'a'));
      assert.equal(r.success, false);
      assert.equal(r.run_success, false);
    });

    for (const batch of BATCHES) {
      test(`test_batch (${kind}/${batch}): Python entries as code-judge, C++ entries invalid_input`, async () => {
        const { results } = await post(`/${kind}/${batch}`, {
          type: 'batch',
          submissions: [
            cpp('#include <cstdio>\nint main(){printf("a");return 0;}\n', 'b'),
            echo('a', 'b'),
            echo('a', 'a'),
            cpp('#include <cstdio>\n#include <unistd.h>\nint main(){sleep(3);printf("a");return 0;}\n', 'a'),
          ],
        });
        assert.equal(results.length, 4);
        // code-judge: [ran + wrong, ran + wrong, ran + right, ran + right]; C++ is out of scope.
        for (const i of [0, 3]) {
          assert.equal(results[i].reason, 'invalid_input');
          assert.equal(results[i].run_success, false);
          assert.equal(results[i].success, false);
        }
        assert.deepEqual([results[1].run_success, results[1].success], [true, false]);
        assert.deepEqual([results[2].run_success, results[2].success], [true, true]);
      });

      test(`test_batch_fail (${kind}/${batch}): failures and successes keep their order`, async () => {
        const submissions = [0, 1, 2].flatMap(() => [echo('', 'b'), echo('a', 'a')]);
        const { results } = await post(`/${kind}/${batch}`, { type: 'batch', submissions });
        assert.equal(results.length, 6);
        results.forEach((r, i) => {
          checkShape(kind, r);
          const ok = i % 2 === 1;
          assert.deepEqual([r.success, r.run_success], [ok, ok], `result ${i}`);
        });
      });
    }

    test(`test_multi_process (${kind}): a child left running fails the call`, async () => {
      const solution = [
        'from time import sleep',
        'from multiprocessing import Process',
        'def worker():',
        '    sleep(100)',
        'p = Process(target=worker)',
        'p.start()',
        'sleep(0.2)',
        'print("parent done, child still running")',
      ].join('\n');
      const r = await post(`/${kind}`, { type: 'python', solution, input: '', expected_output: 'a' });
      assert.equal(r.success, false);
      assert.equal(r.run_success, false);
    });

    test(`test_io_valid (${kind}): a file in the working directory is writable`, async () => {
      const solution = "with open('test.txt', 'w') as f:\n    f.write('Hello, world!')";
      const r = await post(`/${kind}`, { type: 'python', solution, input: '', expected_output: '' });
      assert.equal(r.success, true);
      assert.equal(r.run_success, true);
    });

    test(`test_io_invalid (${kind}): writing outside the working directory answers`, async () => {
      // code-judge only checks for an answer (and reports whether the write escaped).
      const solution = "with open('../test.txt', 'w') as f:\n    f.write('Hello, world!')";
      const r = await post(`/${kind}`, { type: 'python', solution, input: '', expected_output: '' });
      checkShape(kind, r);
    });
  }

  test('the timeout boundary: at the limit always a timeout, comfortably below never', async () => {
    await checkBoundary(server.url, 3);
  });

  test('a timed-out call keeps what it printed, then the timeout line', async () => {
    // Block-buffered output (stdout is a pipe) written before the limit is not lost.
    const solution = 'import time\nprint("partial", 42)\nwhile True:\n    time.sleep(0.01)';
    const r = await post('/run', { type: 'python', solution });
    assert.equal(r.reason, 'worker_timeout');
    assert.equal(r.stdout, 'partial 42\nSuicide from timeout.\n');
    const busy = await post('/run', { type: 'python', solution: 'print("x")\nwhile True:\n    pass' });
    assert.equal(busy.stdout, 'x\nSuicide from timeout.\n');
    assert.equal(busy.stderr, '');
  });
});

test('the timeout boundary holds without namespaces too (degraded mode)', async () => {
  const server = await startGuardedServer(['--workers', '2', '--tool-timeout', String(LIMIT)], {
    env: { RSTAR_SANDBOX_NO_ISOLATION: '1' },
  });
  try {
    await checkBoundary(server.url, 2);
  } finally {
    assert.deepEqual(await server.stop(), []);
  }
});
