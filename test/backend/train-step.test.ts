// Catches: train-step CLI/driver bugs (records sent wrong, bad input accepted, resident mode, data-parallel updates differing from one process); runs the Python backend suites, src/backend/tests.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { execa } from 'execa';
import { BACKEND_DIR, findPython } from '../../src/backend/python.js';
import { backendConfig, trainOptions } from '../../src/backend/train-options.js';
import { startTrainer } from '../../src/backend/trainer.js';
import { Step } from '../../src/records/step.js';
import type { TrainRecord } from '../../src/records/trajectory.js';
import { lines, ndjson, ROOT, rstar, smallConfig } from '../support/helpers.js';
import { tinyModel } from '../support/tiny-model.js';

/** A config far smaller than fixtures/tiny, so the tests do not depend on the fixture's sizes. */
export const SMALL_CONFIG = smallConfig();

const records: TrainRecord[] = [
  { prompt_ids: [1, 5, 9], response_ids: [10, 11, 12, 13], loss_mask: [1, 1, 0, 1], advantage: 1 },
  { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 1, 1], advantage: -1 },
  { prompt_ids: [3, 7, 8, 4], response_ids: [30, 31], loss_mask: [1, 1], advantage: 0.5 },
  { prompt_ids: [1], response_ids: [40, 41, 42, 43, 44], loss_mask: [1, 0, 1, 1, 1], advantage: -0.5 },
];

/** Max |a - b| over all tensors of each pair of checkpoints, computed by the backend's own loader. */
async function weightDiffs(pairs: [string, string][]): Promise<number[]> {
  const python = await findPython();
  const code = [
    'import sys, json; sys.path.insert(0, sys.argv[1])',
    'from rstar_backend.checkpoint import load_state_dict',
    'out = []',
    'for a, b in json.loads(sys.argv[2]):',
    '    x, y = load_state_dict(a), load_state_dict(b)',
    '    assert set(x) == set(y)',
    '    out.append(max(float((x[k] - y[k]).abs().max()) for k in x))',
    'print(json.dumps(out))',
  ].join('\n');
  const { stdout } = await execa(python, ['-c', code, BACKEND_DIR, JSON.stringify(pairs)]);
  return JSON.parse(stdout) as number[];
}

describe('backend: Python unit tests', () => {
  test('src/backend/tests pass under the backend interpreter', async () => {
    const python = await findPython();
    const result = await execa(
      python,
      ['-m', 'unittest', 'discover', '-s', 'src/backend/tests', '-t', 'src/backend/tests'],
      { cwd: ROOT, reject: false, env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } },
    );
    assert.equal(result.exitCode, 0, result.stderr);
    assert.match(result.stderr, /Ran \d+ tests/);
  });

  test("the unit tests' trainer settings name every key train-step sends", async () => {
    const python = await findPython();
    const code = 'import json, common; print(json.dumps(sorted(common.SETTINGS)))';
    const { stdout } = await execa(python, ['-c', code], { cwd: join(ROOT, 'src/backend/tests') });
    const sent = backendConfig(trainOptions({ loss: 'sft', model: 'm', out: 'o' }));
    // model and out are given per test
    const keys = Object.keys(sent).filter((k) => k !== 'model' && k !== 'out');
    assert.deepEqual(JSON.parse(stdout), keys.sort());
  });
});

describe('backend: model-init and train-step CLIs', () => {
  let dir: string;
  let m0: string;
  let data: string;
  before(async () => {
    const tiny = await tinyModel('rstar-backend-', { chatTemplate: true });
    ({ dir, model: m0 } = tiny);
    data = join(dir, 'batch.jsonl');
    writeFileSync(data, ndjson(records));
    assert.ok(tiny.init.parameters > 10_000);
    assert.deepEqual(tiny.init.tokenizer_files, ['chat_template.jinja', 'tokenizer_config.json']);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('model-init writes an HF checkpoint folder', () => {
    const config = JSON.parse(readFileSync(join(m0, 'config.json'), 'utf8'));
    assert.deepEqual(config.architectures, ['Qwen3ForCausalLM']);
    assert.equal(config.num_key_value_heads, 2);
    assert.ok(existsSync(join(m0, 'model.safetensors')));
    assert.ok(existsSync(join(m0, 'chat_template.jinja')));
    const raw = readFileSync(join(m0, 'model.safetensors'));
    const n = Number(raw.readBigUInt64LE(0));
    const header = JSON.parse(raw.subarray(8, 8 + n).toString('utf8'));
    assert.deepEqual(header['model.layers.0.self_attn.q_proj.weight'].shape, [32, 32]);
    assert.equal(header['model.layers.0.self_attn.q_norm.weight'].dtype, 'F32');
  });

  test('model-init with the same seed is reproducible; sharding is an option', async () => {
    const again = join(dir, 'again');
    const sharded = join(dir, 'sharded');
    const cfg = join(dir, 'cfg', 'config.json');
    assert.equal((await rstar(['model-init', '--config', cfg, '--out', again, '--seed', '3'])).code, 0);
    const r = await rstar([
      'model-init',
      '--config',
      cfg,
      '--out',
      sharded,
      '--seed',
      '3',
      '--max-shard-bytes',
      '40000',
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(existsSync(join(sharded, 'model.safetensors.index.json')));
    assert.deepEqual(
      await weightDiffs([
        [m0, again],
        [m0, sharded],
      ]),
      [0, 0],
    );
  });

  test('model-init --init induction: a different start from the same seed; an unknown scheme is a usage error', async () => {
    const ind = join(dir, 'induction');
    const cfg = join(dir, 'cfg', 'config.json');
    const r = await rstar([
      'model-init',
      '--config',
      cfg,
      '--out',
      ind,
      '--seed',
      '3',
      '--init',
      'induction',
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((lines(r.stdout)[0] as { init: string }).init, 'induction');
    const [diff] = await weightDiffs([[m0, ind]]);
    assert.ok((diff ?? 0) > 0.01, `induction init equals the normal one (max diff ${diff})`);
    const bad = await rstar(['model-init', '--config', cfg, '--out', join(dir, 'x'), '--init', 'xavier']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--init.*xavier.*normal, induction/s);
  });

  test('one SFT step, then a second step continues from the saved optimiser state', async () => {
    const m1 = join(dir, 'sft1');
    const m2 = join(dir, 'sft2');
    const r1 = await rstar([
      ...['train-step', '--loss', 'sft', '--model', m0, '--out', m1, '--lr', '1e-3'],
      ...['--beta2', '0.99', data],
    ]);
    assert.equal(r1.code, 0, r1.stderr);
    const [s1] = lines(r1.stdout).map((s) => Step.parse(s));
    assert.equal(s1.step, 1);
    assert.equal(s1.sequences, 4);
    assert.equal(s1.tokens, 24);
    assert.ok(s1.loss > 3 && s1.loss < 6, `loss ${s1.loss} near ln(96)`);
    assert.ok(existsSync(join(m1, 'optimizer.safetensors')));
    const state = JSON.parse(readFileSync(join(m1, 'trainer_state.json'), 'utf8'));
    assert.equal(state.step, 1);
    assert.deepEqual(state.betas, [0.9, 0.99], 'AdamW betas are train-step flags');
    assert.ok(existsSync(join(m1, 'chat_template.jinja')));
    const r2 = await rstar(
      ['train-step', '--loss', 'sft', '--model', m1, '--out', m2, '--lr', '1e-3'],
      ndjson(records),
    );
    assert.equal(r2.code, 0, r2.stderr);
    const [s2] = lines(r2.stdout).map((s) => Step.parse(s));
    assert.equal(s2.step, 2);
    assert.ok(s2.loss < s1.loss);
  });

  test('--follow: one process, one checkpoint and one Step record per batch', async () => {
    const input = [
      ndjson(records.slice(0, 2)),
      '\n',
      ndjson(records.slice(2)),
      '{"end_batch":true,"lr":0.0005}\n',
      '\n',
      ndjson(records),
    ].join('');
    const out = join(dir, 'follow-{step}');
    const r = await rstar(
      ['train-step', '--loss', 'grpo', '--follow', '--model', m0, '--out', out, '--lr', '1e-3'],
      input,
    );
    assert.equal(r.code, 0, r.stderr);
    const steps = lines(r.stdout).map((s) => Step.parse(s));
    assert.deepEqual(
      steps.map((s) => [s.step, s.sequences]),
      [
        [1, 2],
        [2, 2],
        [3, 4],
      ],
    );
    for (const s of steps) assert.ok(existsSync(join(s.checkpoint, 'model.safetensors')));
    assert.equal(steps[2].checkpoint, join(dir, 'follow-3'));
    // an end_batch line may set its step's learning rate (a driver-owned schedule)
    assert.deepEqual(
      steps.map((s) => s.lr),
      [1e-3, 5e-4, 1e-3],
    );
    const bad = await rstar(
      [
        'train-step',
        '--loss',
        'grpo',
        '--follow',
        '--model',
        m0,
        '--out',
        join(dir, 'bad-lr'),
        '--lr',
        '1e-3',
      ],
      `${ndjson(records.slice(0, 2))}{"end_batch":true,"lr":-1}\n`,
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /stdin:3: lr: expected a positive number, got -1/);
  });

  test('startTrainer: the resident trainer train-step and sft-train drive', async () => {
    const trainer = await startTrainer(
      trainOptions({ loss: 'grpo', model: m0, out: join(dir, 'resident-{step}'), lr: 1e-3 }),
    );
    try {
      const [a, b] = await Promise.all([trainer.step(records.slice(0, 2)), trainer.step(records.slice(2))]);
      assert.deepEqual([a.record.step, a.record.sequences, b.record.step, b.record.sequences], [1, 2, 2, 2]);
      assert.equal(Step.parse(JSON.parse(b.line)).checkpoint, join(dir, 'resident-2'));
      assert.ok(existsSync(join(dir, 'resident-2', 'model.safetensors')));
      await assert.rejects(trainer.step([]), /empty batch/);
      // checked before anything is sent: the trainer goes on
      await assert.rejects(
        trainer.step([records[0], { ...records[0], response_ids: [1, 2, 3, 999] }]),
        /batch:2: response_ids\.3: token id 999 is out of the vocabulary/,
      );
      await assert.rejects(
        trainer.add({ text: JSON.stringify({ ...records[0], advantage: undefined }), line: 7, source: 'f' }),
        /f:7: advantage: required by --loss grpo/,
      );
      // a numbered step is taken even when empty; the end_batch line may set its learning rate
      const empty = await trainer.endBatch({ step: 9 });
      assert.deepEqual([empty.record.step, empty.record.sequences], [9, 0]);
      const c = await trainer.step(records, { lr: 5e-4 });
      assert.deepEqual([c.record.step, c.record.sequences, c.record.lr], [4, 4, 5e-4]);
      // records after the last end of batch are dropped, not trained
      await trainer.add({ text: JSON.stringify(records[0]), line: 1, source: 'f' });
    } finally {
      await trainer.close();
    }
    assert.ok(!existsSync(join(dir, 'resident-5')));
  });

  test('a dead trainer says why', async () => {
    const bad = join(dir, 'bad-weights');
    mkdirSync(bad);
    writeFileSync(join(bad, 'config.json'), JSON.stringify(SMALL_CONFIG));
    const trainer = await startTrainer(trainOptions({ loss: 'sft', model: bad, out: join(dir, 'never') }));
    await assert.rejects(trainer.step(records), /not a checkpoint: neither model\.safetensors/);
    await assert.rejects(trainer.close(), /not a checkpoint/);
  });

  test('--threads N trains on N CPU threads per process; the default shares the cores among them', async () => {
    const args = ['train-step', '--loss', 'grpo', '--model', m0, data];
    const one = await rstar([...args, '--out', join(dir, 'threads-1'), '--threads', '1']);
    assert.equal(one.code, 0, one.stderr);
    assert.equal(lines<{ threads: number }>(one.stdout)[0]?.threads, 1);
    const two = await rstar([...args, '--out', join(dir, 'threads-dp'), '--nproc', '2']);
    assert.equal(two.code, 0, two.stderr);
    const shared = Number(process.env.OMP_NUM_THREADS ?? Math.max(1, Math.floor(availableParallelism() / 2)));
    assert.equal(lines<{ threads: number }>(two.stdout)[0]?.threads, shared);
  });

  test('2 data-parallel processes give the same update as 1', async () => {
    const one = join(dir, 'dp1');
    const two = join(dir, 'dp2');
    // SGD, so the weights compare the gradients themselves (AdamW's first step is sign-like);
    // small micro-batches, so accumulation and the all-reduce are both exercised
    const args = ['train-step', '--loss', 'grpo', '--model', m0, '--optimizer', 'sgd', '--lr', '1'];
    args.push('--micro-batch-tokens', '12', data);
    const r1 = await rstar([...args, '--out', one]);
    const r2 = await rstar([...args, '--out', two, '--nproc', '2']);
    assert.equal(r1.code, 0, r1.stderr);
    assert.equal(r2.code, 0, r2.stderr);
    const [s1] = lines<{ loss: number; grad_norm: number; world_size: number }>(r1.stdout);
    const [s2] = lines<{ loss: number; grad_norm: number; world_size: number }>(r2.stdout);
    assert.equal(s2.world_size, 2);
    assert.ok(Math.abs(s1.loss - s2.loss) < 1e-6, `${s1.loss} vs ${s2.loss}`);
    assert.ok(Math.abs(s1.grad_norm - s2.grad_norm) < 1e-6);
    const [diff, moved] = await weightDiffs([
      [one, two],
      [m0, one],
    ]);
    assert.ok(diff < 1e-6, `max weight difference ${diff}`);
    assert.ok(moved > 1e-3, 'the step changed the weights');
  });

  test('bad input: clear messages, non-zero exit', async () => {
    const train = (extra: string[], input: string) =>
      rstar(['train-step', '--loss', 'grpo', '--model', m0, '--out', join(dir, 'bad'), ...extra], input);
    const cases: [string[], string, number, RegExp][] = [
      [[], '{"prompt_ids":[1],"response_ids":[2],"advantage":1}\n', 1, /stdin:1: loss_mask/],
      [
        [],
        ndjson([{ ...records[0], response_ids: [10, 96, 12, 13] }]),
        1,
        /stdin:1: response_ids\.1: .*vocab/,
      ],
      [[], ndjson([{ ...records[0], advantage: undefined }]), 1, /stdin:1: advantage: required/],
      [['--old-logprobs', 'rollout'], ndjson([records[0]]), 1, /stdin:1: logprobs: required/],
      [[], '', 1, /empty batch/],
      [[], '\n\n', 1, /empty batch/],
      [[], '{"prompt_ids":\n', 1, /stdin:1: invalid JSON/],
      [
        ['--follow'],
        `${ndjson([records[0]])}{"end_batch":true,"step":-1}\n`,
        1,
        /stdin:2: step: expected a non-negative integer/,
      ],
      [['--beta1', '1.5'], ndjson(records), 2, /--beta1/],
      [['--old-logprobs', 'maybe'], ndjson(records), 2, /--old-logprobs/],
    ];
    for (const [extra, input, code, message] of cases) {
      const r = await train(extra, input);
      assert.equal(r.code, code, `${message}: ${r.stderr}`);
      assert.match(r.stderr, message);
    }
    const notCkpt = await rstar([
      'train-step',
      '--loss',
      'sft',
      '--model',
      dir,
      '--out',
      join(dir, 'x'),
      data,
    ]);
    assert.equal(notCkpt.code, 1);
    assert.match(notCkpt.stderr, /not a checkpoint: no config\.json/);
    const badLoss = await rstar([
      'train-step',
      '--loss',
      'ppo',
      '--model',
      m0,
      '--out',
      join(dir, 'x'),
      data,
    ]);
    assert.equal(badLoss.code, 2);
    const noWeights = join(dir, 'no-weights');
    mkdirSync(noWeights);
    writeFileSync(join(noWeights, 'config.json'), JSON.stringify(SMALL_CONFIG));
    const r = await rstar([
      'train-step',
      '--loss',
      'sft',
      '--model',
      noWeights,
      '--out',
      join(dir, 'x'),
      data,
    ]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /not a checkpoint: neither model\.safetensors/);
    const badInit = await rstar(['model-init', '--config', join(dir, 'nope.json'), '--out', join(dir, 'x')]);
    assert.equal(badInit.code, 1);
    assert.match(badInit.stderr, /nope\.json/);
  });

  test('no interpreter with torch: the error says how to install it', async () => {
    const r = await rstar(
      ['model-init', '--config', join(dir, 'cfg', 'config.json'), '--out', join(dir, 'x')],
      '',
      {
        RSTAR_PYTHON: '/bin/false',
      },
    );
    assert.equal(r.code, 1);
    assert.match(r.stderr, /RSTAR_PYTHON=\/bin\/false cannot import torch; install PyTorch: .*python3-torch/);
  });
});
