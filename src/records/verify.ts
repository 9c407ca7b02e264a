import { z } from 'zod';

/** One line of `rstar verify` input: a prediction and a reference, free-form or bare answers. */
export const VerifyCase = z.looseObject({
  pred: z.string(),
  ref: z.string(),
  kind: z.enum(['math', 'choice']).optional(),
});
export type VerifyCase = z.output<typeof VerifyCase>;

/** What `rstar verify --problems` needs of a trajectory; every other field passes through untouched. */
export const ScoredTrajectory = z.looseObject({
  problem_id: z.string().min(1),
  text: z.string(),
});
export type ScoredTrajectory = z.output<typeof ScoredTrajectory>;
