/**
 * `fn` over `items` with at most `limit` in flight, results in the items' order. The first failure
 * stops new items from starting and is thrown once those in flight have settled.
 */
export async function mapLimit<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, i: number) => Promise<R>,
): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  let failed = false;
  const worker = async () => {
    while (!failed && next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i] as T, i);
      } catch (error) {
        failed = true;
        throw error;
      }
    }
  };
  const results = await Promise.allSettled(
    Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker),
  );
  const rejected = results.find((r) => r.status === 'rejected');
  if (rejected) throw (rejected as PromiseRejectedResult).reason;
  return out;
}
