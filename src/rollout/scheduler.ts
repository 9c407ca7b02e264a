/**
 * The KV-cache-aware scheduler: one queue of pending assistant turns, engines chosen by free KV
 * capacity. Pure bookkeeping with an injectable clock, so the discrete-event benchmark drives
 * this very code; the rollout runner wraps it with promises (see `AsyncScheduler`).
 */

export type Policy = 'kv' | 'least-requests' | 'round-robin' | 'static';
/** Order in which `kv` starts new trajectories (the baselines always start them first come, first served). */
export type Order = 'longest-first' | 'fifo';
export const POLICIES: readonly Policy[] = ['kv', 'least-requests', 'round-robin', 'static'];

export interface TurnRequest {
  /** The trajectory; later turns prefer the engine that served the earlier ones (prefix cache). */
  key: string;
  /** Problem index: `static` pins each problem's samples to engine `group mod engines`. */
  group: number;
  /** Tokens already in the context (prompt + response so far). */
  contextLen: number;
  maxNewTokens: number;
}

export interface Assignment<R extends TurnRequest = TurnRequest> {
  readonly id: number;
  readonly engine: number;
  readonly request: R;
  /** KV tokens reserved: context + max_new_tokens. */
  readonly reserved: number;
  readonly queuedAt: number;
  readonly dispatchedAt: number;
}

export interface EngineStats {
  alive: boolean;
  total: number;
  free: number;
  inflight: number;
  reserved: number;
  dispatched: number;
  /** Dispatches made although the reservation did not fit: the engine may have to preempt. */
  overcommits: number;
}

export interface SchedulerOptions {
  policy?: Policy;
  /** Milliseconds (or any unit); the benchmark passes simulated time. */
  clock?: () => number;
  /**
   * The prefix engine is kept while it has room for the turn and at least this fraction of the
   * best engine's free capacity; below that, moving is cheaper than waiting (default 0.5).
   */
  prefixMinFraction?: number;
  /**
   * How long (clock units) a turn waits for its prefix engine to have room before it moves and
   * pays a full prefill elsewhere (default 15000). Other turns go ahead meanwhile.
   */
  prefixWaitMs?: number;
  /**
   * `longest-first` (the default for `kv`): new trajectories start one sample of every problem
   * first, then the remaining samples of the problems whose turns take longest (an upper
   * estimate from the durations of finished turns, see `estimateZ`, or the age of a turn still
   * running, whichever is larger). Samples of one problem are alike in length, so this starts the
   * long trajectories early instead of leaving them to trail at the end of the batch. Turns of
   * trajectories under way always go first. `fifo`: in submission order.
   */
  order?: Order;
  /**
   * How pessimistic `longest-first` is about a problem seen little: it is ranked by
   * exp(mean ln duration + z · σ / √n), σ the pooled within-problem spread (default 2).
   */
  estimateZ?: number;
  /**
   * Rounds of probing (`longest-first`, default 3): before any problem is started whole, every
   * problem gets one more sample per round, in estimate order, so the estimate that decides the
   * order rests on up to this many samples (the first wave of 64 engines is mostly probes).
   */
  probes?: number;
  /**
   * A caller's own ranking of problems (larger = longer trajectories, any unit), e.g. the
   * lengths seen in an earlier epoch. Problems it ranks are not probed and are started in its
   * order; give it for every problem or for none, as its unit is not that of the online estimate.
   */
  prior?: (group: number) => number | undefined;
  /**
   * Trajectories under way at once: from the dispatch of a trajectory's first turn until
   * `forget`. A new trajectory starts only below this (default: no limit). The runner passes its
   * `concurrency` here rather than holding trajectories back itself, so that every trajectory of
   * the batch is visible to the start order, not only the first `concurrency` submitted.
   */
  maxActive?: number;
}

interface Engine {
  alive: boolean;
  total: number;
  /** KV in use at the last scrape (ours and anyone else's). */
  scrapedUsed: number;
  /** Assignments with ids above this were made after the last scrape started. */
  scrapeSeq: number;
  /** Outstanding reservations made since the last scrape. */
  sinceScrape: number;
  /** All outstanding reservations. */
  reserved: number;
  inflight: number;
  dispatched: number;
  overcommits: number;
}

/** What the scheduler has seen of one problem's turns: its estimate of how long they run. */
interface Group {
  started: number;
  done: number;
  /** Sums of ln(duration) and ln(duration)² of finished turns (dispatch to release). */
  logSum: number;
  logSq: number;
  /** Dispatch times of its turns in flight, by assignment id. */
  running: Map<number, number>;
}

interface Pending<R> {
  request: R;
  queuedAt: number;
  /** Order of the trajectory's first turn: the queue serves older trajectories first. */
  rank: number;
  /** The trajectory's first turn. */
  fresh?: boolean;
}

export class Scheduler<R extends TurnRequest = TurnRequest> {
  readonly policy: Policy;
  #engines: Engine[];
  #queue: Pending<R>[] = [];
  #clock: () => number;
  #prefixMin: number;
  #prefixWait: number;
  #prefix = new Map<string, number>();
  #ranks = new Map<string, number>();
  #nextRank = 0;
  #outstanding = new Map<number, Assignment<R>>();
  #nextId = 1;
  #rr = 0;
  readonly order: Order;
  /** First turns of trajectories not yet started, per problem, in submission order. */
  #fresh = new Map<number, Pending<R>[]>();
  #freshCount = 0;
  #groups = new Map<number, Group>();
  #z: number;
  #probes: number;
  #prior: ((group: number) => number | undefined) | undefined;
  #maxActive: number;
  /** Keys of trajectories started and not yet forgotten. */
  #active = new Set<string>();

  /** `capacities`: each engine's KV tokens (Infinity when unknown until the first scrape). */
  constructor(capacities: readonly number[], options: SchedulerOptions = {}) {
    if (capacities.length === 0) throw new Error('scheduler needs at least one engine');
    this.policy = options.policy ?? 'kv';
    this.#clock = options.clock ?? (() => performance.now());
    this.#prefixMin = options.prefixMinFraction ?? 0.5;
    this.#prefixWait = options.prefixWaitMs ?? 15_000;
    this.order = this.policy === 'kv' ? (options.order ?? 'longest-first') : 'fifo';
    this.#z = options.estimateZ ?? 2;
    this.#probes = options.probes ?? 3;
    this.#prior = options.prior;
    this.#maxActive = options.maxActive ?? Number.POSITIVE_INFINITY;
    this.#engines = capacities.map((total) => ({
      alive: true,
      total,
      scrapedUsed: 0,
      scrapeSeq: 0,
      sinceScrape: 0,
      reserved: 0,
      inflight: 0,
      dispatched: 0,
      overcommits: 0,
    }));
  }

  get size(): number {
    return this.#engines.length;
  }

  get queued(): number {
    return this.#queue.length + this.#freshCount;
  }

  get inflight(): number {
    return this.#outstanding.size;
  }

  /** Trajectories started and not yet forgotten. */
  get active(): number {
    return this.#active.size;
  }

  /**
   * Free KV of engine `e`: the free capacity the last scrape saw minus what we reserved since
   * that scrape, and never more than capacity minus all our outstanding reservations. The scrape
   * catches KV we did not reserve (other clients, cache); the cap keeps us from admitting on the
   * strength of a scrape that saw our turns before they grew to their reservation, which in the
   * benchmark turned into KV overflows and recomputation (docs/rollout.md).
   */
  free(e: number): number {
    const g = this.#engines[e];
    return Math.min(g.total - g.scrapedUsed - g.sinceScrape, g.total - g.reserved);
  }

  stats(): EngineStats[] {
    return this.#engines.map((g, e) => ({
      alive: g.alive,
      total: g.total,
      free: this.free(e),
      inflight: g.inflight,
      reserved: g.reserved,
      dispatched: g.dispatched,
      overcommits: g.overcommits,
    }));
  }

  /** Sequence number to take just before starting a scrape, and to pass to `observe`. */
  get sequence(): number {
    return this.#nextId - 1;
  }

  /**
   * A scrape: the engine's capacity and the KV in use when it was taken, which includes every
   * turn dispatched up to `sequence` (taken when the scrape started; default: now).
   */
  observe(e: number, capacity: { total: number; used: number }, sequence = this.sequence): void {
    const g = this.#engines[e];
    g.total = capacity.total;
    g.scrapedUsed = capacity.used;
    g.scrapeSeq = sequence;
    g.sinceScrape = 0;
    for (const a of this.#outstanding.values())
      if (a.engine === e && a.id > sequence) g.sinceScrape += a.reserved;
  }

  /** Marks an engine dead (its turns come back through `fail`) or alive again. */
  setAlive(e: number, alive: boolean): void {
    this.#engines[e].alive = alive;
  }

  isAlive(e: number): boolean {
    return this.#engines[e].alive;
  }

  /**
   * Queues a turn. The queue is ordered by when each trajectory started, so a trajectory coming
   * back from a tool call goes ahead of trajectories not yet begun: finishing started work first
   * is what keeps long trajectories from trailing at the end of the batch.
   */
  submit(request: R): void {
    let rank = this.#ranks.get(request.key);
    const fresh = rank === undefined;
    if (rank === undefined) {
      rank = this.#nextRank++;
      this.#ranks.set(request.key, rank);
    }
    const p: Pending<R> = { request, queuedAt: this.#clock(), rank, fresh };
    if (fresh && this.order === 'longest-first') {
      const list = this.#fresh.get(request.group);
      if (list) list.push(p);
      else this.#fresh.set(request.group, [p]);
      this.#freshCount++;
    } else this.#insert(p);
  }

  #group(g: number): Group {
    let x = this.#groups.get(g);
    if (!x) {
      x = { started: 0, done: 0, logSum: 0, logSq: 0, running: new Map() };
      this.#groups.set(g, x);
    }
    return x;
  }

  /**
   * How long this problem's turns may run: the upper end of what its finished turns say
   * (log-normal: mean of ln duration + spread / √n, so a problem seen little counts as long), or
   * the age of its oldest running turn if larger.
   */
  #estimate(g: Group, now: number, spread: number): number {
    let est = g.done > 0 ? Math.exp(g.logSum / g.done + spread / Math.sqrt(g.done)) : 0;
    for (const at of g.running.values()) est = Math.max(est, now - at);
    return est;
  }

  /** Pooled within-problem standard deviation of ln(turn duration). */
  #spread(): number {
    let ss = 0;
    let df = 0;
    for (const g of this.#groups.values()) {
      if (g.done < 2) continue;
      ss += Math.max(0, g.logSq - (g.logSum * g.logSum) / g.done);
      df += g.done - 1;
    }
    return df > 0 ? this.#z * Math.sqrt(ss / df) : 0;
  }

  /** Problems with trajectories waiting to start, in the order to start them. */
  #freshGroups(): number[] {
    const now = this.#clock();
    const spread = this.#spread();
    const keyed = [...this.#fresh.entries()].map(([g, list]) => {
      const x = this.#groups.get(g);
      const prior = this.#prior?.(g);
      // A problem nobody has tried yet goes first: one sample tells how long its turns run.
      const est =
        prior !== undefined
          ? prior
          : !x || x.started === 0
            ? Number.POSITIVE_INFINITY
            : this.#estimate(x, now, spread);
      return { g, est, rank: list[0].rank };
    });
    keyed.sort((a, b) => (b.est === a.est ? a.rank - b.rank : b.est - a.est));
    return keyed.map((k) => k.g);
  }

  #insert(p: Pending<R>): void {
    const q = this.#queue;
    let lo = 0;
    let hi = q.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (q[mid].rank <= p.rank) lo = mid + 1;
      else hi = mid;
    }
    q.splice(lo, 0, p);
  }

  /**
   * Dispatches what can go now, in queue order. A turn waiting for its prefix engine is passed
   * over (for at most `prefixWaitMs`); a new trajectory's turn that fits nowhere stops the scan,
   * so large turns are not starved by a stream of smaller ones.
   */
  poll(): Assignment<R>[] {
    const out: Assignment<R>[] = [];
    for (let i = 0; i < this.#queue.length; ) {
      const head = this.#queue[i];
      if (head.fresh && this.#active.size >= this.#maxActive) {
        i++;
        continue;
      }
      const e = this.#choose(head);
      if (e === 'wait') {
        i++;
        continue;
      }
      if (e === undefined) return out;
      this.#queue.splice(i, 1);
      out.push(this.#dispatch(head, e));
    }
    // Trajectories already under way went first (above); now start new ones: one sample of
    // each problem not tried yet, then whole problems in estimate order, until one fits nowhere.
    // Estimates change only with what was dispatched, so the order is recomputed after a round
    // that started something (a problem just probed is no longer untried).
    let order = this.#freshCount > 0 ? this.#freshGroups() : [];
    let started = 0;
    for (let round = 1; round <= this.#probes + 1; round++) {
      const probe = round <= this.#probes;
      if (started > 0 && this.#freshCount > 0) order = this.#freshGroups();
      started = 0;
      for (const g of order) {
        const list = this.#fresh.get(g);
        if (!list) continue;
        if (probe && ((this.#groups.get(g)?.started ?? 0) >= round || this.#prior?.(g) !== undefined))
          continue;
        do {
          if (this.#active.size >= this.#maxActive) return out;
          const e = this.#choose(list[0]);
          if (e === undefined || e === 'wait') return out;
          out.push(this.#dispatch(list.shift() as Pending<R>, e));
          this.#freshCount--;
          started++;
        } while (!probe && list.length > 0);
        if (list.length === 0) this.#fresh.delete(g);
      }
    }
    return out;
  }

  /** The turn returned: its reservation is released and its engine now holds the prefix. */
  release(a: Assignment<R>): void {
    if (!this.#unreserve(a)) return;
    this.#prefix.set(a.request.key, a.engine);
    const g = this.#groups.get(a.request.group);
    if (g) {
      const l = Math.log(Math.max(this.#clock() - a.dispatchedAt, 1e-3));
      g.done++;
      g.logSum += l;
      g.logSq += l * l;
    }
  }

  /** The turn failed on its engine: released and queued again at the front, not lost. */
  fail(a: Assignment<R>): void {
    if (!this.#unreserve(a)) return;
    if (this.#prefix.get(a.request.key) === a.engine) this.#prefix.delete(a.request.key);
    this.#queue.unshift({ request: a.request, queuedAt: a.queuedAt, rank: -1 });
  }

  /** The trajectory ended; its prefix hint is no longer needed. */
  forget(key: string): void {
    this.#prefix.delete(key);
    this.#ranks.delete(key);
    this.#active.delete(key);
  }

  #unreserve(a: Assignment<R>): boolean {
    if (!this.#outstanding.delete(a.id)) return false;
    this.#groups.get(a.request.group)?.running.delete(a.id);
    const g = this.#engines[a.engine];
    g.reserved -= a.reserved;
    g.inflight--;
    if (a.id > g.scrapeSeq) g.sinceScrape -= a.reserved;
    return true;
  }

  #dispatch(p: Pending<R>, e: number): Assignment<R> {
    const g = this.#engines[e];
    const reserved = p.request.contextLen + p.request.maxNewTokens;
    if (this.free(e) < reserved) g.overcommits++;
    const a: Assignment<R> = {
      id: this.#nextId++,
      engine: e,
      request: p.request,
      reserved,
      queuedAt: p.queuedAt,
      dispatchedAt: this.#clock(),
    };
    g.reserved += reserved;
    g.sinceScrape += reserved;
    g.inflight++;
    g.dispatched++;
    this.#outstanding.set(a.id, a);
    const grp = this.#group(p.request.group);
    grp.running.set(a.id, a.dispatchedAt);
    if (p.fresh) {
      grp.started++;
      this.#active.add(p.request.key);
    }
    return a;
  }

  #alive(): number[] {
    const out: number[] = [];
    for (const [e, g] of this.#engines.entries()) if (g.alive) out.push(e);
    return out;
  }

  #choose(p: Pending<R>): number | 'wait' | undefined {
    const r = p.request;
    const alive = this.#alive();
    if (alive.length === 0) return undefined;
    switch (this.policy) {
      case 'round-robin': {
        for (let k = 0; k < this.#engines.length; k++) {
          const e = (this.#rr + k) % this.#engines.length;
          if (this.#engines[e].alive) {
            this.#rr = e + 1;
            return e;
          }
        }
        return undefined;
      }
      case 'least-requests':
        return alive.reduce((b, e) => (this.#engines[e].inflight < this.#engines[b].inflight ? e : b));
      case 'static': {
        const n = this.#engines.length;
        for (let k = 0; k < n; k++) {
          const e = (r.group + k) % n;
          if (this.#engines[e].alive) return e;
        }
        return undefined;
      }
      case 'kv':
        return this.#chooseKv(p, alive);
    }
  }

  #chooseKv(p: Pending<R>, alive: number[]): number | 'wait' | undefined {
    const r = p.request;
    const need = r.contextLen + r.maxNewTokens;
    const score = (e: number): number => {
      const f = this.free(e);
      // Unknown capacity: fall back to the fewest reserved tokens.
      return Number.isFinite(f) ? f : -this.#engines[e].reserved;
    };
    let best = alive[0];
    for (const e of alive) {
      const s = score(e);
      const b = score(best);
      if (s > b || (s === b && this.#engines[e].inflight < this.#engines[best].inflight)) best = e;
    }
    const fits = (e: number) => this.free(e) >= need || this.#engines[e].inflight === 0;
    const pe = this.#prefix.get(r.key);
    if (pe !== undefined && this.#engines[pe].alive) {
      const fp = this.free(pe);
      const fb = this.free(best);
      if (fits(pe) && (!Number.isFinite(fb) || fp >= this.#prefixMin * fb)) return pe;
      // Its prefix engine is short: wait for it a while rather than recompute the prefix elsewhere.
      if (this.#clock() - p.queuedAt < this.#prefixWait) return 'wait';
    }
    // An idle engine takes even a turn larger than its capacity; otherwise it would never run.
    return fits(best) ? best : undefined;
  }
}

/** The scheduler with promises: `acquire` resolves when the turn is dispatched. */
export class AsyncScheduler<R extends TurnRequest = TurnRequest> {
  readonly core: Scheduler<R>;
  #waiters = new Map<R, (a: Assignment<R>) => void>();
  #pumpQueued = false;

  constructor(core: Scheduler<R>) {
    this.core = core;
  }

  /**
   * Queues a turn; it is dispatched from a microtask, so turns submitted together (a batch of
   * new trajectories) are all in the queue before the start order picks among them.
   */
  acquire(request: R): Promise<Assignment<R>> {
    return new Promise((resolve) => {
      this.#waiters.set(request, resolve);
      this.core.submit(request);
      if (this.#pumpQueued) return;
      this.#pumpQueued = true;
      queueMicrotask(() => {
        this.#pumpQueued = false;
        this.pump();
      });
    });
  }

  release(a: Assignment<R>): void {
    this.core.release(a);
    this.pump();
  }

  /** Sends the turn back to the queue; the returned promise resolves at its next dispatch. */
  retry(a: Assignment<R>): Promise<Assignment<R>> {
    return new Promise((resolve) => {
      this.#waiters.set(a.request, resolve);
      this.core.fail(a);
      this.pump();
    });
  }

  /** Dispatches whatever fits now; call after capacity changes too. */
  pump(): void {
    for (const a of this.core.poll()) {
      const resolve = this.#waiters.get(a.request);
      this.#waiters.delete(a.request);
      resolve?.(a);
    }
  }
}
