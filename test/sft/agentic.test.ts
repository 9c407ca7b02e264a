// Catches: an agentic curriculum task whose answer its programs do not reproduce (in the sandbox,
// with the task's files, stateless or as one session's cells), a data file not in the format the
// task says, a step that does not need what the step before it printed, a recover task whose first
// call does not fail on the token its fix names, and train/test overlap.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Problem } from '../../src/records/problem.js';
import { TrainRecord } from '../../src/records/trajectory.js';
import { loadProtocol, type ProtocolContext } from '../../src/rollout/protocol.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { ConversationRenderer } from '../../src/sft/conversation.js';
import {
  AGENTIC_FAMILIES,
  agenticDemonstrations,
  runSteps,
  stepCalls,
} from '../../src/sft/curriculum/agentic.js';
import { CURRICULA, isTestPrompt, problemOf, split, type Task } from '../../src/sft/curriculum/index.js';
import { sandboxRunner, type ToolRunner } from '../../src/sft/tool-runner.js';
import { lines, ROOT, rstar } from '../support/helpers.js';

let ctx: ProtocolContext;
let runner: ToolRunner;
let close: () => Promise<void>;

before(async () => {
  ctx = await loadProtocol(`${ROOT}fixtures/tiny`);
  const sandbox = await startSandbox();
  runner = sandboxRunner(sandbox.url);
  close = async () => {
    await runner.close();
    await sandbox.close();
  };
});
after(() => close());

const tasks = (name: string, n = 40, seed = 1) => split(name, { train: n, test: 0, seed }).train;

/** The numbers a data file holds, read the way the format says (not the way the programs do). */
function valuesOf(text: string, format: string): number[] {
  const lines = text.trim().split('\n');
  if (format === 'comma') return lines[0].split(',').map(Number);
  if (format === 'lines') return lines.map(Number);
  if (format === 'header') return lines.slice(1).map(Number);
  if (format === 'keyvalue') return lines.map((l) => Number(l.split('=')[1]));
  if (format === 'table') return lines.slice(1).map((l) => Number(l.split(',')[1]));
  return lines.filter((l) => l !== 'N/A').map(Number);
}

const FORMAT_SHAPE: Record<string, RegExp> = {
  comma: /^\d+(,\d+)+\n$/,
  lines: /^(\d+\n)+$/,
  header: /^[a-z]+\n(\d+\n)+$/,
  keyvalue: /^([a-z]+\d+=\d+\n)+$/,
  table: /^name,[a-z]+\n([a-z]\d+,\d+\n)+$/,
  missing: /^((\d+|N\/A)\n)+$/,
};

describe('agentic curriculum', () => {
  it('is registered: seeded, duplicate-free, train and test disjoint by the hash of the prompt', () => {
    for (const name of ['inspect', 'search', 'recover', 'agentic', 'mix-agentic']) {
      assert.ok(CURRICULA.includes(name), name);
      const a = split(name, { train: 150, test: 40, seed: 7 });
      assert.deepEqual(a, split(name, { train: 150, test: 40, seed: 7 }), name);
      const train = new Set(a.train.map((t) => t.prompt));
      assert.equal(train.size, 150, `${name}: duplicate prompts`);
      assert.ok(
        a.test.every((t) => !train.has(t.prompt) && isTestPrompt(t.prompt)),
        name,
      );
      assert.ok(
        split(name, { train: 300, test: 0, seed: 8 }).train.every((t) => !isTestPrompt(t.prompt)),
        name,
      );
    }
    // The one-call mix draws what it drew before the agentic families existed.
    assert.ok(tasks('mix', 200).every((t) => t.steps === undefined));
  });

  it('problems carry their files, family and format; steps are two calls', () => {
    for (const name of Object.keys(AGENTIC_FAMILIES)) {
      for (const t of tasks(name)) {
        const p = Problem.parse(problemOf(t, 'agentic', 'train'));
        assert.equal(p.meta?.family, name);
        assert.equal(t.steps?.length, 2, t.prompt);
        // evaluations count it among the multi-step problems
        assert.equal(p.meta?.steps, 2, t.prompt);
        if (name === 'search') {
          assert.equal(p.files, undefined);
          continue;
        }
        const [file, text] = Object.entries(p.files ?? {})[0] ?? [];
        assert.ok(file !== undefined && t.prompt.includes(file), `${t.prompt}: names its file`);
        const format = String(p.meta?.format);
        assert.match(text, FORMAT_SHAPE[format], `${format}: ${JSON.stringify(text)}`);
        // The prompt does not say how the file is written.
        assert.ok(!/comma|line|header|=|column|N\/A/.test(t.prompt), t.prompt);
      }
    }
  });

  it('every format and wording is drawn', () => {
    const inspect = tasks('inspect', 300);
    assert.deepEqual(
      new Set(inspect.map((t) => t.meta?.format)),
      new Set(['comma', 'lines', 'header', 'keyvalue', 'table']),
    );
    const recover = tasks('recover', 200);
    assert.deepEqual(
      new Set(recover.map((t) => t.meta?.format)),
      new Set(['header', 'comma', 'keyvalue', 'missing']),
    );
    const openings = new Set(inspect.map((t) => t.prompt.split(' ').slice(0, 3).join(' ')));
    assert.ok(openings.size >= 8, [...openings].join(' | '));
    const searches = new Set(tasks('search', 200).map((t) => t.prompt.replace(/\d+/g, 'N')));
    assert.ok(searches.size >= 10, [...searches].join('\n'));
  });

  it('answers come from the data, not from a program', () => {
    for (const t of [...tasks('inspect', 100), ...tasks('recover', 100)]) {
      const text = Object.values(t.files ?? {})[0];
      const xs = valuesOf(text, String(t.meta?.format)).map(BigInt);
      const q = t.prompt;
      const sum = xs.reduce((a, b) => a + b, 0n);
      const max = xs.reduce((a, b) => (b > a ? b : a));
      const min = xs.reduce((a, b) => (b < a ? b : a));
      const want = /squares/.test(q)
        ? xs.reduce((a, b) => a + b * b, 0n)
        : /sum|Add up/.test(q)
          ? sum
          : /difference|far apart/.test(q)
            ? max - min
            : /largest/.test(q)
              ? max
              : min;
      assert.equal(t.answer, String(want), q);
    }
    // search: n by brute force here, then the quantity.
    for (const t of tasks('search', 100)) {
      const x = Number(/than (\d+)/.exec(t.prompt)?.[1]);
      assert.ok(Number.isInteger(x), t.prompt);
      const has = /square/.test(t.prompt)
        ? (n: number) => n * n > x
        : /1 \+ 2/.test(t.prompt)
          ? (n: number) => (n * (n + 1)) / 2 > x
          : /2 to the power n is/.test(t.prompt)
            ? (n: number) => 2 ** n > x
            : (n: number) =>
                n > x && [...Array(Math.floor(Math.sqrt(n)) - 1)].every((_, i) => n % (i + 2) !== 0);
      let n = 1;
      while (!has(n)) n += 1;
      assert.equal(t.steps?.[0].prints, String(n), t.prompt);
      // The second step needs n: its program names it, the prompt does not.
      assert.ok(t.steps?.[1].code.includes(String(n)) && !new RegExp(`\\b${n}\\b`).test(t.prompt), t.prompt);
    }
  });

  it('every step runs for real with the files: stateless calls and session cells reproduce the answer', async () => {
    const all = Object.keys(AGENTIC_FAMILIES).flatMap((name) => tasks(name, 12, 3));
    // runSteps throws when a step does not print what it must (the answer, the head, n) or a
    // recover call does not fail on its token.
    const stateless = await Promise.all(all.map((t) => runSteps(t, runner, 'stateless')));
    stateless.forEach((results, i) => {
      assert.equal((results[1].stdout ?? '').trim(), all[i].answer, all[i].prompt);
      if (all[i].family === 'recover') {
        assert.equal(results[0].run_success, false);
        assert.match(results[0].stderr ?? '', /ValueError at line 2: invalid literal for int\(\)/);
      }
    });
    // Without its files a data task's program fails: the files really are read.
    const withoutFiles = all.filter((t) => t.files !== undefined).slice(0, 4);
    const bare = await runner.run(withoutFiles.map((t) => ({ code: t.code, input: '' })));
    for (const r of bare) assert.match(r.stderr ?? '', /FileNotFoundError/);
    // Session mode: later cells reuse the variables of earlier ones (they would fail alone).
    let sessions = 0;
    for (const t of all) {
      const cells = stepCalls(t, 'session');
      assert.notEqual(cells[1].code, t.steps?.[1].code, 'the second cell reuses a variable');
      try {
        const results = await runSteps(t, runner, 'session');
        assert.equal((results[1].stdout ?? '').trim(), t.answer);
        sessions += 1;
      } catch (error) {
        // A sandbox without isolation has no sessions (501): nothing to check there.
        if (!/501|isolation/.test(String(error))) throw error;
      }
    }
    const alone = await runner.run([{ ...stepCalls(all[0], 'session')[1], files: all[0].files }]);
    assert.equal(alone[0].run_success, false, 'a second cell alone misses the first cell’s variable');
    console.log(`# ${sessions} of ${all.length} tasks run as sessions (0: no isolation, no sessions here)`);
  });

  it('demonstrations: one turn per step, the real tool output, the fix after the traceback', async () => {
    const renderer = new ConversationRenderer(ctx);
    const some = Object.keys(AGENTIC_FAMILIES).flatMap((name) => tasks(name, 3, 5));
    const records = await agenticDemonstrations(some, runner, renderer, {
      name: 'agentic',
      record: (t: Task) => {
        const p = problemOf(t, 'agentic', 'train');
        return { id: p.id, source: p.source as string };
      },
    });
    records.forEach((r, i) => {
      const t = some[i];
      TrainRecord.parse(r);
      assert.equal((r.text.match(/<tool_call>/g) ?? []).length, 2, r.text);
      assert.ok(r.text.endsWith(`<answer>\\boxed{${t.answer}}</answer><|im_end|>`), r.text);
      if (t.family === 'recover') {
        assert.match(r.text, /Tool call failure[\s\S]*ValueError[\s\S]*The error shows '/);
      } else {
        assert.equal((r.text.match(/Tool call success/g) ?? []).length, 2, r.text);
      }
      if (t.family === 'inspect') {
        // The head of the file comes back before the parser is written.
        const text = Object.values(t.files ?? {})[0];
        assert.ok(r.text.indexOf(text.split('\n')[0]) < r.text.lastIndexOf('<tool_call>'), r.text);
      }
    });
  });

  it('rstar sft-data --synthetic mix-agentic: problems with their files, demonstrations in task order', async () => {
    const out = mkdtempSync(join(tmpdir(), 'rstar-agentic-'));
    try {
      const args = ['sft-data', '--synthetic', 'mix-agentic', '--train', '24', '--test', '4', '--seed', '2'];
      const res = await rstar([...args, '--tokenizer', `${ROOT}fixtures/tiny`, '--out', out]);
      assert.equal(res.code, 0, res.stderr);
      const problems = lines<{ id: string; files?: Record<string, string>; meta: { family: string } }>(
        readFileSync(join(out, 'train-problems.jsonl'), 'utf8'),
      );
      const sft = lines<{ problem_id: string; text: string }>(readFileSync(join(out, 'sft.jsonl'), 'utf8'));
      assert.deepEqual(
        sft.map((r) => r.problem_id),
        problems.map((p) => p.id),
      );
      const multi = problems.filter((p) => ['inspect', 'search', 'recover'].includes(p.meta.family));
      assert.ok(multi.length > 0 && multi.length < problems.length, 'both kinds drawn');
      for (const p of multi) {
        const r = sft.find((x) => x.problem_id === p.id);
        assert.equal((r?.text.match(/<tool_call>/g) ?? []).length, 2, p.id);
        if (p.meta.family !== 'search') assert.ok(Object.keys(p.files ?? {}).length === 1, p.id);
      }
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  it('rstar sft-data --tool-state session: the second call reuses the first call’s n', async () => {
    const out = mkdtempSync(join(tmpdir(), 'rstar-agentic-'));
    try {
      const args = [
        'sft-data',
        '--synthetic',
        'search',
        '--train',
        '3',
        '--test',
        '1',
        '--tool-state',
        'session',
      ];
      const res = await rstar([...args, '--tokenizer', `${ROOT}fixtures/tiny`, '--out', out]);
      assert.equal(res.code, 0, res.stderr);
      const sft = lines<{ text: string }>(readFileSync(join(out, 'sft.jsonl'), 'utf8'));
      assert.equal(sft.length, 3);
      for (const r of sft) {
        const second = r.text.split('<tool_call>')[2] ?? '';
        assert.match(second, /[(* ]n[ ),]/, second);
        assert.doesNotMatch(second, /\(\d+ \* \(\d+|2 \*\* \d+|pow\(\d+, \d+, /, second);
      }
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
