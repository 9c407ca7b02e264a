/**
 * A length prior for the scheduler's `prior` option from trajectories written earlier (the same
 * problems' samples in a previous epoch, e.g. the `--out` file of the last rollout). The
 * benchmark's `kv (epoch)` row measures what such a prior buys (docs/rollout.md).
 */

/** Mean response length in tokens per problem id. */
export function lengthsByProblem(
  records: Iterable<{ problem_id: string; response_ids: { readonly length: number }; branch?: unknown }>,
): Map<string, number> {
  const sum = new Map<string, { tokens: number; n: number }>();
  for (const r of records) {
    // a branch's length counts its parent's prefix again: not a sample of the problem's lengths
    if (r.branch !== undefined) continue;
    const x = sum.get(r.problem_id) ?? { tokens: 0, n: 0 };
    x.tokens += r.response_ids.length;
    x.n++;
    sum.set(r.problem_id, x);
  }
  return new Map([...sum].map(([id, x]) => [id, x.tokens / x.n]));
}

/**
 * The scheduler's `prior` for a batch whose problem `g` is `problemIds[g]`: the earlier mean
 * length. A problem never seen before ranks as the longest seen (started early, as the online
 * estimate treats a problem seen little), so every problem has a prior in one unit. Undefined
 * when none of the batch was seen: the scheduler then probes as usual.
 */
export function priorFor(
  problemIds: readonly string[],
  lengths: ReadonlyMap<string, number>,
): ((group: number) => number) | undefined {
  const known = problemIds.map((id) => lengths.get(id));
  const seen = known.filter((x): x is number => x !== undefined);
  if (seen.length === 0) return undefined;
  const longest = Math.max(...seen);
  return (group) => known[group] ?? longest;
}
