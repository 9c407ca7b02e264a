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
  session_id: z
    .string()
    .nullish()
    .describe(
      'run as the next cell of this session (POST /sessions): its variables, imports and files persist',
    ),
  files: z
    .record(z.string(), z.string())
    .nullish()
    .describe(
      'files written into the working directory before the code runs: name -> base64 content (SandboxFusion)',
    ),
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
  'session_not_found',
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
      "why it did not succeed: '' (it did), worker_timeout, queue_timeout, internal_error, invalid_input, memory_limit, output_limit, runtime_error, wrong_answer, session_not_found",
    ),
  stdout: z.string().nullish().describe('standard output, cut at the output limit'),
  stderr: z.string().nullish().describe('standard error (the traceback), cut at the output limit'),
  session_id: z.string().nullish().describe('the session the cell ran in'),
  session_rolled_back: z
    .boolean()
    .nullish()
    .describe(
      'true: the cell was killed (time, memory, output limit, crash) and the session is as it was before it',
    ),
});
export type SubmissionResult = z.output<typeof SubmissionResult>;

export const BatchSubmission = z.looseObject({
  type: z.literal('batch').default('batch').describe('batch'),
  submissions: z.array(Submission).describe('the calls, answered in order'),
});
export type BatchSubmission = z.output<typeof BatchSubmission>;

/** `POST /sessions`: a new session, optionally with files in its working directory. */
export const SessionRequest = z.looseObject({
  files: z
    .record(z.string(), z.string())
    .nullish()
    .describe('files of the working directory: name -> base64 content'),
});
export type SessionRequest = z.output<typeof SessionRequest>;

/** The answer to `POST /sessions` and `POST /sessions/ID/fork`. */
export const SessionInfo = z.looseObject({
  session_id: z.string().describe('send it as the session_id of a submission to run a cell there'),
  ttl_s: z.number().describe('seconds of idleness after which the session is closed'),
});
export type SessionInfo = z.output<typeof SessionInfo>;
