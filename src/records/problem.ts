import { z } from 'zod';
import { version } from './common.js';

/** Input of `rollout` and `eval`: one problem with its reference answer. */
export const Problem = z.looseObject({
  v: version,
  id: z.string().min(1),
  prompt: z.string().min(1),
  answer: z.string(),
  kind: z.enum(['math', 'choice']).default('math'),
  choices: z.array(z.string()).optional(),
  source: z.string().optional(),
  meta: z.record(z.string(), z.unknown()).optional(),
});
export type Problem = z.output<typeof Problem>;
