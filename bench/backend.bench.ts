/**
 * PyTorch backend on this machine with the tiny config (fixtures/tiny/config.json):
 * - train-step tokens/s (SFT and GRPO, resident --follow process),
 * - the TypeScript bridge's overhead: `rstar train-step --follow` vs the Python step run directly
 *   on the same batches (end to end, process start included),
 * - engine-serve generated tokens/s with 1 and with 64 concurrent requests (continuous batching),
 * - engine-serve on agentic turns (16 prompts x 4 samples, 3 turns, a 24-token tool answer between
 *   turns), with its prefix cache and with --disable-radix-cache: wall, CPU, prompt tokens prefilled,
 * - memory (peak RSS) of engine-serve with its KV budget full, and the KV pool's own size.
 * Usage: npm run bench:backend [-- --quick] [-- --json FILE]
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { engineArgs } from '../src/backend/engine.js';
import { BACKEND_SCRIPT, backendEnv, findPython } from '../src/backend/python.js';
import { backendTrainArgv, trainOptions } from '../src/backend/train-options.js';
import { startServer } from '../src/process/serve.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BIN = join(ROOT, 'bin', 'rstar.js');
const quick = process.argv.includes('--quick');
const jsonAt = process.argv.indexOf('--json');
const jsonFile = jsonAt > 0 ? process.argv[jsonAt + 1] : undefined;

const STEPS = quick ? 3 : 6;
const SEQS = 8;
const PROMPT = 64;
const RESPONSE = 192;
const NEW_TOKENS = quick ? 32 : 128;
const ENGINE_PROMPT = 32;

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function batchesFile(dir: string, vocab: number): string {
  const r = rng(1);
  const id = () => 3 + Math.floor(r() * (vocab - 3));
  const lines: string[] = [];
  for (let b = 0; b < STEPS; b++) {
    for (let i = 0; i < SEQS; i++) {
      const response_ids = Array.from({ length: RESPONSE }, id);
      lines.push(
        JSON.stringify({
          prompt_ids: Array.from({ length: PROMPT }, id),
          response_ids,
          loss_mask: response_ids.map((_, j) => (j % 10 < 8 ? 1 : 0)),
          logprobs: response_ids.map(() => -8),
          advantage: i % 2 ? 1 : -1,
        }),
      );
    }
    lines.push('{"end_batch":true}');
  }
  const path = join(dir, 'batches.jsonl');
  writeFileSync(path, `${lines.join('\n')}\n`);
  return path;
}

interface StepOut {
  seconds: number;
  cpu_seconds: number;
  tokens: number;
}

interface Run {
  wall: number;
  /** user + sys CPU seconds of the command and all its children (node, python), from bash `times` */
  cpu: number;
  steps: StepOut[];
}

/** Runs a command under bash so `times` reports the CPU its process tree used; on a shared machine
 * the wall clock measures the neighbours' load as much as ours, the CPU time does not. */
async function measured(cmd: string[], env: NodeJS.ProcessEnv = {}, inputFile?: string): Promise<Run> {
  const t0 = performance.now();
  const r = await execa('bash', ['-c', '"$@" && times >&2', 'bash', ...cmd], {
    env: { ...backendEnv(), ...env },
    ...(inputFile ? { inputFile } : {}),
  });
  const wall = (performance.now() - t0) / 1000;
  const times = String(r.stderr).trim().split('\n').slice(-1)[0];
  const secs = [...times.matchAll(/(\d+)m([\d.]+)s/g)].map((m) => Number(m[1]) * 60 + Number(m[2]));
  const steps = String(r.stdout)
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as StepOut);
  return { wall, cpu: secs[0] + secs[1], steps };
}

async function trainBench(python: string, model: string, dir: string, loss: string, data: string) {
  const common = ['--loss', loss, '--model', model, '--out', join(dir, `out-${loss}`), '--lr', '1e-5'];
  // the same settings as the Python backend receives them from the bridge
  const backend = backendTrainArgv(
    trainOptions({ loss: loss as 'sft' | 'grpo', model, out: join(dir, `out-${loss}`), lr: 1e-5 }),
  );
  const direct: Run[] = [];
  const bridge: Run[] = [];
  // alternate the two (3 times) and keep each one's best: the machine's load drifts
  for (let i = 0; i < (quick ? 1 : 3); i++) {
    direct.push(await measured([python, BACKEND_SCRIPT, ...backend], {}, data));
    bridge.push(await measured([process.execPath, BIN, 'train-step', '--follow', ...common, data]));
  }
  // The bridge's own cost, free of the trainer's run-to-run noise: the same command with a stand-in
  // "python" (awk) that answers each batch with a Step line at once; CPU of node + awk.
  const stub = join(dir, 'stub-python');
  // a whole Step record: the bridge checks what the backend answers
  const step =
    '{\\"v\\":1,\\"step\\":1,\\"policy\\":\\"stub\\",\\"checkpoint\\":\\"stub\\",\\"loss\\":0,\\"pg_clipfrac\\":0,\\"approx_kl\\":0,\\"entropy\\":0,\\"grad_norm\\":0,\\"lr\\":0,\\"sequences\\":0,\\"tokens\\":0,\\"seconds\\":0,\\"cpu_seconds\\":0}';
  writeFileSync(
    stub,
    [
      '#!/bin/sh',
      '[ "$1" = "-c" ] && exit 0',
      `exec awk '/end_batch/ { if (n) print "${step}"; n = 0; next } NF { n++ } END { if (n) print "${step}" }'`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  const bridgeOnly = await measured([process.execPath, BIN, 'train-step', '--follow', ...common, data], {
    RSTAR_PYTHON: stub,
  });
  // ten times the batches: what the bridge costs per batch once started
  const data10 = join(dir, 'batches-x10.jsonl');
  writeFileSync(data10, readFileSync(data, 'utf8').repeat(10));
  const bridgeOnly10 = await measured([process.execPath, BIN, 'train-step', '--follow', ...common, data10], {
    RSTAR_PYTHON: stub,
  });
  const perBatch = Math.max(0, (bridgeOnly10.cpu - bridgeOnly.cpu) / (9 * STEPS));
  const best = (runs: Run[], key: 'wall' | 'cpu') => Math.min(...runs.map((r) => r[key]));
  const steps = direct[0].steps.slice(1); // the first step pays for warm-up allocations
  const tokens = direct[0].steps[0].tokens;
  const stepSeconds = Math.min(...direct.flatMap((r) => r.steps.slice(1).map((s) => s.seconds)));
  const stepCpu = steps.reduce((a, s) => a + s.cpu_seconds, 0) / steps.length;
  return {
    loss,
    steps: direct[0].steps.length,
    tokens_per_step: tokens,
    step_seconds: stepSeconds,
    tokens_per_s: tokens / stepSeconds,
    step_cpu_seconds: stepCpu,
    tokens_per_cpu_s: tokens / stepCpu,
    direct_wall_s: best(direct, 'wall'),
    bridge_wall_s: best(bridge, 'wall'),
    bridge_overhead_wall: (best(bridge, 'wall') - best(direct, 'wall')) / best(direct, 'wall'),
    direct_cpu_s: best(direct, 'cpu'),
    bridge_cpu_s: best(bridge, 'cpu'),
    bridge_overhead_cpu: (best(bridge, 'cpu') - best(direct, 'cpu')) / best(direct, 'cpu'),
    bridge_only_cpu_s: bridgeOnly.cpu,
    bridge_only_wall_s: bridgeOnly.wall,
    bridge_cost_share: bridgeOnly.cpu / best(direct, 'cpu'),
    bridge_cpu_per_batch_s: perBatch,
    bridge_per_step_share: perBatch / stepCpu,
  };
}

async function generate(url: string, prompt: number[], maxNew: number): Promise<number> {
  const res = await fetch(`${url}/generate`, {
    method: 'POST',
    body: JSON.stringify({
      input_ids: prompt,
      sampling_params: { max_new_tokens: maxNew, temperature: 1, ignore_eos: true },
      return_logprob: true,
    }),
  });
  const json = (await res.json()) as { output_ids: number[] };
  return json.output_ids.length;
}

/** user + sys CPU seconds of a process so far (/proc/PID/stat, clock ticks of 1/100 s). */
async function turn(url: string, ids: number[], maxNew: number, seed: number): Promise<number[]> {
  const res = await fetch(`${url}/generate`, {
    method: 'POST',
    body: JSON.stringify({
      input_ids: ids,
      sampling_params: { max_new_tokens: maxNew, temperature: 1, ignore_eos: true, sampling_seed: seed },
      return_logprob: true,
    }),
  });
  return ((await res.json()) as { output_ids: number[] }).output_ids;
}

/** Rollout's traffic: every later turn re-sends the whole context; the samples of a prompt share it. */
async function turnsBench(python: string, model: string, cache: boolean) {
  const server = await startServer({
    name: 'engine-serve',
    command: python,
    args: engineArgs({ model, port: 0, maxTotalTokens: 65536, disableRadixCache: !cache }),
    env: backendEnv(),
  });
  const { url } = server;
  const pid = server.pid as number;
  try {
    const r = rng(7);
    const id = () => 3 + Math.floor(r() * 4000);
    const prompts = Array.from({ length: 16 }, () => Array.from({ length: 3 * ENGINE_PROMPT }, id));
    const tool = Array.from({ length: 64 }, () => Array.from({ length: 24 }, id));
    await turn(url, prompts[0].slice(0, 4), 4, 0); // warm-up
    const t0 = performance.now();
    const cpu0 = cpuOf(pid);
    let generated = 0;
    await Promise.all(
      Array.from({ length: 64 }, async (_, c) => {
        let context = [...prompts[c % 16]];
        for (let k = 0; k < 3; k++) {
          const out = await turn(url, context, NEW_TOKENS / 2, c * 10 + k);
          generated += out.length;
          context = [...context, ...out, ...tool[c]];
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const cpu = cpuOf(pid) - cpu0;
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const metric = (name: string) => Number(new RegExp(`${name}\\{[^}]*\\} (\\S+)`).exec(metrics)?.[1]);
    const prompt = metric('sglang:prompt_tokens_total');
    const cached = metric('sglang:cached_tokens_total');
    return {
      prefix_cache: cache,
      conversations: 64,
      turns: 3,
      generated_tokens: generated,
      seconds,
      cpu_seconds: cpu,
      prompt_tokens: prompt,
      prefilled_tokens: prompt - cached,
      cache_hit_rate: prompt > 0 ? cached / prompt : 0,
    };
  } finally {
    await server.stop();
  }
}

function cpuOf(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

function rssOf(pid: number): { rss_mb: number; peak_rss_mb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)?.[1] ?? 0);
  return { rss_mb: kb('VmRSS') / 1024, peak_rss_mb: kb('VmHWM') / 1024 };
}

async function engineBench(
  python: string,
  model: string,
  concurrency: number,
  budget: number,
  decodeKv: 'rows' | 'pool' = 'rows',
) {
  const server = await startServer({
    name: 'engine-serve',
    command: python,
    args: engineArgs({ model, port: 0, maxTotalTokens: budget, decodeKv }),
    env: backendEnv(),
  });
  const { url } = server;
  const pid = server.pid as number;
  try {
    const r = rng(concurrency);
    const prompt = () => Array.from({ length: ENGINE_PROMPT }, () => 3 + Math.floor(r() * 4000));
    await generate(url, prompt(), 4); // warm-up
    const rounds = concurrency === 1 ? (quick ? 2 : 4) : 1;
    const t0 = performance.now();
    const cpu0 = cpuOf(pid);
    let tokens = 0;
    for (let k = 0; k < rounds; k++) {
      const counts = await Promise.all(
        Array.from({ length: concurrency }, () => generate(url, prompt(), NEW_TOKENS)),
      );
      tokens += counts.reduce((a, b) => a + b, 0);
    }
    const seconds = (performance.now() - t0) / 1000;
    const cpu = cpuOf(pid) - cpu0;
    const info = (await (await fetch(`${url}/get_server_info`)).json()) as { kv_cache_bytes: number };
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const maxUsed = Number(/rstar:max_used_tokens\{[^}]*\} (\S+)/.exec(metrics)?.[1]);
    return {
      concurrency,
      decode_kv: decodeKv,
      kv_budget_tokens: budget,
      max_used_tokens: maxUsed,
      generated_tokens: tokens,
      seconds,
      tokens_per_s: tokens / seconds,
      cpu_seconds: cpu,
      tokens_per_cpu_s: tokens / cpu,
      kv_cache_mb: info.kv_cache_bytes / 2 ** 20,
      ...rssOf(pid),
    };
  } finally {
    await server.stop();
  }
}

async function main(): Promise<void> {
  const python = await findPython();
  const dir = mkdtempSync(join(tmpdir(), 'rstar-bench-backend-'));
  try {
    const model = join(dir, 'tiny');
    const config = join(ROOT, 'fixtures', 'tiny', 'config.json');
    const init = await execa(process.execPath, [BIN, 'model-init', '--config', config, '--out', model]);
    const { parameters } = JSON.parse(String(init.stdout)) as { parameters: number };
    const sizes = JSON.parse(readFileSync(join(model, 'config.json'), 'utf8')) as Record<string, number>;
    const vocab = (JSON.parse(readFileSync(config, 'utf8')) as { vocab_size: number }).vocab_size;
    const data = batchesFile(dir, vocab);
    const torchInfo = await execa(python, [
      '-c',
      'import torch; print(torch.__version__, torch.get_num_threads())',
    ]);
    console.error(
      `torch ${torchInfo.stdout.trim()} (version, threads); ${config}: ${(parameters / 1e6).toFixed(2)} M parameters, ` +
        `hidden ${sizes.hidden_size}, ${sizes.num_hidden_layers} layers, ${sizes.num_attention_heads}/${sizes.num_key_value_heads} heads, ` +
        `vocab ${sizes.vocab_size}`,
    );
    const train = [];
    for (const loss of ['sft', 'grpo']) {
      const r = await trainBench(python, model, dir, loss, data);
      train.push(r);
      console.error(
        `train-step ${loss}: ${r.tokens_per_s.toFixed(0)} tokens/s wall (best step ${r.step_seconds.toFixed(3)} s), ` +
          `${r.tokens_per_cpu_s.toFixed(0)} tokens per CPU-second; ${r.tokens_per_step} tokens/step; ` +
          `${r.steps} steps end to end: direct ${r.direct_wall_s.toFixed(2)} s wall / ${r.direct_cpu_s.toFixed(2)} s CPU, ` +
          `rstar train-step --follow ${r.bridge_wall_s.toFixed(2)} s / ${r.bridge_cpu_s.toFixed(2)} s; ` +
          `bridge overhead ${(100 * r.bridge_overhead_wall).toFixed(1)}% wall, ${(100 * r.bridge_overhead_cpu).toFixed(1)}% CPU; ` +
          `the bridge alone (stand-in backend) ${r.bridge_only_cpu_s.toFixed(2)} s CPU = ` +
          `${(100 * r.bridge_cost_share).toFixed(1)}% of the direct run; per further batch ` +
          `${(1000 * r.bridge_cpu_per_batch_s).toFixed(1)} ms CPU = ${(100 * r.bridge_per_step_share).toFixed(2)}% of a step`,
      );
    }
    const engine = [];
    // the 64-request run gets exactly the KV its requests reserve, so the budget is full
    for (const [c, budget] of [
      [1, 65536],
      [64, 64 * (ENGINE_PROMPT + NEW_TOKENS)],
    ]) {
      const r = await engineBench(python, model, c, budget);
      engine.push(r);
      console.error(
        `engine-serve ${c} concurrent: ${r.tokens_per_s.toFixed(0)} generated tokens/s, ` +
          `${r.tokens_per_cpu_s.toFixed(0)} per CPU-second ` +
          `(${r.generated_tokens} tokens in ${r.seconds.toFixed(2)} s); KV budget ${budget} tokens ` +
          `(${r.kv_cache_mb.toFixed(1)} MiB), max used ${r.max_used_tokens}; peak RSS ${r.peak_rss_mb.toFixed(0)} MiB`,
      );
    }
    // decode over the pool's slots (gathered every step) instead of dense rows, same requests
    const pool = await engineBench(python, model, 64, 64 * (ENGINE_PROMPT + NEW_TOKENS), 'pool');
    console.error(
      `engine-serve 64 concurrent, --decode-kv pool: ${pool.tokens_per_s.toFixed(0)} generated tokens/s, ` +
        `${pool.tokens_per_cpu_s.toFixed(0)} per CPU-second (rows: ${engine[1].tokens_per_s.toFixed(0)}, ` +
        `${engine[1].tokens_per_cpu_s.toFixed(0)}): rows ${(engine[1].tokens_per_s / pool.tokens_per_s).toFixed(2)}x`,
    );
    const turns = [];
    for (const cache of [true, false]) {
      const r = await turnsBench(python, model, cache);
      turns.push(r);
      console.error(
        `engine-serve agentic turns, prefix cache ${cache ? 'on' : 'off'}: ${r.seconds.toFixed(2)} s wall, ` +
          `${r.cpu_seconds.toFixed(2)} s CPU, ${r.generated_tokens} tokens generated; ${r.prefilled_tokens} of ` +
          `${r.prompt_tokens} prompt tokens prefilled (hit rate ${(100 * r.cache_hit_rate).toFixed(1)}%)`,
      );
    }
    const speedup = engine[1].tokens_per_s / engine[0].tokens_per_s;
    const cpuSpeedup = engine[1].tokens_per_cpu_s / engine[0].tokens_per_cpu_s;
    console.error(
      `continuous batching: ${speedup.toFixed(1)}x the single-request throughput (wall), ${cpuSpeedup.toFixed(1)}x per CPU-second`,
    );
    const result = {
      parameters,
      config: sizes,
      train,
      engine,
      decode_kv_pool: pool,
      turns,
      prefix_cache_speedup: turns[1].seconds / turns[0].seconds,
      batching_speedup: speedup,
      batching_speedup_cpu: cpuSpeedup,
      quick,
    };
    if (jsonFile) writeFileSync(jsonFile, `${JSON.stringify(result, null, 2)}\n`);
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
