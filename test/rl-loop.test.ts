/**
 * The RL loop as one streaming pipeline (recipes/rl.sh): rollout --steps | roc-filter | advantage |
 * train-step --follow --sync, with a real trainer on a real (small) checkpoint, a real sandbox, and a
 * scripted SGLang engine whose replies alternate right and wrong answers, so every group is mixed.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Problem } from '../src/records/problem.js';
import { type EngineClient, engineClient } from '../src/rollout/engines.js';
import { loadProtocol } from '../src/rollout/index.js';
import { type EndBatch, rolloutSteps, stepProblems } from '../src/rollout/steps.js';
import { startSandbox } from '../src/sandbox/embedded.js';
import { collect, TINY } from './agent-fixtures.js';
import { type FakeServer, startFakeSglang } from './fake-sglang.js';
import { lines, ndjson, ROOT, rstar } from './helpers.js';

/** A small Qwen3 config over the tiny tokenizer's vocabulary: quick to train, real all the same. */
const CONFIG = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  vocab_size: 4096,
  hidden_size: 32,
  intermediate_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 8,
  max_position_embeddings: 512,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: true,
  bos_token_id: 0,
  eos_token_id: 2,
  torch_dtype: 'float32',
};

const RIGHT = 'Done.</reason>\n<answer>\\boxed{3}</answer>';
const WRONG = 'Done.</reason>\n<answer>\\boxed{4}</answer>';

const problems = (k: number, prefix = 'p'): Problem[] =>
  Array.from({ length: k }, (_, i) => ({
    v: 1 as const,
    kind: 'math' as const,
    id: `${prefix}${i}`,
    prompt: `Solve 2x = 6 (variant ${prefix}${i}).`,
    answer: '3',
  }));

function runRecipe(out: string, env: Record<string, string>): ChildProcess {
  return spawn('bash', ['recipes/rl.sh', out], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true, // its own process group, so a test can kill the whole pipeline at once
  });
}

async function finished(child: ChildProcess): Promise<{ code: number; log: string }> {
  let log = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => {
    log += d;
  });
  const code = await new Promise<number>((resolve) => child.on('close', (c) => resolve(c ?? 1)));
  return { code, log };
}

const readNdjson = <T = Record<string, unknown>>(file: string): T[] => lines<T>(readFileSync(file, 'utf8'));

describe('the streaming RL loop (recipes/rl.sh)', () => {
  let dir: string;
  let engine: FakeServer;
  let env: Record<string, string>;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-rl-loop-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(CONFIG));
    const init = await rstar(['model-init', '--config', join(dir, 'config.json'), '--out', join(dir, 'm0')]);
    assert.equal(init.code, 0, init.stderr);
    writeFileSync(join(dir, 'problems.jsonl'), ndjson(problems(4)));
    engine = await startFakeSglang({
      tokenizer: TINY,
      capacity: 100_000,
      turns: [RIGHT],
      cycle: [{ match: 'variant', replies: [RIGHT, WRONG] }],
    });
    env = {
      RSTAR_RL_MODEL: join(dir, 'm0'),
      RSTAR_RL_PROBLEMS: join(dir, 'problems.jsonl'),
      RSTAR_RL_TOKENIZER: TINY,
      RSTAR_RL_ENGINE: engine.url,
      RSTAR_RL_BATCH: '2',
      RSTAR_RL_KEEP: '4',
      RSTAR_RL_LR: '1e-2',
      RSTAR_RL_MINI_BATCHES: '2',
      RSTAR_RL_MAX_TOKENS: '64',
    };
  });
  after(async () => {
    await engine?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('two steps: one Step record each, new weights, the engine serves them, every trajectory once', async () => {
    const out = join(dir, 'run');
    const { code, log } = await finished(runRecipe(out, { ...env, RSTAR_RL_STEPS: '2' }));
    assert.equal(code, 0, log);
    const steps = readNdjson<{ step: number; updates: number; sequences: number }>(join(out, 'steps.jsonl'));
    assert.deepEqual(
      steps.map((s) => s.step),
      [1, 2],
    );
    for (const s of steps) {
      assert.equal(s.sequences, 8); // 2 problems x keep 4, every group mixed
      assert.equal(s.updates, 2);
    }
    const weights = (p: string) => readFileSync(join(p, 'model.safetensors'));
    assert.ok(!weights(join(dir, 'm0')).equals(weights(join(out, 'step-1'))), 'step 1 changed the weights');
    assert.ok(
      !weights(join(out, 'step-1')).equals(weights(join(out, 'step-2'))),
      'step 2 changed them again',
    );
    for (const k of [1, 2]) {
      const trajectories = readNdjson<{ id: string; step: number; policy_version: string }>(
        join(out, 'trajectories', `step-${k}.jsonl`),
      );
      assert.equal(trajectories.length, 16); // 2 problems x n 8
      assert.equal(new Set(trajectories.map((t) => t.id)).size, 16);
      for (const t of trajectories) {
        assert.equal(t.step, k);
        assert.equal(t.policy_version, String(k - 1)); // on-policy: generated by the previous step's weights
      }
    }
    const stats = await engine.stats();
    assert.deepEqual(
      stats.reloads.slice(-2),
      [join(out, 'step-1'), join(out, 'step-2')].map((p) => join(p)),
    );
    const version = (await (await fetch(`${engine.url}/get_weight_version`)).json()) as {
      weight_version: string;
    };
    assert.equal(version.weight_version, '2');
    const curve = readNdjson<{ step: number; train_reward: number }>(join(out, 'curve.jsonl'));
    assert.deepEqual(
      curve.map((c) => [c.step, c.train_reward]),
      [
        [1, 0.5],
        [2, 0.5],
      ],
    );

    // Rerun with more steps: it resumes after step 2, from step 2's weights.
    const more = await finished(runRecipe(out, { ...env, RSTAR_RL_STEPS: '3' }));
    assert.equal(more.code, 0, more.log);
    assert.match(more.log, /resuming after step 2/);
    assert.deepEqual(
      readNdjson<{ step: number }>(join(out, 'steps.jsonl')).map((s) => s.step),
      [1, 2, 3],
    );
    const third = readNdjson<{ policy_version: string }>(join(out, 'trajectories', 'step-3.jsonl'));
    assert.ok(third.every((t) => t.policy_version === '2'));
  });

  test('a killed run resumes at its last finished step; no step is lost or trained twice', async () => {
    const out = join(dir, 'killed');
    const child = runRecipe(out, { ...env, RSTAR_RL_STEPS: '4' });
    const done = finished(child);
    const deadline = Date.now() + 60_000;
    while (!existsSync(join(out, 'step-2', 'trainer_state.json')) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    process.kill(-child.pid!, 'SIGKILL');
    await done;
    const again = await finished(runRecipe(out, { ...env, RSTAR_RL_STEPS: '4' }));
    assert.equal(again.code, 0, again.log);
    assert.match(again.log, /resuming after step [23]/);
    for (const k of [1, 2, 3, 4]) {
      assert.ok(existsSync(join(out, `step-${k}`, 'trainer_state.json')), `step-${k} checkpoint`);
      const ids = readNdjson<{ id: string }>(join(out, 'trajectories', `step-${k}.jsonl`)).map((t) => t.id);
      assert.equal(ids.length, 16, `step ${k} trajectories`);
      assert.equal(new Set(ids).size, 16);
    }
    const trained = readNdjson<{ step: number }>(join(out, 'steps.jsonl')).map((s) => s.step);
    assert.deepEqual([...new Set(trained)].sort(), [1, 2, 3, 4]);
    assert.equal(trained.length, 4, `each step trained once: ${trained}`);
  });
});

describe('rollout --steps: problem draws and dynamic sampling', () => {
  let engine: FakeServer;
  let sandbox: { url: string; close(): Promise<void> };
  let client: EngineClient;

  before(async () => {
    // Problems "mixed-*" get alternating right/wrong replies; "easy-*" are always right.
    engine = await startFakeSglang({
      tokenizer: TINY,
      capacity: 100_000,
      turns: [RIGHT],
      cycle: [{ match: 'variant mixed', replies: [RIGHT, WRONG] }],
    });
    sandbox = await startSandbox();
    client = engineClient(engine.url, 'sglang');
  });
  after(async () => {
    await engine?.close();
    await sandbox?.close();
  });

  test('each step draws the next problems of a seeded epoch order; an epoch covers the set once', () => {
    const set = problems(5);
    const drawn = [1, 2, 3].map((k) => stepProblems(set, k, 2, 7).map((p) => p.id));
    assert.equal(new Set([...drawn[0], ...drawn[1]]).size, 4);
    assert.deepEqual(stepProblems(set, 2, 2, 7), stepProblems(set, 2, 2, 7));
    assert.equal(new Set(drawn[2]).size, 2); // spans two epochs, each problem once
  });

  test('refills with more problems until --batch groups are mixed, up to the cap', async () => {
    const protocol = await loadProtocol(TINY, { chatTemplate: `${ROOT}fixtures/curriculum/tiny.jinja` });
    const set = [...problems(6, 'variant easy-'), ...problems(2, 'variant mixed-')].map((p) => ({
      ...p,
      prompt: `Solve 2x = 6 (${p.id}).`,
    }));
    const run = (dynamic: number) =>
      collect(
        rolloutSteps(
          set,
          { engines: [client], sandbox: sandbox.url, protocol, n: 2, maxTokens: 64, maxTurns: 1 },
          { batch: 2, steps: 1, dynamicSampling: dynamic, seed: 3 },
        ),
      );
    const full = await run(4); // cap 8 problems: every problem can be drawn, so both mixed ones are found
    const end = full.at(-1) as EndBatch;
    assert.equal(end.end_batch, true);
    assert.equal(end.stats.mixed_groups, 2);
    assert.ok(end.stats.problems <= 8);
    assert.equal(end.stats.trajectories, 2 * end.stats.problems);
    assert.equal(full.length - 1, end.stats.trajectories);
    const capped = await run(1.5); // cap 3 problems
    const cappedEnd = capped.at(-1) as EndBatch;
    assert.ok(cappedEnd.stats.problems <= 3);
    if (cappedEnd.stats.mixed_groups < 2) assert.equal(cappedEnd.stats.problems, 3);
    const off = (await run(1)).at(-1) as EndBatch;
    assert.equal(off.stats.problems, 2);
    assert.equal(off.stats.rounds, 1);
  });
});
