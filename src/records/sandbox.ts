import { z } from 'zod';

/**
 * code-judge's submission: `type` is the language, `solution` the program, `input` its stdin.
 * `expected_output` makes it a judge call; `sub_id` is echoed back and keys idempotent results.
 */
export const Submission = z.looseObject({
  type: z.string().default('python'),
  solution: z.string(),
  input: z.string().nullish(),
  expected_output: z.string().nullish(),
  sub_id: z.union([z.string(), z.int()]).nullish(),
});
export type Submission = z.output<typeof Submission>;

/** Why a call did not succeed. The first five are code-judge's; the rest are ours (documented). */
export const Reason = z.enum([
  '',
  'worker_timeout',
  'queue_timeout',
  'internal_error',
  'invalid_input',
  'memory_limit',
  'output_limit',
  'runtime_error',
  'wrong_answer',
]);
export type Reason = z.output<typeof Reason>;

/** code-judge's result fields. `success` = ran and (for judge calls) matched; `cost` in seconds. */
export const SubmissionResult = z.looseObject({
  sub_id: z.union([z.string(), z.int()]).nullish(),
  success: z.boolean(),
  run_success: z.boolean(),
  cost: z.number(),
  reason: z.string(),
  stdout: z.string().nullish(),
  stderr: z.string().nullish(),
});
export type SubmissionResult = z.output<typeof SubmissionResult>;

export const BatchSubmission = z.looseObject({
  type: z.literal('batch').default('batch'),
  submissions: z.array(Submission),
});
export type BatchSubmission = z.output<typeof BatchSubmission>;
