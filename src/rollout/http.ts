/**
 * HTTP to one engine: every request goes through the client's own undici dispatcher, whose header
 * and body timeouts are the engine timeout setting. Node's global `fetch` would cap every request
 * at undici's hidden 300 s header timeout, below the documented 600 s default; with an explicit
 * dispatcher only the setting decides. Errors name the request and the real cause
 * (`GET /get_weight_version timed out after 5 s`), and a caller can abort the requests in flight
 * when it gives up on the engine (a hung engine never answers them).
 */
import { Agent, fetch } from 'undici';

/** An engine that answered with an HTTP error or malformed data, or not at all: retried, never silently used. */
export class EngineError extends Error {
  override name = 'EngineError';
  constructor(
    message: string,
    /** false when the request may not be resent (a 4xx: the request itself is wrong). */
    readonly retryable = true,
  ) {
    super(message);
  }
}

/** `5 s`, `1.5 s`: how an error says a duration. */
const seconds = (ms: number): string => `${Number((ms / 1000).toFixed(3))} s`;

/** undici's timeout codes: the engine sent no headers, or stopped sending the body, in time. */
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']);

/** The dispatcher's timeouts for an engine timeout setting: the setting, never undici's defaults. */
function dispatcherTimeouts(timeoutMs: number): { headersTimeout: number; bodyTimeout: number } {
  return { headersTimeout: timeoutMs, bodyTimeout: timeoutMs };
}

export interface RequestOptions {
  body?: unknown;
  timeoutMs: number;
  /** Abort it with `abortInflight` (generation and reloads; short probes just time out). */
  abortable?: boolean;
  /** The caller's own cancellation (a health monitor that stops). */
  signal?: AbortSignal;
}

export class EngineHttp {
  readonly #agent: Agent;
  readonly #inflight = new Set<AbortController>();

  /** `timeoutMs`: the longest any request may take (the engine timeout setting). */
  constructor(
    readonly base: string,
    timeoutMs: number,
  ) {
    this.#agent = new Agent(dispatcherTimeouts(timeoutMs));
  }

  async request(method: 'GET' | 'POST', path: string, options: RequestOptions): Promise<unknown> {
    const what = `${this.base}: ${method} ${path}`;
    const deadline = AbortSignal.timeout(options.timeoutMs);
    const own = options.abortable ? new AbortController() : undefined;
    if (own) this.#inflight.add(own);
    const signals = [deadline, own?.signal, options.signal].filter((x) => x !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : deadline;
    const failure = (error: unknown): EngineError => {
      if (own?.signal.aborted) return new EngineError(`${what}: ${String(own.signal.reason)}`);
      if (options.signal?.aborted) return new EngineError(`${what}: cancelled`);
      const code = (error as { cause?: { code?: string } }).cause?.code ?? (error as { code?: string }).code;
      if (deadline.aborted || (code !== undefined && TIMEOUT_CODES.has(code)))
        return new EngineError(`${what} timed out after ${seconds(options.timeoutMs)}`);
      const cause = (error as { cause?: Error }).cause;
      return new EngineError(`${what} failed: ${cause?.message ?? (error as Error).message}`);
    };
    try {
      let res: Awaited<ReturnType<typeof fetch>>;
      let text: string;
      try {
        res = await fetch(`${this.base}${path}`, {
          method,
          dispatcher: this.#agent,
          signal,
          ...(options.body === undefined
            ? {}
            : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(options.body) }),
        });
        text = await res.text();
      } catch (error) {
        throw failure(error);
      }
      if (!res.ok) {
        throw new EngineError(
          `${what}: HTTP ${res.status}: ${text.slice(0, 300)}`,
          res.status >= 500 || res.status === 429,
        );
      }
      if (!(res.headers.get('content-type') ?? '').includes('json')) return text;
      try {
        return JSON.parse(text);
      } catch {
        throw new EngineError(`${what}: invalid JSON response`);
      }
    } finally {
      if (own) this.#inflight.delete(own);
    }
  }

  /** Aborts every abortable request in flight; each fails with `reason`. Returns how many there were. */
  abortInflight(reason: string): number {
    const n = this.#inflight.size;
    for (const c of this.#inflight) c.abort(reason);
    this.#inflight.clear();
    return n;
  }
}
