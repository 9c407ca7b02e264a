// Catches: the warm runner's sessions (sft-data --tool-state session) not following the sandbox's
// cell rules (in its own process, or forked where only a fork is exact: a session forked for
// ordinary cells, or not for a thread or a limit): state lost between cells, an exception undoing
// what ran before it, a cell killed at its limit changing the session (variables or files), a
// cell's background thread living on in the session's state, session processes left behind; and
// the curriculum's session-only demonstration (a second call printing the first call's variable)
// missing, leaking into stateless data, or carrying a prompt without the session sentence.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { SubmissionResult } from '../../src/records/sandbox.js';
import { loadProtocol, promptText } from '../../src/rollout/protocol.js';
import { SESSION_NOTE } from '../../src/rollout/tool-state.js';
import { resolveInterpreter } from '../../src/sandbox/python.js';
import { ConversationRenderer } from '../../src/sft/conversation.js';
import { demonstrations, reuseCalls, split } from '../../src/sft/curriculum/index.js';
import { embeddedRunner, type ToolRunner, warmRunner } from '../../src/sft/tool-runner.js';
import { ROOT } from '../support/helpers.js';

let dir: string;
let python: string;
let warm: ToolRunner;
let sandbox: ToolRunner;

/** Processes running this suite's own Python (a symlink of its own, so other suites' do not count). */
function ours(): number {
  let n = 0;
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0] === python) n += 1;
    } catch {
      // gone meanwhile
    }
  }
  return n;
}

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rstar-warm-session-'));
  python = join(dir, 'python3');
  symlinkSync(resolveInterpreter().executable, python);
  warm = warmRunner({ python, timeout: 1 });
});
after(async () => {
  await warm.close();
  await sandbox?.close();
  rmSync(dir, { recursive: true, force: true });
});

const cell = (code: string, input = '') => ({ code, input });

describe('warmRunner sessions: the sandbox cell rules for trusted code', () => {
  it('keeps variables, imports, functions and files from cell to cell; stateless calls do not', async () => {
    const calls = [
      cell(
        'x = 5\nimport math\ndef twice(n):\n    return 2 * n\nwith open("a.txt", "w") as f:\n    f.write("kept")',
      ),
      cell('print(x, math.isqrt(17), twice(4), open("a.txt").read())'),
    ];
    const session = await warm.runCells(calls);
    assert.deepEqual(
      session.map((r) => [r.run_success, r.stdout, r.session_rolled_back]),
      [
        [true, '', undefined],
        [true, '5 4 8 kept\n', undefined],
      ],
    );
    const stateless = await warm.run(calls);
    assert.equal(stateless[1].run_success, false);
    assert.match(stateless[1].stderr ?? '', /^NameError at line 1: name 'x' is not defined/);
  });

  it('an exception keeps what ran before it, as a notebook does', async () => {
    const [first, second] = await warm.runCells([
      cell('y = 1\nraise ValueError("boom")\ny = 2'),
      cell('print(y)'),
    ]);
    assert.equal(first.run_success, false);
    assert.equal(first.session_rolled_back, undefined);
    assert.match(first.stderr ?? '', /^ValueError at line 2: boom/);
    assert.equal(second.stdout, '1\n');
  });

  it('a cell stopped at its limit leaves the session as it was, its files too', async () => {
    const results = await warm.runCells([
      cell('z = "before"\nopen("f.txt", "w").write("before")'),
      cell(
        'z = "during"\nopen("f.txt", "w").write("during")\nopen("g.txt", "w").write("new")\nprint("started")\nwhile True:\n    pass',
      ),
      cell('import os\nprint(z, open("f.txt").read(), sorted(os.listdir(".")))'),
    ]);
    assert.equal(results[1].reason, 'worker_timeout');
    assert.equal(results[1].stdout, 'started\nSuicide from timeout.\n');
    assert.equal(results[1].session_rolled_back, true);
    assert.equal(results[2].stdout, "before before ['f.txt']\n");
  });

  it("a cell's background thread does not live on in the session's state", async () => {
    // The state is the finished cell's main thread alone: `ticks` does not move while later cells
    // run (a thread kept in the session would go on counting between and during them). Measured
    // inside the later cells, not against the value the first cell saw last: the thread may tick
    // again between that cell's last line and the end of the cell.
    const [, , later] = await warm.runCells([
      cell(
        'import threading, time\nticks = [0]\ndef spin():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.001)\nthreading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.05)',
      ),
      cell('import time\na = ticks[0]\ntime.sleep(0.3)\nb = ticks[0]'),
      cell(
        'import threading, time\ntime.sleep(0.05)\nprint(threading.active_count(), a == b == ticks[0], a > 0)',
      ),
    ]);
    assert.equal(later.stdout, '1 True True\n', String(later.stderr));
  });

  it('runs an ordinary session in its own process, and forks one only where that alone is exact', async () => {
    const runner = (): number => {
      for (const pid of readdirSync('/proc')) {
        try {
          if (/^\d+$/.test(pid) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0] === python)
            return Number(pid);
        } catch {
          // gone meanwhile
        }
      }
      return -1;
    };
    const pid = runner();
    const pids = async (cells: { code: string; input: string }[]) =>
      (await warm.runCells(cells)).map((r) => Number(r.stdout?.trim().split('\n').at(-1) || -1));
    const getpid = cell('import os as o\nprint(o.getpid())');
    // Two ordinary cells (the curriculum's): no fork, the runner's own pid both times.
    assert.deepEqual(await pids([cell('v = 1'), getpid]), [-1, pid]);
    // A thread, or a cell stopped at its limit: the session is a forked one, cell by cell.
    const threaded = await pids([cell('import threading\nv = 1'), getpid]);
    assert.notEqual(threaded[1], pid);
    const stopped = await pids([cell('while True:\n    pass'), getpid]);
    assert.notEqual(stopped[1], pid);
  });

  it('leaves no session process behind once a session is closed', async () => {
    const alone = ours();
    assert.equal(alone, 1, 'the warm runner alone');
    await warm.runCells([cell('a = 1'), cell('while True:\n    pass'), cell('print(a)')]);
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(ours(), alone);
  });
});

describe('warm sessions agree with sandbox-serve sessions', () => {
  before(async () => {
    sandbox = await embeddedRunner({ timeoutS: 1 });
  });

  it('gives every cell the result the sandbox gives it (cost and ids aside)', async () => {
    const cells = [
      cell('import math\nx = 6\ndef f(n):\n    return n * x\nopen("notes.txt", "w").write("kept")\nx'),
      cell('f(7), math.factorial(x), open("notes.txt").read()'),
      cell('a = 1\nb = 1 / 0\nc = 3'),
      cell('[name in globals() for name in ("a", "b", "c")]'),
      cell('import atexit\natexit.register(lambda: print("at exit"))\nprint("registered")'),
      cell('x = 100\nprint("started")\nwhile True:\n    pass'),
      cell('print(x, sorted(__import__("os").listdir(".")))'),
      cell('n = int(input())\nn * 2', '21'),
      cell('print(n, end="")'),
      cell('import sys\nsys.exit(3)'),
      cell('print("still here", n)'),
    ];
    const same = (r: SubmissionResult) => ({
      ...r,
      cost: undefined,
      sub_id: undefined,
      session_id: undefined,
    });
    const [a, b] = await Promise.all([sandbox.runCells(cells), warm.runCells(cells)]);
    assert.equal(b.length, cells.length);
    for (const [i, c] of cells.entries()) assert.deepEqual(same(b[i]), same(a[i]), c.code);
    assert.equal(b[5].session_rolled_back, true);
    assert.equal(b[6].stdout, "6 ['notes.txt']\n");
  });
});

describe("sympy's Dummy numbering: the same in the warm runner as in the sandbox", () => {
  it('numbers the first Dummy of every call and session as a fresh interpreter does, on both', async () => {
    // The warm runner imports sympy in its first call and keeps it: without the reset, its second
    // call would count on from the first, and its base would be its own random draw.
    const code = cell(
      'import sympy\nsympy.solve(sympy.Symbol("t")**2 - 1)\nd = sympy.Dummy("d")\nprint(d.dummy_index, sympy.srepr(d))',
    );
    // Runners of their own with a time limit sympy's import and solve meet on a loaded machine
    // (the shared ones give a cell 1 s, which a busy CI core does not always grant).
    const slowWarm = warmRunner({ python, timeout: 30 });
    const slowBox = await embeddedRunner({ timeoutS: 30 });
    let warmCalls: SubmissionResult[];
    let warmCells: SubmissionResult[];
    let sandboxCalls: SubmissionResult[];
    try {
      [warmCalls, warmCells, sandboxCalls] = await Promise.all([
        slowWarm.run([code, code]),
        slowWarm.runCells([code, code]),
        slowBox.run([code]),
      ]);
    } finally {
      await slowWarm.close();
      await slowBox.close();
    }
    const first = sandboxCalls[0].stdout ?? '';
    assert.match(first, /^(\d+) Dummy\('d', dummy_index=\1\)\n$/);
    assert.deepEqual(
      [...warmCalls, warmCells[0]].map((r) => r.stdout),
      [first, first, first],
    );
    assert.notEqual(warmCells[1].stdout, first, 'a session counts on');
  });
});

describe('sft-data demonstrations in session mode', () => {
  it('adds reuse demonstrations only in session mode, run with the real cell rules', async () => {
    const tasks = split('mix', { train: 40, test: 0, seed: 4 }).train;
    const stateless = new ConversationRenderer(await loadProtocol(`${ROOT}fixtures/tiny`));
    const session = new ConversationRenderer(
      await loadProtocol(`${ROOT}fixtures/tiny`, { toolState: 'session' }),
    );
    const options = { errorRate: 0.2, seed: 4, name: 'mix' };
    const a = await demonstrations(tasks, warm, stateless, options);
    const b = await demonstrations(tasks, warm, session, { ...options, toolState: 'session' });
    assert.equal(a.reused, 0);
    assert.ok(b.reused > 0, 'some demonstrations reuse a variable');
    const reusing = b.records.filter((r) => r.text.includes('"code": "print(value)"'));
    assert.equal(reusing.length, b.reused);
    assert.ok(a.records.every((r) => !r.text.includes('print(value)')));
    for (const r of reusing) {
      assert.match(r.text, /Tool call success\nstdout: (-?\d+)\n\nexecution time: 0\.00s/);
      assert.ok(r.text.endsWith(`<answer>\\boxed{${r.answer}}</answer><|im_end|>`), r.text);
    }
    // The session sentence is in every session prompt and in no stateless one.
    const noted = (ids: number[]) => session.ctx.tokenizer.decode(ids).includes(SESSION_NOTE);
    assert.ok(b.records.every((r) => noted(r.prompt_ids)));
    assert.ok(a.records.every((r) => !noted(r.prompt_ids)));
    // The same demonstration's calls without a session: the second one has no variable to print.
    const task = tasks.find((t) => reuseCalls(t) !== undefined);
    assert.ok(task);
    const pair = reuseCalls(task) ?? [];
    const [, fresh] = await warm.run(pair);
    assert.match(fresh.stderr ?? '', /^NameError at line 1: name 'value' is not defined/);
    // The demonstrations of one call, and the stateless data, are what they were.
    const single = b.records.filter(
      (r) => !r.text.includes('print(value)') && !r.text.includes('Tool call failure'),
    );
    for (const r of single) {
      const same = a.records.find((x) => x.id === r.id);
      assert.equal(same?.text, r.text);
    }
    assert.ok(promptText('q', session.ctx).includes(SESSION_NOTE));
  });
});
