/**
 * The rollout options, owned here: their flags, with the defaults of defaults.ts (declared once; `rstar rollout` and `rstar eval` both add them from here), the parsed flags'
 * types and their mapping onto `RolloutOptions`, and the progress line both commands draw.
 */
import { Option } from 'commander';
import { choice, collect, deprecatedAlias, integer, interactive, number } from '../program.js';
import type { Compat } from '../reward/index.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import type { EngineKind } from './engines.js';
import type { RolloutProgress } from './progress.js';
import { POLICIES, type Policy } from './scheduler.js';
import { TOOL_CACHE_MODES, type ToolCacheMode } from './tool-cache.js';
import { TOOL_STATES, type ToolState } from './tool-state.js';

export { POLICIES, type Policy, ROLLOUT_DEFAULTS };

export const ENGINE_KINDS = ['sglang', 'vllm'] as const satisfies readonly EngineKind[];
export const COMPAT_MODES = ['strict', 'rstar'] as const satisfies readonly Compat[];

/** avg@n over 16 samples, as the paper evaluates. */
export const EVAL_SAMPLES = 16;

/** What the shared flags parse to (commander's camel-cased names). */
export interface SharedRolloutFlags {
  engine: string[];
  engineKind: EngineKind;
  sandbox?: string;
  sandboxToken?: string;
  tokenizer?: string;
  chatTemplate: string;
  n: number;
  maxTurns: number;
  maxTokens: number;
  temperature: number;
  topP: number;
  seed?: number;
  maxInvalidCalls: number;
  rewardTruncated?: boolean;
  maxErrorShare: number;
  schedule: Policy;
  compat: Compat;
  toolCache: ToolCacheMode;
  engineTimeout: number;
  toolCacheAudit: number;
  toolState: ToolState;
}

/** What the flags only `rstar rollout` takes parse to: the runner's knobs eval leaves at their defaults. */
export interface RunnerFlags {
  tools?: string;
  maxParallelCalls: number;
  toolResponseMaxChars: number;
  concurrency: number;
  scrapeMs: number;
  /** Tree rollouts: continuations per failed call (0: off). */
  branch: number;
  branchBudget?: number;
}

const D = ROLLOUT_DEFAULTS satisfies {
  engineKind: EngineKind;
  schedule: Policy;
  compat: Compat;
  toolCache: ToolCacheMode;
  toolState: ToolState;
  [key: string]: string | number;
};

/**
 * The flags both commands take, as fresh Options (a commander Option belongs to one command).
 * `samples` is the command's default `--n`.
 */
export function sharedRolloutOptions(samples: number): Option[] {
  return [
    new Option('--engine <url>', 'inference engine URL (repeatable; engine-serve, SGLang or vLLM)')
      .argParser(collect)
      .default([], 'none'),
    choice('--engine-kind <kind>', 'engine API (engine-serve speaks sglang)', ENGINE_KINDS, D.engineKind),
    new Option('--sandbox <url>', 'sandbox-serve URL; none: start an embedded one'),
    new Option('--sandbox-token <token>', 'bearer token of --sandbox (env RSTAR_SANDBOX_TOKEN)'),
    new Option(
      '--tokenizer <dir>',
      'Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json), or qwen3',
    ),
    new Option('--chat-template <t>', 'rstar2 | model | FILE (a Jinja template)').default(D.chatTemplate),
    new Option('--n <n>', 'samples per problem').argParser(integer(1)).default(samples),
    new Option('--max-turns <n>', 'assistant turns per trajectory').argParser(integer(1)).default(D.maxTurns),
    new Option('--max-tokens <n>', 'response token budget (model + tool tokens)')
      .argParser(integer(1))
      .default(D.maxTokens),
    new Option('--temperature <t>', 'sampling temperature').argParser(number(0)).default(D.temperature),
    new Option('--top-p <p>', 'nucleus sampling').argParser(number(0, 1)).default(D.topP),
    new Option('--seed <s>', 'base seed for per-request seeds').argParser(integer(0)),
    new Option(
      '--max-invalid-calls <n>',
      'end a trajectory (finish invalid_calls) after N consecutive malformed or failing tool calls; 0: no cap',
    )
      .argParser(integer(0))
      .default(D.maxInvalidCalls),
    new Option(
      '--reward-truncated',
      'score length / tool_overflow trajectories like any other (the release); default reward 0',
    ),
    new Option(
      '--max-error-share <x>',
      'fail once more than this share of trajectories failed for infrastructure reasons',
    )
      .argParser(number(0, 1))
      .default(D.maxErrorShare),
    choice('--schedule <policy>', 'engine choice (scheduling policy)', POLICIES, D.schedule),
    choice(
      '--compat <mode>',
      "answer grading: strict, or rstar (the release's lenient grading)",
      COMPAT_MODES,
      D.compat,
    ),
    choice(
      '--tool-cache <mode>',
      "group: a problem's samples share the result of an identical tool call (same code and stdin) instead of running it again, when the program uses only pure modules and its result is reproducible (docs/rollout.md); any other call always runs",
      TOOL_CACHE_MODES,
      D.toolCache,
    ),
    engineTimeout(),
    new Option(
      '--tool-cache-audit <fraction>',
      'with --tool-cache group: run this share of cache hits again for real and compare the outputs; a mismatch is a WARNING',
    )
      .argParser(number(0, 1))
      .default(D.toolCacheAudit),
    toolStateOption(),
  ];
}

/**
 * `--tool-state`, one flag for rollout, eval and sft-data: `session` runs a trajectory's tool calls
 * as the cells of one sandbox session and tells the model so in the tool's description.
 */
export const toolStateOption = (): Option =>
  choice(
    '--tool-state <state>',
    "stateless: every tool call runs in a fresh interpreter (the release); session: a trajectory's calls are the cells of one Python session (variables, imports, functions and files persist), and the tool's description says so",
    TOOL_STATES,
    D.toolState,
  );

const engineTimeout = () =>
  new Option('--engine-timeout <s>', 'one engine request, seconds')
    .argParser(number(1))
    .default(D.timeoutSeconds);

/** The runner's knobs only `rstar rollout` exposes (and rollout's old spelling of --engine-timeout). */
export function runnerOptions(): Option[] {
  return [
    new Option('--tools <file>', 'tool schemas JSON (default: python_code_with_standard_io)'),
    new Option('--max-parallel-calls <n>', 'tool calls executed per turn')
      .argParser(integer(1))
      .default(D.maxParallelCalls),
    new Option('--tool-response-max-chars <n>', 'tool response characters kept (middle-truncated)')
      .argParser(integer(1))
      .default(D.toolResponseMaxChars),
    new Option('--concurrency <n>', 'trajectories in flight').argParser(integer(1)).default(D.concurrency),
    new Option('--scrape-ms <ms>', 'KV capacity scrape interval (0: only at start)')
      .argParser(integer(0))
      .default(D.scrapeMs),
    deprecatedAlias('--timeout <s>', engineTimeout()),
    new Option(
      '--branch <k>',
      "tree rollouts: sample K more continuations from the state just after a sample's first failed tool call (0: off)",
    )
      .argParser(integer(0))
      .default(0),
    new Option(
      '--branch-budget <n>',
      'with --branch: branch samples per step (--steps) or per run; default half the samples (--n x problems)',
    ).argParser(integer(0)),
  ];
}

/** The `RolloutOptions` fields the shared flags set; engines, sandbox and protocol are opened by the caller. */
export function sharedSettings(f: SharedRolloutFlags) {
  return {
    sandboxToken: f.sandboxToken ?? process.env.RSTAR_SANDBOX_TOKEN,
    rewardTruncated: f.rewardTruncated === true,
    maxInvalidCalls: f.maxInvalidCalls,
    maxErrorShare: f.maxErrorShare,
    n: f.n,
    maxTurns: f.maxTurns,
    maxTokens: f.maxTokens,
    temperature: f.temperature,
    topP: f.topP,
    seed: f.seed,
    schedule: f.schedule,
    compat: f.compat,
    toolCache: f.toolCache,
    toolCacheAudit: f.toolCacheAudit,
  };
}

/** One carriage-returned status line: trajectories done, tokens/s, tool calls/s, turns in flight per engine. */
export function progressLine(p: RolloutProgress): string {
  const s = p.elapsedMs / 1000 || 1;
  const load = p.engines.map((e, i) => `e${i}:${e.alive ? `${e.inflight}` : 'down'}`).join(' ');
  return `\r${p.done}/${p.total} trajectories  ${(p.tokens / s).toFixed(0)} tok/s  ${(p.toolCalls / s).toFixed(1)} calls/s  ${load}\x1b[K`;
}

/** Draws the progress line on stderr when a person is watching; undefined (no callback) otherwise. */
export function progressOnStderr(): ((p: RolloutProgress) => void) | undefined {
  return interactive() ? (p) => process.stderr.write(progressLine(p)) : undefined;
}
