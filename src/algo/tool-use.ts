/**
 * How agentic a set of trajectories is (issue 32), computed one way for `rstar eval`'s reports and
 * the RL step statistics (`rollout --steps`). Infrastructure failures are the caller's to leave out.
 */
export interface ToolUseSample {
  tool_calls: number;
  tool_errors: number;
  reward: number;
}

/** A type, not an interface, so it stands where a record of numbers is expected (the summary's schema). */
export type ToolUse = {
  trajectories: number;
  /** Tool calls / trajectories. */
  tool_calls_per_traj: number;
  /** Share of trajectories with 2 or more tool calls. */
  multi_call_share: number;
  /** Failed tool calls / tool calls (0 without calls). */
  tool_error_rate: number;
  /** Trajectories with a failed call that still end correct / trajectories with a failed call (null: none failed). */
  recovery_rate: number | null;
  /**
   * rStar2-Agent's RoC figure: failed tool calls / tool calls within the positive (reward > 0)
   * trajectories (null: no positive trajectory made a call).
   */
  positive_tool_error_rate: number | null;
  /** Share of the positive trajectories with at least one failed call (null: no positives). */
  positive_error_share: number | null;
  /** Share of trajectories with reward > 0. */
  accuracy: number;
};

const ratio = (a: number, b: number): number | null => (b === 0 ? null : a / b);

export function toolUse(samples: readonly ToolUseSample[]): ToolUse {
  let calls = 0;
  let errors = 0;
  let multi = 0;
  let failed = 0;
  let recovered = 0;
  let positives = 0;
  let positiveCalls = 0;
  let positiveErrors = 0;
  let positiveWithError = 0;
  for (const s of samples) {
    const ok = s.reward > 0;
    calls += s.tool_calls;
    errors += s.tool_errors;
    if (s.tool_calls >= 2) multi += 1;
    if (s.tool_errors > 0) {
      failed += 1;
      if (ok) recovered += 1;
    }
    if (ok) {
      positives += 1;
      positiveCalls += s.tool_calls;
      positiveErrors += s.tool_errors;
      if (s.tool_errors > 0) positiveWithError += 1;
    }
  }
  const n = samples.length;
  return {
    trajectories: n,
    tool_calls_per_traj: ratio(calls, n) ?? 0,
    multi_call_share: ratio(multi, n) ?? 0,
    tool_error_rate: ratio(errors, calls) ?? 0,
    recovery_rate: ratio(recovered, failed),
    positive_tool_error_rate: ratio(positiveErrors, positiveCalls),
    positive_error_share: ratio(positiveWithError, positives),
    accuracy: ratio(positives, n) ?? 0,
  };
}

/** Curriculum problem ids read `<family>-<8 hex digits>` (src/sft/curriculum). */
const CURRICULUM_ID = /^([a-z]+)-[0-9a-f]{8}$/;

/** A problem's family: its `meta.family`, else a curriculum id's prefix, else undefined. */
export function familyOf(problemId: string, meta?: Record<string, unknown>): string | undefined {
  const named = meta?.family;
  if (typeof named === 'string' && named !== '') return named;
  return CURRICULUM_ID.exec(problemId)?.[1];
}

/** A problem's `meta.steps` (the calls its demonstration makes) of 2 or more: a multi-step problem. */
export const isMultiStep = (meta?: Record<string, unknown>): boolean =>
  typeof meta?.steps === 'number' && meta.steps >= 2;

/** `toolUse` per family (samples without a family are left out), families in sorted order. */
export function toolUseByFamily<S extends ToolUseSample>(
  samples: readonly S[],
  family: (s: S) => string | undefined,
): Record<string, ToolUse> {
  const groups = new Map<string, S[]>();
  for (const s of samples) {
    const f = family(s);
    if (f === undefined) continue;
    const g = groups.get(f);
    if (g) g.push(s);
    else groups.set(f, [s]);
  }
  return Object.fromEntries([...groups.keys()].sort().map((f) => [f, toolUse(groups.get(f) as S[])]));
}
