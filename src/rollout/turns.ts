import { createHash } from 'node:crypto';
import type { Job, Turn } from './admission.js';
import { AgentAbort, type Generation, ServiceFailure } from './agent.js';
import type { EngineHealth } from './engine-health.js';
import { type EngineClient, EngineError, PolicyMismatch, type SamplingOptions } from './engines.js';
import type { ProgressMeter } from './progress.js';
import type { Assignment, AsyncScheduler } from './scheduler.js';

/** What generating one turn needs of the run. */
export interface TurnContext {
  engines: readonly EngineClient[];
  scheduler: AsyncScheduler<Turn>;
  health: EngineHealth<Turn>;
  meter: ProgressMeter;
  sampling: { temperature: number; topP: number };
  /** Base seed of the per-request seeds. */
  seed?: number;
  /** Consecutive retryable failures of one turn before its trajectory ends with `finish: "error"`. */
  maxAttempts: number;
  /** True once the rollout is over (finished, abandoned or failed): no turn is sent any more. */
  ended(): boolean;
}

/** Each request's seed: derived from the base seed, the trajectory id and the turn, so reruns repeat. */
export function requestSeed(seed: number, id: string, turn: number): number {
  const h = createHash('sha256').update(`${seed}\0${id}\0${turn}`).digest();
  return h.readUInt32LE(0) & 0x7fffffff;
}

/**
 * Generates one turn of `job` on the engine the scheduler assigns. A retryable engine error sets
 * that engine aside and puts the turn back in the queue (backing off 200 ms .. 3 s) up to
 * `maxAttempts` times, after which the trajectory ends as the engines' failure (`ServiceFailure`).
 */
export async function generateTurn(
  run: TurnContext,
  job: Job,
  ids: readonly number[],
  maxNew: number,
  turn: number,
): Promise<{ gen: Generation; assignment: Assignment<Turn> }> {
  if (run.ended()) throw new AgentAbort('rollout stopped');
  const request: Turn = { key: job.id, group: job.group, contextLen: ids.length, maxNewTokens: maxNew, ids };
  let a = await run.scheduler.acquire(request);
  if (run.ended()) {
    // The rollout ended while this turn waited for its engine: nothing is sent.
    run.scheduler.release(a);
    throw new AgentAbort('rollout stopped');
  }
  const s: SamplingOptions = { ...run.sampling };
  if (run.seed !== undefined) s.seed = requestSeed(run.seed, job.id, turn);
  for (let attempt = 1; ; attempt++) {
    try {
      const gen = await run.engines[a.engine].generate(ids, maxNew, s);
      run.scheduler.release(a);
      return { gen, assignment: a };
    } catch (error) {
      if (error instanceof PolicyMismatch) {
        // sampled by another policy than asked (LoRA): off-policy tokens are never kept
        run.scheduler.release(a);
        throw new ServiceFailure('engine', error.message);
      }
      if (!(error instanceof EngineError) || !error.retryable || attempt >= run.maxAttempts) {
        run.scheduler.release(a);
        if (error instanceof EngineError && error.retryable) {
          throw new ServiceFailure('engine', `${error.message} (${attempt} attempts)`);
        }
        throw error;
      }
      run.health.setAside(a.engine, error.message);
      run.meter.report();
      await new Promise((resolve) => setTimeout(resolve, Math.min(100 * 2 ** attempt, 3000)));
      a = await run.scheduler.retry(a);
    }
  }
}
