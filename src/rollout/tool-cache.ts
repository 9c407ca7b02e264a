import type { SubmissionResult } from '../records/sandbox.js';

/** `--tool-cache`: off (every call runs), or group (a problem's identical deterministic calls run once). */
export const TOOL_CACHE_MODES = ['off', 'group'] as const;
export type ToolCacheMode = (typeof TOOL_CACHE_MODES)[number];

/**
 * Code that could print something else when run again: randomness, clocks, the process, the
 * machine, or a way around this check (exec, eval, __import__). Matched as substrings, case
 * aside, so it errs towards running the call (`rand` also catches randint, np.random and sympy's
 * randprime; `time` catches datetime and perf_counter).
 */
const MAY_VARY =
  /rand|shuffle|choice|sample|uniform|gauss|secret|uuid|time|\bdate|clock|sleep|perf_counter|monotonic|\bos\b|getpid|environ|thread|multiprocess|concurrent|asyncio|subprocess|socket|signal|\bid\(|hash|open\(|glob|pathlib|tempfile|resource|platform|ctypes|\bgc\b|argv|exec|eval|__import__|importlib|globals|locals|getattr|__builtins__|\/dev\/|\/proc\b/i;

/** Trajectories per problem among `jobs`: what a group cache counts down. */
export function samplesPerProblem(jobs: readonly { problem: { id: string } }[]): Map<string, number> {
  const samples = new Map<string, number>();
  for (const job of jobs) samples.set(job.problem.id, (samples.get(job.problem.id) ?? 0) + 1);
  return samples;
}

/** Whether running `code` again on the same stdin can only print the same thing. */
export function deterministic(code: string): boolean {
  return !MAY_VARY.test(code);
}

/**
 * The n samples of one problem often make the very same tool call: in the main job 73% of the
 * 25,070 calls of 100 RL steps repeated a call of their own group, each a sandbox fork (~20 ms of
 * CPU on a slow-forking VM). With this cache a group's identical calls (same code, same stdin)
 * share one run, even while it is in flight; code that may print something else when run again
 * (`deterministic`) always runs. A group's entries are dropped when its last sample finishes,
 * so what it holds is bounded by the problems in flight. A call that fails (the sandbox service,
 * not the program) is dropped too: the next identical call runs again.
 */
export class GroupToolCache {
  #groups = new Map<string, { left: number; calls: Map<string, Promise<SubmissionResult>> }>();
  /** Calls answered from an earlier identical call of their group. */
  hits = 0;

  /** `samples`: how many trajectories of each problem this run will finish. */
  constructor(samples: Map<string, number>) {
    for (const [problem, left] of samples) this.#groups.set(problem, { left, calls: new Map() });
  }

  run(problem: string, code: string, input: string, execute: () => Promise<SubmissionResult>) {
    const group = this.#groups.get(problem);
    if (group === undefined || !deterministic(code)) return execute();
    const key = JSON.stringify([code, input]);
    const known = group.calls.get(key);
    if (known !== undefined) {
      this.hits += 1;
      return known;
    }
    const running = execute();
    group.calls.set(key, running);
    running.catch(() => {
      if (group.calls.get(key) === running) group.calls.delete(key);
    });
    return running;
  }

  /** One trajectory of `problem` has finished; the group's results go with its last one. */
  finished(problem: string): void {
    const group = this.#groups.get(problem);
    if (group !== undefined && --group.left <= 0) this.#groups.delete(problem);
  }
}
