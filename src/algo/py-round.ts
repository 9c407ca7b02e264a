/**
 * Python's built-in `round(x)` for a float: nearest integer, ties to the even neighbour
 * (banker's rounding). `Math.round` rounds ties up, which would change RoC's target counts
 * whenever `count * keep / group_size` lands on x.5 (e.g. 3 of 6 kept at 7 -> 3.5 -> 4, but 5 of 10 -> 2.5 -> 2).
 */
export function roundHalfEven(x: number): number {
  if (!Number.isFinite(x)) throw new RangeError(`cannot round ${x}`);
  const floor = Math.floor(x);
  // x - floor(x) is exact in binary floating point, so the tie test is exact too.
  const fraction = x - floor;
  if (fraction < 0.5) return floor;
  if (fraction > 0.5) return floor + 1;
  return floor % 2 === 0 ? floor : floor + 1;
}
