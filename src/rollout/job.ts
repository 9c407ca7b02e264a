import type { Trajectory } from '../records/trajectory.js';
import { encodeFiles, type SandboxClient, SandboxError } from '../sandbox/client.js';
import type { Job, Turn } from './admission.js';
import { AgentAbort, type AgentIO, type AgentOptions, runAgent, ServiceFailure } from './agent.js';
import {
  type BranchOptions,
  type BranchStart,
  branchRecord,
  claimBranches,
  releaseBranches,
} from './branch.js';
import { type ProtocolContext, promptIds } from './protocol.js';
import { type ScoreOptions, scoreTrajectory, trajectoryRecord } from './record.js';
import type { Scheduler } from './scheduler.js';
import { type OpenSessions, ToolSession } from './session.js';
import type { GroupToolCache } from './tool-cache.js';
import { generateTurn, type TurnContext } from './turns.js';

/** What running one trajectory needs of the run, beyond generating its turns. */
export interface JobContext extends TurnContext {
  core: Scheduler<Turn>;
  protocol: ProtocolContext;
  sandbox: SandboxClient;
  /** The records' `policy` field. */
  policy: string;
  agent: Omit<AgentOptions, 'promptIds'>;
  score: ScoreOptions;
  clock: () => number;
  /** Every sample of a problem starts from the same prompt: rendered and tokenized once. */
  promptCache: Map<string, number[]>;
  /**
   * `--tool-cache group`: a problem's identical pure calls with a reproducible result run once; in
   * session mode, a cell whose whole history (the cells before it and itself) is the same.
   */
  toolCache?: GroupToolCache;
  /** Session mode (`protocol.toolState`): the trajectories' sessions open now, closed when the run ends. */
  sessions: OpenSessions;
  /** Tree rollouts (`--branch K`): continuations per failed call and the budget they draw on. */
  branch?: BranchOptions;
  /** Starts more jobs (a sample's branches) in this run; the run waits for them too. */
  spawn(jobs: RunnableJob[]): void;
}

/** A job as the run starts it: a sample of a problem, or a branch of one (with its forked session). */
export interface RunnableJob extends Job {
  branch?: BranchStart;
  /** Session mode: the branch's session, forked from its parent's at the branch point. */
  forked?: ToolSession;
}

/**
 * The sandbox as the agent loop's tool runner: service failures end the trajectory, a refused token
 * the run. In session mode a turn's calls run one after the other as cells of the trajectory's
 * session; otherwise at once, each in a fresh interpreter.
 */
async function runTools(
  run: JobContext,
  problem: string,
  calls: Parameters<AgentIO['runTools']>[0],
  session: ToolSession | undefined,
  files: Record<string, string> | undefined,
) {
  // A stateless call gets the problem's files in its working directory every time.
  const execute = (c: (typeof calls)[number]) => () =>
    run.sandbox.run({ type: 'python', solution: c.code, input: c.input, ...(files ? { files } : {}) });
  try {
    if (session) {
      const results = [];
      for (const c of calls) results.push(await session.run(c));
      return results;
    }
    return await Promise.all(
      calls.map((c) =>
        run.toolCache ? run.toolCache.run(problem, c.code, c.input, execute(c)) : execute(c)(),
      ),
    );
  } catch (error) {
    if (!(error instanceof SandboxError)) throw error;
    // A refused token is the run's configuration: stop it, never show it to the model.
    if (error.kind === 'auth') throw new AgentAbort(error.message);
    throw new ServiceFailure('sandbox', error.message);
  }
}

/** Runs one job through the agent loop, its turns through the scheduler, and returns its scored record. */
export async function runJob(run: JobContext, job: RunnableJob): Promise<Trajectory> {
  const timing = { queuedMs: 0, generateMs: 0 };
  // Under one-step-off the engines may load newer weights while a trajectory is under way, so the
  // policy that generated it is known per turn, not per step.
  const versions: (string | undefined)[] = job.branch ? [...job.branch.versions] : [];
  const files = encodeFiles(job.problem.files);
  const session =
    job.forked ??
    (run.protocol.toolState === 'session'
      ? new ToolSession(
          run.sandbox,
          run.ended,
          run.sessions,
          files,
          run.toolCache && { cache: run.toolCache, problem: job.problem.id },
        )
      : undefined);
  const io: AgentIO = {
    async generate(context, maxNew, turn) {
      const t0 = run.clock();
      const { gen, assignment } = await generateTurn(run, job, context, maxNew, turn);
      timing.queuedMs += assignment.dispatchedAt - t0;
      timing.generateMs += run.clock() - assignment.dispatchedAt;
      run.meter.generated(gen.ids.length);
      versions.push(gen.weightVersion);
      return gen;
    },
    runTools(calls) {
      run.meter.calledTools(calls.length);
      return runTools(run, job.problem.id, calls, session, files);
    },
  };
  const branching = run.branch;
  let branchedAt: { offset: number; of: number } | undefined;
  if (branching && !job.branch) {
    let branched = false;
    // A sample branches at its first failed call only: later ones would spend the budget on the
    // same few trajectories, and a branch never branches again.
    io.afterFailure = async (at) => {
      if (branched) return;
      branched = true;
      const k = claimBranches(branching);
      if (k === 0) return;
      const forks: ToolSession[] = [];
      try {
        if (session) for (let i = 0; i < k; i++) forks.push(await session.fork());
      } catch (error) {
        await Promise.all(forks.map((f) => f.close()));
        if (error instanceof AgentAbort) throw error;
        // The sandbox could not fork: this sample goes on unbranched, its budget back for others.
        releaseBranches(branching, k);
        return;
      }
      run.toolCache?.adopt(job.problem.id, k);
      branchedAt = { offset: at.response_ids.length, of: k };
      run.spawn(
        Array.from({ length: k }, (_, index) => ({
          problem: job.problem,
          group: job.group,
          sample: index,
          id: `${job.id}/b${index}`,
          branch: { parent: job.id, at, index, of: k, versions: [...versions] },
          ...(session ? { forked: forks[index] } : {}),
        })),
      );
    };
  }
  let ids = run.promptCache.get(job.problem.id);
  if (ids === undefined) {
    ids = promptIds(job.problem, run.protocol);
    run.promptCache.set(job.problem.id, ids);
  }
  // The session goes with its trajectory, however it ends (answer, turns, budget, error, abort).
  const r = await runAgent(job.problem.prompt, run.protocol, io, {
    ...run.agent,
    promptIds: ids,
    ...(job.branch ? { resume: job.branch.at } : {}),
  }).finally(async () => {
    run.toolCache?.finished(job.problem.id);
    await session?.close();
  });
  run.core.forget(job.id);
  let record = trajectoryRecord(job, run.policy, r, scoreTrajectory(job.problem, r, run.score), timing);
  if (job.branch) record = branchRecord(record, job.branch, run.protocol);
  if (branchedAt) record.branched = branchedAt;
  if (versions.length > 0 && versions.every((v) => v !== undefined))
    record.turn_versions = versions as string[];
  if (session) {
    record.tool_state = 'session';
    if (session.replays > 0) record.session_replays = session.replays;
  }
  return record;
}
