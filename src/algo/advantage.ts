/**
 * Outcome advantages per group, as verl computes them in `verl/trainer/ppo/core_algos.py`
 * (`compute_grpo_outcome_advantage`, `compute_rloo_outcome_advantage`), including its float32
 * arithmetic: rewards are float32 `token_level_rewards`, and every tensor op rounds to float32.
 */

const f32 = Math.fround;

export type Baseline = 'mean' | 'loo';

export interface AdvantageOptions {
  /** `mean` = GRPO (group mean), `loo` = RLOO (leave-one-out mean, never std-normalised, as in verl). */
  baseline?: Baseline;
  /** GRPO only: divide by (std + epsilon); false is Dr. GRPO (`norm_adv_by_std_in_grpo=False`). */
  normalizeStd?: boolean;
  /** Added to the std before dividing (verl's default 1e-6). */
  epsilon?: number;
}

export interface GroupStats {
  mean: number;
  std: number;
}

/**
 * verl's `id2mean` / `id2std`: a group of one gets mean 0 and std 1; otherwise `torch.mean` and the
 * unbiased `torch.std` (n - 1). torch's CPU std reduces all elements in double (two passes) and
 * rounds once, which is what this does. torch's float32 sum is vectorised, so for rewards whose sum is
 * not exact in float32 the mean can differ from torch in the last bit; 0/1 outcome rewards are exact.
 */
export function groupStats(rewards: readonly number[]): GroupStats {
  const n = rewards.length;
  if (n === 0) throw new RangeError('empty group');
  if (n === 1) return { mean: 0, std: 1 };
  const xs = rewards.map(f32);
  let sum = 0;
  for (const x of xs) sum += x;
  const mean64 = sum / n;
  let squares = 0;
  for (const x of xs) squares += (x - mean64) * (x - mean64);
  return { mean: f32(f32(sum) / n), std: f32(Math.sqrt(squares / (n - 1))) };
}

/** Advantages of one group, in the order of `rewards`. */
export function groupAdvantages(rewards: readonly number[], options: AdvantageOptions = {}): number[] {
  const { baseline = 'mean', normalizeStd = true, epsilon = 1e-6 } = options;
  const { mean, std } = groupStats(rewards);
  const n = rewards.length;
  if (baseline === 'loo') {
    // scores * n / (n - 1) - mean * n / (n - 1), left to right, each op in float32; a lone sample keeps its score.
    if (n === 1) return [f32(rewards[0])];
    const shift = f32(f32(mean * n) / (n - 1));
    return rewards.map((r) => f32(f32(f32(f32(r) * n) / (n - 1)) - shift));
  }
  if (!normalizeStd) return rewards.map((r) => f32(f32(r) - mean));
  const scale = f32(std + f32(epsilon));
  return rewards.map((r) => f32(f32(f32(r) - mean) / scale));
}
