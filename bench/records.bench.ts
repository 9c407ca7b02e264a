/**
 * NDJSON throughput on realistic 8K-token trajectories (`npm run bench`):
 *  (a) pass-through in process: read + validate against Trajectory + write, both re-serialising
 *      (`NdjsonWriter.write`) and raw (`writeRaw`, what roc-filter and advantage do);
 *  (b) `rstar roc-filter --group-size 32` and `rstar advantage --group-size 32` through the real CLI,
 *      on a 50 MB and a 200 MB input, with peak RSS (from /usr/bin/time) to show memory stays flat,
 *      and roc-filter without --group-size, whose memory grows with the input.
 * Prints MB/s of input per wall second and per CPU second (the machine may be shared).
 */
import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NdjsonWriter, readLines, readRecords } from '../src/ndjson/index.js';
import { Trajectory } from '../src/records/index.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BIN = join(ROOT, 'bin/rstar.js');
const GROUP = 32;
const PROMPT_TOKENS = 300;
const RESPONSE_TOKENS = 8192;

/** Deterministic xorshift, so every run benchmarks the same bytes. */
function random(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

const WORDS = [
  'the',
  'sum',
  'of',
  'x',
  '=',
  'we',
  'check',
  'compute',
  'so',
  'answer',
  'is',
  'let',
  '\\frac{1}{2}',
  'prime',
];

/** One trajectory line: 8K response tokens with two tool turns, float32-looking logprobs, ~4 chars per token of text. */
function trajectoryLine(r: () => number, problem: string, sample: number): string {
  const response: number[] = new Array(RESPONSE_TOKENS);
  const mask: number[] = new Array(RESPONSE_TOKENS);
  const logprobs: number[] = new Array(RESPONSE_TOKENS);
  for (let i = 0; i < RESPONSE_TOKENS; i++) {
    response[i] = Math.floor(r() * 151_000);
    const tool = (i > 3000 && i < 3400) || (i > 6000 && i < 6300);
    mask[i] = tool ? 0 : 1;
    logprobs[i] = tool ? 0 : Math.fround(Math.log(r() + 1e-9) / 8);
  }
  const prompt = Array.from({ length: PROMPT_TOKENS }, () => Math.floor(r() * 151_000));
  const words: string[] = [];
  for (let i = 0; i < RESPONSE_TOKENS * 0.8; i++) words.push(WORDS[Math.floor(r() * WORDS.length)]);
  const error = r() < 0.3 ? 'Tool call failure\nreason: NameError: x' : 'Tool call success\nstdout: 42';
  const text =
    `${words.slice(0, 2000).join(' ')}<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print(6*7)", "input": ""}}</tool_call><|im_end|>\n` +
    `<|im_start|>user\n<tool_response>\n${error}\nexecution time: 0.01s\n</tool_response><|im_end|>\n<|im_start|>assistant\n` +
    `${words.slice(2000).join(' ')}</reason><answer>\\boxed{42}</answer><|im_end|>`;
  const reward = r() < 0.5 ? 1 : 0;
  return JSON.stringify({
    v: 1,
    id: `${problem}/${sample}`,
    problem_id: problem,
    sample,
    policy: 'bench',
    prompt_ids: prompt,
    response_ids: response,
    loss_mask: mask,
    logprobs,
    text,
    turns: 2,
    tool_calls: 1,
    tool_errors: error.startsWith('Tool call failure') ? 1 : 0,
    answer_tags: 1,
    finish: 'stop',
    answer: reward ? '42' : '41',
    reward,
  });
}

/** Writes whole groups of 32 until the file reaches `bytes`; a handful of distinct lines are reused. */
async function generate(file: string, bytes: number): Promise<{ bytes: number; records: number }> {
  const r = random(42);
  const pool = Array.from({ length: 8 }, (_, i) => trajectoryLine(r, 'pool', i));
  const out = createWriteStream(file);
  let written = 0;
  let records = 0;
  for (let g = 0; written < bytes; g++) {
    for (let s = 0; s < GROUP; s++) {
      // Same bytes per record as a pool line, but a unique id/problem/sample and a varied reward.
      const base = pool[(g + s) % pool.length];
      const line = base
        .replace('"id":"pool/', `"id":"p${g}/`)
        .replace(/"id":"p\d+\/\d+"/, `"id":"p${g}/${s}"`)
        .replace('"problem_id":"pool"', `"problem_id":"p${g}"`)
        .replace(/"sample":\d+/, `"sample":${s}`)
        .replace(/"reward":\d/, `"reward":${(g * 7 + s * 3) % 5 < 2 ? 1 : 0}`);
      if (!out.write(`${line}\n`)) await new Promise<void>((resolve) => out.once('drain', () => resolve()));
      written += line.length + 1;
      records += 1;
    }
  }
  await new Promise<void>((resolve) => out.end(() => resolve()));
  return { bytes: statSync(file).size, records };
}

const mb = (bytes: number) => bytes / 1e6;

async function passThrough(file: string, raw: boolean): Promise<{ seconds: number; cpu: number }> {
  const sink = createWriteStream('/dev/null');
  const writer = new NdjsonWriter(sink);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  if (raw) {
    for await (const entry of readLines(createReadStream(file), file)) {
      Trajectory.parse(JSON.parse(entry.text));
      await writer.writeRaw(entry.text);
    }
  } else {
    for await (const { record } of readRecords(createReadStream(file), file, Trajectory))
      await writer.write(record);
  }
  await writer.end();
  const seconds = (performance.now() - t0) / 1000;
  const used = process.cpuUsage(cpu0);
  return { seconds, cpu: (used.user + used.system) / 1e6 };
}

interface CliRun {
  seconds: number;
  cpu: number;
  maxRssMb: number | null;
}

/** Runs `rstar ARGS FILE > /dev/null` under /usr/bin/time (when present) for peak RSS. */
function cli(args: string[], file: string): Promise<CliRun> {
  const time = existsSync('/usr/bin/time');
  const command = time ? '/usr/bin/time' : process.execPath;
  const argv = time
    ? ['-f', 'RSTAR_TIME %e %U %S %M', process.execPath, BIN, ...args, file]
    : [BIN, ...args, file];
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(command, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d) => {
      stderr += d;
    });
    child.on('error', reject);
    child.on('close', (code) => {
      const wall = (performance.now() - t0) / 1000;
      if (code !== 0) return reject(new Error(`rstar ${args.join(' ')} exited ${code}: ${stderr}`));
      const m = /RSTAR_TIME ([\d.]+) ([\d.]+) ([\d.]+) (\d+)/.exec(stderr);
      if (!m) return resolve({ seconds: wall, cpu: Number.NaN, maxRssMb: null });
      resolve({ seconds: Number(m[1]), cpu: Number(m[2]) + Number(m[3]), maxRssMb: Number(m[4]) / 1024 });
    });
  });
}

function row(name: string, bytes: number, run: { seconds: number; cpu: number; maxRssMb?: number | null }) {
  const rss = run.maxRssMb == null ? '' : `  peak RSS ${run.maxRssMb.toFixed(0)} MB`;
  const perCpu = Number.isFinite(run.cpu) ? `  ${(mb(bytes) / run.cpu).toFixed(0)} MB/CPU-s` : '';
  console.log(
    `${name.padEnd(46)} ${mb(bytes).toFixed(0).padStart(4)} MB  ${run.seconds.toFixed(2).padStart(6)} s  ${(mb(bytes) / run.seconds).toFixed(0).padStart(4)} MB/s${perCpu}${rss}`,
  );
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rstar-bench-'));
  try {
    const small = join(dir, 'small.jsonl');
    const large = join(dir, 'large.jsonl');
    const sizes = [
      Number(process.env.RSTAR_BENCH_SMALL_MB ?? 50),
      Number(process.env.RSTAR_BENCH_LARGE_MB ?? 200),
    ];
    const a = await generate(small, sizes[0] * 1e6);
    const b = await generate(large, sizes[1] * 1e6);
    console.log(
      `8K-token trajectories: ${(a.bytes / a.records / 1e3).toFixed(0)} KB per record, ${a.records} and ${b.records} records, groups of ${GROUP}`,
    );
    row('pass-through, re-serialised (write)', a.bytes, await passThrough(small, false));
    row('pass-through, raw (writeRaw)', a.bytes, await passThrough(small, true));
    for (const [file, bytes] of [
      [small, a.bytes],
      [large, b.bytes],
    ] as const) {
      row(
        'rstar roc-filter --keep 16 --group-size 32',
        bytes,
        await cli(['roc-filter', '--group-size', '32', '--stats', '/dev/null'], file),
      );
    }
    for (const [file, bytes] of [
      [small, a.bytes],
      [large, b.bytes],
    ] as const) {
      row('rstar advantage --group-size 32', bytes, await cli(['advantage', '--group-size', '32'], file));
    }
    // Without --group-size every group waits for the end of input: memory grows with the input.
    for (const [file, bytes] of [
      [small, a.bytes],
      [large, b.bytes],
    ] as const) {
      row(
        'rstar roc-filter --keep 16 (no --group-size)',
        bytes,
        await cli(['roc-filter', '--stats', '/dev/null'], file),
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// `node dist/bench/records.bench.js --generate FILE MB` only writes the input, for profiling.
if (process.argv[2] === '--generate') {
  const { bytes, records } = await generate(process.argv[3], Number(process.argv[4] ?? 50) * 1e6);
  console.log(`${process.argv[3]}: ${records} records, ${mb(bytes).toFixed(0)} MB`);
} else {
  await main();
}
