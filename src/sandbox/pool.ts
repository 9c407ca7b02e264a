import { availableParallelism } from 'node:os';
import type { Submission, SubmissionResult } from '../records/sandbox.js';
import { type CgroupManager, cgroupManager, serverTag } from './cgroup.js';
import {
  type CallLimits,
  DEFAULT_HASH_SEED,
  Executor,
  type ExecutorConfig,
  type HashSeed,
  isolationSupport,
  type RawRequest,
} from './executor.js';
import { submissionKey } from './key.js';
import { Metrics } from './metrics.js';
import { failure, toResult } from './result.js';

export interface SandboxOptions extends CallLimits {
  workers: number;
  /** Wall-clock limit per call, seconds (CPU time is limited to this + 1 s). */
  timeoutS: number;
  /** Short calls (`/run`, `/run/batch`) waiting longer than this get `queue_timeout`. */
  queueTimeoutS: number;
  /** Long calls (`/run/long-batch`, stream) wait up to this long (code-judge: 1 hour). */
  longQueueTimeoutS: number;
  /** Short calls beyond this many queued are refused with `queue_timeout` at once. */
  maxQueue: number;
  /** Hard bound on all queued calls, long ones included. */
  maxQueueLong: number;
  /** Cores all calls together may use (cgroup CPU quota); undefined: no cap. */
  cpus?: number;
  /** PYTHONHASHSEED of every executor (`--hash-seed`); default a fixed 0, so set order is the same everywhere. */
  hashSeed: HashSeed;
  /** Log lines to stderr. */
  log: (line: string) => void;
}

export function defaultOptions(overrides: Partial<SandboxOptions> = {}): SandboxOptions {
  const workers = overrides.workers ?? Math.max(2, availableParallelism() * 2);
  return {
    workers,
    timeoutS: 10,
    memoryMb: 512,
    outputChars: 1000,
    outputLimitBytes: 8 * 1024 * 1024,
    nproc: 64,
    fsizeMb: 32,
    scratchMb: 64,
    scratchInodes: 4096,
    queueTimeoutS: 20,
    longQueueTimeoutS: 3600,
    maxQueue: workers * 512,
    maxQueueLong: 200_000,
    hashSeed: DEFAULT_HASH_SEED,
    log: () => {},
    ...overrides,
  };
}

function callLimits(o: CallLimits): CallLimits {
  const { memoryMb, outputChars, outputLimitBytes, nproc, fsizeMb, scratchMb, scratchInodes } = o;
  return { memoryMb, outputChars, outputLimitBytes, nproc, fsizeMb, scratchMb, scratchInodes };
}

interface Job {
  submission: Submission;
  long: boolean;
  enqueued: number;
  deadline: number;
  resolve: (result: SubmissionResult) => void;
}

/** Anything that answers submissions: the local executor pool, or the Redis-backed broker. */
export interface Runner {
  submit(submission: Submission, long: boolean): Promise<SubmissionResult>;
  readonly metrics: Metrics;
  close(): Promise<void>;
}

/** A FIFO with O(1) amortised shift. */
class Fifo {
  #items: Job[] = [];
  #head = 0;
  get length(): number {
    return this.#items.length - this.#head;
  }
  push(job: Job): void {
    this.#items.push(job);
  }
  peek(): Job | undefined {
    return this.#head < this.#items.length ? this.#items[this.#head] : undefined;
  }
  shift(): Job | undefined {
    if (this.#head >= this.#items.length) return undefined;
    const job = this.#items[this.#head];
    this.#head += 1;
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
    return job;
  }
  /** Removes and returns the jobs for which `expired` is true. */
  removeWhere(expired: (job: Job) => boolean): Job[] {
    const gone: Job[] = [];
    const keep: Job[] = [];
    for (let i = this.#head; i < this.#items.length; i += 1)
      (expired(this.#items[i]) ? gone : keep).push(this.#items[i]);
    this.#items = keep;
    this.#head = 0;
    return gone;
  }
}

/**
 * Code that names a heavy library goes to executors that preloaded it; everything else to
 * light executors, whose much smaller interpreter forks about twice as fast.
 */
const HEAVY = /\b(sympy|numpy|scipy|mpmath|pandas|networkx|torch)\b/;
export const needsHeavy = (code: string): boolean => HEAVY.test(code);

/**
 * A bounded queue in front of warm executors. Every submission resolves exactly once: with its
 * result, `queue_timeout` (never started: safe to retry), or `internal_error` (its executor died;
 * the executor is restarted). Results of submissions with a `sub_id` are remembered for a while
 * so a retried request gets the first answer instead of a second run.
 */
export class LocalPool implements Runner {
  readonly options: SandboxOptions;
  readonly metrics = new Metrics();
  readonly isolation: { isolate: boolean; reason: string };
  #cgroups: CgroupManager;
  #executors: Executor[] = [];
  #heavy = new Fifo();
  #light = new Fifo();
  #shortQueued = 0;
  #lightCount = 0;
  #inflight = 0;
  #closing = false;
  #sweeper?: NodeJS.Timeout;
  /** Dedup window: the last 50,000 keyed results, none older than 10 minutes. */
  #remembered = new Map<string, { promise: Promise<SubmissionResult>; at: number }>();
  #restartTimes: number[] = [];
  #drained?: () => void;
  /** Calls that can run at once without queueing for a CPU: cores, or the `--cpus` quota. */
  #cores: number;

  constructor(options: SandboxOptions) {
    this.options = options;
    this.isolation = isolationSupport();
    this.#cgroups = cgroupManager(serverTag(process.pid), { cpus: options.cpus });
    this.#cores = Math.max(
      1,
      Math.floor(Math.min(availableParallelism(), options.cpus ?? Number.POSITIVE_INFINITY)),
    );
    this.metrics.gauges = () => ({
      queueDepth: this.queued,
      inflight: this.#inflight,
      workers: this.#executors.length,
      workersAlive: this.#executors.filter((e) => e.alive).length,
    });
  }

  get queued(): number {
    return this.#heavy.length + this.#light.length;
  }

  get cgroupKind(): string {
    return `${this.#cgroups.kind} (${this.#cgroups.reason})`;
  }

  async start(): Promise<void> {
    const o = this.options;
    if (!this.isolation.isolate) {
      o.log(`sandbox: WARNING: isolation degraded: ${this.isolation.reason}; calls run with rlimits only`);
    }
    if (this.#cgroups.kind === 'none') {
      o.log(
        `sandbox: WARNING: no cgroup limits: ${this.#cgroups.reason}; memory and pids bounded by rlimits only`,
      );
    }
    // Distinct uids per server and worker keep RLIMIT_NPROC (counted per uid) per worker.
    const uidBase = 200_000 + (process.pid % 10_000) * 64;
    const starts: Promise<void>[] = [];
    // Light executors first: dispatch offers them light code before a heavy executor takes it.
    const heavyCount = o.workers === 1 ? 1 : Math.ceil(o.workers / 2);
    this.#lightCount = o.workers - heavyCount;
    for (let index = 0; index < o.workers; index += 1) {
      const heavy = index >= o.workers - heavyCount;
      const cgroup = this.#cgroups.create(
        `w${index}`,
        (o.memoryMb + o.scratchMb + 16 + 512) * 1024 * 1024,
        o.nproc + 16,
      );
      const config: ExecutorConfig = {
        index,
        heavy,
        uid: uidBase + index,
        ...callLimits(o),
        isolate: this.isolation.isolate,
        cgroup,
        hashSeed: o.hashSeed,
      };
      const executor = new Executor(config);
      executor.onExit = (e) => this.#onExecutorExit(e);
      this.#executors.push(executor);
      starts.push(executor.start());
    }
    await Promise.all(starts);
    this.#sweeper = setInterval(() => this.#sweep(), 250);
    this.#sweeper.unref();
  }

  submit(submission: Submission, long: boolean): Promise<SubmissionResult> {
    const key = submissionKey(submission);
    if (key !== undefined) {
      const earlier = this.#remembered.get(key)?.promise;
      if (earlier) {
        this.metrics.deduplicated += 1;
        return earlier;
      }
    }
    const promise = this.#enqueue(submission, long);
    if (key !== undefined) {
      const now = Date.now();
      this.#remembered.set(key, { promise, at: now });
      for (const [oldest, entry] of this.#remembered) {
        if (this.#remembered.size <= 50_000 && now - entry.at < 600_000) break;
        this.#remembered.delete(oldest);
      }
      promise.then((result) => {
        // Calls that never ran (or whose executor died) must run when asked again.
        if (result.reason === 'queue_timeout' || result.reason === 'internal_error')
          this.#remembered.delete(key);
      });
    }
    return promise;
  }

  #enqueue(submission: Submission, long: boolean): Promise<SubmissionResult> {
    const now = performance.now();
    return new Promise((resolve) => {
      const answer = (result: SubmissionResult) => {
        this.metrics.record(result.reason, (performance.now() - now) / 1000);
        resolve(result);
      };
      if ((submission.type ?? 'python') !== 'python') {
        answer(
          failure(submission, 'invalid_input', 0, `unsupported type '${submission.type}' (only python)`),
        );
        return;
      }
      if (
        this.#closing ||
        (!long && this.#shortQueued >= this.options.maxQueue) ||
        this.queued >= this.options.maxQueueLong
      ) {
        answer(failure(submission, 'queue_timeout'));
        return;
      }
      const wait = (long ? this.options.longQueueTimeoutS : this.options.queueTimeoutS) * 1000;
      const job = { submission, long, enqueued: now, deadline: now + wait, resolve: answer };
      (needsHeavy(submission.solution) ? this.#heavy : this.#light).push(job);
      if (!long) this.#shortQueued += 1;
      this.#dispatch();
    });
  }

  /**
   * The job this executor runs next: a light executor the oldest light job; a heavy one the oldest
   * heavy job, else light code only when a core would otherwise stay idle. With no light executors
   * (one worker), or without an executor (closing), the oldest job of either kind.
   */
  #take(executor?: Executor): Job | undefined {
    const heavy = this.#heavy.peek();
    const light = this.#light.peek();
    let job: Job | undefined;
    if (executor && !executor.config.heavy) job = this.#light.shift();
    else if (heavy && ((executor && this.#lightCount > 0) || !light || heavy.enqueued <= light.enqueued))
      job = this.#heavy.shift();
    else if (!executor || this.#lightCount === 0 || this.#inflight < this.#cores) {
      // Light code costs a heavy executor ~1.5-2x the CPU, so a heavy executor takes it only when
      // the light ones are all busy (they are offered work first) and a core is free.
      job = this.#light.shift();
    }
    if (job && !job.long) this.#shortQueued -= 1;
    return job;
  }

  #dispatch(): void {
    for (const executor of this.#executors) {
      if (this.queued === 0) return;
      if (!executor.alive || executor.busy) continue;
      let job = this.#take(executor);
      const now = performance.now();
      while (job && job.deadline < now) {
        job.resolve(failure(job.submission, 'queue_timeout', (now - job.enqueued) / 1000));
        job = this.#take(executor);
      }
      if (!job) continue;
      this.#execute(executor, job);
    }
  }

  #execute(executor: Executor, job: Job): void {
    const o = this.options;
    const s = job.submission;
    const expected = s.expected_output;
    // A judged program (expected_output given) runs as a script, as code-judge runs it: its output
    // is what it prints, not also the value of a last expression such as `solve()`.
    const asked = (s as { options?: { mode?: string } }).options?.mode;
    const mode =
      asked === 'script' || asked === 'notebook' ? asked : expected !== undefined ? 'script' : 'notebook';
    const request: RawRequest = {
      code: s.solution,
      input: s.input ?? '',
      timeout: o.timeoutS,
      mode,
      keep: expected ? Math.max(o.outputChars, expected.length + 256) : o.outputChars,
    };
    this.#inflight += 1;
    executor
      .run(request)
      .then(
        (raw) => job.resolve(toResult(s, raw, o.outputChars)),
        (error: Error) => job.resolve(failure(s, 'internal_error', 0, error.message.slice(0, 500))),
      )
      .finally(() => {
        this.#inflight -= 1;
        if (this.#inflight === 0 && this.queued === 0) this.#drained?.();
        this.#dispatch();
      });
  }

  #sweep(): void {
    const now = performance.now();
    if (this.queued === 0) return;
    for (const fifo of [this.#heavy, this.#light]) {
      for (const job of fifo.removeWhere((j) => j.deadline < now)) {
        if (!job.long) this.#shortQueued -= 1;
        job.resolve(failure(job.submission, 'queue_timeout', (now - job.enqueued) / 1000));
      }
    }
  }

  #onExecutorExit(executor: Executor): void {
    if (this.#closing) return;
    this.metrics.workerRestarts += 1;
    const now = Date.now();
    this.#restartTimes = this.#restartTimes.filter((t) => now - t < 10_000);
    this.#restartTimes.push(now);
    // A crash loop (broken interpreter) backs off instead of spinning.
    const delay = this.#restartTimes.length > this.options.workers * 3 ? 1000 : 0;
    setTimeout(() => {
      if (this.#closing) return;
      executor.start().then(
        () => this.#dispatch(),
        (error: Error) => this.options.log(`sandbox: executor restart failed: ${error.message}`),
      );
    }, delay).unref();
  }

  /** Removes the cgroups that dead sibling servers on this host left (a Redis peer found one gone). */
  removeStaleCgroups(): void {
    this.#cgroups.sweep();
  }

  /** Stops taking calls; queued ones get `queue_timeout`, running ones finish (bounded by the timeout). */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    if (this.#sweeper) clearInterval(this.#sweeper);
    let job = this.#take();
    while (job) {
      job.resolve(failure(job.submission, 'queue_timeout'));
      job = this.#take();
    }
    if (this.#inflight > 0) {
      await new Promise<void>((resolve) => {
        this.#drained = resolve;
        setTimeout(resolve, (this.options.timeoutS + 2) * 1000).unref();
      });
    }
    const exits = this.#executors.map(
      (e) =>
        new Promise<void>((resolve) => {
          if (!e.running) return resolve();
          const timer = setTimeout(resolve, 3000);
          e.onExit = () => {
            clearTimeout(timer);
            resolve();
          };
          e.kill();
        }),
    );
    await Promise.all(exits);
    // cgroup directories can only be removed once their last process is reaped.
    for (let i = 0; i < 20; i += 1) {
      if (this.#executors.every((e) => (e.config.cgroup?.pids().length ?? 0) === 0)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    for (const e of this.#executors) e.config.cgroup?.remove();
    this.#cgroups.close();
  }
}
