import { z } from 'zod';
import { version } from './common.js';

/** `eval`: one record per problem. */
export const EvalProblem = z.looseObject({
  v: version,
  problem_id: z.string().describe('the problem'),
  n: z.int().nonnegative().describe('samples scored'),
  correct: z.int().nonnegative().describe('samples with reward 1'),
  mean_reward: z.number().describe('mean reward over the samples'),
  mean_tokens: z.number().describe('mean response tokens'),
  tool_calls: z.number().describe('mean tool calls per sample'),
  tool_errors: z.number().describe('mean failed tool calls per sample'),
  infra_errors: z
    .int()
    .nonnegative()
    .optional()
    .describe('samples that failed for infrastructure reasons (finish "error"), not in n'),
  family: z.string().optional().describe("the problem's family (meta.family or a curriculum id prefix)"),
  multi_step: z.boolean().optional().describe('the problem needs two or more tool calls (meta.steps >= 2)'),
});
export type EvalProblem = z.output<typeof EvalProblem>;

/** `eval`: the closing summary of one benchmark. */
export const EvalSummary = z.looseObject({
  v: version,
  summary: z.literal(true).describe("closes one benchmark's records"),
  benchmark: z.string().describe('the benchmark (its problems file name)'),
  n: z.int().nonnegative().describe('samples per problem'),
  'avg@n': z.number().describe("mean accuracy over all samples (the paper's avg pass@1)"),
  'pass@k': z.record(z.string(), z.number()).describe('unbiased pass@k estimates, by k'),
  mean_tokens: z.number().describe('mean response tokens'),
  tool_error_rate: z.number().describe('failed tool calls / tool calls'),
  policy: z.string().describe('the policy evaluated (checkpoint or engine weight_version)'),
  infra_errors: z
    .int()
    .nonnegative()
    .optional()
    .describe('trajectories that failed for infrastructure reasons, left out of every metric'),
  multi_call_share: z.number().optional().describe('share of trajectories with 2 or more tool calls'),
  recovery_rate: z
    .number()
    .nullable()
    .optional()
    .describe(
      'trajectories with a failed tool call that end correct / trajectories with a failed call (null: none)',
    ),
  positive_tool_error_rate: z
    .number()
    .nullable()
    .optional()
    .describe("failed tool calls / tool calls within the positive trajectories (rStar2-Agent's RoC figure)"),
  positive_error_share: z
    .number()
    .nullable()
    .optional()
    .describe('share of the positive trajectories with at least one failed tool call'),
  families: z
    .record(z.string(), z.record(z.string(), z.number().nullable()))
    .optional()
    .describe(
      'per problem family (meta.family or a curriculum id prefix): trajectories, tool_calls_per_traj, multi_call_share, tool_error_rate, recovery_rate, positive_tool_error_rate, positive_error_share, accuracy',
    ),
  multi_step: z
    .record(z.string(), z.number().nullable())
    .optional()
    .describe('the same metrics over the multi-step problems together (meta.steps >= 2)'),
});
export type EvalSummary = z.output<typeof EvalSummary>;

/** `report.json` of `eval`: the summaries of one eval run. */
export const Report = z.looseObject({
  v: version,
  created: z.string().optional().describe('when the report was written (ISO 8601)'),
  benchmarks: z.array(EvalSummary).describe("each benchmark's summary"),
});
export type Report = z.output<typeof Report>;
