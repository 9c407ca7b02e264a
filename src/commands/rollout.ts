import { appendFile, mkdir, rename, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { startEngine } from '../backend/engine.js';
import { UsageError } from '../errors.js';
import { NdjsonWriter, openInput, openOutput, readAll, readRecords } from '../ndjson/index.js';
import { addDeprecatedAlias, choice, integer, interactive, number, parse, program } from '../program.js';
import { Problem } from '../records/problem.js';
import { Trajectory } from '../records/trajectory.js';
import { branchBudget, defaultBranchBudget } from '../rollout/branch.js';
import { serveCheckpoint } from '../rollout/engines.js';
import {
  type EngineClient,
  engineClient,
  loadProtocol,
  type RolloutOptions,
  rollout,
} from '../rollout/index.js';
import {
  progressOnStderr,
  ROLLOUT_DEFAULTS,
  type RunnerFlags,
  runnerOptions,
  type SharedRolloutFlags,
  sharedRolloutOptions,
  sharedSettings,
} from '../rollout/options.js';
import { dropStepsFrom, finishedIds } from '../rollout/resume.js';
import { lengthsByProblem } from '../rollout/scheduler-prior.js';
import { rolloutSteps } from '../rollout/steps.js';
import { startSandbox } from '../sandbox/embedded.js';

interface Flags extends SharedRolloutFlags, RunnerFlags {
  problems?: string;
  out?: string;
  reload?: string;
  weightVersion?: string;
  model?: string;
  maxTotalTokens?: number;
  prior?: string;
  steps?: number;
  batch?: number;
  startStep: number;
  maxStaleness: number;
  dynamicSampling: number;
  oversample?: boolean;
  refill: 'rounds' | 'streaming';
  save?: string;
  stepStats?: string;
  lora?: boolean;
}

/** Mean response length per problem of an earlier rollout, streamed: only the lengths are kept. */
async function priorLengths(file: string): Promise<Map<string, number>> {
  const { stream, source } = openInput(file);
  const seen: { problem_id: string; response_ids: { length: number } }[] = [];
  for await (const { record } of readRecords(stream, source, Trajectory))
    seen.push({ problem_id: record.problem_id, response_ids: { length: record.response_ids.length } });
  return lengthsByProblem(seen);
}

/**
 * The RL loop's rollout side: `--steps` batches to stdout, each closed by an end_batch line; with
 * `--save`, each step's trajectories also go to their own file, renamed into place when the step
 * ends, so a crash never leaves a half-written step that a resume would take for a finished one.
 */
async function runSteps(problems: Problem[], options: RolloutOptions, f: Flags): Promise<void> {
  const out = new NdjsonWriter();
  const stop = new AbortController();
  let saving: { file: string; tmp: string; lines: string[] } | undefined;
  // The steps about to run again append their lines anew: one line per step.
  if (f.stepStats !== undefined) dropStepsFrom(f.stepStats, f.startStep);
  try {
    for await (const item of rolloutSteps(problems, options, {
      batch: f.batch!,
      steps: f.steps!,
      startStep: f.startStep,
      maxStaleness: f.maxStaleness,
      dynamicSampling: f.dynamicSampling,
      oversample: f.oversample,
      refill: f.refill,
      seed: f.seed,
      signal: stop.signal,
      lora: f.lora,
      ...(f.branch > 0
        ? { branch: { k: f.branch, budget: f.branchBudget ?? defaultBranchBudget(f.n, f.batch!) } }
        : {}),
    })) {
      if ('end_batch' in item) {
        if (options.onProgress) process.stderr.write('\n');
        if (saving) {
          await writeFile(saving.tmp, saving.lines.join(''));
          await rename(saving.tmp, saving.file);
          saving = undefined;
        }
        if (f.stepStats !== undefined) await appendFile(f.stepStats, `${JSON.stringify(item)}\n`);
      } else if (f.save !== undefined) {
        if (!saving) {
          const file = f.save.replaceAll('{step}', String(item.step));
          await mkdir(dirname(file), { recursive: true });
          saving = { file, tmp: `${file}.partial`, lines: [] };
        }
        saving.lines.push(`${JSON.stringify(item)}\n`);
      }
      await out.write(item);
      if (out.closed) break; // downstream has gone: nothing more to do
    }
  } finally {
    stop.abort();
    await out.end();
  }
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'rollout',
    'multi-turn agent rollouts over SGLang/vLLM/engine-serve with the KV-cache-aware scheduler',
  ).option('--problems <file>', 'problems (NDJSON); stdin when - ');
  for (const option of [...sharedRolloutOptions(ROLLOUT_DEFAULTS.n), ...runnerOptions()])
    cmd.addOption(option);
  cmd
    .option(
      '--prior <file>',
      'earlier trajectories (NDJSON, e.g. the last epoch): kv starts the problems they show longest first',
    )
    .option('--out <file>', 'output NDJSON (resumable); stdout when absent')
    .option('--reload <checkpoint>', 'make every engine load CHECKPOINT first and wait for it')
    .option('--weight-version <label>', '--reload: label the loaded weights (the RL step they come from)')
    .option('--model <dir>', 'checkpoint for the embedded engine when no --engine is given')
    .option(
      '--max-total-tokens <n>',
      "the embedded engine's KV cache budget in tokens (engine-serve's flag)",
      integer(1),
    )
    .option(
      '--steps <s>',
      'RL loop: S steps of --batch problems each, each closed by an end_batch line',
      integer(1),
    )
    .option(
      '--batch <b>',
      'RL loop: problems per step (the target of mixed groups under --dynamic-sampling)',
      integer(1),
    )
    .option(
      '--start-step <k>',
      'RL loop: the first step (a resumed run: the last finished step + 1)',
      integer(1),
      1,
    )
    .option(
      '--max-staleness <n>',
      'RL loop: step k starts once every engine serves weight_version k-1-N or later (0: on-policy)',
      integer(0),
      0,
    )
    .option(
      '--dynamic-sampling <x>',
      'RL loop: sample more problems, up to X times --batch, until --batch groups have mixed rewards (1: off)',
      number(1),
      1,
    )
    .option(
      '--oversample',
      "RL loop, --dynamic-sampling: a step's first round samples --batch / r problems, r the last step's mixed share",
    )
    .addOption(
      choice(
        '--refill <when>',
        'RL loop, --dynamic-sampling: start refill problems once the round has finished (rounds), or as soon as the finished groups show a shortfall, beside the trajectories still running (streaming)',
        ['rounds', 'streaming'] as const,
        'rounds',
      ),
    )
    .option(
      '--save <pattern>',
      "RL loop: also write each step's trajectories to this file ({step}), whole or not at all",
    )
    .option('--step-stats <file>', "RL loop: append each step's statistics (the end_batch line) to FILE")
    .option(
      '--lora',
      "RL loop with LoRA: the engines serve adapters rstar-lora-step-N (train-step --sync); every request names the step's adapter (the base for 0) and a reply from another policy is refused",
    );
  addDeprecatedAlias(cmd, '--kv-tokens <n>', '--max-total-tokens');
  if (!parse(cmd, argv)) return;
  const f = cmd.opts<Flags>();
  if (f.problems === undefined && f.reload === undefined) throw new UsageError('--problems FILE is required');
  if (f.problems !== undefined && f.tokenizer === undefined)
    throw new UsageError('--tokenizer DIR is required');
  if (f.steps !== undefined) {
    if (f.batch === undefined) throw new UsageError('--steps needs --batch B (problems per step)');
    if (f.out !== undefined || f.reload !== undefined || f.prior !== undefined) {
      throw new UsageError('--steps writes to stdout (and --save): --out, --reload and --prior do not apply');
    }
    if (f.startStep > f.steps) throw new UsageError(`--start-step ${f.startStep} is past --steps ${f.steps}`);
    if (f.oversample && f.dynamicSampling <= 1) {
      throw new UsageError('--oversample samples ahead of dynamic sampling: give --dynamic-sampling X > 1');
    }
  } else if (
    f.batch !== undefined ||
    f.save !== undefined ||
    f.stepStats !== undefined ||
    f.oversample ||
    f.lora
  ) {
    throw new UsageError(
      '--batch, --oversample, --save, --step-stats and --lora belong to the RL loop: give --steps S',
    );
  }
  if (f.engine.length === 0 && f.model === undefined) {
    throw new UsageError('give --engine URL (repeatable), or --model DIR to start an embedded engine-serve');
  }

  const closers: (() => Promise<void>)[] = [];
  try {
    let urls = f.engine;
    if (urls.length === 0) {
      const engine = await startEngine({ model: f.model!, maxTotalTokens: f.maxTotalTokens });
      closers.push(() => engine.close());
      urls = [engine.url];
    }
    const engines: EngineClient[] = urls.map((u) =>
      engineClient(u, f.engineKind, { timeoutMs: f.engineTimeout * 1000 }),
    );
    if (f.reload !== undefined) {
      // an adapter folder (LoRA) is loaded beside the base as rstar-lora-step-N, N the weight version
      await Promise.all(engines.map((e) => serveCheckpoint(e, f.reload!, f.weightVersion, true)));
      if (interactive()) process.stderr.write(`${engines.length} engine(s) now serve ${f.reload}\n`);
      if (f.problems === undefined) return;
    }

    const problems = (await readAll(f.problems, Problem)).map((x) => x.record);
    const seen = new Set<string>();
    for (const p of problems) {
      if (seen.has(p.id)) throw new UsageError(`${f.problems}: duplicate problem id ${p.id}`);
      seen.add(p.id);
    }
    const protocol = await loadProtocol(f.tokenizer!, {
      chatTemplate: f.chatTemplate,
      toolsFile: f.tools,
      toolState: f.toolState,
    });
    let sandboxUrl = f.sandbox;
    if (sandboxUrl === undefined) {
      const sb = await startSandbox();
      closers.push(() => sb.close());
      sandboxUrl = sb.url;
    }
    const options: RolloutOptions = {
      ...sharedSettings(f),
      engines,
      sandbox: sandboxUrl,
      protocol,
      maxParallelCalls: f.maxParallelCalls,
      toolResponseMaxChars: f.toolResponseMaxChars,
      concurrency: f.concurrency,
      scrapeMs: f.scrapeMs,
      onProgress: progressOnStderr(),
    };
    if (f.branchBudget !== undefined && f.branch === 0)
      throw new UsageError('--branch-budget needs --branch K');
    if (f.steps !== undefined) {
      await runSteps(problems, options, f);
      return;
    }
    const lengths = f.prior !== undefined ? await priorLengths(f.prior) : undefined;
    const skip = f.out !== undefined ? finishedIds(f.out) : undefined;
    const out = openOutput(f.out, { append: true });
    const tty = interactive();
    try {
      const branch =
        f.branch > 0
          ? { k: f.branch, budget: branchBudget(f.branchBudget ?? defaultBranchBudget(f.n, problems.length)) }
          : undefined;
      for await (const t of rollout(problems, { ...options, skip, lengths, policy: f.reload, branch })) {
        await out.write(t);
        if (out.closed) break;
      }
    } finally {
      await out.end();
      if (tty) process.stderr.write('\n');
    }
  } finally {
    for (const close of closers.reverse()) await close().catch(() => {});
  }
}
