import { randomUUID } from 'node:crypto';
import type { Submission, SubmissionResult } from '../records/sandbox.js';

export interface SandboxClientOptions {
  /** Bearer token for a sandbox bound to a non-loopback address. */
  token?: string;
  /** Per HTTP request; a batch that takes longer is retried (never re-run: see below). */
  timeoutMs?: number;
  /** How many times a call answered `queue_timeout` (or a failed request) is sent again. */
  retries?: number;
}

interface Pending {
  submission: Submission;
  resolve: (result: SubmissionResult) => void;
  reject: (error: Error) => void;
}

/** Calls gathered within one tick go out as one batch; batches larger than this are split. */
const MAX_BATCH = 256;

/**
 * Client of `rstar sandbox-serve` (and of code-judge). Calls made in the same tick are sent as
 * one `/run/long-batch` request. Every submission carries a `sub_id` (one is generated when
 * missing) and the server deduplicates by it, so a request that is retried after a lost
 * connection or a timeout gets the first run's result instead of running the code again.
 * `queue_timeout` results are retried because the server guarantees such calls never started.
 */
export class SandboxClient {
  readonly url: string;
  #headers: Record<string, string>;
  #timeoutMs: number;
  #retries: number;
  #pending: Pending[] = [];
  #scheduled = false;
  #inflight = new Set<Promise<void>>();
  #closed = false;

  constructor(url: string, options: { token?: string; timeoutMs?: number; retries?: number } = {}) {
    this.url = url.replace(/\/+$/, '');
    this.#headers = { 'content-type': 'application/json' };
    if (options.token) this.#headers.authorization = `Bearer ${options.token}`;
    this.#timeoutMs = options.timeoutMs ?? 600_000;
    this.#retries = options.retries ?? 5;
  }

  run(submission: Submission): Promise<SubmissionResult> {
    if (this.#closed) return Promise.reject(new Error('SandboxClient is closed'));
    return new Promise((resolve, reject) => {
      this.#pending.push({ submission, resolve, reject });
      if (this.#pending.length >= MAX_BATCH) this.#flush();
      else if (!this.#scheduled) {
        this.#scheduled = true;
        setImmediate(() => this.#flush());
      }
    });
  }

  runBatch(submissions: Submission[]): Promise<SubmissionResult[]> {
    return Promise.all(submissions.map((s) => this.run(s)));
  }

  /** Waits for calls in flight, then refuses new ones. */
  async close(): Promise<void> {
    this.#flush();
    this.#closed = true;
    while (this.#inflight.size > 0) await Promise.allSettled([...this.#inflight]);
  }

  #flush(): void {
    this.#scheduled = false;
    while (this.#pending.length > 0) {
      const batch = this.#pending.splice(0, MAX_BATCH);
      const task = this.#send(batch).finally(() => this.#inflight.delete(task));
      this.#inflight.add(task);
    }
  }

  async #send(batch: Pending[]): Promise<void> {
    // A stable sub_id per call is what makes resending safe; the caller's own id is kept.
    const keyed = batch.map((p) => ({
      pending: p,
      body: { ...p.submission, sub_id: p.submission.sub_id ?? randomUUID() },
    }));
    let todo = keyed;
    let lastError: Error | undefined;
    for (let attempt = 0; attempt <= this.#retries && todo.length > 0; attempt += 1) {
      if (attempt > 0) await sleep(Math.min(100 * 2 ** (attempt - 1), 5_000));
      try {
        const results = await this.#post(todo.map((k) => k.body));
        const again: typeof todo = [];
        results.forEach((result, i) => {
          const item = todo[i];
          if (result.reason === 'queue_timeout' && attempt < this.#retries) again.push(item);
          else item.pending.resolve(result);
        });
        todo = again;
      } catch (error) {
        lastError = error as Error;
        if ((error as { fatal?: boolean }).fatal) break;
      }
    }
    for (const item of todo) {
      item.pending.reject(new Error(`sandbox ${this.url}: ${lastError?.message ?? 'gave up after retries'}`));
    }
  }

  async #post(submissions: Submission[]): Promise<SubmissionResult[]> {
    const response = await fetch(`${this.url}/run/long-batch`, {
      method: 'POST',
      headers: this.#headers,
      body: JSON.stringify({ type: 'batch', submissions }),
      signal: AbortSignal.timeout(this.#timeoutMs),
    });
    const text = await response.text();
    if (!response.ok) {
      const error = new Error(`HTTP ${response.status}: ${text.slice(0, 200)}`);
      // Auth and request errors will not get better by asking again; overload (503) will.
      if (
        response.status === 401 ||
        response.status === 403 ||
        response.status === 422 ||
        response.status === 400
      ) {
        Object.assign(error, { fatal: true });
      }
      throw error;
    }
    const parsed = JSON.parse(text) as { results?: SubmissionResult[] };
    if (!Array.isArray(parsed.results) || parsed.results.length !== submissions.length) {
      throw new Error(
        `malformed batch response (${parsed.results?.length ?? 'no'} results for ${submissions.length})`,
      );
    }
    return parsed.results;
  }
}

export { submissionKey } from './key.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
