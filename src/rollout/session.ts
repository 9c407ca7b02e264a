import type { SubmissionResult } from '../records/sandbox.js';
import { type SandboxClient, SessionLost } from '../sandbox/client.js';
import { AgentAbort, ServiceFailure } from './agent.js';
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

/**
 * One trajectory's Python session (`--tool-state session`): created at its first tool call (a
 * trajectory that never calls a tool costs nothing), every call sent as a cell of it, in order,
 * and closed when the trajectory ends, whatever the way (`close`). It keeps the trajectory's
 * finished cells (a cell killed by a limit left the session as it was and is not kept). When the
 * service loses the session (a worker restarted, the session expired: `SessionLost`), it builds
 * a new one by running those cells again in order, their outputs discarded, then runs the call
 * again; `replays` counts such rebuilds (the record's `session_replays`). A rebuild that fails
 * (lost again `MAX_REBUILDS` times, a replayed cell killed this time, or a service error) ends the
 * trajectory as an infrastructure error (`ServiceFailure`, kind `sandbox`).
 */
export class ToolSession {
  #id: string | undefined;
  #closed = false;
  readonly #cells: CodeCall[] = [];
  replays = 0;

  constructor(
    private readonly sandbox: SandboxClient,
    private readonly ended: () => boolean,
    private readonly open: OpenSessions,
    /** The problem's files (name -> base64): the session's working directory starts with them. */
    private readonly files?: Record<string, string>,
  ) {}

  /** Runs `call` as the session's next cell. */
  async run(call: CodeCall): Promise<SubmissionResult> {
    for (let rebuilds = 0; ; rebuilds++) {
      let id: string | undefined;
      try {
        id = this.#id ?? (await this.#create());
        if (rebuilds > 0) {
          await this.#replay(id);
          this.replays += 1;
        }
        const result = await this.#cell(id, call);
        if (result.session_rolled_back !== true) this.#cells.push(call);
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

  /** The trajectory's finished cells, in order, into a new session; what they print is not used. */
  async #replay(id: string): Promise<void> {
    for (const [i, call] of this.#cells.entries()) {
      const result = await this.#cell(id, call);
      if (result.session_rolled_back === true) {
        throw new ServiceFailure(
          'sandbox',
          `sandbox ${this.sandbox.url}: rebuilding a lost session, cell ${i + 1} of ${this.#cells.length} was killed this time (${result.reason || 'no reason'})`,
        );
      }
    }
  }

  #forget(): void {
    this.#id = undefined;
    this.open.delete(this);
  }
}
