import {
  familyOf,
  isMultiStep,
  repeatedCalls,
  type ToolUseSample,
  toolUse,
  toolUseByFamily,
  trajectoryToolUse,
} from '../algo/tool-use.js';
import { fnv1a, mulberry32 } from '../random.js';
import type { Problem } from '../records/problem.js';
import type { EndBatch as RecordEndBatch } from '../records/step.js';
import type { Trajectory } from '../records/trajectory.js';
import { branchBudget } from './branch.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import { type EngineClient, loraPolicy, servingPolicy } from './engines.js';
import { type RolloutOptions, rollout } from './runner.js';
import { emptyCounts } from './tool-cache.js';

/** The end_batch line rollout --steps writes after each step (the EndBatch record, stats filled). */
export type EndBatch = RecordEndBatch & { v: 1; step: number; stats: StepStats };
export type StepStats = NonNullable<RecordEndBatch['stats']>;

export interface StepOptions {
  /** Problems per step: the batch, and the target number of mixed groups under dynamic sampling. */
  batch: number;
  /** The last step (inclusive). */
  steps: number;
  /** The first step (default 1): a resumed run starts after its last finished checkpoint. */
  startStep?: number;
  /**
   * Step k is generated once every engine serves policy k - 1 - maxStaleness or later (default 0:
   * strictly on-policy, each step waits for the previous one's weights; 1: one-step-off overlap).
   */
  maxStaleness?: number;
  /** Refill up to this many times the batch in problems per step until `batch` groups are mixed (1: off). */
  dynamicSampling?: number;
  /**
   * Under dynamic sampling, the first round of step k already samples batch / r problems (up to the
   * cap), r the share of mixed groups in step k-1, so most steps need no refill round: each round
   * waits for its slowest trajectory, and a refill round's small batch leaves the engines idle.
   */
  oversample?: boolean;
  /**
   * When refill problems start under dynamic sampling. `rounds` (default): once every trajectory of
   * the previous round has finished. `streaming`: as soon as the groups finished so far show that
   * the problems under way will fall short of `batch` mixed groups, alongside the trajectories still
   * running, so a refill does not wait for the slowest trajectory of the round before it.
   */
  refill?: 'rounds' | 'streaming';
  seed?: number;
  /** How often the engines' weight_version is polled while waiting (default 200 ms). */
  pollMs?: number;
  /** Stops waiting (e.g. when downstream has gone away). */
  signal?: AbortSignal;
  /** Tree rollouts: K continuations per failed call, and the branch samples each step may spend. */
  branch?: { k: number; budget: number };
  /**
   * LoRA: the engines serve adapters named `rstar-lora-step-N` (train-step --sync of an adapter);
   * each step's requests name the adapter of the policy waited for (the base for 0), and a reply
   * from another policy ends its trajectory with `finish: "error"`.
   */
  lora?: boolean;
}

/** Problem order: epoch e is a seeded permutation of the set, so a resumed run draws the same batches. */
function permutation(n: number, key: string): number[] {
  const random = mulberry32(fnv1a(key));
  const out = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i -= 1) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** The problems of step k: positions (k-1)B .. kB-1 of the epoch-by-epoch permuted sequence. */
export function stepProblems(
  problems: readonly Problem[],
  k: number,
  batch: number,
  seed: number,
): Problem[] {
  const n = problems.length;
  const out: Problem[] = [];
  const seen = new Set<string>();
  for (let pos = (k - 1) * batch; out.length < Math.min(batch, n); pos += 1) {
    const epoch = Math.floor(pos / n);
    const p = problems[permutation(n, `${seed}:epoch:${epoch}`)[pos % n]];
    if (seen.has(p.id)) continue; // a batch spanning two epochs takes each problem once
    seen.add(p.id);
    out.push(p);
  }
  return out;
}

/** Problems for a refill round of step k: a permutation of its own, without the step's earlier ones. */
function refillProblems(
  problems: readonly Problem[],
  k: number,
  round: number,
  count: number,
  used: ReadonlySet<string>,
  seed: number,
): Problem[] {
  return permutation(problems.length, `${seed}:step:${k}:refill:${round}`)
    .map((i) => problems[i])
    .filter((p) => !used.has(p.id))
    .slice(0, count);
}

function parseVersion(url: string, label: string | undefined): number {
  if (label === undefined) {
    throw new Error(
      `${url}: the engine reports no weight_version; rollout --steps needs one to wait for each step's policy ` +
        '(engine-serve and SGLang >= 0.5 report it; see docs/rollout.md)',
    );
  }
  if (!/^\d+$/.test(label)) {
    throw new Error(
      `${url}: weight_version '${label}' is not a step number; start the engine with --weight-version N ` +
        '(engine-serve) or --weight-version N (SGLang) for the checkpoint it loads',
    );
  }
  return Number(label);
}

/** Waits until every engine serves policy `need` or later; returns the oldest version served. */
async function waitForPolicy(
  engines: readonly EngineClient[],
  need: number,
  options: StepOptions,
): Promise<number> {
  for (;;) {
    const versions = await Promise.all(
      engines.map(async (e) => {
        const label = await e.weightVersion();
        // vLLM with LoRA: no rstar adapter listed yet means the base, policy 0
        return parseVersion(e.url, label ?? (options.lora && e.kind === 'vllm' ? '0' : undefined));
      }),
    );
    const oldest = Math.min(...versions);
    if (oldest >= need) return oldest;
    if (options.signal?.aborted) throw new Error('rollout stopped while waiting for the engines');
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 200));
  }
}

const isMixed = (rewards: readonly number[]) =>
  rewards.length > 1 && Math.min(...rewards) !== Math.max(...rewards);

/**
 * A step's tool use over its scored trajectories (infrastructure failures left out), as its
 * end_batch line carries it: `tool_use`, `tool_use_by_family`, `tool_use_multi_step`, the
 * metrics of src/algo/tool-use.ts.
 */
export class StepToolUse {
  readonly #uses: (ToolUseSample & { family?: string; multi_step: boolean })[] = [];
  constructor(
    readonly families: ReadonlyMap<string, string | undefined>,
    readonly multiStep: ReadonlySet<string>,
  ) {}

  add(t: Trajectory): void {
    if (failed(t)) return;
    this.#uses.push({
      tool_calls: t.tool_calls,
      tool_errors: t.tool_errors,
      ...(t.tool_status !== undefined ? { tool_status: t.tool_status } : {}),
      reward: t.reward,
      repeated_calls: repeatedCalls(t.text),
      family: this.families.get(t.problem_id),
      multi_step: this.multiStep.has(t.problem_id),
    });
  }

  stats(): Pick<StepStats, 'tool_use' | 'tool_use_by_family' | 'tool_use_multi_step'> {
    const byFamily = toolUseByFamily(this.#uses, (u) => u.family);
    const multi = this.#uses.filter((u) => u.multi_step);
    return {
      tool_use: toolUse(this.#uses),
      ...(Object.keys(byFamily).length > 0 ? { tool_use_by_family: byFamily } : {}),
      ...(multi.length > 0 ? { tool_use_multi_step: toolUse(multi) } : {}),
    };
  }
}

/** An infrastructure failure, kept out of the learning signal (finish "error"). */
const failed = (t: Trajectory) => t.finish === 'error';

interface StreamingContext {
  /** Samples per problem: a group is finished when this many of its trajectories are in. */
  n: number;
  target: number;
  cap: number;
  /** The previous step's share of mixed groups, if any: the chance that an undecided group ends mixed. */
  prior: number | undefined;
  used: Set<string>;
  stamp: (t: Trajectory) => Trajectory;
  refill: (round: number, count: number) => Problem[];
}

/**
 * One step's rollouts with refills started as groups are decided. A group is decided mixed as soon as
 * two of its trajectories differ in reward (finished or not), decided equal when all n are in and
 * agree; the rest are undecided. After each group decided equal, the decided mixed groups plus the
 * undecided ones times the previous step's mixed share (0.5 for the first step; at least 1 in 10) are
 * compared to the target, and the shortfall at that share (up to the cap) starts at once as another
 * round, beside the rounds under way. (Counting this step's finished groups instead over-sampled: the
 * groups that finish first are the short ones, mostly all correct.) Returns the number of rounds.
 */
async function* streamingStep(
  first: Problem[],
  round: (problems: Problem[], r: number) => AsyncGenerator<Trajectory>,
  c: StreamingContext,
): AsyncGenerator<Trajectory, number> {
  const seen = new Map<string, { count: number; min: number; max: number }>();
  let mixed = 0; // decided mixed
  let equal = 0; // decided equal
  const rate = Math.max(0.1, c.prior ?? 0.5);
  const running = new Map<
    number,
    { gen: AsyncGenerator<Trajectory>; next: Promise<IteratorResult<Trajectory>> }
  >();
  let rounds = 0;
  const start = (problems: Problem[]) => {
    rounds += 1;
    const gen = round(problems, rounds);
    running.set(rounds, { gen, next: gen.next() });
  };
  start(first);
  try {
    while (running.size > 0) {
      const [r, result] = await Promise.race(
        [...running].map(([id, entry]) => entry.next.then((res) => [id, res] as const)),
      );
      const entry = running.get(r)!;
      if (result.done) {
        running.delete(r);
        continue;
      }
      entry.next = entry.gen.next();
      const t = result.value;
      // A branch is no sample of its problem's group: it decides nothing about the group's rewards.
      if (t.branch !== undefined) {
        yield c.stamp(t);
        continue;
      }
      const g = seen.get(t.problem_id) ?? { count: 0, min: Infinity, max: -Infinity };
      g.count += 1;
      const wasMixed = g.min < g.max;
      if (!failed(t)) {
        g.min = Math.min(g.min, t.reward);
        g.max = Math.max(g.max, t.reward);
      }
      seen.set(t.problem_id, g);
      yield c.stamp(t);
      if (!wasMixed && g.min < g.max) mixed += 1;
      if (g.count !== c.n || g.min < g.max) continue;
      equal += 1;
      const room = c.cap - c.used.size;
      if (room <= 0 || mixed >= c.target) continue;
      const undecided = c.used.size - mixed - equal;
      const short = c.target - mixed - undecided * rate;
      if (short <= 0) continue;
      const more = c.refill(rounds, Math.min(room, Math.ceil(short / rate)));
      if (more.length > 0) start(more);
    }
  } finally {
    await Promise.all([...running.values()].map((e) => e.gen.return(undefined)));
  }
  return rounds;
}

/**
 * The RL loop's rollout side: for each step, waits until the engines serve a recent enough policy,
 * samples the step's problems (n each), refills with more problems while too few groups are mixed
 * (dynamic sampling, DAPO-style, up to a cap), and yields every trajectory as it finishes, stamped
 * with its `step` and `policy_version`, then an EndBatch line. The rollout options are those of a
 * single `rollout` call; each step's sampling seed is derived from the base seed and the step.
 */
export async function* rolloutSteps(
  problems: readonly Problem[],
  rolloutOptions: RolloutOptions,
  options: StepOptions,
): AsyncGenerator<Trajectory | EndBatch> {
  const seed = options.seed ?? rolloutOptions.seed ?? 0;
  const cap = Math.max(1, options.dynamicSampling ?? 1) * options.batch;
  let mixedRate: number | undefined; // the previous step's share of mixed groups (at least 1 in 10)
  const families = new Map(problems.map((p) => [p.id, familyOf(p.id, p.meta)]));
  const multiStep = new Set(problems.filter((p) => isMultiStep(p.meta)).map((p) => p.id));
  for (let k = options.startStep ?? 1; k <= options.steps; k += 1) {
    const t0 = Date.now();
    const version = await waitForPolicy(rolloutOptions.engines, k - 1 - (options.maxStaleness ?? 0), options);
    const waited = (Date.now() - t0) / 1000;
    const rewards = new Map<string, number[]>();
    const used = new Set<string>();
    let batch = stepProblems(problems, k, options.batch, seed);
    if (options.oversample && mixedRate !== undefined) {
      // the step's own problems first, so the draw of step k does not depend on the estimate
      const want = Math.min(cap, Math.ceil(options.batch / mixedRate));
      const own = new Set(batch.map((p) => p.id));
      batch = [...batch, ...refillProblems(problems, k, 0, Math.max(0, want - batch.length), own, seed)];
    }
    const tally = { trajectories: 0, sum: 0, scored: 0 };
    // Every round's cache adds to the step's counts.
    const session = rolloutOptions.protocol.toolState === 'session';
    const toolCache = rolloutOptions.toolCache === 'group' ? emptyCounts() : undefined;
    let replays = 0;
    const turnsByVersion: Record<string, number> = {};
    const uses = new StepToolUse(families, multiStep);
    const budget = options.branch ? branchBudget(options.branch.budget) : undefined;
    const branches = { correct: 0, recovered: 0, errors: 0, tokens: 0 };
    let generated = 0;
    const stamp = (t: Trajectory): Trajectory => {
      tally.trajectories += 1;
      replays += t.session_replays ?? 0;
      // a branch's own tokens only: its prefix was generated (and counted) by its parent
      const own = t.loss_mask.reduce<number>((n, m) => n + m, 0);
      generated += own;
      if (t.branch !== undefined) {
        branches.tokens += own;
        if (failed(t)) branches.errors += 1;
        else if (t.reward > 0) {
          branches.correct += 1;
          if (trajectoryToolUse(t).recovered === true) branches.recovered += 1;
        }
        return { ...t, step: k, policy_version: String(version) } as Trajectory;
      }
      for (const v of t.turn_versions ?? []) turnsByVersion[v] = (turnsByVersion[v] ?? 0) + 1;
      uses.add(t);
      if (!failed(t)) {
        const list = rewards.get(t.problem_id) ?? [];
        list.push(t.reward);
        rewards.set(t.problem_id, list);
        tally.sum += t.reward;
        tally.scored += 1;
      }
      return { ...t, step: k, policy_version: String(version) } as Trajectory;
    };
    // with LoRA the whole step asks for one policy, so its trajectories are exactly `version`'s
    const engines = options.lora
      ? rolloutOptions.engines.map((e) => servingPolicy(e, loraPolicy(version)))
      : rolloutOptions.engines;
    const round = (problemsOfRound: Problem[], r: number) => {
      for (const p of problemsOfRound) used.add(p.id);
      return rollout(problemsOfRound, {
        ...rolloutOptions,
        engines,
        seed: seed * 1_000_003 + k * 101 + r,
        skip: undefined,
        toolCacheCounts: toolCache,
        ...(options.branch && budget ? { branch: { k: options.branch.k, budget } } : {}),
      });
    };
    let rounds = 0;
    if (options.refill === 'streaming') {
      rounds = yield* streamingStep(batch, round, {
        n: rolloutOptions.n ?? ROLLOUT_DEFAULTS.n,
        target: options.batch,
        cap,
        prior: mixedRate,
        used,
        stamp,
        refill: (r, count) => refillProblems(problems, k, r, count, used, seed),
      });
    } else {
      while (batch.length > 0) {
        rounds += 1;
        for await (const t of round(batch, rounds)) yield stamp(t);
        const mixed = [...rewards.values()].filter(isMixed).length;
        const room = cap - used.size;
        if (mixed >= options.batch || room <= 0) break;
        // Ask for enough problems to reach the target at the mixed rate seen so far (at least 1 in 10).
        const rate = Math.max(0.1, mixed / Math.max(1, rewards.size));
        batch = refillProblems(
          problems,
          k,
          rounds,
          Math.min(room, Math.ceil((options.batch - mixed) / rate)),
          used,
          seed,
        );
      }
    }
    const { trajectories, sum, scored } = tally;
    const mixed = [...rewards.values()].filter(isMixed).length;
    if (rewards.size > 0) mixedRate = Math.max(0.1, mixed / rewards.size);
    yield {
      v: 1,
      end_batch: true,
      step: k,
      stats: {
        problems: used.size,
        trajectories,
        mean_reward: scored > 0 ? sum / scored : 0,
        mixed_groups: mixed,
        rounds,
        policy_version: version,
        ...(Object.keys(turnsByVersion).length > 0 ? { turns_by_version: turnsByVersion } : {}),
        ...(toolCache ? { tool_cache: toolCache } : {}),
        ...(session ? { tool_state: 'session' as const, session_replays: replays } : {}),
        ...uses.stats(),
        generated_tokens: generated,
        ...(budget
          ? {
              branches: {
                points: budget.points,
                samples: budget.samples,
                correct: branches.correct,
                recovered: branches.recovered,
                errors: branches.errors,
                tokens: branches.tokens,
              },
            }
          : {}),
        wait_seconds: Math.round(waited * 1000) / 1000,
        seconds: Math.round((Date.now() - t0) / 10) / 100,
      },
    };
  }
}
