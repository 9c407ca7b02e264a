import { z } from 'zod';
import { lossMask, numbers, tokenIds, version } from './common.js';

/**
 * Why a trajectory ended. `length` and `tool_overflow` are truncations (reward 0); `invalid_calls`
 * is the `--max-invalid-calls` cap; `error` is an infrastructure failure (see `TrajectoryError`).
 */
export const Finish = z.enum(['stop', 'length', 'max_turns', 'tool_overflow', 'invalid_calls', 'error']);
export type Finish = z.output<typeof Finish>;

/** Finishes at the token budget: such a trajectory keeps reward 0 whatever its text holds. */
export const TRUNCATED: ReadonlySet<Finish> = new Set<Finish>(['length', 'tool_overflow']);

/**
 * The reward a trajectory keeps: the verifier's, except 0 for a truncated trajectory (unless
 * `rewardTruncated`, the release's behaviour) and for an infrastructure failure.
 */
export function outcomeReward(finish: Finish, reward: number, rewardTruncated = false): number {
  if (finish === 'error') return 0;
  if (TRUNCATED.has(finish) && !rewardTruncated) return 0;
  return reward;
}

/**
 * Why a trajectory ended with `finish: "error"`: the service the agent depends on failed (the
 * sandbox was unreachable, answered 5xx or an internal error reason, or the engines failed every
 * retry), not the model. Such a trajectory is left out of group statistics and metrics.
 */
export const TrajectoryError = z.looseObject({
  kind: z.enum(['sandbox', 'engine']),
  message: z.string(),
});
export type TrajectoryError = z.output<typeof TrajectoryError>;

/** An infrastructure failure: excluded from RoC, advantages and eval metrics, counted apart. */
export const isInfraError = (t: { finish: string }): boolean => t.finish === 'error';

export const Penalty = z.object({ tool_error: z.number(), format: z.number(), total: z.number() });
export type Penalty = z.output<typeof Penalty>;

export const Timing = z.looseObject({ queued_ms: z.number(), generate_ms: z.number(), tool_ms: z.number() });

const count = z.int().nonnegative();

/**
 * One sampled trajectory: token ids end to end, with the mask that separates model tokens (1) from
 * tool/environment tokens (0). Unknown fields pass through so later commands can add theirs.
 */
export const Trajectory = z
  .looseObject({
    v: version,
    id: z.string().min(1),
    problem_id: z.string().min(1),
    sample: count,
    policy: z.string(),
    prompt_ids: tokenIds,
    response_ids: tokenIds,
    loss_mask: lossMask,
    logprobs: numbers,
    text: z.string(),
    turns: count,
    tool_calls: count,
    tool_errors: count,
    answer_tags: count,
    finish: Finish,
    answer: z.string().nullable(),
    reward: z.number(),
    penalty: Penalty.optional(),
    advantage: z.number().optional(),
    timing: Timing.optional(),
    /** rollout --steps: the RL step whose batch this trajectory belongs to. */
    step: count.optional(),
    /** rollout --steps: the engines' weight_version (the policy's step) when its step started. */
    policy_version: z.string().optional(),
    /**
     * The weight_version each generated turn finished under, as the engine reported it (SGLang and
     * engine-serve do; vLLM does not, and then this is absent). Under one-step-off the engines load
     * a newer policy while a step is generated, so later turns may carry a later version.
     */
    turn_versions: z.array(z.string()).optional(),
    /** Present when `finish` is `error`: which service failed and how. */
    error: TrajectoryError.optional(),
  })
  .superRefine((t, ctx) => {
    const n = t.response_ids.length;
    if (t.loss_mask.length !== n) {
      ctx.addIssue({
        code: 'custom',
        path: ['loss_mask'],
        message: `length ${t.loss_mask.length} differs from response_ids length ${n}`,
      });
    }
    if (t.turn_versions !== undefined && t.turn_versions.length !== t.turns) {
      ctx.addIssue({
        code: 'custom',
        path: ['turn_versions'],
        message: `${t.turn_versions.length} versions for ${t.turns} turns`,
      });
    }
    if (t.logprobs.length !== n) {
      ctx.addIssue({
        code: 'custom',
        path: ['logprobs'],
        message: `length ${t.logprobs.length} differs from response_ids length ${n}`,
      });
    }
  });
export type Trajectory = z.output<typeof Trajectory>;

/**
 * What `train-step` needs of a record: the token ids and mask, plus `logprobs`/`advantage` for GRPO.
 * SFT records from `sft-data` are trajectory-shaped but carry only these fields.
 */
export const TrainRecord = z
  .looseObject({
    prompt_ids: tokenIds,
    response_ids: tokenIds.refine((ids) => ids.length > 0, 'must not be empty'),
    loss_mask: lossMask,
    logprobs: numbers.optional(),
    advantage: z.number().optional(),
  })
  .superRefine((t, ctx) => {
    if (t.loss_mask.length !== t.response_ids.length) {
      ctx.addIssue({
        code: 'custom',
        path: ['loss_mask'],
        message: `length ${t.loss_mask.length} differs from response_ids length ${t.response_ids.length}`,
      });
    }
    if (t.logprobs !== undefined && t.logprobs.length !== t.response_ids.length) {
      ctx.addIssue({
        code: 'custom',
        path: ['logprobs'],
        message: `length ${t.logprobs.length} differs from response_ids length ${t.response_ids.length}`,
      });
    }
  });
export type TrainRecord = z.output<typeof TrainRecord>;
