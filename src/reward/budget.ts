/**
 * A time bound for one comparison. Everything here is synchronous (rollout scores each trajectory
 * inline), so instead of a timer the evaluator polls `check()` in its loops; the clock is only read
 * every few hundred polls to keep the integer fast path cheap.
 */
export class Timeout extends Error {
  override name = 'Timeout';
}

export class Budget {
  readonly #deadline: number;
  #polls = 0;

  constructor(ms: number) {
    this.#deadline = performance.now() + ms;
  }

  check(): void {
    this.#polls += 1;
    if ((this.#polls & 255) === 0 && performance.now() > this.#deadline)
      throw new Timeout('comparison timed out');
  }

  /** A hard check that always reads the clock, for the outer (coarse) loops. */
  checkNow(): void {
    if (performance.now() > this.#deadline) throw new Timeout('comparison timed out');
  }
}
