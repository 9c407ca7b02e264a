import { createWriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { UsageError } from '../errors.js';
import { plotCurve } from '../eval/curve.js';
import type { Benchmark, ProblemsFormat } from '../eval/problems.js';
import { benchmarkName, checkDistinct, loadBenchmark, PROBLEMS_FORMATS } from '../eval/problems.js';
import { compareReportFiles } from '../eval/report.js';
import { openRoller, type Roller } from '../eval/rollout.js';
import { type BenchmarkResult, evaluateBenchmark, type Sourced, slug, writeReport } from '../eval/run.js';
import { loadVerifier, type Verifier } from '../eval/verifier.js';
import { NdjsonWriter, openInput, readRecords } from '../ndjson/index.js';
import { choice, collect, integer, interactive, parse, program } from '../program.js';
import { Trajectory } from '../records/trajectory.js';
// The flags alone: parsing them does not load the rollout package (tokenizers, engine clients).
import { EVAL_SAMPLES, type SharedRolloutFlags, sharedRolloutOptions } from '../rollout/options.js';

interface Options extends SharedRolloutFlags {
  problems?: string[];
  problemsFormat: ProblemsFormat;
  shuffleSeed: number;
  out?: string;
  limit?: number;
  fromTrajectories?: string[];
  reverify?: boolean;
  compare?: string[];
  curve?: string;
}

const log = (message: string) => {
  if (interactive()) process.stderr.write(`${message}\n`);
};

async function* fromFile(file: string): AsyncGenerator<Sourced> {
  const { stream, source } = openInput(file);
  for await (const { record, line } of readRecords(stream, source, Trajectory)) {
    yield { trajectory: record, where: `${source}:${line}` };
  }
}

/** Saves trajectories as they stream, so a crash mid-eval keeps what was generated. */
function saver(file: string) {
  const writer = new NdjsonWriter(createWriteStream(file));
  return { write: (t: Trajectory) => writer.write(t), end: () => writer.end() };
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('eval', 'benchmarks: avg@n, unbiased pass@k, maj@n, reports and plots')
    .option('--problems <file>', 'benchmark problems (repeatable; one benchmark per file)', collect)
    .addOption(
      choice(
        '--problems-format <format>',
        'problems (NDJSON Problem records) or gpqa (GPQA CSV)',
        PROBLEMS_FORMATS,
        'problems',
      ),
    )
    .option('--shuffle-seed <n>', 'seed of the GPQA option shuffle', integer(0), 0);
  // Rolling out, eval takes rollout's flags, with its defaults (but --n 16).
  for (const option of sharedRolloutOptions(EVAL_SAMPLES)) cmd.addOption(option);
  cmd
    .option('--out <dir>', 'write trajectories, report.json, report.md and plots here')
    .option('--limit <n>', 'only the first N problems of each benchmark', integer(1))
    .option(
      '--from-trajectories <file>',
      'evaluate saved trajectories instead of rolling out (repeatable)',
      collect,
    )
    .option('--reverify', 're-score trajectories (as rstar verify does) instead of trusting their reward')
    .option('--compare <reports...>', 'print B - A of two report.json files as a markdown table')
    .option(
      '--curve <file>',
      'plot an RL curve.jsonl (training reward, held-out avg@n per step) to curve.svg beside it',
    );
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<Options>();

  if (opts.curve !== undefined) {
    process.stdout.write(`${await plotCurve(opts.curve)}\n`);
    return;
  }
  if (opts.compare) {
    if (opts.compare.length !== 2) throw new UsageError('--compare takes two report.json files: A B');
    const [a, b] = opts.compare;
    process.stdout.write(await compareReportFiles(a, b));
    return;
  }

  const problemFiles = opts.problems ?? [];
  const trajectoryFiles = opts.fromTrajectories ?? [];
  if (problemFiles.length === 0 && trajectoryFiles.length === 0) {
    throw new UsageError('give --problems FILE (to roll out) or --from-trajectories FILE');
  }
  if (
    trajectoryFiles.length > 0 &&
    problemFiles.length > 0 &&
    problemFiles.length !== trajectoryFiles.length
  ) {
    throw new UsageError(
      '--problems pairs with --from-trajectories in order: give one per trajectories file',
    );
  }
  if (opts.reverify && trajectoryFiles.length > 0 && problemFiles.length === 0) {
    throw new UsageError(
      '--reverify needs the reference answers: give --problems FILE for each trajectories file',
    );
  }
  const verifier = await loadVerifier({ compat: opts.compat });

  const benchmarks: (Benchmark | undefined)[] = [];
  for (const file of problemFiles) {
    const bench = await loadBenchmark(file, opts.problemsFormat, opts.shuffleSeed);
    if (opts.limit !== undefined) bench.problems = bench.problems.slice(0, opts.limit);
    benchmarks.push(bench);
  }
  const rollingOut = trajectoryFiles.length === 0;
  if (rollingOut && opts.engine.length === 0) throw new UsageError('rolling out needs --engine URL');
  if (rollingOut && opts.tokenizer === undefined) throw new UsageError('rolling out needs --tokenizer DIR');
  if (!rollingOut && opts.limit !== undefined)
    throw new UsageError('--limit applies to rollouts, not --from-trajectories');
  const names = rollingOut
    ? benchmarks.map((b) => (b as Benchmark).name)
    : trajectoryFiles.map((f, i) => benchmarks[i]?.name ?? benchmarkName(f));
  checkDistinct(names);
  if (opts.out) await mkdir(opts.out, { recursive: true });

  const roller: Roller | undefined = rollingOut
    ? await openRoller({ ...opts, tokenizer: opts.tokenizer as string })
    : undefined;
  try {
    await evaluateAll(opts, names, benchmarks, trajectoryFiles, verifier, roller);
  } finally {
    await roller?.close();
  }
}

async function evaluateAll(
  opts: Options,
  names: string[],
  benchmarks: (Benchmark | undefined)[],
  trajectoryFiles: string[],
  verifier: Verifier,
  roller: Roller | undefined,
): Promise<void> {
  const stdout = new NdjsonWriter(process.stdout);
  const results: BenchmarkResult[] = [];
  for (let i = 0; i < names.length; i += 1) {
    const name = names[i];
    const bench = benchmarks[i];
    let source: AsyncIterable<Sourced>;
    if (roller) {
      const problems = (bench as Benchmark).problems;
      log(`eval ${name}: ${problems.length} problems x ${opts.n} samples`);
      source = roller.trajectories(name, problems);
    } else {
      log(`eval ${name}: ${trajectoryFiles[i]}`);
      source = fromFile(trajectoryFiles[i]);
    }
    // Trajectories are saved when they are new: rolled out here, or re-scored by --reverify.
    const save =
      opts.out && (roller || opts.reverify)
        ? saver(join(opts.out, `trajectories-${slug(name)}.jsonl`))
        : undefined;
    let result: BenchmarkResult;
    try {
      result = await evaluateBenchmark(name, source, {
        problems: bench?.problems,
        verifier,
        reverify: opts.reverify,
        rewardTruncated: opts.rewardTruncated === true,
        maxErrorShare: opts.maxErrorShare,
        onTrajectory: save?.write,
      });
    } finally {
      await save?.end();
    }
    const toolCache = roller?.toolCache(name);
    if (toolCache) result.summary.tool_cache = toolCache;
    for (const record of result.records) await stdout.write(record);
    await stdout.write(result.summary);
    results.push(result);
  }
  if (opts.out) {
    const files = await writeReport(opts.out, results);
    log(`eval: wrote ${files.join(', ')} to ${opts.out}`);
  }
  await stdout.end();
}
