import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { createClient } from 'redis';
import type { Submission, SubmissionResult } from '../records/sandbox.js';
import { submissionKey } from './key.js';
import type { Metrics } from './metrics.js';
import { type LocalPool, type Runner, type SessionHandle, SessionNotFound } from './pool.js';
import { failure } from './result.js';

type Client = ReturnType<typeof createClient>;

/** How often a server says it is alive, and how long that lasts (what a takeover of another host's calls waits). */
const HEARTBEAT_MS = 1000;
const ALIVE_TTL_MS = 5000;
/** Consumer names: `HOST-PID-RANDOM`. */
const CONSUMER = /^(.*)-(\d+)-[0-9a-f]{8}$/;
/** Deletes a call's state key only while it still names the dead runner. */
const RELEASE =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export interface RedisRunnerOptions {
  log?: (line: string) => void;
  /** Key prefix, so several services can share one Redis. */
  prefix?: string;
  /** How long results stay readable (dedup window), seconds. */
  resultTtlS?: number;
}

/** `OWNER~LOCAL`: the server holding a session, and the session's id on that server's pool. */
const SESSION_ID = /^(.+)~(s-[0-9a-f-]+)$/;

interface Remote {
  owner: string;
  giveUpAt: number;
  resolve: (value: Record<string, unknown>) => void;
}

interface Waiter {
  submission: Submission;
  startBy: number;
  giveUpAt: number;
  resolve: (result: SubmissionResult) => void;
}

/**
 * Scale-out over one Redis: every `sandbox-serve --redis URL` enqueues the calls it receives on a
 * shared stream and works that stream with its own executors (consumer group: each message goes
 * to one worker). Delivery is at-least-once: a worker acknowledges a message only after storing
 * its result, and messages a dead worker held are claimed by another after `timeout + 5 s`.
 * Results are idempotent: stored once per submission key (`SET NX`), and a worker skips a call
 * whose result exists. A call is answered `queue_timeout` only after the waiter atomically marks
 * it expired (`SET NX` on its state key), which also prevents any worker from starting it later.
 */
export class RedisRunner implements Runner {
  readonly metrics: Metrics;
  #url: string;
  #pool: LocalPool;
  #log: (line: string) => void;
  #prefix: string;
  #resultTtlS: number;
  #consumer = `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  #client!: Client;
  #reader!: Client;
  #subscriber!: Client;
  #waiters = new Map<string, Waiter[]>();
  #running = 0;
  #closing = false;
  #loops: Promise<void>[] = [];
  #poller?: NodeJS.Timeout;
  #heart?: NodeJS.Timeout;
  #wake?: () => void;
  #started = false;
  #owned!: Client;
  #remotes = new Map<string, Remote>();

  constructor(url: string, pool: LocalPool, options: RedisRunnerOptions = {}) {
    this.#url = url;
    this.#pool = pool;
    this.metrics = pool.metrics;
    this.#log = options.log ?? (() => {});
    this.#prefix = options.prefix ?? 'rstar:sandbox';
    this.#resultTtlS = options.resultTtlS ?? 3600;
  }

  get #stream() {
    return `${this.#prefix}:jobs`;
  }
  get #group() {
    return 'workers';
  }
  get #channel() {
    return `${this.#prefix}:done:${this.#consumer}`;
  }
  #resultKey(id: string) {
    return `${this.#prefix}:res:${id}`;
  }
  #stateKey(id: string) {
    return `${this.#prefix}:state:${id}`;
  }
  #aliveKey(consumer: string) {
    return `${this.#prefix}:alive:${consumer}`;
  }
  get #claimIdleMs() {
    return (this.#pool.options.timeoutS + 5) * 1000;
  }

  async start(): Promise<void> {
    // Before start-up ends, a Redis that cannot be reached fails start() (one error, no retry
    // loop holding the process up); afterwards the clients reconnect, logging why.
    const onError = (error: Error) => {
      if (this.#started) this.#log(`sandbox redis: ${error.message}`);
    };
    const reconnectStrategy = (retries: number, cause: Error) =>
      this.#started && !this.#closing ? Math.min(100 * (retries + 1), 2000) : cause;
    this.#client = createClient({ url: this.#url, socket: { reconnectStrategy } });
    this.#client.on('error', onError);
    try {
      await this.#client.connect();
    } catch (error) {
      throw new Error(`--redis ${this.#url}: ${(error as Error).message || String(error)}`);
    }
    this.#reader = this.#client.duplicate();
    this.#reader.on('error', onError);
    this.#stillStarting();
    await this.#reader.connect();
    this.#subscriber = this.#client.duplicate();
    this.#subscriber.on('error', onError);
    this.#stillStarting();
    await this.#subscriber.connect();
    this.#owned = this.#client.duplicate();
    this.#owned.on('error', onError);
    this.#stillStarting();
    await this.#owned.connect();
    this.#stillStarting();
    try {
      await this.#client.xGroupCreate(this.#stream, this.#group, '0', { MKSTREAM: true });
    } catch (error) {
      if (!String(error).includes('BUSYGROUP')) throw error;
    }
    await this.#subscriber.subscribe(this.#channel, (id) => {
      if (this.#remotes.has(id)) void this.#collectRemote([id]);
      else void this.#collect([id]);
    });
    // The heartbeat goes up before this consumer first reads, so no other server takes it for dead.
    await this.#beat();
    this.#stillStarting();
    this.#started = true;
    this.#heart = setInterval(() => {
      this.#beat().catch((error: Error) => this.#log(`sandbox redis: heartbeat: ${error.message}`));
    }, HEARTBEAT_MS);
    // A server SIGKILLed earlier: its calls are taken over and its consumer removed now.
    await this.#reapDead();
    this.#poller = setInterval(() => this.#poll(), 500);
    this.#loops.push(this.#readLoop(), this.#claimLoop(), this.#ownedLoop());
  }

  /** close() during start(): stop here, before another connection or timer is made. */
  #stillStarting(): void {
    if (this.#closing) throw new Error('closed while starting');
  }

  #beat(): Promise<unknown> {
    return this.#client.set(this.#aliveKey(this.#consumer), '1', { PX: ALIVE_TTL_MS });
  }

  /**
   * Is this consumer's server gone? On this host its pid says so at once; elsewhere, once its
   * heartbeat key has expired (ALIVE_TTL_MS after its last beat).
   */
  async #gone(consumer: string): Promise<boolean> {
    const owner = CONSUMER.exec(consumer);
    if (owner && owner[1] === hostname()) return !pidAlive(Number(owner[2]));
    return (await this.#client.exists(this.#aliveKey(consumer))) === 0;
  }

  /**
   * Takes over the calls of servers that died without closing (SIGKILL, OOM, a lost host) and
   * removes them from the consumer group, instead of leaving their calls to the idle-claim rule
   * (timeout + 5 s) and their names in the group forever. Their cgroups on this host go too.
   */
  async #reapDead(): Promise<void> {
    const consumers = await this.#client.xInfoConsumers(this.#stream, this.#group);
    let reaped = 0;
    for (const c of consumers as unknown as { name: string; pending: number }[]) {
      const name = String(c.name);
      if (name === this.#consumer || !(await this.#gone(name))) continue;
      let taken = 0;
      for (;;) {
        const held = await this.#client.xPendingRange(this.#stream, this.#group, '-', '+', 100, {
          consumer: name,
        });
        if (held.length === 0) break;
        const ids = held.map((h) => h.id);
        const claimed = await this.#client.xClaim(this.#stream, this.#group, this.#consumer, 0, ids);
        for (const m of claimed) {
          if (!m) continue;
          const message = m.message as Record<string, string>;
          // The dead server's run claim would keep the call from starting for up to timeout + 3 s.
          await this.#client.eval(RELEASE, {
            keys: [this.#stateKey(message.id)],
            arguments: [`run:${name}`],
          });
          taken += 1;
          this.#process(m.id, message);
        }
        // Entries whose message was deleted come back as null: acknowledge them away.
        const gone = ids.filter((id) => !claimed.some((m) => m?.id === id));
        if (gone.length > 0) await this.#client.xAck(this.#stream, this.#group, gone);
      }
      await this.#client.xGroupDelConsumer(this.#stream, this.#group, name);
      await this.#client.del(this.#aliveKey(name));
      this.#log(
        `sandbox redis: consumer ${name} is gone: took over ${taken} calls, removed it from the group`,
      );
      reaped += 1;
    }
    if (reaped > 0) this.#pool.removeStaleCgroups();
  }

  // ---- sessions: each lives on the server that made it; calls for it from elsewhere go there ----

  /** This server's stream of calls for its own sessions (sticky routing). */
  #ownedStream(consumer: string): string {
    return `${this.#prefix}:owned:${consumer}`;
  }

  #split(id: string): { owner: string; local: string } | undefined {
    const match = SESSION_ID.exec(id);
    return match ? { owner: match[1], local: match[2] } : undefined;
  }

  #global(handle: SessionHandle): SessionHandle {
    return { ...handle, session_id: `${this.#consumer}~${handle.session_id}` };
  }

  async createSession(files?: Map<string, Buffer>): Promise<SessionHandle> {
    return this.#global(await this.#pool.createSession(files));
  }

  async forkSession(id: string): Promise<SessionHandle> {
    const where = this.#split(id);
    if (!where) throw new SessionNotFound(id);
    if (where.owner === this.#consumer) return this.#global(await this.#pool.forkSession(where.local));
    const answer = await this.#remote(where.owner, { kind: 'fork', session: where.local });
    if (answer.error) throw new SessionNotFound(id, String(answer.error));
    return answer as unknown as SessionHandle;
  }

  async closeSession(id: string): Promise<boolean> {
    const where = this.#split(id);
    if (!where) return false;
    if (where.owner === this.#consumer) return this.#pool.closeSession(where.local);
    const answer = await this.#remote(where.owner, { kind: 'close', session: where.local });
    return answer.closed === true;
  }

  async #submitCell(submission: Submission, long: boolean): Promise<SubmissionResult> {
    const id = String(submission.session_id);
    const where = this.#split(id);
    const lost = (why: string): SubmissionResult => ({
      ...failure(submission, 'session_not_found', 0, `session ${id} ${why}`),
      session_id: id,
    });
    if (!where) return lost('not found (not a session id of this service)');
    if (where.owner === this.#consumer) {
      const result = await this.#pool.submit({ ...submission, session_id: where.local }, long);
      return { ...result, session_id: id };
    }
    const answer = await this.#remote(where.owner, {
      kind: 'cell',
      session: where.local,
      submission: JSON.stringify({ ...submission, session_id: where.local }),
      long: long ? '1' : '0',
    });
    if (answer.lost) return lost(String(answer.lost));
    return { ...(answer as unknown as SubmissionResult), session_id: id };
  }

  /** Sends work to the server that owns a session and waits for its answer (or for it to be gone). */
  #remote(owner: string, fields: Record<string, string>): Promise<Record<string, unknown>> {
    const id = randomUUID();
    const o = this.#pool.options;
    return new Promise((resolve) => {
      this.#remotes.set(id, {
        owner,
        giveUpAt: Date.now() + (o.longQueueTimeoutS + o.timeoutS + 30) * 1000,
        resolve,
      });
      this.#gone(owner)
        .then(async (gone) => {
          if (gone) this.#answerRemote(id, { lost: 'was lost with its server', error: 'lost' });
          else
            await this.#client.xAdd(this.#ownedStream(owner), '*', { ...fields, id, reply: this.#channel });
        })
        .catch((error: Error) =>
          this.#answerRemote(id, { lost: `unreachable: redis: ${error.message}`, error: 'lost' }),
        );
    });
  }

  #answerRemote(id: string, value: Record<string, unknown>): void {
    const remote = this.#remotes.get(id);
    if (!remote) return;
    this.#remotes.delete(id);
    remote.resolve(value);
  }

  async #collectRemote(ids: string[]): Promise<void> {
    const wanted = ids.filter((id) => this.#remotes.has(id));
    if (wanted.length === 0) return;
    const values = await this.#client.mGet(wanted.map((id) => this.#resultKey(id)));
    values.forEach((value, i) => {
      if (value) this.#answerRemote(wanted[i], JSON.parse(value) as Record<string, unknown>);
    });
  }

  /** Remote waits whose owner died: their sessions died with it. */
  async #pollRemotes(): Promise<void> {
    if (this.#remotes.size === 0) return;
    await this.#collectRemote([...this.#remotes.keys()]);
    const now = Date.now();
    const owners = new Map<string, boolean>();
    for (const [id, remote] of this.#remotes) {
      if (!owners.has(remote.owner)) owners.set(remote.owner, await this.#gone(remote.owner));
      if (owners.get(remote.owner) || now > remote.giveUpAt)
        this.#answerRemote(id, { lost: 'was lost with its server', error: 'lost' });
    }
  }

  /** Reads the calls other servers send for this server's sessions. */
  async #ownedLoop(): Promise<void> {
    const stream = this.#ownedStream(this.#consumer);
    let last = '0-0';
    while (!this.#closing) {
      try {
        const reply = (await this.#owned.xRead({ key: stream, id: last }, { COUNT: 64, BLOCK: 500 })) as
          | { messages: { id: string; message: Record<string, string> }[] }[]
          | null;
        for (const entry of reply ?? [])
          for (const m of entry.messages) {
            last = m.id;
            void this.#serveOwned(m.message)
              .catch((error: Error) => this.#log(`sandbox redis: session call: ${error.message}`))
              .finally(() => this.#client.xDel(stream, m.id).catch(() => {}));
          }
      } catch (error) {
        if (this.#closing) break;
        this.#log(`sandbox redis: sessions: ${(error as Error).message}`);
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  async #serveOwned(message: Record<string, string>): Promise<void> {
    let answer: Record<string, unknown>;
    try {
      if (message.kind === 'cell') {
        const result = await this.#pool.submit(
          JSON.parse(message.submission) as Submission,
          message.long === '1',
        );
        answer =
          result.reason === 'session_not_found' ? { lost: 'not found (closed, expired or lost)' } : result;
      } else if (message.kind === 'fork') {
        answer = { ...this.#global(await this.#pool.forkSession(message.session)) };
      } else if (message.kind === 'close') {
        answer = { closed: await this.#pool.closeSession(message.session) };
      } else answer = { error: `unknown kind ${message.kind}` };
    } catch (error) {
      answer = { error: (error as Error).message, lost: (error as Error).message };
    }
    await this.#client.set(this.#resultKey(message.id), JSON.stringify(answer), { EX: this.#resultTtlS });
    await this.#client.publish(message.reply, message.id);
  }

  submit(submission: Submission, long: boolean): Promise<SubmissionResult> {
    if (submission.session_id !== undefined && submission.session_id !== null) {
      const started = performance.now();
      return this.#submitCell(submission, long).then((result) => {
        this.metrics.record(result.reason, (performance.now() - started) / 1000);
        return result;
      });
    }
    const id = submissionKey(submission) ?? randomUUID();
    const o = this.#pool.options;
    const now = Date.now();
    const startBy = now + (long ? o.longQueueTimeoutS : o.queueTimeoutS) * 1000;
    const waiter: Waiter & { promise?: Promise<SubmissionResult> } = {
      submission,
      startBy,
      // A started call finishes within its timeout; re-delivery after a worker death adds one more.
      giveUpAt: startBy + 2 * (o.timeoutS * 1000 + this.#claimIdleMs) + 10_000,
      resolve: () => {},
    };
    const started = performance.now();
    return new Promise<SubmissionResult>((resolve) => {
      waiter.resolve = (result) => {
        this.metrics.record(result.reason, (performance.now() - started) / 1000);
        resolve({ ...result, sub_id: submission.sub_id ?? result.sub_id });
      };
      if ((submission.type ?? 'python') !== 'python') {
        waiter.resolve(
          failure(submission, 'invalid_input', 0, `unsupported type '${submission.type}' (only python)`),
        );
        return;
      }
      if (this.#closing) {
        waiter.resolve(failure(submission, 'queue_timeout'));
        return;
      }
      const list = this.#waiters.get(id);
      if (list) {
        list.push(waiter);
        return;
      }
      this.#waiters.set(id, [waiter]);
      this.#enqueue(id, submission, long, startBy).catch((error: Error) => {
        this.#answer(id, failure(submission, 'internal_error', 0, `redis: ${error.message}`));
      });
    });
  }

  async #enqueue(id: string, submission: Submission, long: boolean, startBy: number): Promise<void> {
    const existing = await this.#client.get(this.#resultKey(id));
    if (existing) {
      this.metrics.deduplicated += 1;
      this.#answer(id, JSON.parse(existing) as SubmissionResult);
      return;
    }
    // A retry of a call that expired unstarted earlier may run now.
    const state = await this.#client.get(this.#stateKey(id));
    if (state === 'expired') await this.#client.del(this.#stateKey(id));
    if (!long && (await this.#client.xLen(this.#stream)) > this.#pool.options.maxQueue * 4) {
      // Overload: answered at once, never started (the state key makes sure of that).
      if (
        (await this.#client.set(this.#stateKey(id), 'expired', { NX: true, EX: this.#resultTtlS })) === 'OK'
      ) {
        this.#answer(id, failure(submission, 'queue_timeout'));
        return;
      }
    }
    await this.#client.xAdd(this.#stream, '*', {
      id,
      submission: JSON.stringify(submission),
      reply: this.#channel,
      start_by: String(startBy),
      long: long ? '1' : '0',
    });
  }

  #answer(id: string, result: SubmissionResult): void {
    const list = this.#waiters.get(id);
    if (!list) return;
    this.#waiters.delete(id);
    for (const waiter of list) waiter.resolve(result);
  }

  async #collect(ids: string[]): Promise<void> {
    const wanted = ids.filter((id) => this.#waiters.has(id));
    if (wanted.length === 0) return;
    const values = await this.#client.mGet(wanted.map((id) => this.#resultKey(id)));
    values.forEach((value, i) => {
      if (value) this.#answer(wanted[i], JSON.parse(value) as SubmissionResult);
    });
  }

  /** Catches results whose notification was missed, and calls that waited too long. */
  #poll(): void {
    void this.#pollRemotes().catch((error: Error) => this.#log(`sandbox redis: poll: ${error.message}`));
    if (this.#waiters.size === 0) return;
    const ids = [...this.#waiters.keys()];
    void this.#collect(ids)
      .then(async () => {
        const now = Date.now();
        for (const id of ids) {
          const list = this.#waiters.get(id);
          if (!list) continue;
          const first = list[0];
          if (now > first.giveUpAt) {
            this.#answer(id, failure(first.submission, 'internal_error', 0, 'no worker answered in time'));
          } else if (now > first.startBy) {
            const ok = await this.#client.set(this.#stateKey(id), 'expired', {
              NX: true,
              EX: this.#resultTtlS,
            });
            if (ok === 'OK')
              this.#answer(id, failure(first.submission, 'queue_timeout', (now - first.startBy) / 1000));
          }
        }
      })
      .catch((error: Error) => this.#log(`sandbox redis: poll: ${error.message}`));
  }

  #free(): number {
    return Math.max(0, this.#pool.options.workers - this.#running);
  }

  async #waitForSlot(): Promise<void> {
    while (!this.#closing && this.#free() === 0) {
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
      });
    }
  }

  async #readLoop(): Promise<void> {
    while (!this.#closing) {
      await this.#waitForSlot();
      if (this.#closing) break;
      try {
        const reply = (await this.#reader.xReadGroup(
          this.#group,
          this.#consumer,
          { key: this.#stream, id: '>' },
          { COUNT: this.#free(), BLOCK: 500 },
        )) as { messages: { id: string; message: Record<string, string> }[] }[] | null;
        for (const stream of reply ?? []) for (const m of stream.messages) this.#process(m.id, m.message);
      } catch (error) {
        if (this.#closing) break;
        this.#log(`sandbox redis: read: ${(error as Error).message}`);
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  /** Re-delivery: messages held by a worker that died (unacknowledged for too long). */
  async #claimLoop(): Promise<void> {
    while (!this.#closing) {
      await new Promise((r) => setTimeout(r, 1000));
      if (this.#closing) continue;
      try {
        await this.#reapDead();
      } catch (error) {
        if (!this.#closing) this.#log(`sandbox redis: reap: ${(error as Error).message}`);
      }
      if (this.#closing || this.#free() === 0) continue;
      try {
        const claimed = await this.#client.xAutoClaim(
          this.#stream,
          this.#group,
          this.#consumer,
          this.#claimIdleMs,
          '0-0',
          {
            COUNT: this.#free(),
          },
        );
        for (const m of claimed.messages) if (m) this.#process(m.id, m.message as Record<string, string>);
      } catch (error) {
        if (!this.#closing) this.#log(`sandbox redis: claim: ${(error as Error).message}`);
      }
    }
  }

  #process(messageId: string, message: Record<string, string>): void {
    this.#running += 1;
    this.#work(messageId, message)
      .catch((error: Error) => this.#log(`sandbox redis: job ${message.id}: ${error.message}`))
      .finally(() => {
        this.#running -= 1;
        this.#wake?.();
      });
  }

  async #work(messageId: string, message: Record<string, string>): Promise<void> {
    const { id, reply } = message;
    // Acknowledged messages are deleted too, so the stream does not grow with every call ever made.
    const ack = async () => {
      await this.#client.xAck(this.#stream, this.#group, messageId);
      await this.#client.xDel(this.#stream, messageId);
    };
    const resultKey = this.#resultKey(id);
    if (await this.#client.exists(resultKey)) {
      await this.#client.publish(reply, id);
      await ack();
      return;
    }
    const timeoutMs = this.#pool.options.timeoutS * 1000;
    // The state key says who runs the call; it expires so a dead runner's call can run again.
    const claim = await this.#client.set(this.#stateKey(id), `run:${this.#consumer}`, {
      NX: true,
      PX: timeoutMs + 3000,
    });
    if (claim !== 'OK') {
      const state = await this.#client.get(this.#stateKey(id));
      if (state === 'expired' || (await this.#client.exists(resultKey))) await ack();
      // Otherwise another worker runs it now; the message stays pending until that settles.
      return;
    }
    const submission = JSON.parse(message.submission) as Submission;
    const result = await this.#pool.submit(submission, true);
    const attempts = Number(message.attempts ?? '0') + 1;
    if ((result.reason === 'internal_error' && attempts < 3) || result.reason === 'queue_timeout') {
      // Not a real answer (this worker is shutting down or its executor died): let another try. A
      // server that is closing gives the call back too (close() waits for this before it leaves the
      // group), so it leaves no pending entry and so no consumer behind.
      await this.#client.del(this.#stateKey(id));
      await ack().then(() => this.#requeue({ ...message, attempts: String(attempts) }));
      return;
    }
    await this.#client.set(resultKey, JSON.stringify(result), { NX: true, EX: this.#resultTtlS });
    await this.#client.publish(reply, id);
    await ack();
  }

  async #requeue(message: Record<string, string>): Promise<void> {
    await this.#client.xAdd(this.#stream, '*', message);
  }

  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    this.#wake?.();
    if (this.#poller) clearInterval(this.#poller);
    if (this.#heart) clearInterval(this.#heart);
    const clients = [this.#client, this.#reader, this.#subscriber, this.#owned].filter(
      (c) => c !== undefined,
    );
    if (!this.#started) {
      // start() did not finish (a signal, an unreachable Redis): nothing was taken from the queue.
      for (const c of clients) if (c.isOpen) c.destroy();
      return;
    }
    // Calls this server started finish; queued ones stay in Redis for the other workers. The loops
    // end first: a read in flight when closing began may still hand over calls, answered (or given
    // back) before the consumer leaves the group.
    const deadline = Date.now() + (this.#pool.options.timeoutS + 2) * 1000;
    await Promise.allSettled(this.#loops);
    while (this.#running > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    for (const [id, list] of this.#waiters) {
      // queue_timeout promises "never started"; only a call marked expired can keep that promise.
      const ok = await this.#client
        .set(this.#stateKey(id), 'expired', { NX: true, EX: this.#resultTtlS })
        .catch(() => null);
      for (const w of list) {
        w.resolve(
          failure(
            w.submission,
            ok === 'OK' ? 'queue_timeout' : 'internal_error',
            0,
            ok === 'OK' ? undefined : 'server shut down while the call ran elsewhere',
          ),
        );
      }
      this.#waiters.delete(id);
    }
    for (const id of [...this.#remotes.keys()])
      this.#answerRemote(id, { lost: 'the server shut down', error: 'lost' });
    await this.#client.del(this.#ownedStream(this.#consumer)).catch(() => {});
    await this.#leaveGroup().catch((error: Error) => this.#log(`sandbox redis: leaving: ${error.message}`));
    await Promise.allSettled(clients.map((c) => c.quit()));
  }

  /** A clean exit leaves no consumer behind; one still holding calls stays until another server takes them. */
  async #leaveGroup(): Promise<void> {
    const held = await this.#client.xPendingRange(this.#stream, this.#group, '-', '+', 1, {
      consumer: this.#consumer,
    });
    if (held.length === 0) await this.#client.xGroupDelConsumer(this.#stream, this.#group, this.#consumer);
    await this.#client.del(this.#aliveKey(this.#consumer));
  }
}
