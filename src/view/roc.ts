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
export function rocVerdict(members: readonly RocMember[], settings: RocSettings): RocVerdict {
  const order = members.map((m, i) => ({ m, i })).sort((a, b) => a.m.sample - b.m.sample);
  const scored = order.filter(({ m }) => m.finish !== 'error');
  const kept = members.map(() => false);
  if (scored.length === 0) return { outcome: 'infra-only', kept };
  const decision = rocSelect(
    scored.map(({ m }) => ({ sample: m.sample, reward: m.reward, penalty: m.penalty })),
    { keep: settings.keep, minPos: 2, minNeg: 2, rejectEqual: true, positives: 'sorted' },
  );
  for (const k of decision.kept) kept[scored[k].i] = true;
  return { outcome: decision.outcome, kept };
}
