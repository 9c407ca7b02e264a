import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { scheduledLr } from '../../src/sft/train.js';
import { lines, ndjson, rstar, smallConfig, trajectory } from '../support/helpers.js';

describe('sft-train: the LR schedule', () => {
  const at = { lr: 1e-3, decay: 0.5, elapsed: 0, seconds: 100, sent: 0, maxSteps: 0 };
  test("before the decay the trainer's own schedule (warm-up, constant) holds", () => {
    assert.equal(scheduledLr(at), undefined);
    assert.equal(scheduledLr({ ...at, elapsed: 50 }), undefined);
    assert.equal(scheduledLr({ ...at, elapsed: 90, decay: 0 }), undefined);
  });
  test('then a linear decay to a 2% floor over the last fraction of the wall-clock or step budget', () => {
    assert.equal(scheduledLr({ ...at, elapsed: 75 }), 5e-4);
    assert.equal(scheduledLr({ ...at, elapsed: 99.9 }), 2e-5);
    assert.equal(scheduledLr({ ...at, elapsed: 120 }), 2e-5);
    // the larger of the two fractions spent
    assert.equal(scheduledLr({ ...at, elapsed: 10, sent: 8, maxSteps: 10 }), 4e-4);
    assert.equal(scheduledLr({ ...at, seconds: 0, sent: 6, maxSteps: 10 }), 8e-4);
    assert.equal(scheduledLr({ ...at, lr: 4e-3, elapsed: 70 }), 0.0024); // 6 significant digits
  });
});

describe('sft-train: the loop', () => {
  let dir: string;
  let m0: string;
  let data: string;
  const record = (i: number) => ({
    prompt_ids: [1, 2 + (i % 5)],
    response_ids: Array.from({ length: 3 + (i % 4) }, (_, j) => 10 + ((i + j) % 50)),
    loss_mask: Array.from({ length: 3 + (i % 4) }, () => 1),
  });
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-sft-train-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(smallConfig()));
    m0 = join(dir, 'm0');
    const r = await rstar(['model-init', '--config', join(dir, 'config.json'), '--out', m0]);
    assert.equal(r.code, 0, r.stderr);
    data = join(dir, 'sft.jsonl');
    writeFileSync(data, ndjson(Array.from({ length: 7 }, (_, i) => record(i))));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a step budget, whole batches over seeded epochs, the decay on the end_batch lines, snapshots', async () => {
    const out = join(dir, 'ckpt');
    const r = await rstar([
      ...['sft-train', '--data', data, '--model', m0, '--out', out, '--batch-records', '2', '--lr', '1e-3'],
      ...['--max-steps', '5', '--decay', '0.5', '--snapshot-every', '2', '--seed', '3'],
    ]);
    assert.equal(r.code, 0, r.stderr);
    const metrics = lines<{
      step: number;
      sequences: number;
      lr: number;
      elapsed: number;
      tokens_per_s: number;
    }>(r.stdout);
    assert.deepEqual(
      metrics.map((m) => [m.step, m.sequences]),
      [1, 2, 3, 4, 5].map((s) => [s, 2]),
    );
    // the step fraction sent so far: 0, .2, .4, then .6 and .8 inside the last half
    assert.deepEqual(
      metrics.map((m) => m.lr),
      [1e-3, 1e-3, 1e-3, 8e-4, 4e-4],
    );
    metrics.forEach((m, i) => {
      assert.ok(m.tokens_per_s > 0);
      assert.ok(m.elapsed > 0 && (i === 0 || m.elapsed >= metrics[i - 1].elapsed));
    });
    assert.ok(existsSync(join(`${out}-2`, 'model.safetensors')));
    assert.ok(existsSync(join(`${out}-4`, 'model.safetensors')));
    assert.ok(!existsSync(`${out}-5`));
    assert.match(r.stderr, /trained 5 steps \(2 epochs started\)/); // 3 whole batches of 2 per epoch
  });

  test('bad data: every record is checked before training, FILE:LINE: field: message', async () => {
    const bad = join(dir, 'bad.jsonl');
    writeFileSync(bad, ndjson([record(0), record(1), { ...record(2), response_ids: [10, 96, 12, 13, 14] }]));
    const args = ['sft-train', '--model', m0, '--out', join(dir, 'x'), '--max-steps', '1'];
    const r = await rstar([...args, '--data', bad]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /bad\.jsonl:3: response_ids\.1: token id 96 is out of the vocabulary/);
    const few = await rstar([...args, '--data', data, '--batch-records', '8']);
    assert.equal(few.code, 1);
    assert.match(few.stderr, /fewer than 8 records, not one batch/);
    const noBudget = await rstar(['sft-train', '--model', m0, '--out', join(dir, 'x'), '--data', data]);
    assert.equal(noBudget.code, 2);
    assert.match(noBudget.stderr, /--seconds and\/or --max-steps/);
    mkdirSync(join(dir, 'empty'));
    const notCkpt = await rstar([...args, '--data', data, '--model', join(dir, 'empty')]);
    assert.equal(notCkpt.code, 1);
    assert.match(notCkpt.stderr, /not a checkpoint/);
  });
});

describe('sft-eval', () => {
  test("one summary line of the SFT stage's held-out figures", async () => {
    const ok = '<tool_response>\nTool call success\n1\n</tool_response>\n<answer>1</answer>';
    const input = ndjson([
      trajectory('p1', 0, 1, { text: ok, tool_calls: 1 }),
      trajectory('p2', 0, 0, {
        finish: 'length',
        ...{ response_ids: [2, 3, 4, 5], loss_mask: [1, 1, 1, 1], logprobs: [-1, -1, -1, -1] },
      }),
    ]);
    const r = await rstar(['sft-eval', '--name', 'greedy'], input);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(lines(r.stdout), [
      {
        name: 'greedy',
        trajectories: 2,
        format_valid: 0.5,
        tool_success: 1,
        accuracy: 0.5,
        tool_calls_per_trajectory: 0.5,
        mean_response_tokens: 3,
        finish: { stop: 1, length: 1 },
      },
    ]);
    const bad = await rstar(['sft-eval'], input);
    assert.equal(bad.code, 2);
  });
});
