import { UsageError } from '../errors.js';
import type { Problem } from '../records/problem.js';

/** What eval needs of `src/reward`: scoring a response and grouping equivalent answers. */
export interface Verifier {
  score(text: string, problem: Problem): Promise<{ answer: string | null; reward: number }>;
  /** Math (or choice-letter) equivalence when the reward module has it, else exact match after trimming. */
  same(a: string, b: string, kind?: Problem['kind']): Promise<boolean>;
  /** True when `same` is the reward module's `isEquivalent`. */
  equivalence: boolean;
}

type ScoreFn = (
  text: string,
  reference: { answer: string; kind?: string; choices?: string[] },
  options?: { compat?: Compat },
) => { answer: string | null; reward: number } | Promise<{ answer: string | null; reward: number }>;
type SameFn = (
  a: string,
  b: string,
  options?: { kind?: string; compat?: Compat },
) => boolean | Promise<boolean>;

/** `strict` (default) or `rstar`: the reward module's rStar2-Agent-compatible lenient grading. */
export type Compat = 'strict' | 'rstar';

/**
 * Loads `src/reward` lazily: it is another module's work, and `--from-trajectories` without
 * `--reverify` must not pay for (or depend on) it. A variable specifier keeps tsc from resolving it.
 */
async function rewardModule(): Promise<Record<string, unknown> | undefined> {
  const specifier = '../reward/index.js';
  try {
    return (await import(specifier)) as Record<string, unknown>;
  } catch (error) {
    if (
      (error as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' &&
      String(error).includes('reward/index.js')
    ) {
      return undefined;
    }
    throw error;
  }
}

const exact: SameFn = (a, b) => a.trim() === b.trim();

export async function loadVerifier({
  needScore = false,
  compat = 'strict',
}: {
  needScore?: boolean;
  compat?: Compat;
} = {}): Promise<Verifier> {
  const mod = await rewardModule();
  const score = mod?.scoreResponse as ScoreFn | undefined;
  const equivalent = mod?.isEquivalent as SameFn | undefined;
  if (needScore && typeof score !== 'function') {
    throw new UsageError('--reverify needs scoreResponse from src/reward, which is not built yet');
  }
  const same = typeof equivalent === 'function' ? equivalent : exact;
  return {
    equivalence: typeof equivalent === 'function',
    async same(a, b, kind) {
      if (a.trim() === b.trim()) return true;
      try {
        return Boolean(await same(a, b, { kind, compat }));
      } catch {
        // An answer the checker cannot parse is simply not equivalent to another one.
        return false;
      }
    },
    async score(text, problem) {
      if (typeof score !== 'function') throw new UsageError('scoreResponse is not available');
      const reference = { answer: problem.answer, kind: problem.kind, choices: problem.choices };
      const result = await score(text, reference, { compat });
      return { answer: result.answer ?? null, reward: result.reward };
    },
  };
}
