import { DataError } from '../errors.js';
import { interactive } from '../program.js';
import type { Problem } from '../records/problem.js';
import { Trajectory } from '../records/trajectory.js';
import type { Policy, RolloutOptions } from '../rollout/index.js';
import { startSandbox } from '../sandbox/embedded.js';
import type { Sourced } from './run.js';
import type { Compat } from './verifier.js';

/** The rollout flags eval takes, named as `rstar rollout` names them. */
export interface EvalRolloutFlags {
  n: number;
  engines: string[];
  engineKind: 'sglang' | 'vllm';
  /** Without one, eval starts an embedded sandbox-serve for the run. */
  sandbox?: string;
  sandboxToken?: string;
  rewardTruncated?: boolean;
  maxInvalidCalls?: number;
  maxErrorShare?: number;
  tokenizer: string;
  chatTemplate?: string;
  maxTokens?: number;
  maxTurns?: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  schedule?: Policy;
  compat: Compat;
}

/** One carriage-returned status line on a TTY stderr (rollout's progress callback). */
function progressLine(p: {
  done: number;
  total: number;
  tokens: number;
  toolCalls: number;
  elapsedMs: number;
}) {
  const rate = p.elapsedMs > 0 ? (1000 * p.tokens) / p.elapsedMs : 0;
  process.stderr.write(
    `\r  ${p.done}/${p.total} trajectories, ${rate.toFixed(0)} tok/s, ${p.toolCalls} tool calls `,
  );
  if (p.done === p.total) process.stderr.write('\n');
}

/** Rolls benchmarks out in-process over one shared set of engine clients, tokenizer and sandbox. */
export interface Roller {
  trajectories(benchmark: string, problems: Problem[]): AsyncGenerator<Sourced>;
  close(): Promise<void>;
}

/**
 * Loads src/rollout lazily (the tokenizer and engine clients are not needed by
 * `--from-trajectories` or `--compare`) and prepares what every benchmark's rollout shares.
 */
export async function openRoller(flags: EvalRolloutFlags): Promise<Roller> {
  const mod = await import('../rollout/index.js');
  const protocol = await mod.loadProtocol(flags.tokenizer, { chatTemplate: flags.chatTemplate });
  const engines = flags.engines.map((url) => mod.engineClient(url, flags.engineKind));
  const embedded = flags.sandbox === undefined ? await startSandbox() : undefined;
  const sandbox = flags.sandbox ?? (embedded?.url as string);
  const options: RolloutOptions = {
    engines,
    sandbox,
    sandboxToken: flags.sandboxToken,
    rewardTruncated: flags.rewardTruncated,
    maxInvalidCalls: flags.maxInvalidCalls,
    maxErrorShare: flags.maxErrorShare,
    protocol,
    n: flags.n,
    maxTokens: flags.maxTokens,
    maxTurns: flags.maxTurns,
    temperature: flags.temperature,
    topP: flags.topP,
    seed: flags.seed,
    schedule: flags.schedule,
    compat: flags.compat,
    onProgress: interactive() ? progressLine : undefined,
  };
  return {
    async *trajectories(benchmark, problems) {
      let index = 0;
      for await (const value of mod.rollout(problems, options)) {
        index += 1;
        const where = `rollout:${benchmark}#${index}`;
        // Checked against the record schema: a contract drift fails here, not in the metrics.
        const parsed = Trajectory.safeParse(value);
        if (!parsed.success) {
          const issue = parsed.error.issues[0];
          throw new DataError(
            `${where}: ${issue.path.map(String).join('.') || '(record)'}: ${issue.message}`,
          );
        }
        yield { trajectory: parsed.data, where };
      }
    },
    async close() {
      await embedded?.close();
    },
  };
}
