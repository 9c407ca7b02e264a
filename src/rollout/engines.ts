import type { Generation } from './agent.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import { EngineError, EngineHttp } from './http.js';

export { EngineError };

export type EngineKind = 'sglang' | 'vllm';

export interface SamplingOptions {
  temperature: number;
  topP: number;
  /** Per-request seed, so a rerun samples the same tokens on engines that honour it. */
  seed?: number;
}

/** KV capacity in tokens, as the engine reports it. */
export interface Capacity {
  total: number;
  used: number;
}

/** An engine the scheduler can send turns to. */
export interface EngineClient {
  readonly url: string;
  readonly kind: EngineKind;
  generate(inputIds: readonly number[], maxNewTokens: number, sampling: SamplingOptions): Promise<Generation>;
  /** Scraped KV capacity, or undefined when the engine does not say; `signal` cancels the probe. */
  capacity(signal?: AbortSignal): Promise<Capacity | undefined>;
  /** The model or checkpoint the engine serves (the trajectories' `policy`). */
  model(): Promise<string>;
  /**
   * Loads a checkpoint and resolves once the engine serves it; `version` labels the weights (SGLang's
   * weight_version), so rollout can wait for a policy and stamp what generated a trajectory.
   */
  reload(checkpoint: string, version?: string): Promise<void>;
  /**
   * The label of the weights served now, or undefined when the engine keeps none (vLLM, or a route
   * it answers 404). An engine that does not answer fails with the cause, never reads as "none".
   */
  weightVersion(): Promise<string | undefined>;
  /** Fails every generation and reload in flight on this engine with `reason` (it stopped answering). */
  abortInflight(reason: string): number;
}

export interface EngineClientOptions {
  /**
   * The engine timeout setting (rollout's `timeoutSeconds`): the longest a generation or a reload
   * may take, and the undici dispatcher's header and body timeouts (default
   * `ROLLOUT_DEFAULTS.timeoutSeconds`, 10 min: a long generation is legitimate).
   */
  timeoutMs?: number;
  /** Timeout for metrics and info requests (default 5 s): an engine that takes longer has stopped answering. */
  probeTimeoutMs?: number;
}

/** The default probe timeout: a health probe that takes longer says the engine stopped answering. */
export const PROBE_TIMEOUT_MS = 5_000;

/** Prometheus text: the first sample of `name` (labels ignored) and the labels of that sample. */
export function promSample(
  text: string,
  name: string,
): { value: number; labels: Record<string, string> } | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== ' ' && rest[0] !== '{') continue;
    const labels: Record<string, string> = {};
    let valuePart = rest;
    if (rest[0] === '{') {
      const close = rest.indexOf('}');
      for (const m of rest.slice(1, close).matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[m[1]] = m[2];
      valuePart = rest.slice(close + 1);
    }
    const value = Number(valuePart.trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) return { value, labels };
  }
  return undefined;
}

function fail(url: string, what: string): never {
  throw new EngineError(`${url}: malformed response: ${what}`, false);
}

/** What both clients share: the engine's URL and its HTTP, with the generation and probe timeouts. */
abstract class HttpEngine {
  readonly url: string;
  readonly #http: EngineHttp;
  readonly #timeoutMs: number;
  readonly #probeMs: number;

  constructor(url: string, options: EngineClientOptions) {
    this.url = url.replace(/\/+$/, '');
    this.#timeoutMs = options.timeoutMs ?? ROLLOUT_DEFAULTS.timeoutSeconds * 1000;
    this.#probeMs = options.probeTimeoutMs ?? PROBE_TIMEOUT_MS;
    this.#http = new EngineHttp(this.url, this.#timeoutMs);
  }

  /** A generation or a reload: up to the engine timeout, aborted when the engine is given up on. */
  protected post(path: string, body: unknown): Promise<unknown> {
    return this.#http.request('POST', path, { body, timeoutMs: this.#timeoutMs, abortable: true });
  }

  /** Metrics and info: a few seconds at most. */
  protected probe(path: string, signal?: AbortSignal): Promise<unknown> {
    return this.#http.request('GET', path, { timeoutMs: this.#probeMs, signal });
  }

  abortInflight(reason: string): number {
    return this.#http.abortInflight(reason);
  }
}

/** SGLang's native API (and `rstar engine-serve`, which speaks its subset). */
export class SglangClient extends HttpEngine implements EngineClient {
  readonly kind = 'sglang';
  #total: number | undefined;

  constructor(url: string, options: EngineClientOptions = {}) {
    super(url, options);
  }

  async generate(inputIds: readonly number[], maxNewTokens: number, s: SamplingOptions): Promise<Generation> {
    const sampling_params: Record<string, unknown> = {
      max_new_tokens: maxNewTokens,
      temperature: s.temperature,
      top_p: s.topP,
      skip_special_tokens: false,
      no_stop_trim: true,
    };
    if (s.seed !== undefined) sampling_params.sampling_seed = s.seed;
    const out = (await this.post('/generate', {
      input_ids: inputIds,
      sampling_params,
      return_logprob: true,
    })) as {
      output_ids?: number[];
      meta_info?: {
        output_token_logprobs?: [number | null, number, unknown][];
        finish_reason?: { type?: string } | null;
        weight_version?: unknown;
      };
    };
    const lps = out?.meta_info?.output_token_logprobs;
    if (!Array.isArray(lps)) fail(this.url, 'meta_info.output_token_logprobs missing');
    const ids = Array.isArray(out.output_ids) ? out.output_ids : lps.map((x) => x[1]);
    if (ids.length !== lps.length) fail(this.url, `${ids.length} output_ids but ${lps.length} logprobs`);
    for (const [i, x] of lps.entries())
      if (x[1] !== ids[i]) fail(this.url, `logprob ${i} is for another token`);
    const type = out.meta_info?.finish_reason?.type;
    if (type === 'abort') throw new EngineError(`${this.url}: generation aborted`);
    if (ids.length > maxNewTokens) fail(this.url, `${ids.length} tokens for max_new_tokens ${maxNewTokens}`);
    const gen: Generation = {
      ids,
      logprobs: lps.map((x) => x[0] ?? 0),
      finishReason: type === 'length' ? 'length' : 'stop',
    };
    const version = out.meta_info?.weight_version;
    if (typeof version === 'string') gen.weightVersion = version;
    return gen;
  }

  async capacity(signal?: AbortSignal): Promise<Capacity | undefined> {
    if (this.#total === undefined) {
      const info = (await this.probe('/get_server_info', signal)) as {
        max_total_num_tokens?: number;
      };
      const total = info?.max_total_num_tokens;
      if (typeof total !== 'number') return undefined;
      this.#total = total;
    }
    // A dead engine must fail here (the runner probes with this); a missing endpoint is fine.
    const metrics = await this.probe('/metrics', signal).catch((e: EngineError) => {
      if (e.retryable) throw e;
      return '';
    });
    const used =
      typeof metrics === 'string' ? promSample(metrics, 'sglang:num_used_tokens')?.value : undefined;
    return { total: this.#total, used: used ?? 0 };
  }

  async model(): Promise<string> {
    const info = (await this.probe('/get_model_info').catch(() => undefined)) as
      | { model_path?: string }
      | undefined;
    return info?.model_path ?? this.url;
  }

  async reload(checkpoint: string, version?: string): Promise<void> {
    const body: Record<string, string> = { model_path: checkpoint };
    if (version !== undefined) body.weight_version = version;
    const out = (await this.post('/update_weights_from_disk', body)) as {
      success?: boolean;
      message?: string;
    };
    if (out?.success === false)
      throw new EngineError(`${this.url}: reload failed: ${out.message ?? ''}`, false);
  }

  /**
   * SGLang's `GET /get_weight_version` (and engine-serve's); undefined on a server without it (a
   * 4xx). A timeout, a refused connection or a 5xx is thrown with its cause: it says nothing about
   * whether the engine keeps a version.
   */
  async weightVersion(): Promise<string | undefined> {
    const out = (await this.probe('/get_weight_version').catch((e: unknown) => {
      if (e instanceof EngineError && !e.retryable) return undefined;
      throw e;
    })) as { weight_version?: unknown } | undefined;
    return typeof out?.weight_version === 'string' ? out.weight_version : undefined;
  }
}

/** vLLM's OpenAI server (>= 0.10.2 for `return_token_ids`). */
export class VllmClient extends HttpEngine implements EngineClient {
  readonly kind = 'vllm';
  #model: string | undefined;

  constructor(url: string, options: EngineClientOptions = {}) {
    super(url, options);
  }

  async model(): Promise<string> {
    if (this.#model === undefined) {
      const list = (await this.probe('/v1/models')) as { data?: { id?: string }[] };
      const id = list?.data?.[0]?.id;
      if (typeof id !== 'string') fail(this.url, '/v1/models lists no model');
      this.#model = id;
    }
    return this.#model;
  }

  async generate(inputIds: readonly number[], maxNewTokens: number, s: SamplingOptions): Promise<Generation> {
    const body: Record<string, unknown> = {
      model: await this.model(),
      prompt: inputIds,
      max_tokens: maxNewTokens,
      temperature: s.temperature,
      top_p: s.topP,
      logprobs: 0,
      return_token_ids: true,
      skip_special_tokens: false,
      spaces_between_special_tokens: false,
    };
    if (s.seed !== undefined) body.seed = s.seed;
    const out = (await this.post('/v1/completions', body)) as {
      choices?: {
        token_ids?: number[];
        finish_reason?: string;
        logprobs?: { token_logprobs?: (number | null)[] };
      }[];
    };
    const choice = out?.choices?.[0];
    const ids = choice?.token_ids;
    const lps = choice?.logprobs?.token_logprobs;
    if (!Array.isArray(ids))
      fail(this.url, 'choices[0].token_ids missing (vLLM >= 0.10.2 with return_token_ids)');
    if (!Array.isArray(lps) || lps.length !== ids.length)
      fail(this.url, 'choices[0].logprobs.token_logprobs');
    return {
      ids,
      logprobs: lps.map((x) => x ?? 0),
      finishReason: choice?.finish_reason === 'length' ? 'length' : 'stop',
    };
  }

  async capacity(signal?: AbortSignal): Promise<Capacity | undefined> {
    const text = await this.probe('/metrics', signal);
    if (typeof text !== 'string') return undefined;
    const usage =
      promSample(text, 'vllm:kv_cache_usage_perc') ?? promSample(text, 'vllm:gpu_cache_usage_perc');
    const config = promSample(text, 'vllm:cache_config_info');
    const blocks = Number(config?.labels.num_gpu_blocks);
    const blockSize = Number(config?.labels.block_size);
    if (usage === undefined || !(blocks > 0) || !(blockSize > 0)) return undefined;
    const total = blocks * blockSize;
    return { total, used: Math.round(usage.value * total) };
  }

  /**
   * vLLM's documented in-place reload: the worker method `reload_weights` with a `weights_path`
   * (vLLM's layerwise-reload design doc), called on every worker through `POST /collective_rpc`,
   * then `POST /reset_prefix_cache` (cached prefixes were computed with the old weights). Both
   * routes exist only when the server runs with `VLLM_SERVER_DEV_MODE=1`; without it they answer
   * 404, and the error says so.
   */
  async reload(checkpoint: string): Promise<void> {
    const devMode = (e: unknown): never => {
      if (e instanceof EngineError && / HTTP 404: /.test(e.message))
        throw new EngineError(
          `${this.url}: vLLM's /collective_rpc and /reset_prefix_cache need the server started with ` +
            'VLLM_SERVER_DEV_MODE=1 (and a vLLM whose workers have reload_weights(weights_path)); ' +
            'otherwise restart vLLM on the checkpoint (see docs/rollout.md)',
          false,
        );
      throw e;
    };
    const out = (await this.post('/collective_rpc', {
      method: 'reload_weights',
      kwargs: { weights_path: checkpoint },
    }).catch(devMode)) as { results?: unknown } | string;
    if (typeof out === 'object' && out !== null && 'results' in out && !Array.isArray(out.results))
      fail(this.url, '/collective_rpc results');
    await this.post('/reset_prefix_cache', {}).catch(devMode);
  }

  /** vLLM labels no weights: rollout cannot wait for a policy version on it. */
  async weightVersion(): Promise<string | undefined> {
    return undefined;
  }
}

export function engineClient(url: string, kind: EngineKind, options: EngineClientOptions = {}): EngineClient {
  return kind === 'vllm' ? new VllmClient(url, options) : new SglangClient(url, options);
}
