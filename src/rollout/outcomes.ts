import { DataError } from '../errors.js';
import type { Trajectory } from '../records/trajectory.js';

/**
 * Finished trajectories in completion order, and the first job that failed outright. Every job
 * is started at once and waits in the scheduler, so this is where the runner waits for them.
 */
export class Outcomes<T> {
  readonly #finished: T[] = [];
  #failure: unknown;
  #stopped = false;
  #wake: (() => void) | undefined;

  push(value: T): void {
    this.#finished.push(value);
    this.#notify();
  }

  fail(error: unknown): void {
    this.#failure ??= error;
    this.#notify();
  }

  /** The consumer is done (all yielded, or it stopped early). */
  stop(): void {
    this.#stopped = true;
  }

  /** True once no further turn should be sent: the consumer stopped, or a job failed the run. */
  get ended(): boolean {
    return this.#stopped || this.#failure !== undefined;
  }

  /** The next finished trajectory; throws the failure once every trajectory finished before it was taken. */
  async next(): Promise<T> {
    for (;;) {
      const value = this.#finished.shift();
      if (value !== undefined) return value;
      if (this.#failure !== undefined) throw this.#failure;
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
      });
    }
  }

  #notify(): void {
    this.#wake?.();
    this.#wake = undefined;
  }
}

/** `maxErrorShare`: the run fails once more than this share of its trajectories ended with `finish: "error"`. */
export class ErrorBudget {
  #errors = 0;
  #first: string | undefined;

  constructor(
    private total: number,
    private readonly maxShare: number,
  ) {}

  /** More trajectories in the run (a sample's branches). */
  grow(count: number): void {
    this.total += count;
  }

  /** Counts `t`; throws once the failures are more than the budget allows. */
  count(t: Trajectory): void {
    if (t.finish !== 'error') return;
    this.#errors++;
    this.#first ??= t.error?.message;
    if (this.#errors > this.maxShare * this.total) {
      throw new DataError(
        `rollout: ${this.#errors} of ${this.total} trajectories failed for infrastructure reasons, ` +
          `more than --max-error-share ${this.maxShare} (first: ${this.#first})`,
      );
    }
  }
}
