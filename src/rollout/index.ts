import { createHash } from 'node:crypto';
import { DataError } from '../errors.js';
import type { Problem } from '../records/problem.js';
import { outcomeReward, type Trajectory } from '../records/trajectory.js';
import { type Compat, scoreResponse } from '../reward/index.js';
import { SandboxClient, SandboxError } from '../sandbox/client.js';
import { AgentAbort, type AgentIO, runAgent, ServiceFailure } from './agent.js';
import { type EngineClient, EngineError, type SamplingOptions } from './engines.js';
import { type ProtocolContext, promptIds } from './protocol.js';
import { type Assignment, AsyncScheduler, type Policy, Scheduler, type TurnRequest } from './scheduler.js';
import { priorFor } from './scheduler-prior.js';

export type { AgentIO, AgentOptions, AgentResult, Generation, Script } from './agent.js';
export { AgentAbort, runAgent, ServiceFailure, scriptedTrajectory } from './agent.js';
export type { Capacity, EngineClient, EngineKind } from './engines.js';
export { EngineError, engineClient, SglangClient, VllmClient } from './engines.js';
export type { ProtocolContext } from './protocol.js';
export {
  createProtocol,
  loadProtocol,
  parseToolCalls,
  promptIds,
  promptText,
  toolTurnIds,
} from './protocol.js';
export type { Policy } from './scheduler.js';
export { POLICIES, Scheduler } from './scheduler.js';
export type { TextTokenizer } from './tokenizer.js';
export { loadTokenizer } from './tokenizer.js';

export interface RolloutOptions {
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
  /** Called after every finished trajectory and engine event; for progress bars. */
  onProgress?: (p: RolloutProgress) => void;
}

export interface RolloutProgress {
  done: number;
  total: number;
  tokens: number;
  toolCalls: number;
  elapsedMs: number;
  engines: { url: string; alive: boolean; inflight: number; free: number; dispatched: number }[];
}

interface Turn extends TurnRequest {
  ids: readonly number[];
}

function requestSeed(seed: number, id: string, turn: number): number {
  const h = createHash('sha256').update(`${seed}\0${id}\0${turn}`).digest();
  return h.readUInt32LE(0) & 0x7fffffff;
}

/**
 * Samples `n` trajectories per problem through the engines and the sandbox; yields each one as it
 * finishes (completion order). An engine that fails a turn is set aside and probed until it
 * answers again; the turn goes back to the queue and runs elsewhere, so every trajectory is
 * produced exactly once. A turn that fails everywhere `maxAttempts` times, and a tool call the
 * sandbox service failed after its retries, end that trajectory with `finish: "error"` and an
 * `error` cause; more than `maxErrorShare` of them end the rollout with an error. A sandbox that
 * refuses the token ends the rollout at once, naming its URL.
 */
export async function* rollout(problems: Problem[], options: RolloutOptions): AsyncGenerator<Trajectory> {
  const { engines, protocol } = options;
  if (engines.length === 0) throw new Error('rollout needs at least one engine');
  const n = options.n ?? 1;
  const sampling = { temperature: options.temperature ?? 1, topP: options.topP ?? 1 };
  const maxAttempts = options.maxAttempts ?? 2 * engines.length + 2;
  const ownSandbox = typeof options.sandbox === 'string';
  const sandbox =
    typeof options.sandbox === 'string'
      ? new SandboxClient(options.sandbox, { token: options.sandboxToken, rejectServiceFailures: true })
      : options.sandbox;
  const maxErrorShare = options.maxErrorShare ?? 0.1;
  const clock = () => performance.now();
  // A wrong token fails here, before any engine is asked for anything.
  await sandbox.checkAuth().catch(async (error: unknown) => {
    if (ownSandbox) await sandbox.close();
    throw error;
  });

  const capacities = await Promise.all(engines.map((e) => e.capacity().catch(() => undefined)));
  const concurrency = Math.max(1, options.concurrency ?? 1024);
  const core = new Scheduler<Turn>(
    capacities.map((c) => c?.total ?? Number.POSITIVE_INFINITY),
    {
      policy: options.schedule ?? 'kv',
      clock,
      maxActive: concurrency,
      prior: options.lengths
        ? priorFor(
            problems.map((p) => p.id),
            options.lengths,
          )
        : undefined,
    },
  );
  capacities.forEach((c, e) => {
    if (c !== undefined) core.observe(e, c);
  });
  const scheduler = new AsyncScheduler(core);
  const policy = options.policy ?? (await engines[0].model().catch(() => engines[0].url));

  const jobs: { problem: Problem; group: number; sample: number; id: string }[] = [];
  problems.forEach((problem, group) => {
    for (let sample = 0; sample < n; sample++) {
      const id = `${problem.id}/${sample}`;
      if (!options.skip?.has(id)) jobs.push({ problem, group, sample, id });
    }
  });

  const started = clock();
  let tokens = 0;
  let toolCalls = 0;
  let done = 0;
  const progress = (): void => {
    if (!options.onProgress) return;
    const stats = core.stats();
    options.onProgress({
      done,
      total: jobs.length,
      tokens,
      toolCalls,
      elapsedMs: clock() - started,
      engines: engines.map((e, i) => ({
        url: e.url,
        alive: stats[i].alive,
        inflight: stats[i].inflight,
        free: stats[i].free,
        dispatched: stats[i].dispatched,
      })),
    });
  };

  // Scrapes capacity of live engines and probes dead ones until they answer again.
  let stopped = false;
  const scrapeOnce = async (): Promise<void> => {
    await Promise.all(
      engines.map(async (engine, e) => {
        const seq = core.sequence;
        const cap = await engine.capacity().catch(() => null);
        if (cap === null) return;
        if (!core.isAlive(e)) core.setAlive(e, true);
        if (cap !== undefined) core.observe(e, cap, seq);
      }),
    );
    scheduler.pump();
    progress();
  };
  const scrapeMs = options.scrapeMs ?? 1000;
  let scrapeTimer: NodeJS.Timeout | undefined;
  const schedule = (): void => {
    if (stopped) return;
    const anyDead = engines.some((_, e) => !core.isAlive(e));
    if (scrapeMs <= 0 && !anyDead) return;
    scrapeTimer = setTimeout(
      () => {
        void scrapeOnce().finally(schedule);
      },
      scrapeMs > 0 ? scrapeMs : 500,
    );
  };

  const generateTurn = async (
    job: (typeof jobs)[number],
    ids: readonly number[],
    maxNew: number,
    turn: number,
  ) => {
    if (stopped || failure !== undefined) throw new AgentAbort('rollout stopped');
    const request: Turn = {
      key: job.id,
      group: job.group,
      contextLen: ids.length,
      maxNewTokens: maxNew,
      ids,
    };
    let a: Assignment<Turn> = await scheduler.acquire(request);
    if (stopped || failure !== undefined) {
      // The rollout ended while this turn waited for its engine: nothing is sent.
      scheduler.release(a);
      throw new AgentAbort('rollout stopped');
    }
    const s: SamplingOptions = { ...sampling };
    if (options.seed !== undefined) s.seed = requestSeed(options.seed, job.id, turn);
    for (let attempt = 1; ; attempt++) {
      try {
        const gen = await engines[a.engine].generate(ids, maxNew, s);
        scheduler.release(a);
        return { gen, assignment: a };
      } catch (error) {
        if (!(error instanceof EngineError) || !error.retryable || attempt >= maxAttempts) {
          scheduler.release(a);
          if (error instanceof EngineError && error.retryable) {
            throw new ServiceFailure('engine', `${error.message} (${attempt} attempts)`);
          }
          throw error;
        }
        // Set the engine aside; the scrape loop brings it back when it answers again.
        if (core.isAlive(a.engine) && core.stats().filter((x) => x.alive).length > 1)
          core.setAlive(a.engine, false);
        if (scrapeTimer === undefined || scrapeMs <= 0) {
          clearTimeout(scrapeTimer);
          schedule();
        }
        progress();
        await new Promise((resolve) => setTimeout(resolve, Math.min(100 * 2 ** attempt, 3000)));
        a = await scheduler.retry(a);
      }
    }
  };

  // Every sample of a problem starts from the same prompt: rendered and tokenized once.
  const promptCache = new Map<string, number[]>();
  const runJob = async (job: (typeof jobs)[number]): Promise<Trajectory> => {
    let queued = 0;
    let engineMs = 0;
    const io: AgentIO = {
      async generate(context, maxNew, turn) {
        const t0 = clock();
        const { gen, assignment } = await generateTurn(job, context, maxNew, turn);
        queued += assignment.dispatchedAt - t0;
        engineMs += clock() - assignment.dispatchedAt;
        tokens += gen.ids.length;
        return gen;
      },
      async runTools(calls) {
        toolCalls += calls.length;
        try {
          return await sandbox.runBatch(
            calls.map((c) => ({ type: 'python', solution: c.code, input: c.input })),
          );
        } catch (error) {
          if (!(error instanceof SandboxError)) throw error;
          // A refused token is the run's configuration: stop it, never show it to the model.
          if (error.kind === 'auth') throw new AgentAbort(error.message);
          throw new ServiceFailure('sandbox', error.message);
        }
      },
    };
    let ids = promptCache.get(job.problem.id);
    if (ids === undefined) {
      ids = promptIds(job.problem, protocol);
      promptCache.set(job.problem.id, ids);
    }
    const r = await runAgent(job.problem.prompt, protocol, io, {
      promptIds: ids,
      maxTurns: options.maxTurns,
      maxTokens: options.maxTokens,
      maxParallelCalls: options.maxParallelCalls,
      toolResponseMaxChars: options.toolResponseMaxChars,
      maxInvalidCalls: options.maxInvalidCalls,
    });
    core.forget(job.id);
    const { answer, reward } = scoreResponse(
      r.text,
      {
        answer: job.problem.answer,
        kind: job.problem.kind,
        choices: job.problem.choices,
        prompt: job.problem.prompt,
      },
      { compat: options.compat },
    );
    return {
      v: 1,
      id: job.id,
      problem_id: job.problem.id,
      sample: job.sample,
      policy,
      prompt_ids: r.prompt_ids,
      response_ids: r.response_ids,
      loss_mask: r.loss_mask,
      logprobs: r.logprobs,
      text: r.text,
      turns: r.turns,
      tool_calls: r.tool_calls,
      tool_errors: r.tool_errors,
      answer_tags: r.answer_tags,
      finish: r.finish,
      ...(r.error ? { error: r.error } : {}),
      answer,
      // The extracted answer stays informative; the reward follows the record contract.
      reward: outcomeReward(r.finish, reward, options.rewardTruncated),
      timing: {
        queued_ms: Math.round(queued),
        generate_ms: Math.round(engineMs),
        tool_ms: Math.round(r.timing.tool_ms),
      },
    };
  };

  // Every trajectory is started at once and waits in the scheduler, which admits `concurrency`
  // of them at a time in its start order; finished ones are handed out in completion order.
  const finished: Trajectory[] = [];
  let errors = 0;
  let firstError: string | undefined;
  let failure: unknown;
  let wake: (() => void) | undefined;
  const notify = () => {
    wake?.();
    wake = undefined;
  };
  const launch = (): void => {
    for (const job of jobs) {
      runJob(job).then(
        (t) => {
          finished.push(t);
          notify();
        },
        (error: unknown) => {
          failure ??= error;
          notify();
        },
      );
    }
  };

  schedule();
  try {
    launch();
    while (done < jobs.length) {
      if (finished.length === 0) {
        if (failure !== undefined) throw failure;
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        continue;
      }
      const t = finished.shift()!;
      if (t.finish === 'error') {
        errors++;
        firstError ??= t.error?.message;
        if (errors > maxErrorShare * jobs.length) {
          throw new DataError(
            `rollout: ${errors} of ${jobs.length} trajectories failed for infrastructure reasons, ` +
              `more than --max-error-share ${maxErrorShare} (first: ${firstError})`,
          );
        }
      }
      done++;
      progress();
      yield t;
    }
  } finally {
    stopped = true;
    clearTimeout(scrapeTimer);
    if (ownSandbox) await sandbox.close();
  }
}
