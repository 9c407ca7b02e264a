import { type EngineClient, EngineError } from './engines.js';
import type { AsyncScheduler, Scheduler, TurnRequest } from './scheduler.js';

/** Where engine events go: one line each, on stderr unless a caller takes them. */
export type HealthLog = (line: string) => void;

const stderrLog: HealthLog = (line) => void process.stderr.write(`${line}\n`);

/**
 * Engine health for one run. Every `scrapeMs` it probes each engine (its KV capacity, within the
 * client's probe timeout, 5 s by default) and feeds the answer to the scheduler. An engine that
 * does not answer a probe (a timeout, a refused connection, a 5xx) has stopped answering, e.g. a
 * hung (SIGSTOPped) process whose sockets still accept: it is set aside at once, named on the log
 * with the cause, and its generations in flight are aborted, so those turns go back to the queue
 * and run on the other engines instead of waiting out the engine timeout. It is never the last
 * engine alive that is set aside (its turns have nowhere else to go). A set-aside engine is probed
 * on as before and rejoins when it answers again (after SIGCONT, say); the log says so. With
 * `scrapeMs` 0 it probes only while some engine is set aside, every 500 ms.
 */
export class EngineHealth<R extends TurnRequest> {
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  /** Cancels the probes in flight at `stop`: one to a hung engine would hold the process for its timeout. */
  #probes = new AbortController();
  /** Engines whose probe has not come back yet: a hung one is not probed twice at once. */
  #probing = new Set<number>();
  /** Engines reported down on the log, so each transition is said once. */
  #down = new Set<number>();

  constructor(
    private readonly engines: readonly EngineClient[],
    private readonly core: Scheduler<R>,
    private readonly scheduler: AsyncScheduler<R>,
    private readonly scrapeMs: number,
    /** Called after every probe (a progress report). */
    private readonly onScrape: () => void,
    private readonly log: HealthLog = stderrLog,
  ) {}

  start(): void {
    this.#schedule();
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#probes.abort();
  }

  /**
   * A turn failed on `engine` with a retryable error (`cause`): set the engine aside (never the
   * last one alive, so the turn has somewhere to go) and make sure a probe will bring it back.
   */
  setAside(engine: number, cause?: string): void {
    if (this.core.isAlive(engine) && this.#othersAlive(engine)) {
      this.core.setAlive(engine, false);
      this.#report(
        engine,
        `failed a turn${cause === undefined ? '' : ` (${this.#cause(engine, cause)})`}: set aside`,
      );
    }
    // Without a periodic scrape no probe may be pending: start one (again).
    if (this.#timer === undefined || this.scrapeMs <= 0) {
      clearTimeout(this.#timer);
      this.#schedule();
    }
  }

  #othersAlive(engine: number): boolean {
    return this.engines.some((_, e) => e !== engine && this.core.isAlive(e));
  }

  /** An error's message without the engine's URL, which the log line says first. */
  #cause(e: number, message: string): string {
    return message.replace(`${this.engines[e].url}: `, '');
  }

  #report(e: number, what: string): void {
    if (this.#down.has(e)) return;
    this.#down.add(e);
    this.log(`rollout: engine ${this.engines[e].url} ${what}`);
  }

  /** The engine did not answer its probe: set it aside and take its turns in flight back. */
  #notAnswering(e: number, cause: string): void {
    if (!this.core.isAlive(e)) return;
    if (!this.#othersAlive(e)) {
      this.#report(e, `stopped answering (${cause}); it is the only engine left: its turns wait for it`);
      return;
    }
    this.core.setAlive(e, false);
    const turns = this.engines[e].abortInflight(`engine set aside: it stopped answering (${cause})`);
    this.#report(
      e,
      `stopped answering (${cause}): set aside, ${turns} turn(s) in flight go to the other engines; ` +
        'it rejoins when it answers again',
    );
  }

  async #probe(e: number): Promise<void> {
    const engine = this.engines[e];
    const seq = this.core.sequence;
    try {
      const cap = await engine.capacity(this.#probes.signal).catch((error: unknown) => {
        // A 4xx is an answer: the engine is up, it only does not report its capacity.
        if (error instanceof EngineError && !error.retryable) return undefined;
        throw error;
      });
      if (!this.core.isAlive(e)) this.core.setAlive(e, true);
      if (this.#down.delete(e)) this.log(`rollout: engine ${engine.url} answers again: back in the rotation`);
      if (cap !== undefined) this.core.observe(e, cap, seq);
    } catch (error) {
      if (this.#stopped) return;
      this.#notAnswering(e, this.#cause(e, (error as Error).message));
    }
    if (this.#stopped) return;
    this.scheduler.pump();
    this.onScrape();
  }

  #scrapeOnce(): void {
    for (const e of this.engines.keys()) {
      if (this.#probing.has(e)) continue;
      this.#probing.add(e);
      void this.#probe(e).finally(() => this.#probing.delete(e));
    }
  }

  #schedule(): void {
    if (this.#stopped) return;
    const anyDead = this.engines.some((_, e) => !this.core.isAlive(e));
    if (this.scrapeMs <= 0 && !anyDead) {
      this.#timer = undefined;
      return;
    }
    this.#timer = setTimeout(
      () => {
        this.#scrapeOnce();
        this.#schedule();
      },
      this.scrapeMs > 0 ? this.scrapeMs : 500,
    );
  }
}
