import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { execa } from 'execa';
import { backendEnv, findPython } from '../../src/backend/python.js';
import { lines, ROOT } from '../support/helpers.js';

const SCRIPT = join(ROOT, 'bench', 'gpu-check.py');
const CHECKS = [
  'environment',
  'hf-reference',
  'train-fp32',
  'train-bf16',
  'engine',
  'ddp',
  'shard',
  'shard-gpu',
  'lora',
];
const NOT_YET = 'needs train-step --dtype/--shard';

interface CheckRecord {
  check?: string;
  ok: boolean;
  skipped?: boolean;
  reason?: string;
  seconds: number;
  summary?: boolean;
  passed?: number;
  failed?: number;
  [figure: string]: unknown;
}

async function gpuCheck(args: string[], env: Record<string, string> = {}) {
  const python = await findPython();
  const r = await execa(python, [SCRIPT, ...args], {
    env: { ...backendEnv(), OUT: '', ...env },
    reject: false,
    timeout: 120_000,
  });
  return { code: r.exitCode, records: lines<CheckRecord>(String(r.stdout)), stderr: String(r.stderr) };
}

describe('bench/gpu-check.py --cpu', () => {
  test('one record per check, then a summary; what needs a GPU, transformers or FSDP says why it skipped', async () => {
    const { code, records, stderr } = await gpuCheck(['--cpu']);
    assert.equal(code, 0, stderr);
    const summary = records.at(-1);
    const checks = records.slice(0, -1);
    assert.deepEqual(
      checks.map((r) => r.check),
      CHECKS,
    );
    const by = Object.fromEntries(checks.map((r) => [r.check, r]));
    for (const r of checks) {
      assert.equal(typeof r.ok, 'boolean');
      assert.ok(r.seconds >= 0);
      if (r.skipped) assert.ok(typeof r.reason === 'string' && r.reason.length > 0, r.check);
      else assert.equal(r.ok, true, `${r.check}: ${JSON.stringify(r)}`);
    }
    const env = by.environment as CheckRecord & {
      mode: string;
      build: { kind: string };
      train_api: { dtype: boolean; shard: boolean };
      fsdp: { api: string | null };
    };
    assert.equal(env.mode, 'cpu');
    // until train-step has bf16 compute and sharding, those checks skip rather than fake it
    if (!env.train_api.dtype) assert.equal(by['train-bf16'].reason, NOT_YET);
    if (!env.train_api.shard) assert.equal(by.shard.reason, NOT_YET);
    else if (env.fsdp.api === null) assert.match(String(by.shard.reason), /^FSDP does not import/);
    if (by['hf-reference'].skipped) assert.match(String(by['hf-reference'].reason), /transformers/);
    // what runs here runs for real: the trainer learns, the engine serves bf16 close to the trainer
    const train = by['train-fp32'] as CheckRecord & { sft_losses: number[]; grpo_margin: number[] };
    assert.ok(train.sft_losses.length >= 2 && train.sft_losses.at(-1)! < train.sft_losses[0]);
    assert.ok(train.grpo_margin.at(-1)! > train.grpo_margin[0]);
    const engine = by.engine as CheckRecord & Record<string, number | string>;
    assert.equal(engine.dtype, 'bf16');
    assert.ok((engine.tokens_per_s_batch64 as number) > 0 && (engine.tokens_per_s_batch1 as number) > 0);
    assert.ok((engine.logprob_mismatch_mean as number) > 0); // bf16 against fp32 is never exact
    assert.ok((engine.logprob_std as number) > 1); // peaked distributions: the tolerance means something
    const ddp = by.ddp as CheckRecord & { max_update: number; max_weight_diff: number; backend: string };
    assert.equal(ddp.backend, 'gloo');
    assert.ok(ddp.max_update > 0 && ddp.max_weight_diff <= 1e-4 * ddp.max_update);
    assert.deepEqual(
      { summary: summary?.summary, ok: summary?.ok, failed: summary?.failed },
      { summary: true, ok: true, failed: 0 },
    );
    assert.equal(summary?.passed, checks.filter((r) => !r.skipped).length);
    assert.equal(summary?.skipped, checks.filter((r) => r.skipped).length);
  });

  test('a failed check exits 1 and is counted (an impossible engine tolerance)', async () => {
    const { code, records } = await gpuCheck(['--cpu', '--only', 'engine', '--tolerance', 'engine_mean=0']);
    assert.equal(code, 1);
    assert.equal(records.length, 2);
    assert.equal(records[0].check, 'engine');
    assert.equal(records[0].ok, false);
    assert.deepEqual(
      { ok: records[1].ok, failed: records[1].failed, passed: records[1].passed },
      { ok: false, failed: 1, passed: 0 },
    );
  });

  test('--out DIR keeps every record and each check log; the summary is the last stdout line', async () => {
    const out = mkdtempSync(join(tmpdir(), 'gpu-check-out-'));
    try {
      const { code, records, stderr } = await gpuCheck(['--cpu', '--only', 'environment,ddp', '--out', out]);
      assert.equal(code, 0, stderr);
      const saved = lines<CheckRecord>(readFileSync(join(out, 'gpu-check.jsonl'), 'utf8'));
      assert.deepEqual(saved, records);
      assert.equal(records.at(-1)?.summary, true);
      const files = readdirSync(out).sort();
      for (const f of ['environment.log', 'ddp.log', 'ddp-w2-rank0.log', 'ddp-w2-rank1.log'])
        assert.ok(files.includes(f), f);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  test('$OUT is the default --out', async () => {
    const out = mkdtempSync(join(tmpdir(), 'gpu-check-env-'));
    try {
      const { code } = await gpuCheck(['--cpu', '--only', 'environment'], { OUT: out });
      assert.equal(code, 0);
      assert.equal(lines<CheckRecord>(readFileSync(join(out, 'gpu-check.jsonl'), 'utf8')).length, 2);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  test('a distributed launch past --launch-timeout fails its check within the cap, naming it', async () => {
    const t0 = Date.now();
    const { code, records } = await gpuCheck(['--cpu', '--only', 'ddp', '--launch-timeout', '0.5']);
    assert.equal(code, 1);
    assert.equal(records[0].ok, false);
    assert.match(String(records[0].reason), /did not finish within 0 s|did not finish within 1 s/);
    assert.ok(Date.now() - t0 < 60_000);
  });

  test('hf-reference covers Qwen2 (random biases) and Llama (llama3 rope, untied) as transformers names them', async () => {
    // transformers is on GPU machines only: what can be checked here is that every case, at the CPU
    // and at the GPU sizes, writes a checkpoint of the architecture the transformers class expects
    const python = await findPython();
    const code = [
      'import importlib.util, json, os, shutil, sys, tempfile',
      'spec = importlib.util.spec_from_file_location("gc", sys.argv[1])',
      'gc = importlib.util.module_from_spec(spec); spec.loader.exec_module(gc)',
      'from rstar_backend.checkpoint import load_state_dict',
      'out, tmp = [], tempfile.mkdtemp()',
      'for sizes, conf in (("cpu", gc.CPU_CONFIG), ("gpu", gc.GPU_CONFIG)):',
      '    for tag, cls, arch, tie, bias_std, cfg in gc.hf_reference_cases(conf):',
      '        d = gc.checkpoint(os.path.join(tmp, sizes + tag), cfg, seed=11, tie=tie, arch=arch, bias_std=bias_std)',
      '        hf = json.load(open(os.path.join(d, "config.json")))',
      '        sd = load_state_dict(d) if sizes == "cpu" else {}',
      '        biases = [k for k in sd if k.endswith(".bias")]',
      '        out.append({"sizes": sizes, "tag": tag, "cls": cls, "architectures": hf["architectures"],',
      '                    "rope": (hf.get("rope_scaling") or {}).get("rope_type"), "tied": hf["tie_word_embeddings"],',
      '                    "biases": len(biases), "nonzero_bias": any(bool(sd[k].abs().max() > 0) for k in biases)})',
      'shutil.rmtree(tmp)',
      'print(json.dumps(out))',
    ].join('\n');
    const r = await execa(python, ['-c', code, SCRIPT], { env: backendEnv(), reject: false });
    assert.equal(r.exitCode, 0, r.stderr);
    const cases = JSON.parse(r.stdout) as {
      sizes: string;
      tag: string;
      cls: string;
      architectures: string[];
      rope: string | undefined;
      tied: boolean;
      biases: number;
      nonzero_bias: boolean;
    }[];
    for (const c of cases) assert.deepEqual(c.architectures, [c.cls], `${c.sizes} ${c.tag}`);
    const cpu = Object.fromEntries(cases.filter((c) => c.sizes === 'cpu').map((c) => [c.tag, c]));
    assert.deepEqual(Object.keys(cpu), ['tied', 'untied', 'qwen2', 'llama', 'llama_bias']);
    assert.equal(cases.filter((c) => c.sizes === 'gpu').length, 5);
    assert.ok(cpu.qwen2.biases > 0 && cpu.qwen2.nonzero_bias, 'Qwen2 biases random, not zero');
    assert.deepEqual([cpu.llama.rope, cpu.llama.tied, cpu.llama.biases], ['llama3', false, 0]);
    assert.ok(cpu.llama_bias.nonzero_bias);
  });

  test('bad usage exits 2', async () => {
    assert.equal((await gpuCheck(['--cpu', '--only', 'nope'])).code, 2);
    assert.equal((await gpuCheck(['--cpu', '--tolerance', 'nope=1'])).code, 2);
  });

  test('without --cpu and no GPU: exit 2, pointing at --cpu', async (t) => {
    const python = await findPython();
    const gpu = await execa(python, ['-c', 'import torch; print(torch.cuda.is_available())']);
    if (gpu.stdout.trim() === 'True') return t.skip('a GPU is present');
    const { code, stderr, records } = await gpuCheck([]);
    assert.equal(code, 2);
    assert.equal(records.length, 0);
    assert.match(stderr, /sees no GPU; run with --cpu/);
  });
});
