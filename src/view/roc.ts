import { type RocOutcome, rocSelect } from '../algo/roc.js';

/**
 * Which trajectories RoC kept. The RL recipe saves rollout's trajectories before `roc-filter`, and
 * roc-filter writes only what it keeps, so the viewer decides again: roc-filter's choice is a pure
 * function of the group (rewards and penalties in sample order) and its flags, which the stage's
 * manifest records (`RSTAR_RL_KEEP`, `RSTAR_RL_N`, `RSTAR_RL_DOWN_SAMPLE`); rl.sh leaves the others
 * (`--min-pos 2 --min-neg 2`, sorted positives, reject-equal) at their defaults, as here.
 */
export interface RocSettings {
  /** Rollouts per problem (the group). */
  n: number;
  /** Rollouts kept (`--keep`): G, or N under `RSTAR_RL_DOWN_SAMPLE=none`. */
  keep: number;
}

/** A group's decision rule: the stage's keep, and RoC's per-class minimums (rl.sh: 2 and 2). */
export interface GroupRule {
  keep: number;
  minPos: number;
  minNeg: number;
}

/** A problem's group of samples: the stage's settings as rl.sh passes them to roc-filter. */
export function rootRule(settings: RocSettings): GroupRule {
  return { keep: settings.keep, minPos: 2, minNeg: 2 };
}

/**
 * A branch group (tree rollouts: the `of` siblings from one branch point) as roc-filter decides it:
 * at most min(--keep, of) kept, the minimums clamped to that (a group smaller than --keep is not
 * too small to train on, as a problem's would be; src/commands/roc-filter.ts).
 */
export function branchRule(settings: RocSettings, of: number): GroupRule {
  const keep = Math.min(settings.keep, of);
  return { keep, minPos: Math.min(2, keep), minNeg: Math.min(2, keep) };
}

export interface RocMember {
  sample: number;
  reward: number;
  penalty: number;
  finish: string;
}

export interface RocVerdict {
  outcome: RocOutcome | 'infra-only';
  /** Per member, in the order given: kept by RoC. */
  kept: boolean[];
}

/** The stage's settings from its manifest, or undefined when they are not recorded. */
export function rocSettings(manifest: Record<string, string>): RocSettings | undefined {
  const keep = Number(manifest.RSTAR_RL_KEEP);
  const n = Number(manifest.RSTAR_RL_N ?? 2 * keep);
  if (!Number.isInteger(keep) || keep < 1 || !Number.isInteger(n) || n < 1) return undefined;
  return { n, keep: manifest.RSTAR_RL_DOWN_SAMPLE === 'none' ? n : keep };
}

/** roc-filter's decision on one complete group (infrastructure failures are never kept). */
export function rocVerdict(members: readonly RocMember[], rule: GroupRule): RocVerdict {
  const order = members.map((m, i) => ({ m, i })).sort((a, b) => a.m.sample - b.m.sample);
  const scored = order.filter(({ m }) => m.finish !== 'error');
  const kept = members.map(() => false);
  if (scored.length === 0) return { outcome: 'infra-only', kept };
  const decision = rocSelect(
    scored.map(({ m }) => ({ sample: m.sample, reward: m.reward, penalty: m.penalty })),
    { keep: rule.keep, minPos: rule.minPos, minNeg: rule.minNeg, rejectEqual: true, positives: 'sorted' },
  );
  for (const k of decision.kept) kept[scored[k].i] = true;
  return { outcome: decision.outcome, kept };
}
