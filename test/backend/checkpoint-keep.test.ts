import assert from 'node:assert/strict';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Step } from '../../src/records/step.js';
import type { TrainRecord } from '../../src/records/trajectory.js';
import { lines, ndjson, rstar, smallConfig } from '../support/helpers.js';

const records: TrainRecord[] = [
  { prompt_ids: [1, 5, 9], response_ids: [10, 11, 12, 13], loss_mask: [1, 1, 0, 1], advantage: 1 },
  { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 1, 1], advantage: -1 },
];

/** `--follow` input: one small batch per step, closed by rollout's numbered end_batch line. */
const batches = (from: number, to: number): string => {
  let text = '';
  for (let k = from; k <= to; k++) text += `${ndjson(records)}{"end_batch":true,"step":${k}}\n`;
  return text;
};

const state = (dir: string): { step: number } =>
  JSON.parse(readFileSync(join(dir, 'trainer_state.json'), 'utf8')) as { step: number };

describe('checkpoint folders stay consistent and bounded', () => {
  let dir: string;
  let cfg: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-ckpt-keep-'));
    mkdirSync(join(dir, 'cfg'));
    cfg = join(dir, 'cfg', 'config.json');
    writeFileSync(cfg, JSON.stringify(smallConfig()));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('model-init refuses a non-empty --out; --force replaces it whole, AdamW state and step count included', async () => {
    const m = join(dir, 'm');
    assert.equal((await rstar(['model-init', '--config', cfg, '--out', m, '--seed', '1'])).code, 0);
    const trained = await rstar(['train-step', '--loss', 'sft', '--model', m, '--out', m], ndjson(records));
    assert.equal(trained.code, 0, trained.stderr);
    assert.equal(state(m).step, 1);
    const weights = readFileSync(join(m, 'model.safetensors'));

    const refused = await rstar(['model-init', '--config', cfg, '--out', m, '--seed', '2']);
    assert.equal(refused.code, 2);
    assert.match(refused.stderr, /--out .*\/m: not empty.*--force/);
    assert.deepEqual(
      readFileSync(join(m, 'model.safetensors')),
      weights,
      'a refused init changed the weights',
    );

    const forced = await rstar(['model-init', '--config', cfg, '--out', m, '--seed', '2', '--force']);
    assert.equal(forced.code, 0, forced.stderr);
    assert.equal((lines(forced.stdout)[0] as { checkpoint: string }).checkpoint, m);
    assert.deepEqual(readdirSync(m).sort(), ['config.json', 'generation_config.json', 'model.safetensors']);
    assert.deepEqual(
      readdirSync(dir).filter((n) => n.includes('.partial') || n.includes('.old')),
      [],
    );
    // the next step starts afresh: step 1, not "step 2" on the old moments
    const next = await rstar(
      ['train-step', '--loss', 'sft', '--model', m, '--out', join(dir, 'm1')],
      ndjson(records),
    );
    assert.equal(next.code, 0, next.stderr);
    assert.equal(Step.parse(lines(next.stdout)[0]).step, 1);
  });

  test('--keep-checkpoints K --keep-every N: the last K, every Nth and --model remain; a resume continues', async () => {
    const m0 = join(dir, 'm0');
    assert.equal((await rstar(['model-init', '--config', cfg, '--out', m0])).code, 0);
    const out = join(dir, 'rl', 'step-{step}');
    const keep = ['--keep-checkpoints', '2', '--keep-every', '3'];
    const steps = () =>
      readdirSync(join(dir, 'rl'))
        .map((n) => Number(n.replace('step-', '')))
        .sort((a, b) => a - b);
    const first = await rstar(
      ['train-step', '--follow', '--loss', 'grpo', '--model', m0, '--out', out, ...keep],
      batches(1, 5),
    );
    assert.equal(first.code, 0, first.stderr);
    assert.equal(lines(first.stdout).length, 5);
    assert.deepEqual(steps(), [3, 4, 5]);

    // resumed from the newest: its folder is --model, kept while this trainer runs although it
    // falls out of the last two
    const from = join(dir, 'rl', 'step-5');
    const second = await rstar(
      [
        'train-step',
        '--follow',
        '--loss',
        'grpo',
        '--model',
        from,
        '--weight-version',
        '5',
        '--out',
        out,
        ...keep,
      ],
      batches(6, 7),
    );
    assert.equal(second.code, 0, second.stderr);
    assert.deepEqual(steps(), [3, 5, 6, 7]);
    assert.equal(state(join(dir, 'rl', 'step-7')).step, 7, 'the resume continued the step count');
    assert.ok(existsSync(join(dir, 'rl', 'step-7', 'optimizer.safetensors')));

    const usage = await rstar(
      ['train-step', '--loss', 'grpo', '--model', m0, '--out', join(dir, 'flat'), '--keep-checkpoints', '1'],
      ndjson(records),
    );
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /--keep-checkpoints: --out must name each step's folder with \{step\}/);
  });
});
