import { existsSync } from 'node:fs';
import { join } from 'node:path';
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
  /**
   * LoRA: the policy the request must be served by. The request names the adapter (SGLang's
   * `lora_path`, vLLM's `model`) and a reply from anything else is refused with `PolicyMismatch`.
   */
  policy?: LoraPolicy;
}

/** A LoRA run's policy: an adapter the engines serve, or the base (`adapter` undefined: step 0, B = 0). */
export interface LoraPolicy {
  adapter?: string;
  /** Its weight_version: the step the adapter was trained to. */
  version: string;
}

/** The adapter name of step N: a new name per step, so no engine reuses a prefix cached under another (vLLM #42125). */
export function adapterName(step: number): string {
  return `rstar-lora-step-${step}`;
}

/** The step of an adapter named by `adapterName`, or undefined. */
export function adapterStep(name: string): number | undefined {
  const m = /^rstar-lora-step-(\d+)$/.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** A LoRA adapter folder in PEFT's format (what train-step --lora-rank checkpoints), not a full checkpoint. */
export function isAdapterFolder(folder: string): boolean {
  return existsSync(join(folder, 'adapter_config.json'));
}

/**
 * Makes `engine` serve `folder` as weight_version `version`: a full checkpoint reloaded in place, an
 * adapter folder loaded beside the base as `adapterName(version)` (the base is never sent again).
 * `replace`: an adapter of that name the engine may still hold (a resumed run) is unloaded first.
 */
export async function serveCheckpoint(
  engine: EngineClient,
  folder: string,
  version?: string,
  replace = false,
): Promise<void> {
  if (!isAdapterFolder(folder)) return engine.reload(folder, version);
  if (version === undefined || !/^\d+$/.test(version))
    throw new EngineError(
      `${folder}: an adapter is served as rstar-lora-step-N: its weight version must be a step number (--weight-version N), got ${JSON.stringify(version)}`,
      false,
    );
  const name = adapterName(Number(version));
  if (replace)
    await engine.unloadAdapter(name).catch((e: unknown) => {
      if (!(e instanceof EngineError) || e.retryable) throw e; // a 4xx: it held none of that name
    });
  await engine.loadAdapter(name, folder, version);
}

/** The policy of version V in a LoRA run: the base for 0 (its adapter has B = 0), else step V's adapter. */
export function loraPolicy(version: number): LoraPolicy {
  return version === 0 ? { version: '0' } : { adapter: adapterName(version), version: String(version) };
}

/**
 * A reply served by another policy than the request named (the base, or a stale adapter): never
 * kept, the trajectory ends with `finish: "error"` (kind engine).
 */
export class PolicyMismatch extends EngineError {
  override name = 'PolicyMismatch';
  constructor(message: string) {
    super(message, false);
  }
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
  /**
   * Loads a LoRA adapter folder (PEFT's format) under `name` and resolves once requests may name it;
   * `version` is its step, which the engine then reports as its weight_version.
   */
  loadAdapter(name: string, path: string, version: string): Promise<void>;
  /** Unloads adapter `name`: requests naming it fail from now on. */
  unloadAdapter(name: string): Promise<void>;
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
    const body: Record<string, unknown> = { input_ids: inputIds, sampling_params, return_logprob: true };
    if (s.policy?.adapter !== undefined) body.lora_path = s.policy.adapter;
    const out = (await this.post('/generate', body)) as {
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
    if (s.policy !== undefined && version !== s.policy.version) {
      throw new PolicyMismatch(
        `${this.url}: asked for ${s.policy.adapter ?? 'the base model'} (weight_version ${s.policy.version}) ` +
          `but the reply is from weight_version ${JSON.stringify(version)}: refused, never trained on`,
      );
    }
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

  /**
   * SGLang's `POST /load_lora_adapter` {lora_name, lora_path}, then `POST /update_weight_version`
   * (SGLang's weight_version is the server's label, not the adapter's: it says the newest adapter).
   */
  async loadAdapter(name: string, path: string, version: string): Promise<void> {
    const out = (await this.post('/load_lora_adapter', { lora_name: name, lora_path: path }).catch(
      (e: unknown) => {
        throw e instanceof EngineError
          ? new EngineError(`${this.url}: load_lora_adapter ${name}: ${e.message}`, false)
          : e;
      },
    )) as { success?: boolean; error_message?: string };
    if (out?.success !== true)
      throw new EngineError(
        `${this.url}: load_lora_adapter ${name} failed: ${out?.error_message ?? ''}`,
        false,
      );
    const v = (await this.post('/update_weight_version', {
      new_version: version,
      abort_all_requests: false,
    })) as { success?: boolean; message?: string };
    if (v?.success === false)
      throw new EngineError(
        `${this.url}: update_weight_version ${version} failed: ${v.message ?? ''}`,
        false,
      );
  }

  async unloadAdapter(name: string): Promise<void> {
    const out = (await this.post('/unload_lora_adapter', { lora_name: name })) as {
      success?: boolean;
      error_message?: string;
    };
    if (out?.success === false)
      throw new EngineError(
        `${this.url}: unload_lora_adapter ${name} failed: ${out.error_message ?? ''}`,
        false,
      );
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
      const list = (await this.probe('/v1/models')) as { data?: { id?: string; parent?: string | null }[] };
      // with adapters loaded /v1/models lists them too, each with its base as `parent`
      const id = list?.data?.find((m) => !m.parent)?.id;
      if (typeof id !== 'string') fail(this.url, '/v1/models lists no model');
      this.#model = id;
    }
    return this.#model;
  }

  async generate(inputIds: readonly number[], maxNewTokens: number, s: SamplingOptions): Promise<Generation> {
    const body: Record<string, unknown> = {
      model: s.policy?.adapter ?? (await this.model()),
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
      model?: unknown;
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
    const gen: Generation = {
      ids,
      logprobs: lps.map((x) => x ?? 0),
      finishReason: choice?.finish_reason === 'length' ? 'length' : 'stop',
    };
    if (s.policy !== undefined) {
      // vLLM keeps no weight versions: the reply's `model` names what served it (the adapter or the base)
      if (out.model !== body.model) {
        throw new PolicyMismatch(
          `${this.url}: asked for model ${JSON.stringify(body.model)} (weight_version ${s.policy.version}) ` +
            `but the reply is from ${JSON.stringify(out.model)}: refused, never trained on`,
        );
      }
      gen.weightVersion = s.policy.version;
    }
    return gen;
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

  /**
   * vLLM labels no weights; with LoRA adapters named by `adapterName` loaded, the newest one's step
   * (from `/v1/models`, which lists them). Without any: undefined, so rollout cannot wait on it.
   */
  async weightVersion(): Promise<string | undefined> {
    const list = (await this.probe('/v1/models')) as { data?: { id?: string }[] };
    const steps = (list?.data ?? [])
      .map((m) => (typeof m.id === 'string' ? adapterStep(m.id) : undefined))
      .filter((n): n is number => n !== undefined);
    return steps.length > 0 ? String(Math.max(...steps)) : undefined;
  }

  /**
   * vLLM's `POST /v1/load_lora_adapter` {lora_name, lora_path} (the server needs `--enable-lora` and
   * `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; it answers 404 without the latter).
   */
  async loadAdapter(name: string, path: string): Promise<void> {
    await this.post('/v1/load_lora_adapter', { lora_name: name, lora_path: path }).catch((e: unknown) => {
      if (e instanceof EngineError && / HTTP 404: /.test(e.message))
        throw new EngineError(
          `${this.url}: vLLM's /v1/load_lora_adapter needs the server started with --enable-lora and ` +
            'VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (see docs/gpu.md)',
          false,
        );
      throw e instanceof EngineError
        ? new EngineError(`${this.url}: load_lora_adapter ${name}: ${e.message}`, false)
        : e;
    });
  }

  async unloadAdapter(name: string): Promise<void> {
    await this.post('/v1/unload_lora_adapter', { lora_name: name });
  }
}

/**
 * `engine` whose every generation asks for `policy` (rollout --lora): the requests name the adapter,
 * and a reply from any other policy is refused.
 */
export function servingPolicy(engine: EngineClient, policy: LoraPolicy): EngineClient {
  return {
    get url() {
      return engine.url;
    },
    get kind() {
      return engine.kind;
    },
    generate: (ids, maxNew, s) => engine.generate(ids, maxNew, { ...s, policy }),
    capacity: (signal) => engine.capacity(signal),
    model: () => engine.model(),
    reload: (checkpoint, version) => engine.reload(checkpoint, version),
    weightVersion: () => engine.weightVersion(),
    abortInflight: (reason) => engine.abortInflight(reason),
    loadAdapter: (name, path, version) => engine.loadAdapter(name, path, version),
    unloadAdapter: (name) => engine.unloadAdapter(name),
  };
}

export function engineClient(url: string, kind: EngineKind, options: EngineClientOptions = {}): EngineClient {
  return kind === 'vllm' ? new VllmClient(url, options) : new SglangClient(url, options);
}
