import { randomUUID } from 'node:crypto';
import type { Submission, SubmissionResult } from '../records/sandbox.js';

export interface SandboxClientOptions {
  /** Bearer token for a sandbox bound to a non-loopback address. */
  token?: string;
  /** Per HTTP request; a batch that takes longer is retried (never re-run: see below). */
  timeoutMs?: number;
  /** How many times a call answered `queue_timeout` (or a failed request) is sent again. */
  retries?: number;
  /**
   * Reject (with a `SandboxError`) a call still answered `queue_timeout` or `internal_error` after
   * the retries, instead of resolving with that result. Rollout sets it: the service's own failure
   * must not reach the model as if its code had failed. Default false (`sandbox-run` prints results).
   */
  rejectServiceFailures?: boolean;
}

/**
 * Why the sandbox service (not the code it ran) failed a call: `auth` (401/403: a missing or wrong
 * token; retrying cannot help), `unavailable` (unreachable, 5xx, the request timed out, a
 * malformed answer), `internal` (the call kept coming back `internal_error` or `queue_timeout`).
 */
export type SandboxErrorKind = 'auth' | 'unavailable' | 'internal';

export class SandboxError extends Error {
  override name = 'SandboxError';
  constructor(
    readonly kind: SandboxErrorKind,
    readonly url: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * A session the service does not have (closed, expired, lost with its worker, never made): its
 * calls cannot run, and retrying cannot help. Never a silent fresh interpreter.
 */
export class SessionLost extends SandboxError {
  override name = 'SessionLost';
  constructor(
    url: string,
    readonly sessionId: string,
    message: string,
  ) {
    super('internal', url, message);
  }
}

/** Options of a new session. */
export interface SessionOptions {
  /** Files of its working directory: name -> base64 content. */
  files?: Record<string, string>;
}

/** Result reasons that report the service's failure, not the code's: retried with the same sub_id. */
export const SERVICE_REASONS: ReadonlySet<string> = new Set(['queue_timeout', 'internal_error']);

const authError = (url: string, status: number, text: string): SandboxError =>
  new SandboxError(
    'auth',
    url,
    `sandbox ${url} refused the request (HTTP ${status}: ${text.slice(0, 200)}): ` +
      'give its token with --sandbox-token or the RSTAR_SANDBOX_TOKEN environment variable',
  );

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
  #rejectService: boolean;
  #pending: Pending[] = [];
  #scheduled = false;
  #inflight = new Set<Promise<void>>();
  #closed = false;

  constructor(url: string, options: SandboxClientOptions = {}) {
    this.url = url.replace(/\/+$/, '');
    this.#headers = { 'content-type': 'application/json' };
    if (options.token) this.#headers.authorization = `Bearer ${options.token}`;
    this.#timeoutMs = options.timeoutMs ?? 600_000;
    this.#retries = options.retries ?? 5;
    this.#rejectService = options.rejectServiceFailures ?? false;
  }

  /**
   * Checks the token before any call: an empty batch is refused with 401/403 by a server that
   * wants another token (a `SandboxError` of kind `auth`) and with 422 otherwise. An unreachable
   * server passes here; its calls fail (and are retried) later.
   */
  async checkAuth(): Promise<void> {
    let response: Response;
    try {
      response = await fetch(`${this.url}/run/long-batch`, {
        method: 'POST',
        headers: this.#headers,
        body: JSON.stringify({ type: 'batch', submissions: [] }),
        signal: AbortSignal.timeout(Math.min(this.#timeoutMs, 30_000)),
      });
    } catch {
      return;
    }
    const text = await response.text().catch(() => '');
    if (response.status === 401 || response.status === 403) throw authError(this.url, response.status, text);
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

  /** A new stateful session; send its id as the `session_id` of submissions to run cells there. */
  async createSession(options: SessionOptions = {}): Promise<string> {
    const body = options.files ? { files: options.files } : {};
    const answer = await this.#call('POST', '/sessions', body);
    return (answer as { session_id: string }).session_id;
  }

  /** A new session holding a copy of `id`'s current state (variables and files). */
  async forkSession(id: string): Promise<string> {
    const answer = await this.#call('POST', `/sessions/${encodeURIComponent(id)}/fork`, {}, id);
    return (answer as { session_id: string }).session_id;
  }

  /** Closes a session; one the service no longer has is closed already (no error). */
  async closeSession(id: string): Promise<void> {
    try {
      await this.#call('DELETE', `/sessions/${encodeURIComponent(id)}`, undefined, id);
    } catch (error) {
      if (!(error instanceof SessionLost)) throw error;
    }
  }

  /** One session request, retried while the service is unreachable or overloaded. */
  async #call(method: string, path: string, body: unknown, session?: string): Promise<unknown> {
    let lastError: Error | undefined;
    for (let attempt = 0; attempt <= this.#retries; attempt += 1) {
      if (attempt > 0) await sleep(Math.min(100 * 2 ** (attempt - 1), 5_000));
      let response: Response;
      let text: string;
      try {
        response = await fetch(`${this.url}${path}`, {
          method,
          headers: this.#headers,
          ...(body === undefined ? {} : { body: JSON.stringify(body) }),
          signal: AbortSignal.timeout(Math.min(this.#timeoutMs, 60_000)),
        });
        text = await response.text();
      } catch (error) {
        const cause = (error as { cause?: { code?: string; message?: string } }).cause;
        lastError = new Error(
          `${(error as Error).message}${cause ? ` (${cause.code ?? cause.message})` : ''}`,
        );
        continue;
      }
      if (response.ok) return JSON.parse(text);
      const detail = (() => {
        try {
          return String((JSON.parse(text) as { detail?: unknown }).detail ?? text);
        } catch {
          return text;
        }
      })();
      if (response.status === 401 || response.status === 403)
        throw authError(this.url, response.status, text);
      if (response.status === 404 && session !== undefined)
        throw new SessionLost(this.url, session, `sandbox ${this.url}: ${detail}`);
      if (response.status < 500 || response.status === 501)
        throw new SandboxError(
          'internal',
          this.url,
          `sandbox ${this.url}: ${method} ${path}: HTTP ${response.status}: ${detail}`,
        );
      lastError = new Error(`HTTP ${response.status}: ${detail.slice(0, 200)}`);
    }
    throw new SandboxError(
      'unavailable',
      this.url,
      `sandbox ${this.url}: ${method} ${path}: ${lastError?.message ?? 'failed'} (${this.#retries + 1} attempts)`,
    );
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
          if (result.reason === 'session_not_found') {
            const id = String(item.body.session_id);
            item.pending.reject(
              new SessionLost(
                this.url,
                id,
                `sandbox ${this.url}: ${result.stderr || `session ${id} not found`}`,
              ),
            );
            return;
          }
          const service =
            SERVICE_REASONS.has(result.reason) && (this.#rejectService || result.reason === 'queue_timeout');
          if (service && attempt < this.#retries) again.push(item);
          else if (service && this.#rejectService) {
            item.pending.reject(
              new SandboxError(
                'internal',
                this.url,
                `sandbox ${this.url}: call answered ${result.reason} ${attempt + 1} times`,
              ),
            );
          } else item.pending.resolve(result);
        });
        todo = again;
      } catch (error) {
        lastError = error as Error;
        if (error instanceof SandboxError || (error as { fatal?: boolean }).fatal) break;
      }
    }
    for (const item of todo) {
      if (lastError instanceof SandboxError && lastError.kind === 'auth') item.pending.reject(lastError);
      else if ((lastError as { fatal?: boolean } | undefined)?.fatal)
        item.pending.reject(new Error(`sandbox ${this.url}: ${lastError?.message}`));
      else {
        const why = lastError?.message ?? 'gave up after retries';
        item.pending.reject(
          new SandboxError(
            'unavailable',
            this.url,
            `sandbox ${this.url}: ${why} (${this.#retries + 1} attempts)`,
          ),
        );
      }
    }
  }

  async #post(submissions: Submission[]): Promise<SubmissionResult[]> {
    let response: Response;
    let text: string;
    try {
      response = await fetch(`${this.url}/run/long-batch`, {
        method: 'POST',
        headers: this.#headers,
        body: JSON.stringify({ type: 'batch', submissions }),
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
      text = await response.text();
    } catch (error) {
      // fetch's own message is "fetch failed"; the cause says why (ECONNREFUSED, a reset, a timeout).
      const cause = (error as { cause?: { code?: string; message?: string } }).cause;
      const why = cause?.code ?? cause?.message;
      throw new Error(`${(error as Error).message}${why ? ` (${why})` : ''}`);
    }
    if (!response.ok) {
      if (response.status === 401 || response.status === 403)
        throw authError(this.url, response.status, text);
      const error = new Error(`HTTP ${response.status}: ${text.slice(0, 200)}`);
      // Request errors will not get better by asking again; overload (503) and 5xx may.
      if (response.status === 422 || response.status === 400) Object.assign(error, { fatal: true });
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

/** Text files (name -> UTF-8 text, as a Problem carries them) as the sandbox's `files` (name -> base64); none: undefined. */
export function encodeFiles(files: Record<string, string> | undefined): Record<string, string> | undefined {
  if (!files || Object.keys(files).length === 0) return undefined;
  return Object.fromEntries(
    Object.entries(files).map(([name, text]) => [name, Buffer.from(text, 'utf8').toString('base64')]),
  );
}
