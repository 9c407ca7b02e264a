import {
  avgAtN,
  G_PASS_TAUS,
  gPassAtK,
  majorityVote,
  mGPassAtK,
  passAtK,
  passAtKCurve,
  reportedKs,
  tauKey,
} from '../algo/pass-at-k.js';
import {
  type CallStatus,
  repeatedCalls,
  type ToolUse,
  type ToolUseCounts,
  toolUse,
  toolUseByFamily,
  toolUseCounts,
  toolUseOf,
} from '../algo/tool-use.js';
import type { EvalProblem, EvalSummary } from '../records/eval.js';
import type { Finish, Trajectory } from '../records/trajectory.js';
import { mean, median, percentile } from './stats.js';

/**
 * What eval keeps of a trajectory: a few numbers instead of its token ids, so 16 samples of 500
 * problems with 30K-token responses fit in memory.
 */
export interface Sample {
  problem_id: string;
  sample: number;
  policy: string;
  reward: number;
  answer: string | null;
  /** Response length: every response token, tool output included (what the token budget counts). */
  tokens: number;
  /** Model-generated tokens only (loss_mask = 1). */
  model_tokens: number;
  tool_calls: number;
  tool_errors: number;
  /** Each call's status (absent from trajectories written before it existed). */
  tool_status?: CallStatus[];
  /** Calls identical to an earlier call of the trajectory (src/algo/tool-use.ts `repeatedCalls`). */
  repeated_calls?: number;
  answer_tags: number;
  finish: Finish;
  /** The problem's family (its meta.family, or a curriculum id's prefix), for the per-family tool use. */
  family?: string;
  /** The problem needs two or more calls (its meta.steps: the agentic families). */
  multi_step?: boolean;
}

export function toSample(t: Trajectory, family?: string, multiStep = false): Sample {
  let modelTokens = 0;
  for (const m of t.loss_mask) modelTokens += m;
  return {
    problem_id: t.problem_id,
    sample: t.sample,
    policy: t.policy,
    reward: t.reward,
    answer: t.answer,
    tokens: t.response_ids.length,
    model_tokens: modelTokens,
    tool_calls: t.tool_calls,
    tool_errors: t.tool_errors,
    ...(t.tool_status !== undefined ? { tool_status: t.tool_status } : {}),
    repeated_calls: repeatedCalls(t.text),
    answer_tags: t.answer_tags,
    finish: t.finish,
    ...(family !== undefined ? { family } : {}),
    ...(multiStep ? { multi_step: true } : {}),
  };
}

/** Outcome rewards are 1 or 0; anything positive counts as solved. */
export const isCorrect = (s: Sample): boolean => s.reward > 0;

/** No closed answer block, or nothing extracted from it. */
export const isFormatViolation = (s: Sample): boolean => s.answer_tags === 0 || s.answer === null;

/**
 * The violations by how their trajectory ended, and by its last call: one that ran and failed (the
 * answer was lost in the turns where the model has to read a traceback and fix its call) or one that
 * could not be read (the slip came earlier, in a call).
 */
export function violationEnds(samples: readonly Sample[]): {
  by_finish: Record<string, number>;
  after_failed_call: number;
  after_unparsable_call: number;
} {
  const violations = samples.filter(isFormatViolation);
  const lastIs = (status: CallStatus) => (s: Sample) => s.tool_status?.at(-1) === status;
  return {
    by_finish: countFinish(violations),
    after_failed_call: violations.filter(lastIs('failed')).length,
    after_unparsable_call: violations.filter(lastIs('unparsable')).length,
  };
}

function countFinish(samples: readonly Sample[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of samples) out[s.finish] = (out[s.finish] ?? 0) + 1;
  return out;
}

/** Groups distinct answers into equivalence classes once, so voting needs no repeated checks. */
async function classes(
  answers: readonly (string | null)[],
  same: (a: string, b: string) => Promise<boolean>,
): Promise<Map<string, number>> {
  const reps: string[] = [];
  const classOf = new Map<string, number>();
  for (const answer of answers) {
    if (answer === null || classOf.has(answer)) continue;
    let found = -1;
    for (let i = 0; i < reps.length && found < 0; i += 1) if (await same(reps[i], answer)) found = i;
    if (found < 0) {
      found = reps.length;
      reps.push(answer);
    }
    classOf.set(answer, found);
  }
  return classOf;
}

export interface EvalProblemRecord extends EvalProblem {
  benchmark: string;
  'pass@k': Record<string, number>;
  'maj@n': number;
  maj_answer: string | null;
  maj_votes: number;
  median_tokens: number;
  mean_model_tokens: number;
  tool_calls_per_traj: number;
  /** The tool-use counts of the problem's samples (src/algo/tool-use.ts): a family's metrics are ratios of their sums. */
  tool_counts: ToolUseCounts;
  format_violations: number;
  finish: Record<string, number>;
  /** Samples that ended with `finish: "error"` (infrastructure failures): not in `n` or any metric. */
  infra_errors: number;
}

/** The problem's family and whether it is multi-step, for the per-family intervals of `eval --compare`. */
const problemKind = (s: Sample | undefined) => ({
  ...(s?.family !== undefined ? { family: s.family } : {}),
  ...(s?.multi_step ? { multi_step: true } : {}),
});

/**
 * One problem's record over its scored samples (`unordered`, infrastructure failures already left
 * out and counted in `infraErrors`). `correct` counts rewarded samples; the majority answer is correct when
 * most of the samples in its class were rewarded (so maj@n uses the same verifier as the rewards).
 */
export async function problemRecord(
  benchmark: string,
  problemId: string,
  unordered: readonly Sample[],
  same: (a: string, b: string) => Promise<boolean>,
  infraErrors = 0,
): Promise<EvalProblemRecord> {
  const samples = [...unordered].sort((a, b) => a.sample - b.sample);
  const n = samples.length;
  const correct = samples.filter(isCorrect).length;
  const answers = samples.map((s) => s.answer);
  const classOf = await classes(answers, same);
  const maj = majorityVote(answers, (a, b) => classOf.get(a) === classOf.get(b));
  const majCorrect = maj !== null && maj.members.filter((i) => isCorrect(samples[i])).length * 2 >= maj.votes;
  const counts = toolUseCounts(samples);
  return {
    v: 1,
    benchmark,
    problem_id: problemId,
    n,
    correct,
    mean_reward: mean(samples.map((s) => s.reward)),
    'pass@k': passAtKCurve(n, correct),
    'maj@n': majCorrect ? 1 : 0,
    maj_answer: maj?.answer ?? null,
    maj_votes: maj?.votes ?? 0,
    mean_tokens: mean(samples.map((s) => s.tokens)),
    median_tokens: median(samples.map((s) => s.tokens)),
    mean_model_tokens: mean(samples.map((s) => s.model_tokens)),
    tool_calls: counts.calls,
    tool_errors: counts.failed_calls + counts.unparsable_calls,
    tool_calls_per_traj: toolUseOf(counts).tool_calls_per_traj,
    tool_counts: counts,
    format_violations: samples.filter(isFormatViolation).length,
    finish: countFinish(samples),
    infra_errors: infraErrors,
    ...problemKind(samples[0]),
  };
}

/**
 * The summary carries every tool-use metric of src/algo/tool-use.ts under its name there (their
 * definitions: `ToolUse`, docs/eval.md "Agentic tool use"), `accuracy` aside: that is avg@n's job.
 */
export type EvalSummaryRecord = EvalSummary & Omit<ToolUse, 'accuracy'> & EvalSummaryFigures;

interface EvalSummaryFigures {
  problems: number;
  /** Smallest and largest samples per problem; pass@k is reported for k up to the smallest. */
  n_max: number;
  /**
   * G-Pass@k_τ (arXiv 2412.13147), by k (the reported k from 2 up) then τ ("0.5", "0.75", "1"): the
   * chance that at least ⌈τk⌉ of k samples are correct, averaged over problems like pass@k.
   */
  'g-pass@k': Record<string, Record<string, number>>;
  /** mG-Pass@k by k: G-Pass@k_τ integrated over τ in [0.5, 1] (times 2), averaged over problems. */
  'mg-pass@k': Record<string, number>;
  'maj@n': number;
  median_tokens: number;
  p90_tokens: number;
  mean_model_tokens: number;
  /** Tool calls and calls that did not succeed (failed + unparsable), summed over the trajectories. */
  tool_calls: number;
  tool_errors: number;
  /** The tool-use counts of all the trajectories (src/algo/tool-use.ts). */
  tool_counts: ToolUseCounts;
  format_violations: number;
  format_violation_rate: number;
  /** The format violations by their trajectory's finish reason. */
  format_violations_by_finish: Record<string, number>;
  /** Format violations whose last tool call ran and failed (`violationEnds`). */
  format_violations_after_failed_call: number;
  /** Format violations whose last tool call could not be read. */
  format_violations_after_unparsable_call: number;
  finish: Record<string, number>;
  /** How answers were grouped for maj@n: the reward module's isEquivalent, or exact strings. */
  equivalence: 'isEquivalent' | 'exact';
  /** Where rewards came from: the trajectories as written, or re-verified by eval. */
  rewards: 'trajectory' | 'reverify';
  /** Trajectories that failed for infrastructure reasons (`finish: "error"`), left out of every metric. */
  infra_errors: number;
  /** Problems all of whose samples failed that way: left out of the averages. */
  problems_unscored: number;
  /** The tool-use metrics per problem family, where the problems name one. */
  families?: Record<string, ToolUse>;
  /** The same over the multi-step problems together (meta.steps >= 2), where there are any. */
  multi_step?: ToolUse;
}

/**
 * The benchmark summary. avg@n, pass@k and maj@n are macro averages over problems (each problem
 * weighs the same even if it has more samples); token and tool statistics are over trajectories.
 * Infrastructure failures are in neither (`samples` holds none); problems left with no scored
 * sample are counted in `problems_unscored` and left out of the averages.
 */
export function summarize(
  benchmark: string,
  all: readonly EvalProblemRecord[],
  samples: readonly Sample[],
  how: { equivalence: boolean; reverified: boolean },
): EvalSummaryRecord {
  const records = all.filter((r) => r.n > 0);
  const ns = records.map((r) => r.n);
  const n = ns.length === 0 ? 0 : Math.min(...ns);
  const passes: Record<string, number> = {};
  for (const k of reportedKs(n)) {
    passes[String(k)] = mean(records.map((r) => passAtK(r.n, r.correct, k) ?? 0));
  }
  // k = 1 is left out: every G-Pass@1_τ is pass@1, and mG-Pass@1's sum is empty.
  const gPasses: Record<string, Record<string, number>> = {};
  const mgPasses: Record<string, number> = {};
  for (const k of reportedKs(n).filter((k) => k >= 2)) {
    gPasses[String(k)] = Object.fromEntries(
      G_PASS_TAUS.map((tau) => [
        tauKey(tau),
        mean(records.map((r) => gPassAtK(r.n, r.correct, k, tau) ?? 0)),
      ]),
    );
    mgPasses[String(k)] = mean(records.map((r) => mGPassAtK(r.n, r.correct, k) ?? 0));
  }
  const counts = toolUseCounts(samples);
  const { accuracy: _, ...use } = toolUseOf(counts);
  const tokens = samples.map((s) => s.tokens);
  const violations = samples.filter(isFormatViolation).length;
  const ends = violationEnds(samples);
  const policies = [...new Set(samples.map((s) => s.policy))].sort();
  const families = toolUseByFamily(samples, (s) => s.family);
  const multiStep = samples.filter((s) => s.multi_step);
  return {
    v: 1,
    summary: true,
    benchmark,
    policy: policies.join(','),
    problems: all.length,
    n,
    n_max: ns.length === 0 ? 0 : Math.max(...ns),
    'avg@n': mean(records.map((r) => avgAtN(r.n, r.correct) ?? 0)),
    'pass@k': passes,
    'g-pass@k': gPasses,
    'mg-pass@k': mgPasses,
    'maj@n': mean(records.map((r) => r['maj@n'])),
    mean_tokens: mean(tokens),
    median_tokens: median(tokens),
    p90_tokens: percentile(tokens, 0.9),
    mean_model_tokens: mean(samples.map((s) => s.model_tokens)),
    tool_calls: counts.calls,
    tool_errors: counts.failed_calls + counts.unparsable_calls,
    tool_counts: counts,
    format_violations: violations,
    format_violation_rate: samples.length === 0 ? 0 : violations / samples.length,
    format_violations_by_finish: ends.by_finish,
    format_violations_after_failed_call: ends.after_failed_call,
    format_violations_after_unparsable_call: ends.after_unparsable_call,
    finish: countFinish(samples),
    equivalence: how.equivalence ? 'isEquivalent' : 'exact',
    rewards: how.reverified ? 'reverify' : 'trajectory',
    infra_errors: all.reduce((acc, r) => acc + r.infra_errors, 0),
    problems_unscored: all.length - records.length,
    ...use,
    ...(Object.keys(families).length > 0 ? { families } : {}),
    ...(multiStep.length > 0 ? { multi_step: toolUse(multiStep) } : {}),
  };
}
