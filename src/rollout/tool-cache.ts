import { fnv1a, mulberry32 } from '../random.js';
import type { SubmissionResult } from '../records/sandbox.js';
import { PurityClassifier, type Verdict } from './purity.js';

/** `--tool-cache`: off (every call runs), or group (a problem's identical pure calls run once). */
export const TOOL_CACHE_MODES = ['off', 'group'] as const;
export type ToolCacheMode = (typeof TOOL_CACHE_MODES)[number];

/** What a run's cache did: calls answered from a shared result, of those re-run for real, and how many differed. */
export interface ToolCacheCounts {
  /** Calls answered from a shared result. */
  hits: number;
  /** Hits re-run for real by the audit. */
  audited: number;
  /** Audited hits whose real result differed. */
  mismatches: number;
  /** Every call of a problem the cache holds (hits / calls: the share of calls shared). */
  calls: number;
}

export const emptyCounts = (): ToolCacheCounts => ({ hits: 0, audited: 0, mismatches: 0, calls: 0 });

/** What the cache must know of the sandbox: its time limit and whether its string-hash seed is fixed. */
export interface SandboxTraits {
  timeoutS: number;
  hashSeedFixed: boolean;
}

/** A sandbox that does not say (code-judge): sandbox-serve's default limit, and a hash seed that may vary. */
export const UNKNOWN_SANDBOX: SandboxTraits = { timeoutS: 10, hashSeedFixed: false };

/** Asks `GET /health` of sandbox-serve (`timeout_s`, `hash_seed`); what it does not say is assumed unknown. */
export async function sandboxTraits(url: string): Promise<SandboxTraits> {
  try {
    const response = await fetch(`${url}/health`, { signal: AbortSignal.timeout(10_000) });
    const body = (await response.json()) as { timeout_s?: unknown; hash_seed?: unknown };
    return {
      timeoutS: typeof body.timeout_s === 'number' ? body.timeout_s : UNKNOWN_SANDBOX.timeoutS,
      hashSeedFixed: typeof body.hash_seed === 'number',
    };
  } catch {
    return UNKNOWN_SANDBOX;
  }
}

/** A default repr's memory address (`<object object at 0x7f...>`): differs from run to run. */
const ADDRESS = /0x[0-9a-f]+/i;

/**
 * Why a result must not be shared, or undefined: only a clean finish is (no timeout, memory,
 * output-limit or service failure), well inside the time limit (a run that took over half of it
 * may time out the next time), and without a memory address in its output.
 */
export function unshareable(result: SubmissionResult, timeoutS: number): string | undefined {
  if (result.reason !== '') return `reason ${result.reason}`;
  if (result.cost > timeoutS / 2) return `ran ${result.cost}s of a ${timeoutS}s limit`;
  if (ADDRESS.test(result.stdout ?? '') || ADDRESS.test(result.stderr ?? ''))
    return 'a memory address in its output';
  return undefined;
}

/**
 * The first difference between two results of one call, as the model would see it (status, then
 * stdout and stderr line by line; the execution time is ignored), or undefined when they agree.
 */
export function firstDifference(a: SubmissionResult, b: SubmissionResult): string | undefined {
  const status = (r: SubmissionResult) =>
    `success=${r.success} run_success=${r.run_success} reason=${r.reason}`;
  if (status(a) !== status(b)) return `status: ${status(a)} vs ${status(b)}`;
  for (const stream of ['stdout', 'stderr'] as const) {
    const x = (a[stream] ?? '').split('\n');
    const y = (b[stream] ?? '').split('\n');
    for (let i = 0; i < Math.max(x.length, y.length); i++) {
      if (x[i] !== y[i])
        return `${stream} line ${i + 1}: ${JSON.stringify(x[i] ?? '<none>')} vs ${JSON.stringify(y[i] ?? '<none>')}`;
    }
  }
  return undefined;
}

/** Trajectories per problem among `jobs`: what a group cache counts down. */
export function samplesPerProblem(jobs: readonly { problem: { id: string } }[]): Map<string, number> {
  const samples = new Map<string, number>();
  for (const job of jobs) samples.set(job.problem.id, (samples.get(job.problem.id) ?? 0) + 1);
  return samples;
}

export interface GroupToolCacheOptions {
  /** Trajectories of each problem this run will finish. */
  samples: Map<string, number>;
  sandbox?: SandboxTraits;
  /** Share of hits re-run for real and compared (`--tool-cache-audit`); default 0. */
  audit?: number;
  /** The run's seed: which hits are audited is a function of it and the call. */
  seed?: number;
  /** Added to as the run goes (the caller's step or benchmark totals); default a fresh one. */
  counts?: ToolCacheCounts;
  /** Where a mismatch is reported; default a WARNING line on stderr. */
  warn?: (line: string) => void;
  /** Judges a program, or a session's cells as one program (PurityClassifier). */
  classifier?: { classify(code: string | readonly string[]): Promise<Verdict>; close?(): void };
}

/** A call's outcome for the samples waiting on it: the shared result, or each runs its own. */
type Outcome = { shared: true; result: SubmissionResult } | { shared: false };

/**
 * The n samples of one problem often make the very same tool call: in the main job 73% of the
 * 25,070 calls of 100 RL steps repeated a call of their own group, each a sandbox fork. With this
 * cache a group's identical calls (same code, same stdin) share one run, even while it is in
 * flight, but only when sharing cannot correlate the group's samples (GRPO's advantages assume
 * independent ones): the program is pure by the allow-list of purity.py, and its result is
 * reproducible (`unshareable`). Otherwise every sample runs its own call, as without the cache.
 * A run the sandbox service failed is not shared either: each waiting sample runs the call itself,
 * with its own retries. A group's entries go with its last sample, so what the cache holds is
 * bounded by the problems in flight.
 */
export class GroupToolCache {
  #groups = new Map<
    string,
    { left: number; calls: Map<string, { outcome: Promise<Outcome>; hits: number }> }
  >();
  #sandbox: SandboxTraits;
  #audit: number;
  #seed: number;
  #warn: (line: string) => void;
  #classifier: NonNullable<GroupToolCacheOptions['classifier']>;
  readonly counts: ToolCacheCounts;

  constructor(options: GroupToolCacheOptions) {
    for (const [problem, left] of options.samples) this.#groups.set(problem, { left, calls: new Map() });
    this.#sandbox = options.sandbox ?? UNKNOWN_SANDBOX;
    this.#audit = options.audit ?? 0;
    this.#seed = options.seed ?? 0;
    this.counts = options.counts ?? emptyCounts();
    this.#warn = options.warn ?? ((line) => process.stderr.write(`${line}\n`));
    this.#classifier = options.classifier ?? new PurityClassifier();
  }

  /**
   * Runs one call of `problem` through the cache. In session mode `history` is the trajectory's
   * finished cells before this one: a cell's result depends on them, so the key is the whole
   * history, and the cell is shared only when the history and the cell, judged as one program, are
   * pure.
   */
  async run(
    problem: string,
    code: string,
    input: string,
    execute: () => Promise<SubmissionResult>,
    history?: readonly { code: string; input: string }[],
  ): Promise<SubmissionResult> {
    const group = this.#groups.get(problem);
    if (group === undefined) return execute();
    this.counts.calls += 1;
    const key = JSON.stringify(
      history === undefined ? [code, input] : [...history.map((c) => [c.code, c.input]), [code, input]],
    );
    const known = group.calls.get(key);
    if (known !== undefined) {
      const outcome = await known.outcome;
      if (!outcome.shared) return execute();
      this.counts.hits += 1;
      const n = known.hits++;
      if (this.#audit > 0 && mulberry32(fnv1a(`${this.#seed}\0${problem}\0${key}\0${n}`))() < this.#audit)
        await this.#check(problem, outcome.result, execute);
      return outcome.result;
    }
    let settle!: (o: Outcome) => void;
    const entry = { outcome: new Promise<Outcome>((resolve) => (settle = resolve)), hits: 0 };
    group.calls.set(key, entry);
    // A session's cell is judged with its history as one program: alone, a name it takes from an
    // earlier cell (`np` of `import numpy as np`) would be unknown, and what it does with it unseen.
    const verdict = await this.#classifier.classify(
      history === undefined ? code : [...history.map((c) => c.code), code],
    );
    if (!verdict.pure || (verdict.sets && !this.#sandbox.hashSeedFixed)) {
      settle({ shared: false });
      return execute();
    }
    let result: SubmissionResult;
    try {
      result = await execute();
    } catch (error) {
      // The service failed this run, not the program: the next identical call may lead again.
      if (group.calls.get(key) === entry) group.calls.delete(key);
      settle({ shared: false });
      throw error;
    }
    settle(
      unshareable(result, this.#sandbox.timeoutS) === undefined
        ? { shared: true, result }
        : { shared: false },
    );
    return result;
  }

  /** The audit: runs a hit for real; the trajectory keeps the shared result either way. */
  async #check(problem: string, shared: SubmissionResult, execute: () => Promise<SubmissionResult>) {
    let real: SubmissionResult;
    try {
      real = await execute();
    } catch {
      return; // the service failed the audit's run: nothing was compared
    }
    this.counts.audited += 1;
    const difference = firstDifference(shared, real);
    if (difference === undefined) return;
    this.counts.mismatches += 1;
    this.#warn(
      `WARNING tool cache: a shared result of problem ${problem} differs when run again, so its group's samples were correlated (${difference})`,
    );
  }

  /** `count` more trajectories of `problem` (a sample's branches) will use its results. */
  adopt(problem: string, count: number): void {
    const group = this.#groups.get(problem);
    if (group !== undefined) group.left += count;
  }

  /** One trajectory of `problem` has finished; the group's results go with its last one. */
  finished(problem: string): void {
    const group = this.#groups.get(problem);
    if (group !== undefined && --group.left <= 0) this.#groups.delete(problem);
  }

  /** Stops the classifier (the run is over). */
  close(): void {
    this.#classifier.close?.();
  }
}
