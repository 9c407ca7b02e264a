/**
 * LoRA's adapter-only sync and rollout (issue 42 §3), against the scripted SGLang and vLLM fakes
 * (their LoRA routes as the servers document them) and a real trainer. Catches: a sync that sends the
 * base (a full checkpoint) instead of the adapter, an adapter reloaded under the same name (vLLM
 * #42125's stale prefix blocks), adapters never unloaded past the staleness window (an engine's
 * --max-loras fills up), a request that does not name the adapter and is served by the base
 * (verl #5220), and a reply from the base or a stale adapter kept as if on-policy.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Problem } from '../../src/records/problem.js';
import { Step } from '../../src/records/step.js';
import type { Trajectory } from '../../src/records/trajectory.js';
import {
  adapterName,
  type EngineClient,
  engineClient,
  loraPolicy,
  PolicyMismatch,
  SglangClient,
  VllmClient,
} from '../../src/rollout/engines.js';
import { loadProtocol } from '../../src/rollout/index.js';
import { type EndBatch, rolloutSteps } from '../../src/rollout/steps.js';
import { loadTokenizer } from '../../src/rollout/tokenizer.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { collect, TINY } from '../support/agent-fixtures.js';
import { type FakeOptions, type FakeServer, startFakeSglang } from '../support/fake-sglang.js';
import { type FakeVllm, startFakeVllm } from '../support/fake-vllm.js';
import { BIN, cleanEnv, lines, ndjson, ROOT, rstar, smallConfig } from '../support/helpers.js';

const ANSWER = 'Done.</reason>\n<answer>\\boxed{3}</answer>';

/** `--follow` input: one small GRPO batch per step, closed by rollout's numbered end_batch line. */
const batches = (steps: number): string => {
  let text = '';
  for (let k = 1; k <= steps; k++) {
    const policy_version = String(k - 1);
    text += ndjson([
      {
        prompt_ids: [1, 5, 9],
        response_ids: [10, 11, 12, 13],
        loss_mask: [1, 1, 0, 1],
        advantage: 1,
        policy_version,
      },
      { prompt_ids: [2, 6], response_ids: [20, 21, 22], loss_mask: [1, 1, 1], advantage: -1, policy_version },
    ]);
    text += `{"end_batch":true,"step":${k}}\n`;
  }
  return text;
};

const bytes = (folder: string, files: string[]) =>
  files.reduce((n, f) => n + statSync(join(folder, f)).size, 0);

const problems = (k: number): Problem[] =>
  Array.from({ length: k }, (_, i) => ({
    v: 1 as const,
    kind: 'math' as const,
    id: `p${i}`,
    prompt: `Solve 2x = 6 (variant ${i}).`,
    answer: '3',
  }));

describe('LoRA: adapter-only sync and rollout that never goes silently off-policy', () => {
  let dir: string;
  let m0: string;
  const servers: FakeServer[] = [];
  const vllms: FakeVllm[] = [];
  const sglang = async (o: Partial<FakeOptions> = {}) => {
    const s = await startFakeSglang({ tokenizer: TINY, capacity: 100_000, turns: [ANSWER], ...o });
    servers.push(s);
    return s;
  };
  const vllm = async (o: Partial<Parameters<typeof startFakeVllm>[0]> = {}) => {
    const s = await startFakeVllm({ tokenizer: TINY, turns: [ANSWER], ...o });
    vllms.push(s);
    return s;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-lora-sync-'));
    mkdirSync(join(dir, 'cfg'));
    // the tiny tokenizer's vocabulary, so the recipe can train on the fake engine's replies
    writeFileSync(join(dir, 'cfg', 'config.json'), JSON.stringify(smallConfig(4096)));
    m0 = join(dir, 'm0');
    const init = await rstar(['model-init', '--config', join(dir, 'cfg', 'config.json'), '--out', m0]);
    assert.equal(init.code, 0, init.stderr);
  });
  after(async () => {
    await Promise.all([...servers.map((s) => s.close()), ...vllms.map((s) => s.close())]);
    rmSync(dir, { recursive: true, force: true });
  });

  test('train-step --sync --lora-rank: SGLang gets each step as a new adapter (never the base), the ones past --max-staleness unloaded', async (t) => {
    const engine = await sglang();
    const out = join(dir, 'sg');
    const r = await rstar(
      [
        ...['train-step', '--follow', '--loss', 'grpo', '--model', m0, '--out', join(out, 'step-{step}')],
        ...['--lora-rank', '4', '--lr', '1e-2', '--sync', engine.url, '--max-staleness', '1'],
      ],
      batches(3),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      lines(r.stdout).map((x) => Step.parse(x).step),
      [1, 2, 3],
    );
    const stats = await engine.stats();
    assert.deepEqual(stats.reloads, [], 'the base was sent (update_weights_from_disk)');
    // rollout --max-staleness 1 may still ask for step K-1's adapter: K and K-1 stay loaded
    assert.deepEqual(stats.adapters, [
      { op: 'load', name: 'rstar-lora-step-1', path: join(out, 'step-1') },
      { op: 'load', name: 'rstar-lora-step-2', path: join(out, 'step-2') },
      { op: 'load', name: 'rstar-lora-step-3', path: join(out, 'step-3') },
      { op: 'unload', name: 'rstar-lora-step-1' },
    ]);
    const version = (await (await fetch(`${engine.url}/get_weight_version`)).json()) as Record<
      string,
      string
    >;
    assert.equal(version.weight_version, '3');
    for (const { path } of stats.adapters.filter((a) => a.op === 'load')) {
      const files = readdirSync(path!);
      assert.ok(
        files.includes('adapter_config.json') && files.includes('adapter_model.safetensors'),
        `${files}`,
      );
      // what an engine reads of the folder is the adapter; no base weight or config goes with it
      for (const base of ['model.safetensors', 'model.safetensors.index.json', 'config.json'])
        assert.ok(!files.includes(base), `${path} holds ${base}: the base went with the adapter`);
    }
    const sent = bytes(join(out, 'step-1'), ['adapter_config.json', 'adapter_model.safetensors']);
    const full = bytes(m0, ['config.json', 'model.safetensors']);
    t.diagnostic(
      `bytes per sync: adapter ${sent}, full checkpoint ${full} (${((100 * sent) / full).toFixed(1)}%)`,
    );
    assert.ok(sent < full / 3, `adapter ${sent} bytes vs full ${full}`);
  });

  test('train-step --sync --engine-kind vllm --lora-rank: /v1/load_lora_adapter per step, /v1/models says the newest', async () => {
    const engine = await vllm();
    const out = join(dir, 'vl');
    const r = await rstar(
      [
        ...['train-step', '--follow', '--loss', 'grpo', '--model', m0, '--out', join(out, 'step-{step}')],
        ...['--lora-rank', '4', '--lr', '1e-2', '--sync', engine.url, '--engine-kind', 'vllm'],
      ],
      batches(2),
    );
    assert.equal(r.code, 0, r.stderr);
    // --max-staleness 0: only the newest adapter stays
    assert.deepEqual(engine.adapters, [
      { op: 'load', name: 'rstar-lora-step-1', path: join(out, 'step-1') },
      { op: 'load', name: 'rstar-lora-step-2', path: join(out, 'step-2') },
      { op: 'unload', name: 'rstar-lora-step-1' },
    ]);
    const client = new VllmClient(engine.url);
    assert.equal(await client.weightVersion(), '2');
    assert.equal(await client.model(), '/models/base', 'the base, not an adapter listed beside it');
    // without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes are 404: the error says what to set
    const locked: EngineClient = new VllmClient((await vllm({ runtimeLora: false })).url);
    await assert.rejects(locked.loadAdapter('rstar-lora-step-1', join(out, 'step-1'), '1'), {
      message: /--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/,
    });
  });

  test('a failed adapter sync stops train-step even while its input stays open (rollout waits for that policy)', async () => {
    const locked = await vllm({ runtimeLora: false });
    const child = spawn(
      process.execPath,
      [
        ...[
          BIN,
          'train-step',
          '--follow',
          '--loss',
          'grpo',
          '--model',
          m0,
          '--out',
          join(dir, 'locked', 'step-{step}'),
        ],
        ...['--lora-rank', '4', '--sync', locked.url, '--engine-kind', 'vllm'],
      ],
      { env: cleanEnv(), stdio: ['pipe', 'ignore', 'pipe'] },
    );
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    child.stdin.write(batches(1)); // and nothing more: the pipe stays open, as rollout's does
    const code = await Promise.race([
      new Promise<number | null>((resolve) => child.on('close', resolve)),
      new Promise<string>((resolve) => setTimeout(resolve, 60_000, 'hung')),
    ]);
    child.kill();
    assert.equal(code, 1, stderr);
    assert.match(stderr, /--sync: step 1: .*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/);
  });

  test('a reply from the base or from a stale adapter is refused; the right adapter is accepted', async () => {
    const ids = (await loadTokenizer(TINY)).encode('<|im_start|>assistant\n');
    const s = { temperature: 1, topP: 1 };
    const load = async (c: EngineClient) => {
      for (const k of [1, 2]) await c.loadAdapter(adapterName(k), join(dir, `a${k}`), String(k));
    };
    // engine-serve's semantics: a reply's weight_version is the adapter that served it
    const honest = await sglang({ loraVersion: 'adapter' });
    const ok = new SglangClient(honest.url);
    await load(ok);
    const gen = await ok.generate(ids, 8, { ...s, policy: loraPolicy(2) });
    assert.equal(gen.weightVersion, '2');
    const sent = (await honest.stats()).generated.at(-1);
    assert.equal(sent?.lora_path, 'rstar-lora-step-2', 'the request names its adapter');
    for (const fault of [{ dropLora: true }, { staleLora: true }]) {
      const bad = new SglangClient((await sglang({ loraVersion: 'adapter', ...fault })).url);
      await load(bad);
      await assert.rejects(bad.generate(ids, 8, { ...s, policy: loraPolicy(2) }), (e: Error) => {
        assert.ok(e instanceof PolicyMismatch, `${e}`);
        assert.match(
          e.message,
          /asked for rstar-lora-step-2 \(weight_version 2\) but the reply is from weight_version "[01]"/,
        );
        return true;
      });
    }
    // vLLM keeps no versions: the reply's model says what served it
    const v = await vllm();
    const client = new VllmClient(v.url);
    await load(client);
    assert.equal((await client.generate(ids, 8, { ...s, policy: loraPolicy(2) })).weightVersion, '2');
    assert.equal(v.asked.at(-1), 'rstar-lora-step-2');
    const based = new VllmClient((await vllm({ dropLora: true })).url);
    await load(based);
    await assert.rejects(based.generate(ids, 8, { ...s, policy: loraPolicy(2) }), PolicyMismatch);
  });

  test("rollout --steps --lora: every request names its step's adapter, an off-policy reply ends its trajectory as an engine error", async () => {
    const sandbox = await startSandbox();
    try {
      const protocol = await loadProtocol(TINY, { chatTemplate: `${ROOT}fixtures/curriculum/tiny.jinja` });
      const run = async (o: Partial<FakeOptions>, startStep: number, maxErrorShare?: number) => {
        const engine = await sglang({ loraVersion: 'adapter', ...o });
        const client = engineClient(engine.url, 'sglang');
        for (let k = 1; k < startStep; k++)
          await client.loadAdapter(adapterName(k), join(dir, `a${k}`), String(k));
        const items = await collect(
          rolloutSteps(
            problems(2),
            {
              engines: [client],
              sandbox: sandbox.url,
              protocol,
              n: 2,
              maxTokens: 64,
              maxTurns: 1,
              maxErrorShare,
            },
            { batch: 2, steps: startStep, startStep, lora: true },
          ),
        );
        const trajectories = items.filter((x): x is Trajectory => !('end_batch' in x));
        const end = items.find((x): x is EndBatch => 'end_batch' in x)!;
        return { trajectories, end, asked: (await engine.stats()).generated.map((g) => g.lora_path) };
      };
      // step 1 samples the base (B = 0): no adapter named, weight_version 0
      const first = await run({}, 1);
      assert.deepEqual(first.asked, [undefined, undefined, undefined, undefined]);
      assert.ok(first.trajectories.every((t) => t.finish === 'stop' && t.policy_version === '0'));
      const third = await run({}, 3);
      assert.deepEqual(third.asked, Array(4).fill('rstar-lora-step-2'));
      for (const t of third.trajectories) {
        assert.equal(t.finish, 'stop');
        assert.equal(t.policy_version, '2');
        assert.deepEqual(t.turn_versions, ['2']);
      }
      // vLLM: the base until /v1/models lists an adapter, then `model` names it
      const v = await vllm();
      const client = engineClient(v.url, 'vllm');
      const vllmSteps = (step: number) =>
        collect(
          rolloutSteps(
            problems(2),
            { engines: [client], sandbox: sandbox.url, protocol, n: 2, maxTokens: 64, maxTurns: 1 },
            { batch: 2, steps: step, startStep: step, lora: true },
          ),
        );
      await vllmSteps(1);
      await client.loadAdapter(adapterName(1), join(dir, 'a1'), '1');
      const second = (await vllmSteps(2)).filter((x): x is Trajectory => !('end_batch' in x));
      assert.deepEqual(v.asked, [...Array(4).fill('/models/base'), ...Array(4).fill('rstar-lora-step-1')]);
      assert.ok(second.every((t) => t.finish === 'stop' && t.policy_version === '1'));
      for (const fault of [{ staleLora: true }, { dropLora: true }]) {
        // by default a step that many off-policy replies fails the whole rollout, naming the cause
        await assert.rejects(
          run(fault, 3),
          /more than --max-error-share .* but the reply is from weight_version "[01]": refused/,
        );
        const bad = await run(fault, 3, 1);
        assert.equal(bad.trajectories.length, 4);
        for (const t of bad.trajectories) {
          assert.equal(t.finish, 'error', 'an off-policy reply was kept');
          assert.equal(t.error?.kind, 'engine');
          assert.match(t.error?.message ?? '', /asked for rstar-lora-step-2 .* refused, never trained on/);
        }
        assert.equal(bad.end.stats.mean_reward, 0);
      }
    } finally {
      await sandbox.close();
    }
  });

  test('recipes/rl.sh with RSTAR_RL_LORA_RANK: adapters trained, synced and asked for by name; recorded in the manifest; a rerun resumes from the adapter', async () => {
    const WRONG = 'Done.</reason>\n<answer>\\boxed{4}</answer>';
    const engine = await sglang({ cycle: [{ match: 'variant', replies: [ANSWER, WRONG] }] });
    writeFileSync(join(dir, 'problems.jsonl'), ndjson(problems(4)));
    const out = join(dir, 'recipe');
    const recipe = async (steps: number, stage: Record<string, string> = {}, expected = 0) => {
      const child = spawn('bash', ['recipes/rl.sh', out], {
        cwd: ROOT,
        env: cleanEnv({
          RSTAR_RL_MODEL: m0,
          RSTAR_RL_PROBLEMS: join(dir, 'problems.jsonl'),
          RSTAR_RL_TOKENIZER: TINY,
          RSTAR_RL_ENGINE: engine.url,
          RSTAR_RL_BATCH: '2',
          RSTAR_RL_KEEP: '4',
          RSTAR_RL_LR: '1e-2',
          RSTAR_RL_MAX_TOKENS: '64',
          RSTAR_RL_STEPS: String(steps),
          RSTAR_RL_LORA_RANK: '4',
          ...stage,
        }),
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      let log = '';
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        log += d;
      });
      const code = await new Promise<number>((resolve) => child.on('close', (c) => resolve(c ?? 1)));
      if (expected === 0) assert.equal(code, 0, log);
      else assert.notEqual(code, 0, log);
      return log;
    };
    await recipe(1);
    const manifest = readFileSync(join(out, 'manifest-stage-1.txt'), 'utf8').split('\n');
    for (const setting of ['RSTAR_RL_LORA_RANK=4', 'RSTAR_RL_LORA_ALPHA=4'])
      assert.ok(manifest.includes(setting), `${setting} in the manifest:\n${manifest.join('\n')}`);
    assert.ok(existsSync(join(out, 'step-1', 'adapter_model.safetensors')));
    assert.ok(!existsSync(join(out, 'step-1', 'model.safetensors')), 'a full checkpoint, not an adapter');
    const log = await recipe(2);
    assert.match(log, /resuming after step 1 \(.*step-1\)/);
    const stats = await engine.stats();
    // the stage's base went to the engine once per run (the recipe's --reload); every step after it
    // as an adapter, the resumed run reloading step 1's under its name first
    assert.deepEqual(stats.reloads, [m0, m0]);
    assert.deepEqual(
      stats.adapters.map((a) => `${a.op} ${a.name}`),
      [
        'load rstar-lora-step-1',
        'unload rstar-lora-step-1',
        'load rstar-lora-step-1',
        'load rstar-lora-step-2',
        'unload rstar-lora-step-1',
      ],
    );
    // step 1 sampled the base (B = 0: no adapter named), step 2 step 1's adapter
    const asked = new Set(stats.generated.map((g) => g.lora_path ?? 'base'));
    assert.deepEqual([...asked], ['base', 'rstar-lora-step-1']);
    const step2 = lines<{ policy_version: string }>(
      readFileSync(join(out, 'trajectories', 'step-2.jsonl'), 'utf8'),
    );
    assert.ok(step2.every((t) => t.policy_version === '1'));

    // A second stage goes on from the first one's last adapter: the base its adapter_config.json
    // names goes back to the engine, that adapter beside it, and training continues from it.
    const before = (await engine.stats()).adapters.length;
    const stage2 = { RSTAR_RL_FIRST: '3', RSTAR_RL_MODEL: join(out, 'step-2'), RSTAR_RL_MAX_TOKENS: '96' };
    await recipe(3, stage2);
    const after = await engine.stats();
    assert.deepEqual(after.reloads, [m0, m0, m0]);
    assert.deepEqual(
      after.adapters.slice(before).map((a) => `${a.op} ${a.name}`),
      [
        'unload rstar-lora-step-2',
        'load rstar-lora-step-2',
        'load rstar-lora-step-3',
        'unload rstar-lora-step-2',
      ],
    );
    const step3 = lines<{ policy_version: string }>(
      readFileSync(join(out, 'trajectories', 'step-3.jsonl'), 'utf8'),
    );
    assert.ok(step3.every((t) => t.policy_version === '2'));
    const config = JSON.parse(readFileSync(join(out, 'step-3', 'adapter_config.json'), 'utf8')) as {
      base_model_name_or_path: string;
      r: number;
    };
    assert.deepEqual([config.base_model_name_or_path, config.r], [m0, 4]);
    const state = JSON.parse(readFileSync(join(out, 'step-3', 'trainer_state.json'), 'utf8')) as {
      step: number;
    };
    assert.equal(state.step, 3, "the adapter's AdamW state went on from step 2's");
    assert.ok(
      readFileSync(join(out, 'manifest-stage-3.txt'), 'utf8').includes(
        `RSTAR_RL_MODEL=${join(out, 'step-2')}`,
      ),
    );

    // what a LoRA stage cannot start from, said before anything runs
    const full = await recipe(4, { RSTAR_RL_FIRST: '4', RSTAR_RL_STEPS: '4' }, 1);
    assert.match(full, /a LoRA stage at RSTAR_RL_FIRST=4 goes on from the previous stage's adapter folder/);
    const noLora = await recipe(
      4,
      { RSTAR_RL_FIRST: '4', RSTAR_RL_MODEL: join(out, 'step-3'), RSTAR_RL_LORA_RANK: '0' },
      1,
    );
    assert.match(noLora, /step-3 is a LoRA adapter folder: set RSTAR_RL_LORA_RANK/);
  });

  test('rollout --lora belongs to the RL loop', async () => {
    const r = await rstar([
      ...[
        'rollout',
        '--problems',
        'x.jsonl',
        '--tokenizer',
        'tok',
        '--engine',
        'http://127.0.0.1:1',
        '--lora',
      ],
    ]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--lora belong to the RL loop: give --steps S/);
  });
});
