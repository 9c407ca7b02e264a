import { z } from 'zod';

/**
 * code-judge's submission: `type` is the language, `solution` the program, `input` its stdin.
 * `expected_output` makes it a judge call; `sub_id` is echoed back and keys idempotent results.
 */
export const Submission = z.looseObject({
  type: z.string().default('python').describe('language (python)'),
  solution: z.string().describe('the program'),
  input: z.string().nullish().describe('its stdin'),
  expected_output: z.string().nullish().describe('makes it a judge call: success only when stdout matches'),
  sub_id: z
    .union([z.string(), z.int()])
    .nullish()
    .describe('echoed back; keys idempotent results over Redis'),
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
  sub_id: z.union([z.string(), z.int()]).nullish().describe("the submission's sub_id"),
  success: z.boolean().describe('ran to exit 0 and, for a judge call, matched expected_output'),
  run_success: z.boolean().describe('ran to exit 0'),
  cost: z.number().describe('wall-clock seconds of the run'),
  reason: z
    .string()
    .describe(
      "why it did not succeed: '' (it did), worker_timeout, queue_timeout, internal_error, invalid_input, memory_limit, output_limit, runtime_error, wrong_answer",
    ),
  stdout: z.string().nullish().describe('standard output, cut at the output limit'),
  stderr: z.string().nullish().describe('standard error (the traceback), cut at the output limit'),
});
export type SubmissionResult = z.output<typeof SubmissionResult>;

export const BatchSubmission = z.looseObject({
  type: z.literal('batch').default('batch').describe('batch'),
  submissions: z.array(Submission).describe('the calls, answered in order'),
});
export type BatchSubmission = z.output<typeof BatchSubmission>;
