import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import {
  addCounts,
  readCounts,
  type ToolUse,
  type ToolUseCounts,
  toolUse,
  toolUseOf,
  zeroCounts,
} from '../algo/tool-use.js';
import { compareReportFiles } from '../eval/report.js';
import type { IndexedRow, RunIndex } from './run-index.js';
import { readRange } from './tail.js';
import { splitTurns } from './turns.js';

/**
 * The JSON the page reads, one function per route. The server answers them live; `--export`
 * writes the same payloads to files, so the page has one data shape in both modes.
 */

/** The rows' columns, in the order `rowsPayload` sends each row's values (a table, not objects: ~2x smaller). */
export const ROW_COLUMNS = [
  'n',
  'id',
  'problem_id',
  'sample',
  'step',
  'eval',
  'family',
  'reward',
  'finish',
  'turns',
  'tool_calls',
  'tool_errors',
  'answer_tags',
  'answer',
  'tokens',
  'model_tokens',
  'policy_version',
  'turn_versions',
  'roc',
  'roc_outcome',
  'penalty_tool',
  'penalty_format',
  'branch',
] as const;

function rowValues(r: IndexedRow): unknown[] {
  return [
    r.n,
    r.id,
    r.problem_id,
    r.sample,
    r.step,
    r.eval,
    r.family,
    r.reward,
    r.finish,
    r.turns,
    r.tool_calls,
    r.tool_errors,
    r.answer_tags,
    r.answer,
    r.tokens,
    r.model_tokens,
    r.policy_version,
    r.turn_versions,
    r.roc,
    r.roc_outcome,
    r.penalty.tool_error,
    r.penalty.format,
    r.branch,
  ];
}

export function runsPayload(runs: readonly RunIndex[]) {
  return runs.map((ix, i) => ({
    index: i,
    name: ix.name,
    version: ix.version,
    generation: ix.generation,
    rows: ix.rows.length,
    indexed: ix.indexed,
    steps: stepNumbers(ix).length,
    evals: [...ix.evals.keys()],
    issues: ix.issues,
    issueCount: ix.issueCount,
  }));
}

function stepNumbers(ix: RunIndex): number[] {
  const steps = new Set<number>();
  for (const m of ix.steps.values()) for (const k of m.keys()) steps.add(k);
  for (const m of ix.rollout.values()) for (const k of m.keys()) steps.add(k);
  for (const t of ix.layout.trajectories) steps.add(t.step);
  return [...steps].sort((a, b) => a - b);
}

type Point = Record<string, unknown> & { step: number };

/** train-step's figures the overview plots (absent ones become null). */
const STEP_FIELDS = [
  'loss',
  'pg_clipfrac',
  'approx_kl',
  'rollout_kl',
  'entropy',
  'grad_norm',
  'lr',
  'sequences',
  'tis_capped_frac',
  'logprob_mismatch',
  'skipped',
];
/** rollout's statistics of a step (its end_batch line). */
const ROLLOUT_FIELDS = [
  'problems',
  'trajectories',
  'mean_reward',
  'mixed_groups',
  'rounds',
  'policy_version',
  'turns_by_version',
  'tool_cache',
  // the model's own tokens (a branch's part after its branch point only): arms compare at equal ones
  'generated_tokens',
  // tree rollouts: {points, samples, correct, recovered, errors, tokens}
  'branches',
  'wait_seconds',
];

function pick(record: object, keys: readonly string[]): Record<string, unknown> {
  const r = record as Record<string, unknown>;
  return Object.fromEntries(keys.map((k) => [k, r[k] ?? null]));
}

/** One point per RL step: train-step's figures, rollout's statistics, and the trajectories' means. */
export function overviewPayload(ix: RunIndex) {
  const points = new Map<number, Point>();
  const at = (step: number): Point => {
    let p = points.get(step);
    if (!p) {
      p = { step, stage: ix.stageAt(step) };
      points.set(step, p);
    }
    return p;
  };
  for (const step of stepNumbers(ix)) at(step);
  for (const m of ix.steps.values()) {
    for (const [k, s] of m) {
      Object.assign(at(k), pick(s, STEP_FIELDS), { train_tokens: s.tokens, train_seconds: s.seconds });
    }
  }
  for (const m of ix.rollout.values()) {
    for (const [k, s] of m) {
      Object.assign(at(k), pick(s, ROLLOUT_FIELDS), {
        generate_seconds: Math.max(0, s.seconds - s.wait_seconds),
      });
    }
  }
  const heldout: { step: number; value: number; eval: string }[] = [];
  for (const list of ix.curves.values()) {
    for (const c of list) {
      if (c.train_reward !== undefined) at(c.step).train_reward = c.train_reward;
      if (c['heldout_avg@n'] !== undefined) {
        heldout.push({ step: c.step, value: c['heldout_avg@n'], eval: c.eval ?? '' });
      }
    }
  }
  const sums = new Map<number, Record<string, number>>();
  const uses = new Map<number, IndexedRow[]>();
  for (const r of ix.rows) {
    if (r.eval !== null || r.step === null) continue;
    let s = sums.get(r.step);
    if (!s) {
      s = { n: 0, reward: 0, tokens: 0, format: 0, kept: 0, dropped: 0, truncated: 0, branches: 0 };
      sums.set(r.step, s);
    }
    // RoC's verdicts cover every trained trajectory, branches too
    if (r.roc === 'kept') s.kept += 1;
    if (r.roc === 'dropped') s.dropped += 1;
    // the means are the problem's samples', as rollout's own statistics (a branch repeats its
    // parent's prefix and starts from a failed call: it is no sample of the policy)
    if (r.branch) {
      s.branches += 1;
      continue;
    }
    s.n += 1;
    s.reward += r.reward;
    s.tokens += r.tokens;
    // infrastructure failures are in no tool-use metric (src/algo/tool-use.ts)
    if (r.finish !== 'error') {
      const list = uses.get(r.step);
      if (list) list.push(r);
      else uses.set(r.step, [r]);
    }
    if (r.answer_tags === 0 || r.answer === null) s.format += 1;
    if (r.finish === 'length' || r.finish === 'tool_overflow') s.truncated += 1;
  }
  for (const [k, s] of sums) {
    const mean = (x: number) => (s.n > 0 ? x / s.n : null);
    Object.assign(at(k), {
      indexed: s.n,
      indexed_branches: s.branches,
      traj_reward: mean(s.reward),
      response_tokens: mean(s.tokens),
      format_violation_share: mean(s.format),
      truncated_share: mean(s.truncated),
      roc_kept: s.kept,
      roc_dropped: s.dropped,
    });
  }
  for (const [k, p] of points) Object.assign(p, stepToolUse(ix, k, uses.get(k) ?? []));
  const stages = ix.stages.map((s, i) => ({ stage: i + 1, first: s.first }));
  return {
    name: ix.name,
    version: ix.version,
    generation: ix.generation,
    /** False while the trajectories are indexed: their per-step means are not all known yet. */
    indexed: ix.indexed,
    steps: [...points.values()].sort((a, b) => a.step - b.step),
    heldout: heldout.sort((a, b) => a.step - b.step),
    stages,
  };
}

/** The overview's per-step tool-use series (src/algo/tool-use.ts), in the chart's field names. */
const STEP_TOOL_USE = ['tool_calls_per_traj', 'failed_calls_per_traj', 'unparsable_calls_per_traj'] as const;

/**
 * A step's tool use: rollout's own figures (its end_batch `stats.tool_use`, computed from each
 * call's status) where it wrote them, else the module's over the step's indexed rows, which carry
 * no call status: their `tool_errors` count as failed calls and the unparsable ones are unknown.
 */
function stepToolUse(ix: RunIndex, step: number, rows: readonly IndexedRow[]): Record<string, number | null> {
  for (const m of ix.rollout.values()) {
    const use = m.get(step)?.tool_use;
    if (use && typeof use.failed_calls_per_traj === 'number') {
      return Object.fromEntries(STEP_TOOL_USE.map((k) => [k, use[k] ?? null]));
    }
  }
  if (rows.length === 0) return Object.fromEntries(STEP_TOOL_USE.map((k) => [k, null]));
  const use = toolUse(rows);
  return {
    tool_calls_per_traj: use.tool_calls_per_traj,
    failed_calls_per_traj: use.failed_calls_per_traj,
    unparsable_calls_per_traj: null,
  };
}

/** Rows from `from` on (all of them when the client's generation is stale). */
export function rowsPayload(ix: RunIndex, from = 0, generation = ix.generation) {
  const start = generation === ix.generation ? Math.max(0, Math.min(from, ix.rows.length)) : 0;
  return {
    generation: ix.generation,
    from: start,
    columns: ROW_COLUMNS,
    rows: ix.rows.slice(start).map(rowValues),
  };
}

/** Per-token text of a response, for shading by log-prob (needs the run's tokenizer). */
export type TokenText = (ids: number[]) => Promise<string[] | undefined>;

/** One trajectory: its line read again, cut into turns, with its problem and RoC verdict. */
export async function trajectoryPayload(ix: RunIndex, n: number, tokenText?: TokenText) {
  const row = ix.rows[n];
  if (!row) return undefined;
  const path = ix.files[row.file];
  const t = JSON.parse((await readRange(path, row.offset, row.length)).toString('utf8')) as Record<
    string,
    unknown
  >;
  const text = typeof t.text === 'string' ? t.text : '';
  const problem = ix.problems.get(row.problem_id) ?? null;
  const ids = Array.isArray(t.response_ids) ? (t.response_ids as number[]) : [];
  const texts = tokenText ? await tokenText(ids) : undefined;
  const parent = ix.parentOf(row);
  const point = (t.branch ?? {}) as Record<string, unknown>;
  const whole = (v: unknown) => (typeof v === 'number' ? v : null);
  return {
    n,
    generation: ix.generation,
    where: `${relative(ix.root, path) || path}:${row.line}`,
    id: row.id,
    problem_id: row.problem_id,
    sample: row.sample,
    step: row.step,
    eval: row.eval,
    family: row.family,
    policy: typeof t.policy === 'string' ? t.policy : null,
    policy_version: row.policy_version,
    turn_versions: row.turn_versions,
    problem,
    answer: row.answer,
    reward: row.reward,
    finish: row.finish,
    turns: row.turns,
    tool_calls: row.tool_calls,
    tool_errors: row.tool_errors,
    answer_tags: row.answer_tags,
    tokens: row.tokens,
    penalty: row.penalty,
    roc: row.roc,
    roc_outcome: row.roc_outcome,
    /** Tree rollouts: where this trajectory branched from (its parent's handle, when indexed). */
    branch: row.branch
      ? {
          parent: row.branch.parent,
          parent_n: parent?.n ?? null,
          offset: row.branch.offset,
          text_offset: whole(point.text_offset),
          turn: whole(point.turn),
          calls: whole(point.calls),
          index: row.branch.index,
          of: row.branch.of,
        }
      : null,
    /** The trajectories branched from this one, by branch point and index. */
    branches: ix
      .branchesOf(row)
      .map((b) => ({
        n: b.n,
        id: b.id,
        offset: b.branch?.offset ?? 0,
        index: b.branch?.index ?? 0,
        of: b.branch?.of ?? 0,
        reward: b.reward,
        finish: b.finish,
        tool_errors: b.tool_errors,
        roc: b.roc,
      }))
      .sort((a, b) => a.offset - b.offset || a.index - b.index),
    advantage: typeof t.advantage === 'number' ? t.advantage : null,
    error: t.error ?? null,
    timing: t.timing ?? null,
    segments: splitTurns(text, row.turn_versions),
    token_view: texts
      ? {
          text: texts,
          logprobs: Array.isArray(t.logprobs) ? t.logprobs : [],
          mask: Array.isArray(t.loss_mask) ? t.loss_mask : [],
        }
      : null,
  };
}

/**
 * A per-problem record's tool-use counts: its `tool_counts`, or for a record written before them
 * (issue 40) what its sums tell (`tool_errors` all counted as failed calls), with `legacy` set.
 */
function problemCounts(r: Record<string, unknown>): { counts: ToolUseCounts; legacy: boolean } {
  const counts = readCounts(r.tool_counts);
  if (counts) return { counts, legacy: false };
  const c = zeroCounts();
  c.trajectories = Number(r.n ?? 0);
  c.positives = Number(r.correct ?? 0);
  c.calls = Number(r.tool_calls ?? 0);
  c.failed_calls = Number(r.tool_errors ?? 0);
  return { counts: c, legacy: true };
}

/** The metrics an older record's sums cannot give (call order, unparsable calls, per-trajectory counts). */
const LEGACY_UNKNOWN: readonly (keyof ToolUse)[] = [
  'unparsable_calls_per_traj',
  'unparsable_call_rate',
  'multi_call_share',
  'recovery_rate',
  'positive_tool_error_rate',
  'positive_error_share',
];

/**
 * Per-family accuracy and tool use of one benchmark's per-problem records: the tool-use metrics are
 * src/algo/tool-use.ts's over the family's summed counts, so they equal eval's `families`.
 */
export function familiesOf(ix: Pick<RunIndex, 'problems' | 'rows'>, records: Record<string, unknown>[]) {
  const by = new Map<
    string,
    {
      problems: number;
      correct: number;
      samples: number;
      solved: number;
      counts: ToolUseCounts;
      legacy: boolean;
    }
  >();
  for (const r of records) {
    const id = String(r.problem_id);
    const family = ix.problems.get(id)?.family ?? ix.rows.find((x) => x.problem_id === id)?.family ?? 'other';
    const f = by.get(family) ?? {
      problems: 0,
      correct: 0,
      samples: 0,
      solved: 0,
      counts: zeroCounts(),
      legacy: false,
    };
    f.problems += 1;
    f.correct += Number(r.correct ?? 0);
    f.samples += Number(r.n ?? 0);
    if (Number(r.correct ?? 0) > 0) f.solved += 1;
    const { counts, legacy } = problemCounts(r);
    addCounts(f.counts, counts);
    f.legacy ||= legacy;
    by.set(family, f);
  }
  return [...by.entries()]
    .sort((a, b) => a[0].localeCompare(b[0]))
    .map(([family, f]) => {
      const use: { [K in keyof ToolUse]: ToolUse[K] | null } = toolUseOf(f.counts);
      if (f.legacy) for (const k of LEGACY_UNKNOWN) use[k] = null;
      return {
        family,
        problems: f.problems,
        'avg@n': f.samples > 0 ? f.correct / f.samples : 0,
        'pass@n': f.problems > 0 ? f.solved / f.problems : 0,
        ...use,
        /** The records predate the tool-use counts: the metrics they cannot give are null. */
        legacy: f.legacy,
      };
    });
}

/** The evaluations: summaries, per-family tables, and SFT vs RL with paired intervals. */
export async function evalsPayload(ix: RunIndex) {
  const evals = [...ix.evals.values()].map((e) => ({
    name: e.name,
    created: e.report?.created ?? null,
    benchmarks: e.report?.benchmarks ?? [],
    families: Object.fromEntries(
      Object.entries(e.problems).map(([b, records]) => [b, familiesOf(ix, records)]),
    ),
    trajectories: ix.rows.filter((r) => r.eval === e.name).length,
  }));
  return { version: ix.version, evals, compare: await comparison(ix) };
}

/**
 * `eval --compare` of the SFT and the RL evaluation, computed as soon as both exist (the main job
 * writes compare.md a moment later); else the run's compare.md as it is.
 */
async function comparison(ix: RunIndex): Promise<{ title: string; markdown: string } | null> {
  const dirs = ix.layout.evals;
  const sft = dirs.find((e) => /(^|[-/])sft$/.test(e.name));
  const rl = dirs.find((e) => /(^|[-/])rl$/.test(e.name));
  if (sft && rl && existsSync(sft.report) && existsSync(rl.report)) {
    try {
      return { title: `${sft.name} → ${rl.name}`, markdown: await compareReportFiles(sft.report, rl.report) };
    } catch (error) {
      return { title: 'comparison failed', markdown: (error as Error).message };
    }
  }
  if (ix.layout.compare) {
    return { title: 'compare.md', markdown: await readFile(ix.layout.compare, 'utf8').catch(() => '') };
  }
  return null;
}

/** Where the run's own tokenizer is (the main job's SFT checkpoint), for the log-prob shading. */
export function findTokenizer(root: string): string | undefined {
  for (const dir of [join(root, 'sft', 'ckpt'), join(root, '..', 'sft', 'ckpt'), join(root, 'ckpt')]) {
    if (existsSync(join(dir, 'tokenizer.json'))) return dir;
  }
  return undefined;
}
