/**
 * Every default of a rollout, for the flags and for `rollout()`, `runAgent` and the engine clients.
 * A leaf: it imports nothing from src/rollout, so the modules that read a default (engines, agent,
 * protocol, ...) do not import the flags module, which imports their types (an import circle).
 * options.ts checks the enum values against their types.
 */
import { DEFAULT_TOOL_RESPONSE_CHARS } from '../sandbox/tool-response.js';

export const ROLLOUT_DEFAULTS = {
  engineKind: 'sglang',
  chatTemplate: 'rstar2',
  /** Samples per problem of `rollout` (eval's own default is `EVAL_SAMPLES`). */
  n: 1,
  maxTurns: 5,
  maxTokens: 8192,
  temperature: 1,
  topP: 1,
  maxParallelCalls: 1,
  toolResponseMaxChars: DEFAULT_TOOL_RESPONSE_CHARS,
  maxInvalidCalls: 0,
  maxErrorShare: 0.1,
  schedule: 'kv',
  concurrency: 1024,
  scrapeMs: 1000,
  /** One engine request (`--engine-timeout`). */
  timeoutSeconds: 600,
  compat: 'strict',
  toolCache: 'off',
  toolCacheAudit: 0,
  /** `--tool-state`: each call in a fresh interpreter (the release), or a trajectory's calls in one session. */
  toolState: 'stateless',
} as const;
