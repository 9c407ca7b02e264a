import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Problem } from '../../src/records/problem.js';
import { TrainRecord } from '../../src/records/trajectory.js';
import { loadProtocol, type ProtocolContext, promptIds } from '../../src/rollout/protocol.js';
import { ConversationRenderer } from '../../src/sft/conversation.js';
import {
  CURRICULA,
  demonstrations,
  FAMILIES,
  isTestPrompt,
  parseFamilyWeights,
  split,
} from '../../src/sft/curriculum/index.js';
import { embeddedRunner, type ToolRunner } from '../../src/sft/tool-runner.js';
import { lines, ROOT, rstar } from '../support/helpers.js';

let ctx: ProtocolContext;
let runner: ToolRunner;
let dir: string;

before(async () => {
  ctx = await loadProtocol(`${ROOT}fixtures/tiny`);
  runner = await embeddedRunner();
  dir = mkdtempSync(join(tmpdir(), 'rstar-curriculum-'));
});
after(async () => {
  await runner.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The boxed answer at the end of a demonstration. */
function fixedAnswer(text: string): string {
  return /\\boxed\{(-?\d+)\}<\/answer><\|im_end\|>$/.exec(text)?.[1] ?? '(none)';
}

describe('synthetic curriculum', () => {
  it('gives seeded, duplicate-free, disjoint train and test sets', () => {
    for (const name of CURRICULA) {
      const a = split(name, { train: 150, test: 40, seed: 7 });
      const b = split(name, { train: 150, test: 40, seed: 7 });
      assert.deepEqual(a, b, name);
      assert.equal(a.train.length, 150);
      assert.equal(a.test.length, 40);
      const train = new Set(a.train.map((t) => t.prompt));
      assert.equal(train.size, 150, `${name}: duplicate train prompts`);
      assert.ok(
        a.test.every((t) => !train.has(t.prompt)),
        `${name}: test prompt in train`,
      );
      // The split is a function of the prompt, so even another seed's train set never holds them.
      const other = split(name, { train: 300, test: 0, seed: 8 });
      assert.ok(other.train.every((t) => !isTestPrompt(t.prompt)));
      assert.ok(a.test.every((t) => isTestPrompt(t.prompt)));
    }
  });

  it('has no trivially guessable answers (a count of 0 whatever the bound)', () => {
    const counts = split('count', { train: 300, test: 0, seed: 5 }).train;
    assert.ok(counts.every((t) => Number(t.answer) > 0));
    // Nor a condition that names one divisor twice (seed 1 drew "both 18 and 18" before the fix).
    const both = split('mix', { train: 5000, test: 0, seed: 1 }).train.filter((t) => / both /.test(t.prompt));
    assert.ok(both.length > 0);
    for (const t of both) {
      const [, a, b] = /both (\d+) and (\d+)\?/.exec(t.prompt) ?? [];
      assert.notEqual(a, b, t.prompt);
    }
  });

  it('answers are right: each family’s programs, run in the sandbox, print the computed answer', async () => {
    // 30 per family reaches every wording of every family (at most 6 each) with near certainty.
    const tasks = Object.keys(FAMILIES).flatMap((name) => split(name, { train: 30, test: 0, seed: 1 }).train);
    const results = await runner.run(tasks.map((t) => ({ code: t.code, input: t.input })));
    tasks.forEach((t, i) => {
      assert.equal(results[i].run_success, true, `${t.prompt}: ${results[i].stderr}`);
      assert.equal((results[i].stdout ?? '').trim(), t.answer, t.prompt);
    });
  });

  it('demonstrations are rollout trajectories: rStar2 format, real tool output, masks, fixed errors', async () => {
    const renderer = new ConversationRenderer(ctx);
    const tasks = split('mix', { train: 12, test: 0, seed: 3 }).train;
    const { records, failedFirst } = await demonstrations(tasks, runner, renderer, {
      errorRate: 0.5,
      seed: 3,
      name: 'mix',
    });
    assert.equal(records.length, tasks.length);
    assert.ok(failedFirst > 0, 'some first calls fail');
    records.forEach((r, i) => {
      TrainRecord.parse(r);
      assert.deepEqual(r.prompt_ids, promptIds(tasks[i].prompt, ctx));
      assert.ok(r.text.endsWith(`<answer>\\boxed{${tasks[i].answer}}</answer><|im_end|>`), r.text);
      assert.match(
        r.text,
        /^[^<]+<\/reason>\n<tool_call>\n\{"name": "python_code_with_standard_io", "arguments": /,
      );
      // Every tool response is environment (mask 0); everything the model writes is 1.
      const masked = r.response_ids.filter((_, j) => r.loss_mask[j] === 0);
      const env = ctx.tokenizer.decode(masked);
      assert.ok(env.includes('<tool_response>\nTool call success\nstdout: '), env);
      assert.ok(
        !ctx.tokenizer
          .decode(r.response_ids.filter((_, j) => r.loss_mask[j] === 1))
          .includes('<tool_response>'),
      );
    });
    const fixed = records.filter((r) => r.text.includes('Tool call failure'));
    assert.equal(fixed.length, failedFirst);
    for (const r of fixed) {
      assert.match(r.text, /(NameError|SyntaxError)/);
      assert.match(r.text, /The code has an error\. I will fix it\.<\/reason>/);
      // The slipped call is in the context but not in the loss; the fix and the answer are.
      const learnt = ctx.tokenizer.decode(r.response_ids.filter((_, j) => r.loss_mask[j] === 1));
      assert.ok(!/prnt\(|pritn\(/.test(learnt), learnt);
      assert.ok(learnt.startsWith('The code has an error. I will fix it.</reason>'), learnt);
      assert.ok(learnt.endsWith(`<answer>\\boxed{${fixedAnswer(r.text)}}</answer><|im_end|>`), learnt);
    }
    // --slip-loss: the same demonstrations, the slipped call trained on as well.
    const withSlips = await demonstrations(tasks, runner, renderer, {
      errorRate: 0.5,
      slipLoss: true,
      seed: 3,
      name: 'mix',
    });
    // The same text but for the slipped call's mask: the data set is a function of its seed.
    const ones = (mask: number[]) => mask.filter((m) => m === 1).length;
    withSlips.records.forEach((r, i) => {
      assert.equal(r.text, records[i].text);
      const extra = ones(r.loss_mask) - ones(records[i].loss_mask);
      assert.equal(extra > 0, r.text.includes('Tool call failure'), r.text);
      assert.ok(extra >= 0);
    });
  });

  it('demonstrations are a function of the seed, whatever the calls measured', async () => {
    const renderer = new ConversationRenderer(ctx);
    const tasks = split('mix', { train: 12, test: 0, seed: 5 }).train;
    // the real sandbox's results, with the times an idle and a loaded machine measure
    const measured = (cost: number, reason?: string): ToolRunner => ({
      run: async (calls) =>
        (await runner.run(calls)).map((r) => ({ ...r, cost, reason: reason ?? r.reason })),
      runCells: runner.runCells,
      close: async () => {},
    });
    const options = { errorRate: 0.5, seed: 5, name: 'mix' };
    const a = await demonstrations(tasks, measured(0.004), renderer, options);
    const b = await demonstrations(tasks, measured(0.087), renderer, options);
    assert.deepEqual(b.records, a.records);
    // a 100 ms stall on a loaded machine (seen once in 5,000 calls) changes nothing either
    const stalled = await demonstrations(tasks, measured(0.104), renderer, options);
    assert.deepEqual(stalled.records, a.records);
    for (const r of a.records) assert.match(r.text, /execution time: 0\.00s/);
    // a call stopped at its limit shows the limit
    const c = await demonstrations(tasks.slice(0, 1), measured(10.004, 'worker_timeout'), renderer, options);
    assert.match(c.records[0].text, /execution time: 10\.00s/);
  });

  it('runs a program that several demonstrations share once, and gives each its output', async () => {
    const renderer = new ConversationRenderer(ctx);
    const tasks = split('mix', { train: 10, test: 0, seed: 6 }).train;
    // each task twice over, so every program (and every slip) has a repeat
    const doubled = [...tasks, ...tasks];
    const asked: number[] = [];
    const counting: ToolRunner = {
      run: async (calls) => {
        asked.push(calls.length);
        return runner.run(calls);
      },
      runCells: runner.runCells,
      close: async () => {},
    };
    const options = { errorRate: 0.5, seed: 6, name: 'mix' };
    const once = await demonstrations(tasks, runner, renderer, options);
    const twice = await demonstrations(doubled, counting, renderer, options);
    const distinct = new Set(doubled.map((t) => JSON.stringify([t.code, t.input]))).size;
    assert.equal(asked[0], distinct);
    assert.ok(asked[0] <= tasks.length);
    for (const [i, r] of twice.records.entries()) {
      assert.ok(r.text.endsWith(`<answer>\\boxed{${doubled[i].answer}}</answer><|im_end|>`), r.text);
      if (i < tasks.length) assert.deepEqual(r, once.records[i]);
    }
  });

  it('each family words its problems several ways: operation and operand order come from the wording', () => {
    const tasks = Object.keys(FAMILIES).flatMap(
      (name) => split(name, { train: 200, test: 0, seed: 4 }).train,
    );
    const subtractFrom = tasks.filter((t) => t.prompt.startsWith('Subtract '));
    assert.ok(subtractFrom.length > 0);
    for (const t of subtractFrom) {
      const [, b, a] = /^Subtract (\d+) from (\d+)\.$/.exec(t.prompt) ?? [];
      assert.equal(t.code, `print(${a} - ${b})`);
    }
    const needs = tasks.filter((t) => / but needs /.test(t.prompt));
    assert.ok(needs.length > 0);
    for (const t of needs) {
      const [, b, a] = / has (\d+) \w+ but needs (\d+)\./.exec(t.prompt) ?? [];
      assert.equal(t.code, `print(${a} - ${b})`);
    }
    const families = new Set(tasks.map((t) => t.family));
    assert.deepEqual([...families].sort(), Object.keys(FAMILIES).sort());
    // Each family words its problems at least four ways (numbers replaced by N).
    for (const name of Object.keys(FAMILIES)) {
      const shapes = new Set(
        tasks.filter((t) => t.family === name).map((t) => t.prompt.replace(/\d+/g, 'N')),
      );
      assert.ok(shapes.size >= 4, `${name}: ${[...shapes].join(' | ')}`);
    }
  });

  it('rstar sft-data --synthetic writes demonstrations and held-out problems', async () => {
    const out = join(dir, 'data');
    const res = await rstar([
      'sft-data',
      '--synthetic',
      'stdin',
      '--train',
      '8',
      '--test',
      '5',
      '--seed',
      '2',
      '--out',
      out,
    ]);
    assert.equal(res.code, 0, res.stderr);
    const sft = lines<TrainRecord>(readFileSync(join(out, 'sft.jsonl'), 'utf8'));
    assert.equal(sft.length, 8);
    for (const r of sft) TrainRecord.parse(r);
    const test = lines(readFileSync(join(out, 'test-problems.jsonl'), 'utf8')).map((p) => Problem.parse(p));
    const train = lines(readFileSync(join(out, 'train-problems.jsonl'), 'utf8')).map((p) => Problem.parse(p));
    assert.equal(test.length, 5);
    assert.ok(test.every((p) => !train.some((q) => q.prompt === p.prompt)));
    const bad = await rstar(['sft-data', '--synthetic', 'nope']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--synthetic: nope is not one of /);
  });

  it('--family-weights draws the training families in proportion and leaves the held-out problems as they were', () => {
    const count = (tasks: { family: string }[]) => {
      const c: Record<string, number> = {};
      for (const t of tasks) c[t.family] = (c[t.family] ?? 0) + 1;
      return c;
    };
    const plain = split('mix-agentic', { train: 4000, test: 60, seed: 3 });
    const weights = parseFamilyWeights('inspect=3,search=3,recover=3,word=0', 'mix-agentic');
    const weighted = split('mix-agentic', { train: 4000, test: 60, seed: 3, weights });
    // the same held-out problems, so runs with other weights are evaluated alike
    assert.deepEqual(weighted.test, plain.test);
    assert.equal(weighted.train.length, 4000);
    const train = new Set(weighted.train.map((t) => t.prompt));
    assert.equal(train.size, 4000);
    assert.ok(weighted.test.every((t) => !train.has(t.prompt)));
    // weights 1 1 1 1 0 3 3 3: a weight-3 family 3/13 of the draws, a weight-1 family 1/13, word none
    const c = count(weighted.train);
    assert.equal(c.word, undefined);
    for (const f of ['inspect', 'search', 'recover'])
      assert.ok(Math.abs(c[f] / 4000 - 3 / 13) < 0.03, `${f}: ${c[f]}`);
    for (const f of ['arith', 'mod', 'count', 'stdin'])
      assert.ok(Math.abs(c[f] / 4000 - 1 / 13) < 0.02, `${f}: ${c[f]}`);
    // uniform: every family about 1/8
    for (const n of Object.values(count(plain.train))) assert.ok(Math.abs(n / 4000 - 1 / 8) < 0.025);
    // seeded
    assert.deepEqual(split('mix-agentic', { train: 4000, test: 60, seed: 3, weights }), weighted);
  });

  it('--family-weights refuses what it cannot draw, naming the entry', async () => {
    assert.throws(
      () => parseFamilyWeights('inspect=2', 'mix'),
      /'inspect' is not a family of mix \(its families: arith, /,
    );
    assert.throws(() => parseFamilyWeights('inspect=-1', 'agentic'), /'inspect=-1': expected FAMILY=WEIGHT/);
    assert.throws(() => parseFamilyWeights('inspect', 'agentic'), /'inspect': expected FAMILY=WEIGHT/);
    assert.throws(() => parseFamilyWeights('search=1,search=2', 'agentic'), /'search' is named twice/);
    assert.throws(
      () => parseFamilyWeights('inspect=0,search=0,recover=0', 'agentic'),
      /every family weighs 0/,
    );
    assert.deepEqual(parseFamilyWeights('inspect=0.5, search = 2', 'agentic'), { inspect: 0.5, search: 2 });
    const out = join(dir, 'weighted');
    const bad = await rstar([
      'sft-data',
      '--synthetic',
      'mix',
      '--train',
      '2',
      '--test',
      '1',
      '--family-weights',
      'recover=2',
      '--out',
      out,
    ]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--family-weights: 'recover' is not a family of mix/);
    const stray = await rstar([
      'sft-data',
      '--family-weights',
      'arith=2',
      'fixtures/sft-sources/openai.jsonl',
    ]);
    assert.equal(stray.code, 2);
    assert.match(stray.stderr, /--family-weights is for --synthetic/);
  });
});
