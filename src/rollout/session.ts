import type { SubmissionResult } from '../records/sandbox.js';
import { type SandboxClient, SandboxError, SessionLost } from '../sandbox/client.js';
import { AgentAbort, ServiceFailure } from './agent.js';
import { firstDifference, type GroupToolCache } from './tool-cache.js';
import type { CodeCall } from './tool-parser.js';

/**
 * How many times one call may rebuild a lost session (a new session, the trajectory's earlier
 * finished cells replayed into it) before the trajectory ends as the sandbox's failure: the
 * first loss and two more.
 */
export const MAX_REBUILDS = 3;

/** A result that says the session is unknown (a client that resolves it instead of rejecting). */
class NotFound extends Error {
  override name = 'NotFound';
}

const lost = (error: unknown): error is Error => error instanceof SessionLost || error instanceof NotFound;

/**
 * The sessions of a run that are open now, so the run can close those of trajectories it stops
 * (an abort, the error budget, a consumer that went away) before it closes its sandbox client.
 */
export class OpenSessions {
  readonly #open = new Set<ToolSession>();
  add(session: ToolSession): void {
    this.#open.add(session);
  }
  delete(session: ToolSession): void {
    this.#open.delete(session);
  }
  get size(): number {
    return this.#open.size;
  }
  /** Closes every session still open (a trajectory's own close afterwards does nothing). */
  async closeAll(): Promise<void> {
    await Promise.all([...this.#open].map((s) => s.close()));
  }
}

/** The group tool cache as a session sees it: the problem its trajectory belongs to. */
export interface SessionCache {
  cache: GroupToolCache;
  problem: string;
}

/**
 * One trajectory's Python session (`--tool-state session`): created when a cell must really run
 * (a trajectory that never calls a tool, or whose every cell comes from the cache, costs nothing),
 * every call sent as a cell of it, in order, and closed when the trajectory ends, whatever the way
 * (`close`). It keeps the trajectory's finished cells (a cell killed by a limit left the session
 * as it was and is not kept) and how many of them the live session holds: a cell answered from the
 * group cache (`--tool-cache group`: the same history of pure cells ran in another sample of the
 * problem) is not run, so the next cell that must run first replays those. When the service
 * loses the session (a worker restarted, the session expired: `SessionLost`), it builds a new one
 * the same way and runs the call again; `replays` counts such rebuilds (the record's
 * `session_replays`). A replayed cell must answer what the model saw the first time (status,
 * stdout, stderr: `firstDifference`): an impure cell (time, random numbers) that answers otherwise
 * would leave the session in a state the model never saw, and the trajectory would go on from it.
 * A rebuild that fails (lost again `MAX_REBUILDS` times, a replayed cell killed or answering
 * otherwise this time, or a service error) ends the trajectory as an infrastructure error
 * (`ServiceFailure`, kind `sandbox`).
 */
export class ToolSession {
  #id: string | undefined;
  #closed = false;
  readonly #cells: CodeCall[] = [];
  /** What each of `#cells` answered when the model saw it: a replay must answer the same. */
  readonly #seen: SubmissionResult[] = [];
  /** How many of `#cells` the live session (`#id`) holds. */
  #applied = 0;
  replays = 0;

  constructor(
    private readonly sandbox: SandboxClient,
    private readonly ended: () => boolean,
    private readonly open: OpenSessions,
    /** The problem's files (name -> base64): the session's working directory starts with them. */
    private readonly files?: Record<string, string>,
    private readonly shared?: SessionCache,
  ) {}

  /** Runs `call` as the session's next cell (or takes its result from the group cache). */
  async run(call: CodeCall): Promise<SubmissionResult> {
    const result = this.shared
      ? await this.shared.cache.run(
          this.shared.problem,
          call.code,
          call.input,
          () => this.#live(call),
          this.#cells,
        )
      : await this.#live(call);
    if (result.session_rolled_back !== true) {
      this.#cells.push(call);
      this.#seen.push(result);
    }
    return result;
  }

  /** Runs `call` in the live session, after the finished cells it does not hold yet. */
  async #live(call: CodeCall): Promise<SubmissionResult> {
    const history = this.#cells.length;
    for (let rebuilds = 0; ; rebuilds++) {
      let id: string | undefined;
      try {
        id = this.#id ?? (await this.#create());
        if (rebuilds > 0) this.replays += 1;
        await this.#catchUp(id, history);
        const result = await this.#cell(id, call);
        if (result.session_rolled_back !== true) this.#applied = history + 1;
        return result;
      } catch (error) {
        if (!lost(error)) throw error;
        if (this.#id === id) this.#forget();
        if (rebuilds + 1 >= MAX_REBUILDS) {
          throw new ServiceFailure(
            'sandbox',
            `sandbox ${this.sandbox.url}: the session was lost ${rebuilds + 1} times and could not be rebuilt (${error.message})`,
          );
        }
      }
    }
  }

  /**
   * A session for a branch (tree rollouts) that holds this one's state now: the same finished cells,
   * and, when a live session holds any of them, a fork of it (`POST /sessions/ID/fork`: variables
   * and files copied), so its cells run on from exactly where this trajectory stood. Cells the
   * live session does not hold (answered by the group cache) are replayed into the fork when it
   * first runs a cell, as after a loss; a fork of a session the service lost starts that way too.
   */
  async fork(): Promise<ToolSession> {
    if (this.#closed || this.ended()) throw new AgentAbort('rollout stopped');
    const child = new ToolSession(this.sandbox, this.ended, this.open, this.files, this.shared);
    child.#cells.push(...this.#cells);
    child.#seen.push(...this.#seen);
    const id = this.#id;
    if (id === undefined || this.#applied === 0) return child;
    let copy: string;
    try {
      copy = await this.sandbox.forkSession(id);
    } catch (error) {
      if (lost(error)) return child;
      if (!(error instanceof SandboxError)) throw error;
      // as for a call: a refused token stops the run, any other failure is the sandbox's
      if (error.kind === 'auth') throw new AgentAbort(error.message);
      throw new ServiceFailure('sandbox', error.message);
    }
    if (this.#closed || this.ended()) {
      await this.sandbox.closeSession(copy).catch(() => {});
      throw new AgentAbort('rollout stopped');
    }
    child.#id = copy;
    child.#applied = this.#applied;
    this.open.add(child);
    return child;
  }

  /** Closes the session if one was opened; idempotent, and never fails the trajectory. */
  async close(): Promise<void> {
    this.#closed = true;
    const id = this.#id;
    this.#forget();
    if (id !== undefined) await this.sandbox.closeSession(id).catch(() => {});
  }

  async #create(): Promise<string> {
    if (this.#closed || this.ended()) throw new AgentAbort('rollout stopped');
    const id = await this.sandbox.createSession(this.files ? { files: this.files } : {});
    if (this.#closed || this.ended()) {
      // The trajectory (or the run) ended while the session was being made: nothing uses it.
      await this.sandbox.closeSession(id).catch(() => {});
      throw new AgentAbort('rollout stopped');
    }
    this.#id = id;
    this.#applied = 0;
    this.open.add(this);
    return id;
  }

  async #cell(id: string, call: CodeCall): Promise<SubmissionResult> {
    const result = await this.sandbox.run({
      type: 'python',
      solution: call.code,
      input: call.input,
      session_id: id,
    });
    if (result.reason === 'session_not_found')
      throw new NotFound(`sandbox ${this.sandbox.url}: session ${id} not found`);
    return result;
  }

  /**
   * The finished cells the live session does not hold (all of them in a new session, those the
   * cache answered otherwise), in order; each must answer as it did when the model saw it.
   */
  async #catchUp(id: string, upTo: number): Promise<void> {
    for (let i = this.#applied; i < upTo; i++) {
      const result = await this.#cell(id, this.#cells[i]);
      if (result.session_rolled_back === true) {
        throw new ServiceFailure(
          'sandbox',
          `sandbox ${this.sandbox.url}: replaying the session's cell ${i + 1} of ${upTo}, it was killed this time (${result.reason || 'no reason'})`,
        );
      }
      const difference = firstDifference(this.#seen[i], result);
      if (difference !== undefined) {
        throw new ServiceFailure(
          'sandbox',
          `sandbox ${this.sandbox.url}: replaying the session's cell ${i + 1} of ${upTo}, it answered otherwise than the model saw (${difference}): the session cannot be rebuilt as it was`,
        );
      }
      this.#applied = i + 1;
    }
  }

  #forget(): void {
    this.#id = undefined;
    this.#applied = 0;
    this.open.delete(this);
  }
}
