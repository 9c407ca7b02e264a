// Catches: model-init writing a Qwen3 checkpoint for a Qwen2/Llama/MoE config.json (issue 42), --arch
// writing the wrong config.json or tensor names, a refusal that is not one line naming file and field,
// and a Qwen2/Llama checkpoint that train-step or engine-serve cannot take.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { startEngine } from '../../src/backend/engine.js';
import { lines, ndjson, rstar, smallConfig } from '../support/helpers.js';

interface TensorInfo {
  dtype: string;
  shape: number[];
}

/** The tensor names and shapes of a single-file checkpoint, from its safetensors header. */
function tensors(folder: string): Record<string, TensorInfo> {
  const raw = readFileSync(join(folder, 'model.safetensors'));
  const n = Number(raw.readBigUInt64LE(0));
  const header = JSON.parse(raw.subarray(8, 8 + n).toString('utf8')) as Record<string, TensorInfo>;
  delete header.__metadata__;
  return header;
}

const readJson = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;

const ATTN = 'model.layers.0.self_attn.';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rstar-model-arch-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('model-init --arch: tiny random models of each architecture', () => {
  test('qwen3, qwen2 and llama each write their own config.json and tensor names', async () => {
    for (const arch of ['qwen3', 'qwen2', 'llama']) {
      const out = join(dir, `tiny-${arch}`);
      const r = await rstar(['model-init', '--arch', arch, '--out', out]);
      assert.equal(r.code, 0, r.stderr);
      const info = lines(r.stdout)[0] as { arch: string; tokenizer_files: string[] };
      assert.equal(info.arch, arch);
      assert.ok(info.tokenizer_files.includes('tokenizer.json'), 'the fixture tokenizer comes along');
      assert.ok(existsSync(join(out, 'tokenizer.json')));
      const cfg = readJson(join(out, 'config.json'));
      const names = tensors(out);
      const has = (n: string) => n in names;
      if (arch === 'qwen3') {
        assert.deepEqual([cfg.architectures, cfg.model_type], [['Qwen3ForCausalLM'], 'qwen3']);
        assert.ok(has(`${ATTN}q_norm.weight`) && has(`${ATTN}k_norm.weight`));
        assert.ok(!has(`${ATTN}q_proj.bias`));
      } else if (arch === 'qwen2') {
        assert.deepEqual([cfg.architectures, cfg.model_type], [['Qwen2ForCausalLM'], 'qwen2']);
        for (const p of ['q', 'k', 'v']) assert.deepEqual(names[`${ATTN}${p}_proj.bias`]?.shape.length, 1, p);
        assert.deepEqual(names[`${ATTN}q_proj.bias`].shape, [128]);
        assert.ok(!has(`${ATTN}o_proj.bias`) && !has(`${ATTN}q_norm.weight`));
        assert.equal(cfg.use_sliding_window, false);
      } else {
        assert.deepEqual([cfg.architectures, cfg.model_type], [['LlamaForCausalLM'], 'llama']);
        assert.deepEqual(cfg.rope_scaling, {
          rope_type: 'llama3',
          factor: 8,
          low_freq_factor: 1,
          high_freq_factor: 4,
          original_max_position_embeddings: 1024,
        });
        assert.equal(cfg.tie_word_embeddings, false);
        assert.ok(has('lm_head.weight'), 'untied head written');
        assert.ok(!has(`${ATTN}q_proj.bias`) && !has(`${ATTN}q_norm.weight`));
        assert.equal(cfg.mlp_bias, false);
      }
    }
  });

  test('neither --config nor --arch is a usage error; an unknown --arch too', async () => {
    const r = await rstar(['model-init', '--out', join(dir, 'none')]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--config FILE.*--arch qwen3\|qwen2\|llama/);
    assert.equal((await rstar(['model-init', '--arch', 'mixtral', '--out', join(dir, 'none')])).code, 2);
    assert.ok(!existsSync(join(dir, 'none')));
  });
});

describe('model-init --config: the config.json decides the architecture', () => {
  test('a Qwen2 config.json gives a Qwen2 checkpoint with its q/k/v biases', async () => {
    const cfgDir = join(dir, 'qwen2-cfg');
    mkdirSync(cfgDir);
    const { architectures: _a, model_type: _m, head_dim: _h, ...plain } = smallConfig();
    writeFileSync(
      join(cfgDir, 'config.json'),
      JSON.stringify({
        ...plain,
        architectures: ['Qwen2ForCausalLM'],
        model_type: 'qwen2',
        use_sliding_window: false,
        sliding_window: 32768,
      }),
    );
    const out = join(dir, 'qwen2');
    const r = await rstar(['model-init', '--config', join(cfgDir, 'config.json'), '--out', out]);
    assert.equal(r.code, 0, r.stderr);
    const cfg = readJson(join(out, 'config.json'));
    assert.deepEqual([cfg.architectures, cfg.model_type], [['Qwen2ForCausalLM'], 'qwen2']);
    const names = tensors(out);
    for (const p of ['q', 'k', 'v']) assert.ok(`model.layers.1.self_attn.${p}_proj.bias` in names, p);
    assert.ok(!(`${ATTN}q_norm.weight` in names));
  });

  test('a Mixtral config.json is refused in one line naming the file and the field; nothing written', async () => {
    const cfgDir = join(dir, 'mixtral-cfg');
    mkdirSync(cfgDir);
    const config = join(cfgDir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        ...smallConfig(),
        architectures: ['MixtralForCausalLM'],
        model_type: 'mixtral',
        num_local_experts: 8,
        num_experts_per_tok: 2,
      }),
    );
    const out = join(dir, 'mixtral');
    const r = await rstar(['model-init', '--config', config, '--out', out]);
    assert.equal(r.code, 1);
    const msg = r.stderr.trim();
    assert.equal(msg.split('\n').length, 1, msg);
    assert.ok(msg.includes(config), msg);
    assert.match(msg, /num_local_experts=8: mixture-of-experts models are not supported/);
    assert.ok(!existsSync(out));
    // a yarn-scaled Qwen2.5 long-context config: the rope scaling is named
    writeFileSync(
      config,
      JSON.stringify({
        ...smallConfig(),
        architectures: ['Qwen2ForCausalLM'],
        model_type: 'qwen2',
        rope_scaling: { type: 'yarn', factor: 4, original_max_position_embeddings: 32768 },
      }),
    );
    const y = await rstar(['model-init', '--config', config, '--out', out]);
    assert.equal(y.code, 1);
    assert.match(y.stderr, /config\.json: rope_scaling: rope type 'yarn' is not supported/);
  });
});

describe('a Llama checkpoint trains (train-step) and serves (engine-serve)', () => {
  test('one SFT step, then greedy generation from the trained checkpoint', async () => {
    const m0 = join(dir, 'llama-m0');
    const m1 = join(dir, 'llama-m1');
    assert.equal((await rstar(['model-init', '--arch', 'llama', '--out', m0, '--seed', '4'])).code, 0);
    const data = join(dir, 'batch.jsonl');
    writeFileSync(
      data,
      ndjson([
        { prompt_ids: [1, 5, 9], response_ids: [10, 11, 12, 13], loss_mask: [1, 1, 1, 1] },
        { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 1, 1] },
      ]),
    );
    const r = await rstar(['train-step', '--loss', 'sft', '--model', m0, '--out', m1, '--lr', '1e-3', data]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((lines(r.stdout)[0] as { step: number }).step, 1);
    const cfg = readJson(join(m1, 'config.json'));
    assert.deepEqual([cfg.architectures, cfg.tie_word_embeddings], [['LlamaForCausalLM'], false]);
    assert.equal((cfg.rope_scaling as { rope_type: string }).rope_type, 'llama3');
    const engine = await startEngine({ model: m1, maxTotalTokens: 256 });
    try {
      const res = await fetch(`${engine.url}/generate`, {
        method: 'POST',
        body: JSON.stringify({
          input_ids: [1, 100, 200, 300],
          sampling_params: { max_new_tokens: 5, temperature: 0, ignore_eos: true },
          return_logprob: true,
        }),
      });
      assert.equal(res.status, 200);
      const json = (await res.json()) as {
        output_ids: number[];
        meta_info: { output_token_logprobs: [number, number, null][] };
      };
      assert.equal(json.output_ids.length, 5);
      for (const [lp] of json.meta_info.output_token_logprobs) assert.ok(Number.isFinite(lp) && lp <= 0);
    } finally {
      await engine.close();
    }
  });
});
