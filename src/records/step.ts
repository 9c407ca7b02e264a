import { z } from 'zod';
import { version } from './common.js';

/** Output of `train-step`: one optimiser step. */
export const Step = z.looseObject({
  v: version,
  step: z.int().nonnegative(),
  policy: z.string(),
  checkpoint: z.string(),
  loss: z.number(),
  pg_clipfrac: z.number(),
  approx_kl: z.number(),
  entropy: z.number(),
  grad_norm: z.number(),
  lr: z.number(),
  sequences: z.int().nonnegative(),
  tokens: z.int().nonnegative(),
  seconds: z.number().nonnegative(),
});
export type Step = z.output<typeof Step>;
