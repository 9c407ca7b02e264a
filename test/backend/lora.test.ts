// Catches: LoRA through the CLIs (train-step/sft-train flags reaching the backend, adapter folders as --out, retention of adapter folders, the Step record's adapter flag, data-parallel LoRA = one process) and model-merge (output = base + adapter; bad input exits non-zero with one line naming file and field). The maths and PEFT's format: src/backend/tests/test_lora.py.
import assert from 'node:assert/strict';
import { cpSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { execa } from 'execa';
import { BACKEND_DIR, findPython } from '../../src/backend/python.js';
import { Step } from '../../src/records/step.js';
import type { TrainRecord } from '../../src/records/trajectory.js';
import { lines, ndjson, rstar } from '../support/helpers.js';
import { tinyModel } from '../support/tiny-model.js';

const records: TrainRecord[] = [
  { prompt_ids: [1, 5, 9], response_ids: [10, 11, 12, 13], loss_mask: [1, 1, 0, 1] },
  { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 1, 1] },
  { prompt_ids: [3, 7, 8, 4], response_ids: [30, 31], loss_mask: [1, 1] },
  { prompt_ids: [1], response_ids: [40, 41, 42, 43, 44], loss_mask: [1, 0, 1, 1, 1] },
];

const batches = (from: number, to: number): string => {
  let text = '';
  for (let k = from; k <= to; k++) text += `${ndjson(records)}{"end_batch":true,"step":${k}}\n`;
  return text;
};

/** Max |Δ log-prob| over `records` between model A (+ adapter A) and model B (+ adapter B), by the backend. */
async function logprobDiff(a: [string, string | null], b: [string, string | null]): Promise<number> {
  const python = await findPython();
  const code = [
    'import sys, json, torch; sys.path.insert(0, sys.argv[1])',
    'from rstar_backend.checkpoint import load_model',
    'from rstar_backend.lora import load_adapter',
    'from rstar_backend.model import token_logprobs',
    'def lp(model, adapter, recs):',
    '    m = load_model(model)',
    '    if adapter: load_adapter(m, adapter)',
    '    out = []',
    '    for r in recs:',
    '        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])',
    '        with torch.no_grad(): out.append(token_logprobs(m(ids)[0, :-1], ids[0, 1:]))',
    '    return torch.cat(out)',
    'a, b, recs = json.loads(sys.argv[2])',
    'print(float((lp(*a, recs) - lp(*b, recs)).abs().max()))',
  ].join('\n');
  const { stdout } = await execa(python, ['-c', code, BACKEND_DIR, JSON.stringify([a, b, records])]);
  return Number(stdout);
}

/** Max |a - b| over the tensors of two adapter folders. */
async function adapterDiff(a: string, b: string): Promise<number> {
  const python = await findPython();
  const code = [
    'import sys; sys.path.insert(0, sys.argv[1])',
    'from rstar_backend.lora import read_adapter',
    '_, x = read_adapter(sys.argv[2]); _, y = read_adapter(sys.argv[3])',
    'assert set(x) == set(y)',
    'print(max(float((x[k] - y[k]).abs().max()) for k in x))',
  ].join('\n');
  const { stdout } = await execa(python, ['-c', code, BACKEND_DIR, a, b]);
  return Number(stdout);
}

const ADAPTER_FILES = [
  'adapter_config.json',
  'adapter_model.safetensors',
  'optimizer.safetensors',
  'step.json',
  'trainer_state.json',
];

describe('LoRA: train-step, sft-train and model-merge', () => {
  let dir: string;
  let m0: string;
  /** One step of rank-4 LoRA from m0 (`dir/w1`), which several tests start from or merge. */
  let w1: string;
  let w1Step: { loss: number; step: number };
  before(async () => {
    ({ dir, model: m0 } = await tinyModel('rstar-lora-'));
    w1 = join(dir, 'w1');
    const r = await rstar(
      ['train-step', '--loss', 'sft', '--model', m0, '--out', w1, '--lora-rank', '4', '--lr', '0.02'],
      ndjson(records),
    );
    assert.equal(r.code, 0, r.stderr);
    [w1Step] = lines<{ loss: number; step: number }>(r.stdout) as [{ loss: number; step: number }];
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('train-step --lora-rank --follow writes adapter folders, keeps the last K, and learns', async () => {
    const out = join(dir, 'run', 'ad-{step}');
    const r = await rstar(
      [
        'train-step',
        '--loss',
        'sft',
        '--model',
        m0,
        '--out',
        out,
        '--follow',
        '--lora-rank',
        '8',
        '--lr',
        '0.02',
        '--keep-checkpoints',
        '2',
      ],
      batches(1, 5),
    );
    assert.equal(r.code, 0, r.stderr);
    const steps = lines(r.stdout).map((s) => Step.parse(s));
    // the record schema declares the field (a loose schema would let any value through)
    assert.throws(() => Step.parse({ ...steps[0], adapter: 'yes' }));
    assert.deepEqual(
      steps.map((s) => s.adapter),
      [true, true, true, true, true],
    );
    assert.ok((steps[4]?.loss ?? 0) < (steps[0]?.loss ?? 0) - 0.1, JSON.stringify(steps.map((s) => s.loss)));
    assert.deepEqual(readdirSync(join(dir, 'run')).sort(), ['ad-4', 'ad-5']);
    assert.deepEqual(readdirSync(join(dir, 'run', 'ad-5')).sort(), ADAPTER_FILES);
    const config = JSON.parse(readFileSync(join(dir, 'run', 'ad-5', 'adapter_config.json'), 'utf8'));
    assert.equal(config.r, 8);
    assert.equal(config.lora_alpha, 8);
    assert.equal(config.base_model_name_or_path, m0);
    assert.equal(config.peft_type, 'LORA');
    // the adapter changed the model: base + adapter is not the base
    assert.ok((await logprobDiff([m0, join(dir, 'run', 'ad-5')], [m0, null])) > 1e-3);
  });

  test('--lora-targets and --lora-alpha reach the adapter; a bad target is a usage error', async () => {
    const out = join(dir, 'qv');
    const r = await rstar(
      [
        'train-step',
        '--loss',
        'sft',
        '--model',
        m0,
        '--out',
        out,
        '--lora-rank',
        '2',
        '--lora-alpha',
        '6',
        '--lora-targets',
        'v,q_proj',
      ],
      ndjson(records),
    );
    assert.equal(r.code, 0, r.stderr);
    const config = JSON.parse(readFileSync(join(out, 'adapter_config.json'), 'utf8'));
    assert.deepEqual(config.target_modules, ['q_proj', 'v_proj']);
    assert.equal(config.lora_alpha, 6);
    const bad = await rstar(
      [
        'train-step',
        '--loss',
        'sft',
        '--model',
        m0,
        '--out',
        join(dir, 'never'),
        '--lora-targets',
        'q,lm_head',
      ],
      ndjson(records),
    );
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--lora-targets.*"lm_head" is not a LoRA target/);
    const alone = await rstar(
      ['train-step', '--loss', 'sft', '--model', m0, '--out', join(dir, 'never'), '--lora-alpha', '16'],
      ndjson(records),
    );
    assert.equal(alone.code, 2);
    assert.match(alone.stderr, /^rstar train-step: --lora-alpha: needs --lora-rank \(or --lora-init\)\n$/);
  });

  test('--lora-init warm-starts from an adapter; a rank that differs: exit 1, one line', async () => {
    const first = w1;
    const second = join(dir, 'w2');
    const r2 = await rstar(
      ['train-step', '--loss', 'sft', '--model', m0, '--out', second, '--lora-init', first, '--lr', '0.02'],
      ndjson(records),
    );
    assert.equal(r2.code, 0, r2.stderr);
    // continued: the warm start's step count and a loss below the first step's
    const [s2] = lines<{ loss: number; step: number }>(r2.stdout);
    assert.equal(s2?.step, 2);
    assert.ok((s2?.loss ?? 0) < w1Step.loss);
    const bad = await rstar(
      [
        'train-step',
        '--loss',
        'sft',
        '--model',
        m0,
        '--out',
        join(dir, 'never'),
        '--lora-init',
        first,
        '--lora-rank',
        '8',
      ],
      ndjson(records),
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /^rstar train-step: .*w1\/adapter_config\.json: r: 4 but --lora-rank 8\n$/);
  });

  test('sft-train takes the LoRA flags and writes an adapter', async () => {
    const data = join(dir, 'sft.jsonl');
    writeFileSync(data, ndjson(records));
    const out = join(dir, 'sft');
    const r = await rstar([
      'sft-train',
      '--data',
      data,
      '--model',
      m0,
      '--out',
      out,
      '--batch-records',
      '2',
      '--max-steps',
      '2',
      '--lora-rank',
      '4',
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      lines<{ adapter?: boolean }>(r.stdout).map((s) => s.adapter),
      [true, true],
    );
    assert.ok(existsSync(join(out, 'adapter_model.safetensors')));
    assert.ok(!existsSync(join(out, 'model.safetensors')));
  });

  test('data-parallel LoRA (--nproc 2) trains the adapter one process trains', async () => {
    const train = (out: string, nproc: string) =>
      rstar(
        [
          'train-step',
          '--loss',
          'sft',
          '--model',
          m0,
          '--out',
          out,
          '--lora-rank',
          '4',
          '--lr',
          '0.02',
        ].concat(['--nproc', nproc, '--optimizer', 'sgd']),
        ndjson(records),
      );
    const [one, two] = [join(dir, 'dp1'), join(dir, 'dp2')];
    const r1 = await train(one, '1');
    assert.equal(r1.code, 0, r1.stderr);
    const r2 = await train(two, '2');
    assert.equal(r2.code, 0, r2.stderr);
    assert.ok((await adapterDiff(one, w1)) > 1e-4); // SGD, not AdamW: a different update
    assert.ok((await adapterDiff(one, two)) < 1e-6);
  });

  test('model-merge writes a checkpoint with the log-probs of base + adapter', async () => {
    const adapter = w1;
    const merged = join(dir, 'merged');
    const r = await rstar(['model-merge', '--base', m0, '--adapter', adapter, '--out', merged]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(lines<{ checkpoint: string }>(r.stdout)[0]?.checkpoint, merged);
    assert.ok(existsSync(join(merged, 'config.json')) && existsSync(join(merged, 'tokenizer_config.json')));
    assert.ok((await logprobDiff([merged, null], [m0, adapter])) < 1e-5);
    assert.ok((await logprobDiff([merged, null], [m0, null])) > 1e-4);
    const again = await rstar(['model-merge', '--base', m0, '--adapter', adapter, '--out', merged]);
    assert.equal(again.code, 2);
    assert.match(again.stderr, /--out .*not empty/);
  });

  test('model-merge: bad input exits 1 with one line naming the file and field', async () => {
    const adapter = w1;
    const broken = (name: string, change: Record<string, unknown>): string => {
      const folder = join(dir, name);
      rmSync(folder, { recursive: true, force: true });
      cpSync(adapter, folder, { recursive: true });
      const path = join(folder, 'adapter_config.json');
      writeFileSync(path, JSON.stringify({ ...JSON.parse(readFileSync(path, 'utf8')), ...change }));
      return folder;
    };
    const wide = await tinyModel('rstar-lora-wide-');
    try {
      writeFileSync(
        join(wide.dir, 'cfg', 'config.json'),
        JSON.stringify({ ...JSON.parse(readFileSync(wide.config, 'utf8')), hidden_size: 48 }),
      );
      const wider = join(wide.dir, 'wider');
      assert.equal((await rstar(['model-init', '--config', wide.config, '--out', wider])).code, 0);
      const cases: [string, string, RegExp][] = [
        [m0, join(dir, 'absent'), /absent: not a directory/],
        [
          m0,
          broken('rank', { r: 2 }),
          /adapter_model\.safetensors: .*lora_A\.weight: shape \[4, 32\] does not have rank r=2/,
        ],
        [
          m0,
          broken('target', { target_modules: ['q_proj', 'embed_tokens'] }),
          /adapter_config\.json: target_modules: embed_tokens/,
        ],
        [wider, adapter, /w1\/adapter_config\.json: base_model_name_or_path: .* in hidden_size/],
      ];
      for (const [base, folder, want] of cases) {
        const out = join(dir, 'merge-bad');
        const r = await rstar(['model-merge', '--base', base, '--adapter', folder, '--out', out]);
        assert.equal(r.code, 1, `${folder}: ${r.stderr}`);
        assert.match(r.stderr, /^rstar model-merge: [^\n]+\n$/, r.stderr);
        assert.match(r.stderr, want);
        assert.ok(!existsSync(out));
      }
    } finally {
      rmSync(wide.dir, { recursive: true, force: true });
    }
  });
});
