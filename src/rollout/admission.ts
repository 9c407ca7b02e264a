import type { Problem } from '../records/problem.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import type { EngineClient } from './engines.js';
import { AsyncScheduler, type Policy, Scheduler, type TurnRequest } from './scheduler.js';
import { priorFor } from './scheduler-prior.js';

/** One trajectory to generate: sample `sample` of `problem`, the `group`-th problem of the batch. */
export interface Job {
  problem: Problem;
  group: number;
  sample: number;
  id: string;
}

/** An assistant turn waiting for an engine, with the context it continues. */
export interface Turn extends TurnRequest {
  ids: readonly number[];
}

/** The batch's jobs in submission order: `n` samples per problem, minus the ids already written (resume). */
export function expandJobs(problems: readonly Problem[], n: number, skip?: ReadonlySet<string>): Job[] {
  const jobs: Job[] = [];
  problems.forEach((problem, group) => {
    for (let sample = 0; sample < n; sample++) {
      const id = `${problem.id}/${sample}`;
      if (!skip?.has(id)) jobs.push({ problem, group, sample, id });
    }
  });
  return jobs;
}

export interface AdmissionOptions {
  schedule?: Policy;
  concurrency?: number;
  lengths?: ReadonlyMap<string, number>;
}

/**
 * The scheduler that admits trajectories and places their turns: sized by each engine's KV
 * capacity as first scraped (an engine that does not answer counts as unbounded until it does),
 * at most `concurrency` trajectories under way, and `kv` ranking problems by `lengths` if given.
 */
export async function openAdmission(
  engines: readonly EngineClient[],
  problems: readonly Problem[],
  options: AdmissionOptions,
  clock: () => number,
): Promise<{ core: Scheduler<Turn>; scheduler: AsyncScheduler<Turn> }> {
  const capacities = await Promise.all(engines.map((e) => e.capacity().catch(() => undefined)));
  const core = new Scheduler<Turn>(
    capacities.map((c) => c?.total ?? Number.POSITIVE_INFINITY),
    {
      policy: options.schedule ?? ROLLOUT_DEFAULTS.schedule,
      clock,
      maxActive: Math.max(1, options.concurrency ?? ROLLOUT_DEFAULTS.concurrency),
      prior: options.lengths
        ? priorFor(
            problems.map((p) => p.id),
            options.lengths,
          )
        : undefined,
    },
  );
  capacities.forEach((c, e) => {
    if (c !== undefined) core.observe(e, c);
  });
  return { core, scheduler: new AsyncScheduler(core) };
}
