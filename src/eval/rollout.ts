import { DataError, UsageError } from '../errors.js';
import type { Problem } from '../records/problem.js';
import { Trajectory } from '../records/trajectory.js';
import type { Sourced } from './run.js';

/** The rollout flags eval passes through, named as `rstar rollout` names them. */
export interface EvalRolloutOptions {
  n: number;
  engines: string[];
  sandbox?: string;
  tokenizer?: string;
  maxTokens?: number;
  maxTurns?: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  schedule?: string;
}

type RolloutFn = (problems: Problem[], options: EvalRolloutOptions) => AsyncIterable<unknown>;

/**
 * Loads `rollout` from src/rollout lazily (a variable specifier keeps tsc from resolving a module
 * that is built separately), so `--from-trajectories` and `--compare` work without it.
 */
async function loadRollout(): Promise<RolloutFn> {
  const specifier = '../rollout/index.js';
  let mod: Record<string, unknown>;
  try {
    mod = (await import(specifier)) as Record<string, unknown>;
  } catch (error) {
    if (
      (error as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' &&
      String(error).includes('rollout/index.js')
    ) {
      throw new UsageError('rollout is not built yet; evaluate saved trajectories with --from-trajectories');
    }
    throw error;
  }
  if (typeof mod.rollout !== 'function') throw new UsageError('src/rollout does not export rollout()');
  return mod.rollout as RolloutFn;
}

/** Runs rollout in-process and checks each trajectory against the record schema. */
export async function* rolloutTrajectories(
  benchmark: string,
  problems: Problem[],
  options: EvalRolloutOptions,
): AsyncGenerator<Sourced> {
  const rollout = await loadRollout();
  let index = 0;
  for await (const value of rollout(problems, options)) {
    index += 1;
    const where = `rollout:${benchmark}#${index}`;
    const parsed = Trajectory.safeParse(value);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw new DataError(`${where}: ${issue.path.map(String).join('.') || '(record)'}: ${issue.message}`);
    }
    yield { trajectory: parsed.data, where };
  }
}
