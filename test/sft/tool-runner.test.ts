import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Rng } from '../../src/random.js';
import type { SubmissionResult } from '../../src/records/sandbox.js';
import { stepCalls } from '../../src/sft/curriculum/agentic.js';
import { brokenCode } from '../../src/sft/curriculum/families.js';
import { split } from '../../src/sft/curriculum/index.js';
import { type CodeCall, embeddedRunner, type ToolRunner, warmRunner } from '../../src/sft/tool-runner.js';

// The warm runner stands in for the sandbox when sft-data builds demonstrations: every field of
// every result must be the sandbox's own (cost aside), or the model learns tool outputs that RL's
// sandbox never gives.
let sandbox: ToolRunner;
let warm: ToolRunner;

// 3 s: the warm runner imports sympy at its first sympy call (the sandbox's executors preloaded it),
// which under load took over the 1 s limit these tests had and failed the comparison.
before(async () => {
  sandbox = await embeddedRunner({ timeoutS: 3 });
  warm = warmRunner({ timeout: 3 });
});
after(async () => {
  await sandbox.close();
  await warm.close();
});

const same = (r: SubmissionResult) => ({ ...r, cost: undefined, sub_id: undefined });

async function agree(calls: CodeCall[]): Promise<SubmissionResult[]> {
  const [a, b] = await Promise.all([sandbox.run(calls), warm.run(calls)]);
  assert.equal(b.length, calls.length);
  for (const [i, call] of calls.entries()) assert.deepEqual(same(b[i]), same(a[i]), JSON.stringify(call));
  return b;
}

describe('warmRunner: the sandbox results of trusted code, in one interpreter', () => {
  it("answers the curriculum's programs and their slips as the sandbox does", async () => {
    const tasks = split('mix', { train: 300, test: 0, seed: 3 }).train;
    const rng = new Rng(11);
    const calls = tasks.flatMap((t) => [
      { code: t.code, input: t.input },
      { code: brokenCode(t.code, rng), input: t.input },
    ]);
    const results = await agree(calls);
    assert.ok(results.some((r) => r.run_success) && results.some((r) => !r.run_success));
  });

  it('keeps the notebook semantics, error text and exit status of a sandboxed call', async () => {
    const results = await agree(
      [
        'x = 5\nx',
        'None',
        'def f(n):\n    return 10 // n\n\nf(0)',
        'print((1)',
        'import sympy as sp\nx = sp.symbols("x")\nsp.solve(x**2 - 4, x)',
        'import sympy as sp\nsp.solve(undefined_name, 1)',
        'import sys\nprint("partial")\nsys.exit(3)',
        'exit("bye")',
        'raise SystemExit',
        'import atexit\natexit.register(lambda: print("at exit"))\nprint("hi")',
        'import sys\nprint("to stderr", file=sys.stderr)\nprint("to stdout")',
        'import os\nos.write(1, b"raw fd\\n")',
        'print("x" * 5000)',
        'print("héllo ✓ 😀")',
        'import sys\nsys.stdout.buffer.write(b"\\xff\\xfe ok\\n")',
        'print("no newline", end="")',
      ].map((code) => ({ code, input: '' })),
    );
    assert.equal(results[0].stdout, '5\n');
    assert.match(
      results[2].stderr ?? '',
      /^ZeroDivisionError at line 2: integer division or modulo by zero\n {6}return 10 \/\/ n/,
    );
    assert.equal((results[12].stdout ?? '').length, 1000);
  });

  it("prints a set of strings in the sandbox's order (the same string-hash seed)", async () => {
    const code = "print(set('hello world'), {'ab', 'cd', 'ef', 'gh'}, hash('rstar'))";
    const [result] = await agree([{ code, input: '' }]);
    assert.ok(result.run_success, String(result.stderr));
  });

  it('gives the program its stdin, through input(), sys.stdin and fd 0', async () => {
    const input = '3 4 5\nsecond line\n';
    const results = await agree([
      { code: 'print(sum(map(int, input().split())))', input },
      { code: 'import sys\nprint(sys.stdin.read()[::-1])', input },
      { code: 'print(open(0).read().upper())', input },
      { code: 'input()', input: '' },
    ]);
    assert.equal(results[0].stdout, '12\n');
    assert.match(results[3].stderr ?? '', /^EOFError/);
  });

  it("reads a call's files in a working folder of its own, stateless and as a session's cells", async () => {
    const tasks = split('agentic', { train: 24, test: 0, seed: 5 }).train;
    // Stateless: each call brings the task's files (the first call of recover fails on them).
    const calls = tasks.flatMap((t) => stepCalls(t, 'stateless').map((c) => ({ ...c, files: t.files })));
    const results = await agree(calls);
    assert.ok(results.some((r) => !r.run_success && /ValueError/.test(r.stderr ?? '')));
    // A call's files are its own: a call without them does not find the last call's.
    const file = Object.keys(tasks.find((t) => t.files)?.files ?? {})[0];
    const [missing] = await agree([{ code: `print(open(${JSON.stringify(file)}).read())`, input: '' }]);
    assert.match(missing.stderr ?? '', /^FileNotFoundError/);
    // Sessions: the files once, at the session's start; the second cell reuses the first's variables.
    for (const t of tasks.slice(0, 6)) {
      const cells = stepCalls(t, 'session');
      const [a, b] = await Promise.all([sandbox.runCells(cells, t.files), warm.runCells(cells, t.files)]);
      const cell = (r: SubmissionResult) => ({ ...same(r), session_id: undefined });
      assert.deepEqual(b.map(cell), a.map(cell), t.prompt);
      assert.equal((b[b.length - 1].stdout ?? '').trim(), t.answer, t.prompt);
    }
  });

  it('stops a call at its limit with the timeout answer, and runs the next one', async () => {
    const results = await agree([
      { code: 'print("started")\nwhile True:\n    pass', input: '' },
      { code: 'print(2 + 2)', input: '' },
    ]);
    assert.equal(results[0].reason, 'worker_timeout');
    assert.equal(results[0].stdout, 'started\nSuicide from timeout.\n');
    assert.equal(results[1].stdout, '4\n');
  });
});

describe('warmRunner failures', () => {
  it('names the Python it could not run', async () => {
    const broken = warmRunner({ python: '/nonexistent/python3' });
    await assert.rejects(
      broken.run([{ code: 'print(1)', input: '' }]),
      /warm runner.*\/nonexistent\/python3/,
    );
    await broken.close();
  });
});
