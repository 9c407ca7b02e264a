import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { lines, ndjson, rstar } from '../support/helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'rstar-verify-'));
after(() => rmSync(dir, { recursive: true, force: true }));

describe('rstar verify (pairs)', () => {
  it('adds equal and the extracted answers, keeping other fields', async () => {
    const input = ndjson([
      { id: 1, pred: 'so \\boxed{025}', ref: '25' },
      { id: 2, pred: '5', ref: '500' },
      { id: 3, pred: 'the answer is (C)', ref: 'C', kind: 'choice' },
    ]);
    const { code, stdout, stderr } = await rstar(['verify'], input);
    assert.equal(code, 0, stderr);
    const out = lines(stdout);
    assert.deepEqual(
      out.map((o) => [o.id, o.equal, o.pred_answer, o.ref_answer]),
      [
        [1, true, '025', '25'],
        [2, false, '5', '500'],
        [3, true, '(C)', 'C'],
      ],
    );
  });

  it('--compat rstar reproduces the release leniency', async () => {
    const input = ndjson([{ pred: '5', ref: '500' }]);
    const { code, stdout } = await rstar(['verify', '--compat', 'rstar'], input);
    assert.equal(code, 0);
    assert.equal(lines(stdout)[0].equal, true);
  });

  it("applies the rounding a pair's prompt asks for; rejects approximations and broken markup", async () => {
    const input = ndjson([
      { pred: '4.67', ref: '\\frac{14}{3}', prompt: 'Round to the nearest hundredth.' },
      { pred: '4.67', ref: '\\frac{14}{3}' },
      { pred: '4.6667', ref: '\\frac{14}{3}' },
      { pred: '<answer>\\boxed{12</answer>', ref: '12' },
    ]);
    const { code, stdout, stderr } = await rstar(['verify'], input);
    assert.equal(code, 0, stderr);
    assert.deepEqual(
      lines(stdout).map((o) => [o.equal, o.pred_answer]),
      [
        [true, '4.67'],
        [false, '4.67'],
        [false, '4.6667'],
        [false, null],
      ],
    );
    const rstarOut = lines((await rstar(['verify', '--compat', 'rstar'], input)).stdout);
    assert.deepEqual(
      rstarOut.map((o) => [o.equal, o.pred_answer]),
      [
        [false, '4.67'],
        [false, '4.67'],
        [true, '4.6667'],
        [true, '12'],
      ],
    );
  });

  it('reads a file argument', async () => {
    const file = join(dir, 'pairs.jsonl');
    writeFileSync(file, ndjson([{ pred: '\\frac{1}{2}', ref: '0.5' }]));
    const { code, stdout } = await rstar(['verify', file]);
    assert.equal(code, 0);
    assert.equal(lines(stdout)[0].equal, true);
  });

  const bad: [string, string, RegExp][] = [
    ['broken JSON', '{"pred":"1","ref":"1"}\n{"pred":\n', /^rstar verify: stdin:2: invalid JSON/m],
    ['a missing field', '{"pred":"1","ref":"1"}\n\n{"pred":"1"}\n', /^rstar verify: stdin:3: ref: /m],
    ['a wrong type', '{"pred":1,"ref":"1"}\n', /^rstar verify: stdin:1: pred: /m],
    ['a wrong kind', '{"pred":"1","ref":"1","kind":"essay"}\n', /^rstar verify: stdin:1: kind: /m],
    [
      'a prompt that is not text',
      '{"pred":"1","ref":"1"}\n{"pred":"1","ref":"1","prompt":3}\n',
      /^rstar verify: stdin:2: prompt: /m,
    ],
  ];
  for (const [what, input, message] of bad) {
    it(`fails on ${what} with the line number (exit 1)`, async () => {
      const { code, stderr } = await rstar(['verify'], input);
      assert.equal(code, 1);
      assert.match(stderr, message);
    });
  }

  it('names the file of a bad line', async () => {
    const file = join(dir, 'bad.jsonl');
    writeFileSync(file, '{"pred":"1","ref":"1"}\nnot json\n');
    const { code, stderr } = await rstar(['verify', file]);
    assert.equal(code, 1);
    assert.ok(stderr.includes(`${file}:2: invalid JSON`), stderr);
  });

  it('rejects a bad --compat (exit 2)', async () => {
    const { code, stderr } = await rstar(['verify', '--compat', 'loose'], '');
    assert.equal(code, 2);
    assert.match(stderr, /--compat/);
  });
});

describe('rstar verify --problems', () => {
  const problems = join(dir, 'problems.jsonl');
  writeFileSync(
    problems,
    ndjson([
      { id: 'p1', prompt: 'q1', answer: '25' },
      { id: 'p2', prompt: 'q2', answer: 'B', kind: 'choice', choices: ['1', '2', '3', '4'] },
      { id: 'p3', prompt: 'Give the area to the nearest tenth.', answer: '\\frac{14}{3}' },
    ]),
  );
  const traj = (problem_id: string, text: string, extra: Record<string, unknown> = {}) => ({
    id: `${problem_id}/0`,
    problem_id,
    sample: 0,
    text,
    answer: null,
    reward: 0,
    ...extra,
  });

  it('fills answer and reward by problem_id', async () => {
    const input = ndjson([
      traj('p1', '<answer>\\boxed{025}</answer>', { turns: 2 }),
      traj('p1', '<answer>\\boxed{5}</answer>'),
      traj('p2', 'so \\boxed{2}'),
      traj('p1', 'no box'),
      traj('p1', '<answer>\\boxed{25}', { finish: 'length' }),
    ]);
    const { code, stdout, stderr } = await rstar(['verify', '--problems', problems], input);
    assert.equal(code, 0, stderr);
    const out = lines(stdout);
    assert.deepEqual(
      out.map((o) => [o.answer, o.reward]),
      [
        ['025', 1],
        ['5', 0],
        ['2', 1],
        [null, 0],
        ['25', 0],
      ],
    );
    assert.equal(out[0].turns, 2);
  });

  it("applies the rounding the problem's prompt asks for", async () => {
    const input = ndjson([
      traj('p3', '<answer>\\boxed{4.7}</answer>'),
      traj('p3', '<answer>\\boxed{4.6667}</answer>'),
      traj('p3', '<answer>\\boxed{4.7</answer>'),
    ]);
    const { code, stdout, stderr } = await rstar(['verify', '--problems', problems], input);
    assert.equal(code, 0, stderr);
    assert.deepEqual(
      lines(stdout).map((o) => [o.answer, o.reward]),
      [
        ['4.7', 1],
        ['4.6667', 0],
        [null, 0],
      ],
    );
  });

  it('fails on an unknown problem_id with its line', async () => {
    const { code, stderr } = await rstar(
      ['verify', '--problems', problems],
      ndjson([traj('p1', 'x'), traj('zz', 'x')]),
    );
    assert.equal(code, 1);
    assert.match(stderr, /stdin:2: problem_id: no problem 'zz'/);
  });

  it('fails on a trajectory without text', async () => {
    const { code, stderr } = await rstar(['verify', '--problems', problems], '{"problem_id":"p1"}\n');
    assert.equal(code, 1);
    assert.match(stderr, /stdin:1: text: /);
  });

  it('fails on a bad problems file with its name and line', async () => {
    const file = join(dir, 'bad-problems.jsonl');
    writeFileSync(file, '{"id":"p","prompt":"q","answer":"1"}\n{"id":"q","prompt":"q"}\n');
    const { code, stderr } = await rstar(['verify', '--problems', file], '');
    assert.equal(code, 1);
    assert.ok(stderr.includes(`${file}:2: answer: `), stderr);
  });
});
