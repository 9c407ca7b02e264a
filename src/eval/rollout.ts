import { DataError } from '../errors.js';
import type { Problem } from '../records/problem.js';
import { Trajectory } from '../records/trajectory.js';
import type { RolloutOptions } from '../rollout/index.js';
import { progressOnStderr, type SharedRolloutFlags, sharedSettings } from '../rollout/options.js';
import { emptyCounts, type ToolCacheCounts } from '../rollout/tool-cache.js';
import { startSandbox } from '../sandbox/embedded.js';
import type { Sourced } from './run.js';

/** Rolls benchmarks out in-process over one shared set of engine clients, tokenizer and sandbox. */
export interface Roller {
  trajectories(benchmark: string, problems: Problem[]): AsyncGenerator<Sourced>;
  /** With `--tool-cache group`: what the cache did for a benchmark rolled out (hits, audited, mismatches). */
  toolCache(benchmark: string): ToolCacheCounts | undefined;
  close(): Promise<void>;
}

/**
 * Loads src/rollout lazily (the tokenizer and engine clients are not needed by
 * `--from-trajectories` or `--compare`) and prepares what every benchmark's rollout shares.
 */
export async function openRoller(flags: SharedRolloutFlags & { tokenizer: string }): Promise<Roller> {
  const mod = await import('../rollout/index.js');
  const protocol = await mod.loadProtocol(flags.tokenizer, {
    chatTemplate: flags.chatTemplate,
    toolState: flags.toolState,
  });
  const engines = flags.engine.map((url) =>
    mod.engineClient(url, flags.engineKind, { timeoutMs: flags.engineTimeout * 1000 }),
  );
  // Without --sandbox, eval starts an embedded sandbox-serve for the run.
  const embedded = flags.sandbox === undefined ? await startSandbox() : undefined;
  const sandbox = flags.sandbox ?? (embedded?.url as string);
  const onProgress = progressOnStderr();
  const options: RolloutOptions = { ...sharedSettings(flags), engines, sandbox, protocol, onProgress };
  const counts = new Map<string, ToolCacheCounts>();
  return {
    async *trajectories(benchmark, problems) {
      let index = 0;
      // In session mode too: there a cell is shared only with its whole history.
      const toolCacheCounts = flags.toolCache === 'group' ? emptyCounts() : undefined;
      if (toolCacheCounts) counts.set(benchmark, toolCacheCounts);
      for await (const value of mod.rollout(problems, { ...options, toolCacheCounts })) {
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
      if (onProgress) process.stderr.write('\n');
    },
    toolCache: (benchmark) => counts.get(benchmark),
    async close() {
      await embedded?.close();
    },
  };
}
