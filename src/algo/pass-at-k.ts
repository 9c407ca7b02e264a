/**
 * Sampling metrics of one problem from `n` samples of which `c` are correct.
 *
 * pass@k is Chen et al. 2021's unbiased estimator 1 - C(n-c, k) / C(n, k): the chance that at
 * least one of k samples drawn without replacement from the n is correct. The binomials overflow
 * for n in the hundreds, so it is computed as the product 1 - prod_{i=n-c+1..n} (1 - k/i).
 */

function check(n: number, c: number): void {
  if (!Number.isInteger(n) || n < 0) throw new RangeError(`n must be a non-negative integer, got ${n}`);
  if (!Number.isInteger(c) || c < 0 || c > n)
    throw new RangeError(`c must be an integer in [0, ${n}], got ${c}`);
}

/** Unbiased pass@k; undefined when k > n (not estimable from n samples) or n = 0. */
export function passAtK(n: number, c: number, k: number): number | undefined {
  check(n, c);
  if (!Number.isInteger(k) || k < 1) throw new RangeError(`k must be a positive integer, got ${k}`);
  if (n === 0 || k > n) return undefined;
  if (n - c < k) return 1;
  let miss = 1;
  for (let i = n - c + 1; i <= n; i += 1) miss *= 1 - k / i;
  return 1 - miss;
}

/** avg@n: mean accuracy over the n samples, the paper's "average pass@1" (equals pass@1). */
export function avgAtN(n: number, c: number): number | undefined {
  check(n, c);
  return n === 0 ? undefined : c / n;
}

/** The k reported for n samples: 1, 2, 4, ... up to n, and n itself when it is not a power of two. */
export function reportedKs(n: number): number[] {
  const ks: number[] = [];
  for (let k = 1; k <= n; k *= 2) ks.push(k);
  if (n >= 1 && ks[ks.length - 1] !== n) ks.push(n);
  return ks;
}

/** pass@k for every reported k of this n, keyed by k as a string (JSON object keys). */
export function passAtKCurve(n: number, c: number, ks: number[] = reportedKs(n)): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of ks) {
    const p = passAtK(n, c, k);
    if (p !== undefined) out[String(k)] = p;
  }
  return out;
}

/**
 * Majority vote over extracted answers, grouping answers into classes with `same` (e.g. math
 * equivalence, so "1/2" and "0.5" vote together). Null answers do not vote. Ties go to the class
 * seen first, so the result is deterministic in sample order. Returns the winning class's first
 * answer, its votes and the indices of its members, or null when no sample produced an answer.
 */
export function majorityVote(
  answers: readonly (string | null)[],
  same: (a: string, b: string) => boolean = (a, b) => a === b,
): { answer: string; votes: number; members: number[] } | null {
  const classes: { answer: string; members: number[] }[] = [];
  answers.forEach((answer, index) => {
    if (answer === null) return;
    const found = classes.find((cls) => same(cls.answer, answer));
    if (found) found.members.push(index);
    else classes.push({ answer, members: [index] });
  });
  let best: { answer: string; members: number[] } | undefined;
  for (const cls of classes) if (best === undefined || cls.members.length > best.members.length) best = cls;
  return best ? { answer: best.answer, votes: best.members.length, members: best.members } : null;
}
