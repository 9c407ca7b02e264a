import type { Problem } from '../records/problem.js';
import type { Trajectory } from '../records/trajectory.js';
import type { Compat } from '../reward/index.js';
import { SandboxClient } from '../sandbox/client.js';
import { expandJobs, openAdmission } from './admission.js';
import type { BranchOptions } from './branch.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import { EngineHealth } from './engine-health.js';
import type { EngineClient } from './engines.js';
import { type JobContext, type RunnableJob, runJob } from './job.js';
import { ErrorBudget, Outcomes } from './outcomes.js';
import { ProgressMeter, type RolloutProgress } from './progress.js';
import type { ProtocolContext } from './protocol.js';
import type { Policy } from './scheduler.js';
import { OpenSessions } from './session.js';
import {
  GroupToolCache,
  type SandboxTraits,
  samplesPerProblem,
  sandboxTraits,
  type ToolCacheCounts,
  type ToolCacheMode,
} from './tool-cache.js';

export interface RolloutOptions {
  /** `group`: a problem's identical pure calls with a reproducible result run once (GroupToolCache); default off. */
  toolCache?: ToolCacheMode;
  /** With the cache: share of hits run again for real and compared (default 0). */
  toolCacheAudit?: number;
  /** With the cache: counts added to as the run goes (the caller's step or benchmark totals). */
  toolCacheCounts?: ToolCacheCounts;
  /** With the cache: the sandbox's time limit and hash seed (default: asked of its /health). */
  sandboxTraits?: SandboxTraits;
  engines: EngineClient[];
  /**
   * The sandbox client (or its URL) that runs `python_code_with_standard_io`. A client made here
   * sends `sandboxToken` and rejects calls the service itself failed (`rejectServiceFailures`).
   */
  sandbox: SandboxClient | string;
  /** Bearer token for a sandbox given by URL. */
  sandboxToken?: string;
  /** Keep the verifier's reward for `length` / `tool_overflow` trajectories (the release); default 0. */
  rewardTruncated?: boolean;
  /** End a trajectory after this many consecutive malformed or failing tool calls (0: no cap). */
  maxInvalidCalls?: number;
  /**
   * Stop with an error once more than this share of the run's trajectories ended with
   * `finish: "error"` (an infrastructure failure); default 0.1, 1 = never.
   */
  maxErrorShare?: number;
  protocol: ProtocolContext;
  /** Samples per problem (default 1). */
  n?: number;
  maxTurns?: number;
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  /** Base seed: each request gets one derived from it, the trajectory id and the turn. */
  seed?: number;
  maxParallelCalls?: number;
  toolResponseMaxChars?: number;
  schedule?: Policy;
  /** Trajectory ids already written (resume): skipped, never generated again. */
  skip?: ReadonlySet<string>;
  /**
   * Trajectories under way at once (default 1024). The scheduler enforces it, so which ones
   * start next is its start order over the whole batch, not submission order.
   */
  concurrency?: number;
  /**
   * Mean response tokens per problem id from earlier trajectories (`lengthsByProblem` of, e.g.,
   * the previous epoch's rollout): `kv` then starts the problems it ranks longest first instead
   * of probing (scheduler option `prior`).
   */
  lengths?: ReadonlyMap<string, number>;
  /** How often engines' KV capacity is scraped (default 1000 ms; 0 = only at start). */
  scrapeMs?: number;
  /**
   * Consecutive failures of one turn before its trajectory ends with `finish: "error"` (kind
   * `engine`; default 2 × engines + 2).
   */
  maxAttempts?: number;
  /** `policy` field of each trajectory; default: the first engine's model path. */
  policy?: string;
  compat?: Compat;
  /**
   * Tree rollouts: K continuations from the state just after a sample's first failed tool call,
   * drawing on `budget` (shared by the rounds of one step). Absent: no branches.
   */
  branch?: BranchOptions;
  /** Called after every finished trajectory and engine event; for progress bars. */
  onProgress?: (p: RolloutProgress) => void;
}

/** The sandbox of the run, its token checked: a wrong one fails here, before any engine is asked. */
async function connectSandbox(options: RolloutOptions): Promise<{ client: SandboxClient; own: boolean }> {
  if (typeof options.sandbox !== 'string') {
    await options.sandbox.checkAuth();
    return { client: options.sandbox, own: false };
  }
  const client = new SandboxClient(options.sandbox, {
    token: options.sandboxToken,
    rejectServiceFailures: true,
  });
  await client.checkAuth().catch(async (error: unknown) => {
    await client.close();
    throw error;
  });
  return { client, own: true };
}

/**
 * Samples `n` trajectories per problem through the engines and the sandbox; yields each one as it
 * finishes (completion order). An engine that fails a turn is set aside and probed until it
 * answers again; the turn goes back to the queue and runs elsewhere, so every trajectory is
 * produced exactly once. A turn that fails everywhere `maxAttempts` times, and a tool call the
 * sandbox service failed after its retries, end that trajectory with `finish: "error"` and an
 * `error` cause; more than `maxErrorShare` of them end the rollout with an error. A sandbox that
 * refuses the token ends the rollout at once, naming its URL.
 *
 * The parts: admission (`openAdmission`, the scheduler), engine health (`EngineHealth`), retry
 * (`generateTurn`), one job through the agent loop (`runJob`), scoring and the record
 * (`record.ts`), and the completions and error budget (`outcomes.ts`).
 */
export async function* rollout(problems: Problem[], options: RolloutOptions): AsyncGenerator<Trajectory> {
  const { engines } = options;
  if (engines.length === 0) throw new Error('rollout needs at least one engine');
  const clock = () => performance.now();
  const sandbox = await connectSandbox(options);
  const { core, scheduler } = await openAdmission(engines, problems, options, clock);
  const policy = options.policy ?? (await engines[0].model().catch(() => engines[0].url));
  const jobs = expandJobs(problems, options.n ?? ROLLOUT_DEFAULTS.n, options.skip);

  const meter = new ProgressMeter(jobs.length, engines, () => core.stats(), clock, options.onProgress);
  const outcomes = new Outcomes<Trajectory>();
  const budget = new ErrorBudget(jobs.length, options.maxErrorShare ?? ROLLOUT_DEFAULTS.maxErrorShare);
  const health = new EngineHealth(
    engines,
    core,
    scheduler,
    options.scrapeMs ?? ROLLOUT_DEFAULTS.scrapeMs,
    () => meter.report(),
  );
  const start = (job: RunnableJob) =>
    runJob(run, job).then(
      (t) => outcomes.push(t),
      (error: unknown) => outcomes.fail(error),
    );
  const run: JobContext = {
    engines,
    core,
    scheduler,
    health,
    meter,
    sampling: {
      temperature: options.temperature ?? ROLLOUT_DEFAULTS.temperature,
      topP: options.topP ?? ROLLOUT_DEFAULTS.topP,
    },
    seed: options.seed,
    maxAttempts: options.maxAttempts ?? 2 * engines.length + 2,
    ended: () => outcomes.ended,
    protocol: options.protocol,
    sandbox: sandbox.client,
    policy,
    agent: {
      maxTurns: options.maxTurns,
      maxTokens: options.maxTokens,
      maxParallelCalls: options.maxParallelCalls,
      toolResponseMaxChars: options.toolResponseMaxChars,
      maxInvalidCalls: options.maxInvalidCalls,
    },
    score: { compat: options.compat, rewardTruncated: options.rewardTruncated },
    clock,
    promptCache: new Map(),
    sessions: new OpenSessions(),
    toolCache:
      options.toolCache === 'group'
        ? new GroupToolCache({
            samples: samplesPerProblem(jobs),
            sandbox: options.sandboxTraits ?? (await sandboxTraits(sandbox.client.url)),
            audit: options.toolCacheAudit ?? ROLLOUT_DEFAULTS.toolCacheAudit,
            seed: options.seed,
            counts: options.toolCacheCounts,
          })
        : undefined,
    branch: options.branch,
    spawn(more) {
      meter.grow(more.length);
      budget.grow(more.length);
      for (const job of more) start(job);
    },
  };

  health.start();
  try {
    // Every job starts at once and waits in the scheduler, which admits `concurrency` of them at
    // a time in its start order; finished ones are handed out in completion order.
    for (const job of jobs) start(job);
    // A sample's branches are added (meter.grow) while it runs, before it finishes: the total is
    // final once every trajectory so far is in.
    while (meter.done < meter.total) {
      const t = await outcomes.next();
      budget.count(t);
      meter.finished();
      yield t;
    }
  } finally {
    outcomes.stop();
    health.stop();
    run.toolCache?.close();
    // Trajectories stopped mid-way (an abort, the error budget, a consumer gone) close their sessions here.
    await run.sessions.closeAll();
    if (sandbox.own) await sandbox.client.close();
  }
}
