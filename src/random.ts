/**
 * Seeded randomness shared by every subsystem that must be reproducible across machines and Node
 * versions (Math.random cannot be seeded): the SFT data sets and epoch order, RoC's weighted
 * positives, rollout's step batches, GPQA option shuffles, the eval bootstrap, numeric-sampling
 * equivalence and the scheduler simulation. test/random.test.ts pins their sequences.
 */

/** mulberry32: a tiny 32-bit PRNG, uniform in [0, 1). */
export function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * FNV-1a over UTF-16 code units: a string key to a 32-bit seed, and a stable hash (train/test
 * partitioning, problem ids).
 */
export function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** mulberry32 seeded by the FNV-1a of a key, so a stream is named rather than numbered. */
export function seededRandom(seed: number | string): () => number {
  return mulberry32(fnv1a(String(seed)));
}

/** Fisher-Yates, in place. */
export function shuffleInPlace<T>(items: T[], random: () => number): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

/** Fisher-Yates shuffle of a copy. */
export function shuffled<T>(items: readonly T[], random: () => number): T[] {
  return shuffleInPlace([...items], random);
}

/** A seeded generator with the draws the SFT data generator needs. */
export class Rng {
  /** Uniform in [0, 1). */
  readonly next: () => number;

  constructor(seed: number) {
    this.next = mulberry32((seed >>> 0) ^ 0x9e3779b9);
  }

  /** Integer in [lo, hi], both inclusive. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** An integer with exactly `digits` decimal digits. */
  digits(digits: number): number {
    return this.int(10 ** (digits - 1), 10 ** digits - 1);
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }

  /** Fisher-Yates, in place. */
  shuffle<T>(items: T[]): T[] {
    return shuffleInPlace(items, this.next);
  }
}
