import { randomUUID } from 'node:crypto';
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
  type RawResult,
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
  /** Idle seconds after which a session is closed (`--session-ttl`). */
  sessionTtlS: number;
  /** Sessions held at once (`--max-sessions`); beyond it the least recently used idle one is closed. */
  maxSessions: number;
  /** Memory for idle sessions, MiB, all workers together (`--session-memory`); beyond it idle sessions are closed, oldest first. */
  sessionMemoryMb: number;
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
    sessionTtlS: 600,
    maxSessions: 1024,
    sessionMemoryMb: 4096,
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
  /** A session's cell or operation: it runs on the executor that holds the session. */
  session?: Session;
  /** A session operation (start, fork, close) instead of code; answers through its own promise. */
  op?: (executor: Executor) => Promise<void>;
}

/** One session as the pool knows it; `number` names it to its executor. */
interface Session {
  id: string;
  number: number;
  /** The executor holding it; undefined until its first cell or fork places it. */
  executor?: Executor;
  family?: Family;
  /** Files for its working directory, kept until it is started. */
  files?: Map<string, Buffer>;
  /** Started on its executor (a failed start, a lost family: false again, and `lost` set). */
  started: boolean;
  lost?: string;
  closed: boolean;
  lastUsed: number;
  /** Cells and operations queued or running. */
  pending: number;
}

/** Sessions forked from one another share a family on their executor (session.py). */
interface Family {
  uid: number;
  slot: number;
  members: Set<Session>;
}

/** An unknown, closed, expired or lost session. */
export class SessionNotFound extends Error {
  override name = 'SessionNotFound';
  constructor(
    readonly sessionId: string,
    why = 'not found (closed, expired, lost with its worker, or never made)',
  ) {
    super(`session ${sessionId} ${why}`);
  }
}

/** Every session slot is held by a busy session. */
export class TooManySessions extends Error {
  override name = 'TooManySessions';
}

/** What a runner says about a session it made. */
export interface SessionHandle {
  session_id: string;
  ttl_s: number;
}

/** Anything that answers submissions: the local executor pool, or the Redis-backed broker. */
export interface Runner {
  submit(submission: Submission, long: boolean): Promise<SubmissionResult>;
  /** A new session, its working directory holding `files` (name -> bytes). */
  createSession(files?: Map<string, Buffer>): Promise<SessionHandle>;
  /** A new session holding a copy of `id`'s state; rejects with SessionNotFound. */
  forkSession(id: string): Promise<SessionHandle>;
  /** Closes a session; false when it was not there. */
  closeSession(id: string): Promise<boolean>;
  readonly metrics: Metrics;
  close(): Promise<void>;
}

/** Session numbers on the wire are u32; family uids come from a range of their own per server. */
const MAX_FAMILIES = 4096;

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
  #pinned = new Map<Executor, Fifo>();
  #pinnedCount = 0;
  #sessions = new Map<string, Session>();
  #nextSession = 1;
  #freeSlots: number[] = [];
  #familyUidBase = 10_000_000 + (process.pid % 100_000) * MAX_FAMILIES;
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
      sessions: this.#sessions.size,
    });
    for (let slot = MAX_FAMILIES - 1; slot >= 0; slot -= 1) this.#freeSlots.push(slot);
  }

  get queued(): number {
    return this.#heavy.length + this.#light.length + this.#pinnedCount;
  }

  /** Sessions held now. */
  get sessionCount(): number {
    return this.#sessions.size;
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
      // Any one worker may hold every session (placement follows their code): room for all of
      // them, an init and a state each, and for the whole session memory; #checkMemory keeps the
      // workers together under the server's budget.
      const cgroup = this.#cgroups.create(
        `w${index}`,
        this.#workerMemoryBytes(),
        o.nproc * 2 + 16 + 3 * o.maxSessions,
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
      this.#pinned.set(executor, new Fifo());
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
    const promise =
      submission.session_id !== undefined && submission.session_id !== null
        ? this.#submitCell(submission, long)
        : this.#enqueue(submission, long);
    if (key !== undefined) {
      const now = Date.now();
      this.#remembered.set(key, { promise, at: now });
      for (const [oldest, entry] of this.#remembered) {
        if (this.#remembered.size <= 50_000 && now - entry.at < 600_000) break;
        this.#remembered.delete(oldest);
      }
      promise.then((result) => {
        // Calls that never ran (or whose executor died) must run when asked again.
        if (
          result.reason === 'queue_timeout' ||
          result.reason === 'internal_error' ||
          result.reason === 'session_not_found'
        )
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
    const pinned = executor ? this.#pinned.get(executor) : undefined;
    const mine = pinned?.peek();
    if (mine && (!heavy || mine.enqueued <= heavy.enqueued) && (!light || mine.enqueued <= light.enqueued)) {
      this.#pinnedCount -= 1;
      const job = pinned?.shift();
      if (job && !job.long) this.#shortQueued -= 1;
      return job;
    }
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
      // A job may end without using the executor (a cell of a session lost meanwhile): the
      // executor then takes the next one at once, not at the next event.
      while (this.queued > 0 && executor.alive && !executor.busy) {
        let job = this.#take(executor);
        const now = performance.now();
        while (job && job.deadline < now) {
          if (job.session) job.session.pending -= 1;
          job.resolve(failure(job.submission, 'queue_timeout', (now - job.enqueued) / 1000));
          job = this.#take(executor);
        }
        if (!job) break;
        if (job.op) this.#operate(executor, job);
        else if (job.session) this.#executeCell(executor, job);
        else this.#execute(executor, job);
      }
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
      files: decodeFiles(s.files),
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

  // ---- sessions ----------------------------------------------------------------------------

  createSession(files?: Map<string, Buffer>): Promise<SessionHandle> {
    if (!this.isolation.isolate)
      return Promise.reject(new Error(`sessions need the isolated sandbox: ${this.isolation.reason}`));
    if (this.#closing) return Promise.reject(new TooManySessions('the sandbox is shutting down'));
    if (this.#sessions.size >= this.options.maxSessions && !this.#evictIdle())
      return Promise.reject(
        new TooManySessions(`all ${this.options.maxSessions} sessions are busy (--max-sessions)`),
      );
    const session = this.#newSession();
    if (files && files.size > 0) session.files = files;
    return Promise.resolve(this.#handle(session));
  }

  async forkSession(id: string): Promise<SessionHandle> {
    const source = this.#live(id);
    if (this.#sessions.size >= this.options.maxSessions && !this.#evictIdle(source))
      throw new TooManySessions(`all ${this.options.maxSessions} sessions are busy (--max-sessions)`);
    const copy = this.#newSession();
    source.lastUsed = performance.now();
    if (!source.executor) {
      // Nothing ran there yet: the copy is a new session with the same files.
      if (source.files) copy.files = new Map(source.files);
      return this.#handle(copy);
    }
    const family = source.family as Family;
    copy.executor = source.executor;
    copy.family = family;
    family.members.add(copy);
    const result = await this.#pinnedOp(
      copy,
      async (executor) => {
        if (source.lost || !source.started) throw new SessionNotFound(id, source.lost ?? 'did not start');
        const raw = await executor.sessionFork(source.number, copy.number);
        if (raw.error) throw new Error(raw.error);
        if (raw.lost) throw new SessionNotFound(id, 'was lost: its processes died');
        copy.started = true;
      },
      source,
    );
    if (result.reason !== '') {
      this.#lose(copy, `could not be forked: ${result.stderr ?? result.reason}`);
      this.#forget(copy);
      if (result.reason === 'session_not_found') throw new SessionNotFound(id, source.lost ?? 'was lost');
      throw new Error(`session ${id}: fork failed: ${result.stderr ?? result.reason}`);
    }
    return this.#handle(copy);
  }

  async closeSession(id: string): Promise<boolean> {
    const session = this.#sessions.get(id);
    if (!session || session.closed) return false;
    this.#closeSession(session);
    return true;
  }

  #closeSession(session: Session): void {
    session.closed = true;
    this.#sessions.delete(session.id);
    if (!session.executor || session.lost || (!session.started && session.pending === 0)) {
      this.#forget(session);
      return;
    }
    // After whatever it has queued: the close runs in order on its executor.
    void this.#pinnedOp(session, async (executor) => {
      if (session.started && !session.lost) await executor.sessionClose(session.number);
    }).finally(() => this.#forget(session));
  }

  #handle(session: Session): SessionHandle {
    return { session_id: session.id, ttl_s: this.options.sessionTtlS };
  }

  #newSession(): Session {
    const number = this.#nextSession;
    this.#nextSession = (this.#nextSession % 0xfffffffe) + 1;
    const session: Session = {
      id: `s-${randomUUID()}`,
      number,
      started: false,
      closed: false,
      lastUsed: performance.now(),
      pending: 0,
    };
    this.#sessions.set(session.id, session);
    return session;
  }

  /** A session that can take work, or SessionNotFound. */
  #live(id: string): Session {
    const session = this.#sessions.get(id);
    if (!session || session.closed) throw new SessionNotFound(id);
    if (session.lost) throw new SessionNotFound(id, session.lost);
    return session;
  }

  #submitCell(submission: Submission, long: boolean): Promise<SubmissionResult> {
    const id = String(submission.session_id);
    let session: Session;
    try {
      session = this.#live(id);
    } catch (error) {
      return Promise.resolve(notFound(submission, id, (error as Error).message));
    }
    session.lastUsed = performance.now();
    if (!session.executor && !this.#place(session, submission.solution))
      return Promise.resolve(failure(submission, 'queue_timeout', 0, 'no session slot free'));
    return this.#enqueuePinned(session, submission, long);
  }

  /** Chooses the executor of a session at its first cell (heavy code: a heavy executor) and starts it there. */
  #place(session: Session, code: string): boolean {
    const slot = this.#freeSlots.pop();
    if (slot === undefined) return false;
    const heavy = needsHeavy(code);
    const load = new Map<Executor, number>();
    for (const s of this.#sessions.values())
      if (s.executor) load.set(s.executor, (load.get(s.executor) ?? 0) + 1);
    // Heavy code goes to an executor that preloaded numpy and sympy: on a light one every session
    // would import them into pages of its own (~30 MiB per idle session instead of ~11). With the
    // default --workers (2 x cores) there are as many heavy executors as cores.
    const candidates = this.#executors.filter((e) => !heavy || e.config.heavy);
    let best = candidates[0];
    for (const e of candidates) if ((load.get(e) ?? 0) < (load.get(best) ?? 0)) best = e;
    session.executor = best;
    const family: Family = { uid: this.#familyUidBase + slot, slot, members: new Set([session]) };
    session.family = family;
    void this.#pinnedOp(session, async (executor) => {
      const raw = await executor.sessionNew(session.number, family.uid, session.files);
      if (raw.error) throw new Error(raw.error);
      session.started = true;
      session.files = undefined;
    }).then((result) => {
      if (result.reason !== '') this.#lose(session, `could not start: ${result.stderr ?? result.reason}`);
    });
    return true;
  }

  #enqueuePinned(
    session: Session,
    submission: Submission,
    long: boolean,
    op?: Job['op'],
  ): Promise<SubmissionResult> {
    const now = performance.now();
    return new Promise((resolve) => {
      const answer = (result: SubmissionResult) => {
        if (!op) this.metrics.record(result.reason, (performance.now() - now) / 1000);
        resolve(result);
      };
      if (this.#closing || this.queued >= this.options.maxQueueLong) {
        answer(failure(submission, 'queue_timeout'));
        return;
      }
      const wait = (long ? this.options.longQueueTimeoutS : this.options.queueTimeoutS) * 1000;
      const job: Job = {
        submission,
        long,
        enqueued: now,
        deadline: now + wait,
        resolve: answer,
        session,
        op,
      };
      const fifo = this.#pinned.get(session.executor as Executor) as Fifo;
      fifo.push(job);
      this.#pinnedCount += 1;
      if (!long) this.#shortQueued += 1;
      session.pending += 1;
      this.#dispatch();
    });
  }

  /** Runs `run` on the session's executor in its turn; resolves with reason '' or the failure. */
  #pinnedOp(session: Session, run: NonNullable<Job['op']>, on: Session = session): Promise<SubmissionResult> {
    const placeholder: Submission = { type: 'python', solution: '', session_id: on.id };
    return this.#enqueuePinned(on, placeholder, true, run);
  }

  #operate(executor: Executor, job: Job): void {
    this.#inflight += 1;
    const session = job.session as Session;
    (job.op as NonNullable<Job['op']>)(executor)
      .then(
        () => job.resolve({ ...failure(job.submission, ''), success: true, run_success: true }),
        (error: Error) =>
          job.resolve(
            failure(
              job.submission,
              error instanceof SessionNotFound ? 'session_not_found' : 'internal_error',
              0,
              error.message,
            ),
          ),
      )
      .finally(() => {
        session.pending -= 1;
        this.#settled();
      });
  }

  #executeCell(executor: Executor, job: Job): void {
    const o = this.options;
    const s = job.submission;
    const session = job.session as Session;
    if (session.lost || !session.started) {
      session.pending -= 1;
      job.resolve(notFound(s, session.id, `session ${session.id} ${session.lost ?? 'did not start'}`));
      return;
    }
    const asked = (s as { options?: { mode?: string } }).options?.mode;
    const request: RawRequest = {
      code: s.solution,
      input: s.input ?? '',
      timeout: o.timeoutS,
      mode: asked === 'script' ? 'script' : 'notebook',
      keep: o.outputChars,
    };
    this.#inflight += 1;
    executor
      .sessionCell(session.number, request)
      .then(
        (raw: RawResult) => {
          if (raw.lost) {
            // The executor says which check found the session gone (docs/sandbox.md, sessions).
            const why = raw.stderr.trim() || 'memory, a worker restart';
            this.#lose(session, `was lost: its processes died (${why})`);
            job.resolve(notFound(s, session.id, `session ${session.id} ${session.lost}`));
            return;
          }
          const result: SubmissionResult = { ...toResult(s, raw, o.outputChars), session_id: session.id };
          if (raw.rolled_back) result.session_rolled_back = true;
          job.resolve(result);
        },
        (error: Error) => job.resolve(failure(s, 'internal_error', 0, error.message.slice(0, 500))),
      )
      .finally(() => {
        session.pending -= 1;
        session.lastUsed = performance.now();
        this.#checkMemory(executor);
        this.#settled();
      });
  }

  #settled(): void {
    this.#inflight -= 1;
    if (this.#inflight === 0 && this.queued === 0) this.#drained?.();
    this.#dispatch();
  }

  /** A session whose processes are gone: its calls are answered session_not_found from now on. */
  #lose(session: Session, why: string): void {
    if (session.lost) return;
    session.lost = why;
    session.started = false;
  }

  /** Drops what the pool holds for a closed or lost session; the family's uid is free with its last member. */
  #forget(session: Session): void {
    const family = session.family;
    if (!family || !family.members.delete(session)) return;
    if (family.members.size === 0) this.#freeSlots.push(family.slot);
  }

  /** Closes the least recently used idle session (not `keep`); false when every session is busy. */
  #evictIdle(keep?: Session, on?: Executor): boolean {
    let oldest: Session | undefined;
    for (const s of this.#sessions.values()) {
      if (s === keep || s.pending > 0 || (on && s.executor !== on)) continue;
      if (!oldest || s.lastUsed < oldest.lastUsed) oldest = s;
    }
    if (!oldest) return false;
    this.metrics.sessionsEvicted += 1;
    this.#closeSession(oldest);
    return true;
  }

  /** Idle sessions past their TTL are closed; lost ones are forgotten. */
  #expireSessions(now: number): void {
    const ttl = this.options.sessionTtlS * 1000;
    for (const s of [...this.#sessions.values()]) {
      if (s.pending > 0) continue;
      if (now - s.lastUsed > ttl) {
        this.metrics.sessionsExpired += 1;
        this.#closeSession(s);
      }
    }
  }

  /**
   * Keeps a worker under its memory limit: while its cgroup holds more than the limit less one
   * call's budget, its least recently used idle sessions are closed.
   */
  #checkMemory(executor: Executor): void {
    const cgroup = executor.config.cgroup;
    if (!cgroup) return;
    const o = this.options;
    const MB = 1024 * 1024;
    const headroom = (o.memoryMb + o.scratchMb + 64) * MB;
    // The server's budget: every worker's own share (its interpreter and one call) plus the sessions'.
    const budget = o.workers * (o.memoryMb + o.scratchMb + 16 + 512) * MB + o.sessionMemoryMb * MB - headroom;
    const total = () => this.#executors.reduce((sum, e) => sum + (e.config.cgroup?.memoryUsage() ?? 0), 0);
    for (let i = 0; i < 64; i += 1) {
      const used = cgroup.memoryUsage();
      if (used === undefined) return;
      if (used > this.#workerMemoryBytes() - headroom) {
        if (!this.#evictIdle(undefined, executor)) return;
      } else if (total() > budget) {
        if (!this.#evictIdle()) return;
      } else return;
    }
  }

  /** A worker's memory limit: its interpreter and one call, plus every session's memory. */
  #workerMemoryBytes(): number {
    const o = this.options;
    return (o.memoryMb + o.scratchMb + 16 + 512 + o.sessionMemoryMb) * 1024 * 1024;
  }

  #sweep(): void {
    const now = performance.now();
    this.#expireSessions(now);
    if (this.queued === 0) return;
    for (const fifo of [this.#heavy, this.#light, ...this.#pinned.values()]) {
      const pinned = fifo !== this.#heavy && fifo !== this.#light;
      for (const job of fifo.removeWhere((j) => j.deadline < now)) {
        if (!job.long) this.#shortQueued -= 1;
        if (pinned) this.#pinnedCount -= 1;
        if (job.session) job.session.pending -= 1;
        job.resolve(failure(job.submission, 'queue_timeout', (now - job.enqueued) / 1000));
      }
    }
  }

  #onExecutorExit(executor: Executor): void {
    for (const session of this.#sessions.values())
      if (session.executor === executor)
        this.#lose(session, 'was lost with its worker (the executor restarted)');
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

/** The answer for a cell whose session is not there. */
function notFound(submission: Submission, id: string, message: string): SubmissionResult {
  return { ...failure(submission, 'session_not_found', 0, message), session_id: id };
}

/** A submission's `files` (name -> base64) as bytes; names checked by the server before. */
export function decodeFiles(
  files: Record<string, string> | null | undefined,
): Map<string, Buffer> | undefined {
  if (!files) return undefined;
  const map = new Map<string, Buffer>();
  for (const [name, content] of Object.entries(files)) map.set(name, Buffer.from(content, 'base64'));
  return map.size > 0 ? map : undefined;
}
