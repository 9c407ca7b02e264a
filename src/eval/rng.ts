import { fnv1a, mulberry32 } from '../random.js';

/**
 * A small seeded PRNG (mulberry32 over a string-hashed seed), so GPQA option orders are the same
 * on every machine and Node version: Math.random cannot be seeded.
 */
export function seededRandom(seed: number | string): () => number {
  return mulberry32(fnv1a(String(seed)));
}

/** Fisher-Yates shuffle of a copy. */
export function shuffled<T>(items: readonly T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i -= 1) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}
