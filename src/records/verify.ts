import { z } from 'zod';

/** One line of `rstar verify` input: a prediction and a reference, free-form or bare answers. */
export const VerifyCase = z.looseObject({
  pred: z.string().describe('the prediction: a whole response or a bare answer'),
  ref: z.string().describe('the reference answer'),
  kind: z.enum(['math', 'choice']).optional().describe('math (default) or multiple choice'),
});
export type VerifyCase = z.output<typeof VerifyCase>;

/** What `rstar verify --problems` needs of a trajectory; every other field passes through untouched. */
export const ScoredTrajectory = z.looseObject({
  problem_id: z.string().min(1).describe('the problem the trajectory answers (looked up in --problems)'),
  text: z.string().describe("the trajectory's decoded text, where the final answer is read"),
});
export type ScoredTrajectory = z.output<typeof ScoredTrajectory>;
