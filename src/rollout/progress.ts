import type { EngineClient } from './engines.js';
import type { EngineStats } from './scheduler.js';

export interface RolloutProgress {
  done: number;
  total: number;
  tokens: number;
  toolCalls: number;
  elapsedMs: number;
  engines: { url: string; alive: boolean; inflight: number; free: number; dispatched: number }[];
}

/** The run's counters, reported through `onProgress` after every finished trajectory and engine event. */
export class ProgressMeter {
  #done = 0;
  #tokens = 0;
  #toolCalls = 0;
  readonly #started: number;

  constructor(
    public total: number,
    private readonly engines: readonly EngineClient[],
    private readonly stats: () => EngineStats[],
    private readonly clock: () => number,
    private readonly onProgress: ((p: RolloutProgress) => void) | undefined,
  ) {
    this.#started = clock();
  }

  /** More trajectories to wait for (a sample's branches). */
  grow(count: number): void {
    this.total += count;
  }

  get done(): number {
    return this.#done;
  }

  generated(tokens: number): void {
    this.#tokens += tokens;
  }

  calledTools(calls: number): void {
    this.#toolCalls += calls;
  }

  finished(): void {
    this.#done++;
    this.report();
  }

  report(): void {
    if (!this.onProgress) return;
    const stats = this.stats();
    this.onProgress({
      done: this.#done,
      total: this.total,
      tokens: this.#tokens,
      toolCalls: this.#toolCalls,
      elapsedMs: this.clock() - this.#started,
      engines: this.engines.map((e, i) => ({
        url: e.url,
        alive: stats[i].alive,
        inflight: stats[i].inflight,
        free: stats[i].free,
        dispatched: stats[i].dispatched,
      })),
    });
  }
}
