import { z } from 'zod';
import { version } from './common.js';

/** Input of `rollout` and `eval`: one problem with its reference answer. */
export const Problem = z.looseObject({
  v: version.describe('record schema version (1)'),
  id: z.string().min(1).describe('unique id of the problem within its file'),
  prompt: z.string().min(1).describe('the question as the user asks it'),
  answer: z
    .string()
    .describe('reference answer the verifier compares the final answer with (a letter for kind choice)'),
  kind: z
    .enum(['math', 'choice'])
    .default('math')
    .describe('math: equivalence of math answers; choice: a multiple-choice letter'),
  choices: z
    .array(z.string())
    .optional()
    .describe('the options of a choice problem, in the order their letters name them'),
  files: z
    .record(z.string().regex(/^[A-Za-z0-9._-]+$/), z.string())
    .optional()
    .describe(
      "files of the problem's working directory, name -> UTF-8 text (plain, not base64; the sandbox's files are these base64-encoded); rollout and eval put them in the working directory of every stateless call and of the trajectory's session",
    ),
  source: z.string().optional().describe('where the problem comes from (benchmark, file)'),
  meta: z
    .record(z.string(), z.unknown())
    .optional()
    .describe('anything else the source carries, passed through'),
});
export type Problem = z.output<typeof Problem>;
