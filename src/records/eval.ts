import { z } from 'zod';
import { version } from './common.js';

/** `eval`: one record per problem. */
export const EvalProblem = z.looseObject({
  v: version,
  problem_id: z.string(),
  n: z.int().nonnegative(),
  correct: z.int().nonnegative(),
  mean_reward: z.number(),
  mean_tokens: z.number(),
  tool_calls: z.number(),
  tool_errors: z.number(),
  /** Samples that failed for infrastructure reasons (`finish: "error"`), not in `n`; absent before. */
  infra_errors: z.int().nonnegative().optional(),
});
export type EvalProblem = z.output<typeof EvalProblem>;

/** `eval`: the closing summary of one benchmark. */
export const EvalSummary = z.looseObject({
  v: version,
  summary: z.literal(true),
  benchmark: z.string(),
  n: z.int().nonnegative(),
  'avg@n': z.number(),
  'pass@k': z.record(z.string(), z.number()),
  mean_tokens: z.number(),
  tool_error_rate: z.number(),
  policy: z.string(),
  /** Trajectories that failed for infrastructure reasons, left out of every metric; absent before. */
  infra_errors: z.int().nonnegative().optional(),
});
export type EvalSummary = z.output<typeof EvalSummary>;

/** `report.json` of `eval`: the summaries of one eval run. */
export const Report = z.looseObject({
  v: version,
  created: z.string().optional(),
  benchmarks: z.array(EvalSummary),
});
export type Report = z.output<typeof Report>;
