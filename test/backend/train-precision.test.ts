import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { execa } from 'execa';
import { findPython } from '../../src/backend/python.js';
import { lines, ndjson, rstar, smallConfig } from '../support/helpers.js';

/** Whether the backend's torch has FSDP2 (torch >= 2.4 with a working fully_shard import). */
async function hasFsdp2(): Promise<boolean> {
  const python = await findPython();
  const code = [
    'import sys; sys.path.insert(0, "src/backend")',
    'from rstar_backend import parallel',
    'try:\n    parallel.fully_shard_api(); print("yes")\nexcept parallel.SetupError:\n    print("no")',
  ].join('\n');
  return (await execa(python, ['-c', code])).stdout.trim() === 'yes';
}

const record = (i: number) => ({
  prompt_ids: [1, 3 + (i % 5), 7],
  response_ids: Array.from({ length: 6 }, (_, j) => 10 + ((3 * i + j) % 60)),
  loss_mask: [1, 1, 1, 1, 1, 1],
});

describe('train-step --dtype / --shard', () => {
  let dir: string;
  let m0: string;
  const batch = ndjson(Array.from({ length: 6 }, (_, i) => record(i)));
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-train-precision-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...smallConfig(), initializer_range: 0.2 }));
    m0 = join(dir, 'm0');
    const r = await rstar(['model-init', '--config', join(dir, 'config.json'), '--out', m0]);
    assert.equal(r.code, 0, r.stderr);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('bf16 steps on CPU: the loss falls, no NaN, the record says bf16', async () => {
    const end = '{"end_batch":true}\n';
    const r = await rstar(
      ['train-step', '--loss', 'sft', '--model', m0, '--out', join(dir, 'bf16-{step}'), '--follow'].concat([
        '--dtype',
        'bf16',
        '--lr',
        '3e-3',
      ]),
      `${batch}${end}${batch}${end}${batch}${end}`,
    );
    assert.equal(r.code, 0, r.stderr);
    const steps = lines<{ loss: number; dtype: string; shard: string }>(r.stdout);
    assert.equal(steps.length, 3);
    assert.ok(steps.every((s) => Number.isFinite(s.loss) && s.dtype === 'bf16' && s.shard === 'none'));
    assert.ok(steps[1].loss < steps[0].loss && steps[2].loss < steps[1].loss, JSON.stringify(steps));
  });

  test('sft-train takes --dtype too', async () => {
    const data = join(dir, 'sft.jsonl');
    writeFileSync(data, batch);
    const r = await rstar(
      ['sft-train', '--data', data, '--model', m0, '--out', join(dir, 'sft')].concat([
        '--batch-records',
        '3',
        '--max-steps',
        '2',
        '--dtype',
        'bf16',
      ]),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      lines<{ dtype: string }>(r.stdout).map((s) => s.dtype),
      ['bf16', 'bf16'],
    );
  });

  test('a setup this torch or device cannot run: one line, exit 2, before training', async () => {
    const train = (extra: string[]) =>
      rstar(['train-step', '--loss', 'sft', '--model', m0, '--out', join(dir, 'never'), ...extra], batch);
    const cases: [string[], RegExp][] = [
      [['--dtype', 'fp16'], /^rstar train-step: --dtype fp16 on cpu: .*use --dtype bf16 on CPU$/],
      [['--shard', 'full'], /^rstar train-step: --shard full: needs --nproc 2 or more/],
      [['--dtype', 'int8'], /--dtype/], // commander's choices
    ];
    if (!(await hasFsdp2())) {
      // Debian's torch 1.13: no FSDP2; the two ranks stop before their process group starts
      cases.push([
        ['--shard', 'grad-op', '--nproc', '2'],
        /^rstar train-step: --shard: (needs torch >= 2\.4|torch .* cannot import FSDP2)/,
      ]);
    }
    for (const [extra, message] of cases) {
      const r = await train(extra);
      assert.equal(r.code, 2, `${extra.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr.trim(), message);
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
      assert.doesNotMatch(r.stderr, /Traceback/);
      assert.equal(r.stdout, '');
    }
  });
});
