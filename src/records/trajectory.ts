import { z } from 'zod';
import { lossMask, numbers, tokenIds, version } from './common.js';

export const Finish = z.enum(['stop', 'length', 'max_turns', 'tool_overflow', 'error']);
export type Finish = z.output<typeof Finish>;

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
