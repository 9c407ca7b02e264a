// Catches: train-step ignoring the per-token `advantages` that `advantage --step-weight` writes
// (training every token on the record's one `advantage`), or misplacing them (a per-token array
// equal to the scalar everywhere must give the very same update as the scalar).
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { lines, ndjson, rstar } from '../support/helpers.js';
import { tinyModel } from '../support/tiny-model.js';

type Rec = { prompt_ids: number[]; response_ids: number[]; loss_mask: number[]; advantage: number };
const RECORDS: Rec[] = [
  // two model turns around a tool response
  { prompt_ids: [1, 5, 9], response_ids: [10, 11, 12, 13, 14], loss_mask: [1, 1, 0, 1, 1], advantage: 1 },
  { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 0, 1], advantage: -1 },
];
const perToken = (r: Rec, turnValues: number[]) => {
  let turn = -1;
  let inTurn = false;
  const advantages = r.loss_mask.map((m) => {
    if (m === 1 && !inTurn) turn += 1;
    inTurn = m === 1;
    return m === 1 ? turnValues[turn] : 0;
  });
  return { ...r, advantages };
};

describe('train-step with per-token advantages', () => {
  let dir: string;
  let m0: string;
  before(async () => {
    ({ dir, model: m0 } = await tinyModel('rstar-step-adv-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  async function step(name: string, records: unknown[]) {
    const data = join(dir, `${name}.jsonl`);
    writeFileSync(data, ndjson(records));
    const args = ['train-step', '--loss', 'grpo', '--model', m0, '--optimizer', 'sgd', '--lr', '1'];
    const r = await rstar([...args, '--out', join(dir, name), data]);
    assert.equal(r.code, 0, r.stderr);
    return lines<{ loss: number; grad_norm: number }>(r.stdout)[0];
  }

  test('equal to the scalar when they repeat it, and used when they differ per turn', async () => {
    const scalar = await step('scalar', RECORDS);
    const same = await step(
      'same',
      RECORDS.map((r) => perToken(r, [r.advantage, r.advantage])),
    );
    assert.ok(Math.abs(scalar.loss - same.loss) < 1e-7, `${scalar.loss} vs ${same.loss}`);
    assert.ok(Math.abs(scalar.grad_norm - same.grad_norm) < 1e-7);
    // the second turn's sign flipped: another gradient
    const split = await step(
      'split',
      RECORDS.map((r) => perToken(r, [r.advantage, -r.advantage])),
    );
    assert.ok(
      Math.abs(split.grad_norm - scalar.grad_norm) > 1e-4,
      `${split.grad_norm} vs ${scalar.grad_norm}`,
    );
  });
});
