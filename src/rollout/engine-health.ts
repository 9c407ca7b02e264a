import type { EngineClient } from './engines.js';
import type { AsyncScheduler, Scheduler, TurnRequest } from './scheduler.js';

/**
 * Engine health for one run: every `scrapeMs` it scrapes the engines' KV capacity into the
 * scheduler, and it probes engines set aside after a failed turn until they answer again. With
 * `scrapeMs` 0 it runs only while some engine is set aside, probing every 500 ms.
 */
export class EngineHealth<R extends TurnRequest> {
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(
    private readonly engines: readonly EngineClient[],
    private readonly core: Scheduler<R>,
    private readonly scheduler: AsyncScheduler<R>,
    private readonly scrapeMs: number,
    /** Called after every scrape (a progress report). */
    private readonly onScrape: () => void,
  ) {}

  start(): void {
    this.#schedule();
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
  }

  /**
   * A turn failed on `engine` with a retryable error: set the engine aside (never the last one
   * alive, so the turn has somewhere to go) and make sure a probe will bring it back.
   */
  setAside(engine: number): void {
    if (this.core.isAlive(engine) && this.core.stats().filter((x) => x.alive).length > 1)
      this.core.setAlive(engine, false);
    // Without a periodic scrape no probe may be pending: start one (again).
    if (this.#timer === undefined || this.scrapeMs <= 0) {
      clearTimeout(this.#timer);
      this.#schedule();
    }
  }

  async #scrapeOnce(): Promise<void> {
    await Promise.all(
      this.engines.map(async (engine, e) => {
        const seq = this.core.sequence;
        const cap = await engine.capacity().catch(() => null);
        if (cap === null) return;
        if (!this.core.isAlive(e)) this.core.setAlive(e, true);
        if (cap !== undefined) this.core.observe(e, cap, seq);
      }),
    );
    this.scheduler.pump();
    this.onScrape();
  }

  #schedule(): void {
    if (this.#stopped) return;
    const anyDead = this.engines.some((_, e) => !this.core.isAlive(e));
    if (this.scrapeMs <= 0 && !anyDead) return;
    this.#timer = setTimeout(
      () => {
        void this.#scrapeOnce().finally(() => this.#schedule());
      },
      this.scrapeMs > 0 ? this.scrapeMs : 500,
    );
  }
}
