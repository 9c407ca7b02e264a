import { z } from 'zod';
import { version } from './common.js';

const count = z.int().nonnegative();

/**
 * The tool-use counts of a set of trajectories (src/algo/tool-use.ts `ToolUseCounts`): every
 * tool-use metric is a ratio of two of them, so a family's metrics come from its problems' sums.
 */
export const ToolCounts = z
  .looseObject({
    trajectories: count,
    positives: count.describe('trajectories with reward > 0'),
    calls: count.describe('tool calls, unparsable ones included'),
    failed_calls: count.describe('calls that ran and failed (non-zero exit, exception, timeout)'),
    unparsable_calls: count.describe('calls that could not be read as a call of a known tool (never ran)'),
    multi_call: count.describe('trajectories with 2 or more calls'),
    with_failure: count.describe('trajectories with a failed call, their call order known (tool_status)'),
    recovered: count.describe(
      'of those, the ones with a later call that ran and succeeded and a correct answer',
    ),
    positive_calls: count.describe('calls within the positive trajectories'),
    positive_failed_calls: count.describe('failed calls within the positive trajectories'),
    positive_with_failure: count.describe('positive trajectories with a failed call'),
  })
  .describe('tool-use counts (docs/eval.md "Agentic tool use"); every tool-use metric is a ratio of two');

/** `eval`: one record per problem. */
export const EvalProblem = z.looseObject({
  v: version,
  problem_id: z.string().describe('the problem'),
  n: z.int().nonnegative().describe('samples scored'),
  correct: z.int().nonnegative().describe('samples with reward 1'),
  mean_reward: z.number().describe('mean reward over the samples'),
  mean_tokens: z.number().describe('mean response tokens'),
  tool_calls: z.number().describe('tool calls of the n samples, summed (tool_calls_per_traj is the mean)'),
  tool_errors: z
    .number()
    .describe('tool calls of the n samples that did not succeed (failed + unparsable), summed'),
  tool_calls_per_traj: z.number().optional().describe('tool calls / samples (mean per sample)'),
  tool_counts: ToolCounts.optional().describe(
    "the samples' tool-use counts (absent before issue 40: then tool_errors all count as failed)",
  ),
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
  tool_error_rate: z.number().describe('tool calls that ran and failed / tool calls (0 without calls)'),
  trajectories: z
    .int()
    .nonnegative()
    .optional()
    .describe('trajectories scored (infrastructure failures left out)'),
  tool_calls: z.number().optional().describe('tool calls of all the trajectories, summed'),
  tool_errors: z
    .number()
    .optional()
    .describe('tool calls that did not succeed (failed + unparsable) of all the trajectories, summed'),
  tool_calls_per_traj: z.number().optional().describe('tool calls / trajectories (mean per sample)'),
  failed_calls_per_traj: z
    .number()
    .optional()
    .describe('tool calls that ran and failed / trajectories (mean per sample)'),
  unparsable_calls_per_traj: z
    .number()
    .optional()
    .describe('unparsable tool calls (never ran) / trajectories (mean per sample)'),
  unparsable_call_rate: z
    .number()
    .optional()
    .describe('unparsable tool calls / tool calls (0 without calls)'),
  tool_counts: ToolCounts.optional(),
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
      'recovered trajectories (a failed call, then a later call that ran and succeeded, and a correct answer) / trajectories with a failed call (null: none)',
    ),
  positive_tool_error_rate: z
    .number()
    .nullable()
    .optional()
    .describe(
      "tool calls that ran and failed / tool calls within the positive trajectories (rStar2-Agent's RoC figure)",
    ),
  positive_error_share: z
    .number()
    .nullable()
    .optional()
    .describe('share of the positive trajectories with at least one failed tool call'),
  avoided_rate: z
    .number()
    .nullable()
    .optional()
    .describe(
      'trajectories with 2 or more calls and no failed call / trajectories with 2 or more calls (null: none)',
    ),
  repeated_calls_per_traj: z
    .number()
    .nullable()
    .optional()
    .describe('calls identical (tool, code, stdin) to an earlier call of the same trajectory / trajectories'),
  format_violations_by_finish: z
    .record(z.string(), z.int().nonnegative())
    .optional()
    .describe('answer-format violations by how their trajectory ended (stop, length, max_turns, ...)'),
  format_violations_after_failed_call: z
    .int()
    .nonnegative()
    .optional()
    .describe('answer-format violations whose last tool call ran and failed'),
  format_violations_after_unparsable_call: z
    .int()
    .nonnegative()
    .optional()
    .describe('answer-format violations whose last tool call could not be read'),
  'g-pass@k': z
    .record(z.string(), z.record(z.string(), z.number()))
    .optional()
    .describe(
      'G-Pass@k (arXiv 2412.13147) by k, then by tau: the chance that at least ceil(tau k) of k samples are correct',
    ),
  'mg-pass@k': z
    .record(z.string(), z.number())
    .optional()
    .describe('mG-Pass@k by k: G-Pass@k integrated over tau in [0.5, 1]'),
  families: z
    .record(z.string(), z.record(z.string(), z.number().nullable()))
    .optional()
    .describe(
      'per problem family (meta.family or a curriculum id prefix): trajectories, tool_calls_per_traj, failed_calls_per_traj, unparsable_calls_per_traj, multi_call_share, tool_error_rate, unparsable_call_rate, recovery_rate, positive_tool_error_rate, positive_error_share, accuracy',
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
