import type { Problem } from '../records/problem.js';
import type { Compat } from '../reward/index.js';

export type { Compat } from '../reward/index.js';

/** What eval needs of `src/reward`: scoring a response and grouping equivalent answers. */
export interface Verifier {
  score(text: string, problem: Problem): Promise<{ answer: string | null; reward: number }>;
  /** Math (or choice-letter) equivalence of two extracted answers, per `isEquivalent`. */
  same(a: string, b: string, kind?: Problem['kind']): Promise<boolean>;
  /** True when `same` is the reward module's `isEquivalent` (always, since src/reward exists). */
  equivalence: boolean;
}

/**
 * Loads `src/reward` lazily: `--compare` and plain `--from-trajectories` runs should not pay for
 * its parsers. `compat` is passed to both scoring and equivalence (`strict` or the release's
 * lenient `rstar` grading).
 */
export async function loadVerifier({ compat = 'strict' }: { compat?: Compat } = {}): Promise<Verifier> {
  const { isEquivalent, scoreResponse } = await import('../reward/index.js');
  return {
    equivalence: true,
    async same(a, b, kind) {
      return a.trim() === b.trim() || isEquivalent(a, b, { kind, compat });
    },
    async score(text, problem) {
      const reference = {
        answer: problem.answer,
        kind: problem.kind,
        choices: problem.choices,
        prompt: problem.prompt,
      };
      return scoreResponse(text, reference, { compat });
    },
  };
}
