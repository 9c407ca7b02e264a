import { G_PASS_TAUS, tauKey } from '../algo/pass-at-k.js';
import { DataError } from '../errors.js';
import { type EvalSummary, Report } from '../records/eval.js';

export { Report };

import type { EvalProblem } from '../records/eval.js';
import { compareMetric, type PerProblem, readPerProblem } from './bootstrap.js';
import type { EvalSummaryRecord } from './metrics.js';
import { readText } from './problems.js';

export function makeReport(summaries: EvalSummaryRecord[], extra: Record<string, unknown> = {}): Report {
  return { v: 1, created: new Date().toISOString(), ...extra, benchmarks: summaries };
}

const pct = (x: unknown): string =>
  typeof x === 'number' && Number.isFinite(x) ? `${(100 * x).toFixed(1)}` : '';
const num = (x: unknown, digits = 0): string =>
  typeof x === 'number' && Number.isFinite(x) ? x.toFixed(digits) : '';

/** The k columns shown: every k that any benchmark reports, ascending. */
function allKs(summaries: readonly EvalSummary[]): number[] {
  const ks = new Set<number>();
  for (const s of summaries) for (const k of Object.keys(s['pass@k'])) ks.add(Number(k));
  return [...ks].sort((a, b) => a - b);
}

function table(header: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

/** One row per benchmark, percentages with one decimal, as in the paper's tables. */
export function markdownTable(summaries: readonly EvalSummary[]): string {
  const ks = allKs(summaries);
  const header = [
    'benchmark',
    'problems',
    'n',
    'avg@n (%)',
    ...ks.map((k) => `pass@${k} (%)`),
    'maj@n (%)',
    'mean len',
    'median len',
    'p90 len',
    'tool calls/traj',
    'tool err (%)',
    'unparsable (%)',
    'multi-call (%)',
    'recovery (%)',
    'pos. tool err (%)',
    'avoided (%)',
    'repeats/traj',
    'format viol (%)',
  ];
  const rows = summaries.map((s) => [
    s.benchmark,
    num(s.problems),
    num(s.n),
    pct(s['avg@n']),
    ...ks.map((k) => pct(s['pass@k'][String(k)])),
    pct(s['maj@n']),
    num(s.mean_tokens),
    num(s.median_tokens),
    num(s.p90_tokens),
    num(s.tool_calls_per_traj, 2),
    pct(s.tool_error_rate),
    pct(s.unparsable_call_rate),
    pct(s.multi_call_share),
    pct(s.recovery_rate),
    pct(s.positive_tool_error_rate),
    pct(s.avoided_rate),
    num(s.repeated_calls_per_traj, 2),
    pct(s.format_violation_rate),
  ]);
  return table(header, rows);
}

/**
 * One row per benchmark and k (from 2 up) with G-Pass@k at each reported τ and mG-Pass@k; empty
 * when no summary carries them (reports written before they existed).
 */
export function gPassTable(summaries: readonly EvalSummary[]): string {
  const taus = [...G_PASS_TAUS];
  const rows: string[][] = [];
  for (const s of summaries) {
    const g = s['g-pass@k'] as Record<string, Record<string, number>> | undefined;
    const mg = s['mg-pass@k'] as Record<string, number> | undefined;
    if (g === undefined) continue;
    for (const k of Object.keys(g).sort((a, b) => Number(a) - Number(b))) {
      rows.push([s.benchmark, k, ...taus.map((tau) => pct(g[k][tauKey(tau)])), pct(mg?.[k])]);
    }
  }
  if (rows.length === 0) return '';
  return table(['benchmark', 'k', ...taus.map((tau) => `G-Pass@k τ=${tau} (%)`), 'mG-Pass@k (%)'], rows);
}

/** The tool-use metrics of one family (an entry of a summary's `families`), as docs/eval.md defines them. */
type FamilyUse = Record<string, number | null>;

const FAMILY_METRICS: { name: string; key: string; percent: boolean }[] = [
  { name: 'accuracy (%)', key: 'accuracy', percent: true },
  { name: 'tool calls/traj', key: 'tool_calls_per_traj', percent: false },
  { name: 'multi-call (%)', key: 'multi_call_share', percent: true },
  { name: 'tool err (%)', key: 'tool_error_rate', percent: true },
  { name: 'unparsable (%)', key: 'unparsable_call_rate', percent: true },
  { name: 'recovery (%)', key: 'recovery_rate', percent: true },
  { name: 'pos. tool err (%)', key: 'positive_tool_error_rate', percent: true },
  { name: 'pos. with err (%)', key: 'positive_error_share', percent: true },
  { name: 'avoided (%)', key: 'avoided_rate', percent: true },
  { name: 'repeats/traj', key: 'repeated_calls_per_traj', percent: false },
];

/** A summary's row for its multi-step problems together, after the families. */
export const MULTI_STEP = 'multi-step';

/** The families of a summary, and its multi-step problems together as one more row. */
const familiesOf = (s: EvalSummary): Record<string, FamilyUse> => ({
  ...((s.families ?? {}) as Record<string, FamilyUse>),
  ...(s.multi_step ? { [MULTI_STEP]: s.multi_step as FamilyUse } : {}),
});

/** Whether a per-problem record belongs to a row of the family table. */
const inFamily = (p: EvalProblem, family: string): boolean =>
  family === MULTI_STEP ? p.multi_step === true : p.family === family;

/** One row per benchmark and problem family: how agentic the trajectories were (empty without families). */
export function familyTable(summaries: readonly EvalSummary[]): string {
  const rows = summaries.flatMap((s) =>
    Object.entries(familiesOf(s)).map(([family, use]) => [
      s.benchmark,
      family,
      num(use.trajectories),
      ...FAMILY_METRICS.map((m) => (m.percent ? pct(use[m.key]) : num(use[m.key], 2))),
    ]),
  );
  if (rows.length === 0) return '';
  return table(['benchmark', 'family', 'trajectories', ...FAMILY_METRICS.map((m) => m.name)], rows);
}

export function markdownReport(
  report: Report,
  plots: { passAtK?: string; lengths: Record<string, string> },
): string {
  const parts = ['# rstar eval report', ''];
  const policies = [...new Set(report.benchmarks.map((s) => s.policy))].filter((p) => p !== '');
  if (policies.length > 0) parts.push(`Policy: \`${policies.join('`, `')}\``, '');
  if (report.created) parts.push(`Created: ${report.created}`, '');
  parts.push(markdownTable(report.benchmarks), '');
  const families = familyTable(report.benchmarks);
  if (families !== '')
    parts.push(
      'Tool use by problem family (docs/eval.md "Agentic tool use"; tool err: calls that ran and failed / calls; unparsable: calls that could not be read / calls; multi-call: trajectories with 2+ calls; recovery: of the trajectories with a failed call, those with a later call that succeeded and a correct answer; pos. tool err: failed calls / calls in the correct trajectories; avoided: of the trajectories with 2+ calls, those with no failed call; repeats/traj: calls identical to an earlier call of the trajectory, per trajectory):',
      '',
      families,
      '',
    );
  const stability = gPassTable(report.benchmarks);
  if (stability !== '')
    parts.push(
      'Stability (G-Pass@k, arXiv 2412.13147): G-Pass@k_τ is the chance that at least ⌈τk⌉ of k samples are correct (τ = 1: all k); mG-Pass@k integrates it over τ in [0.5, 1]. Averaged over problems, like pass@k:',
      '',
      stability,
      '',
    );
  parts.push(
    'avg@n is the mean accuracy over the n samples of each problem (the paper\'s "average pass@1"); pass@k is',
    "Chen et al.'s unbiased estimator; maj@n is majority vote over the extracted answers. Lengths are response",
    'tokens including tool output. avg@n, pass@k and maj@n are averaged over problems; the length and tool',
    'figures are over trajectories (tool err and unparsable: shares of the tool calls).',
    '',
  );
  const finishes = report.benchmarks.map((s) => {
    const finish = (s.finish ?? {}) as Record<string, number>;
    const list = Object.entries(finish)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    return `- ${s.benchmark}: ${list || 'none'}`;
  });
  parts.push('Finish reasons:', '', ...finishes, '');
  const violated = report.benchmarks.filter(
    (s) => Object.keys(s.format_violations_by_finish ?? {}).length > 0,
  );
  if (violated.length > 0)
    parts.push(
      "Format violations (no closed `<answer>` with an answer) by finish reason, and by the trajectory's last call: one that ran and failed (the answer was lost in the turns after a failed call) or one that could not be read (the slip came earlier, in a call):",
      '',
      ...violated.map((s) => {
        const list = Object.entries(s.format_violations_by_finish ?? {})
          .map(([k, v]) => `${k} ${v}`)
          .join(', ');
        return `- ${s.benchmark}: ${list}; last call failed ${s.format_violations_after_failed_call ?? 0}, unparsable ${s.format_violations_after_unparsable_call ?? 0}`;
      }),
      '',
    );
  const failed = report.benchmarks.filter((s) => (s.infra_errors ?? 0) > 0);
  if (failed.length > 0) {
    parts.push(
      'Infrastructure failures (finish "error": the sandbox or the engines failed, not the model), left out of every metric above:',
      '',
      ...failed.map((s) => `- ${s.benchmark}: ${s.infra_errors}`),
      '',
    );
  }
  parts.push(...toolCacheLines(report.benchmarks));
  if (plots.passAtK) parts.push(`![pass@k](${plots.passAtK})`, '');
  for (const [bench, file] of Object.entries(plots.lengths))
    parts.push(`![${bench} response lengths](${file})`, '');
  return parts.join('\n');
}

/** The tool cache's counts per benchmark (eval --tool-cache group), a WARNING when the audit saw a shared result vary. */
function toolCacheLines(summaries: readonly EvalSummary[]): string[] {
  const lines: string[] = [];
  for (const s of summaries) {
    const c = s.tool_cache as
      | { hits?: number; audited?: number; mismatches?: number; calls?: number }
      | undefined;
    if (c === undefined) continue;
    const of = c.calls === undefined ? '' : ` of ${c.calls} calls`;
    lines.push(
      `- ${s.benchmark}: ${c.hits ?? 0} hits${of}, ${c.audited ?? 0} audited, ${c.mismatches ?? 0} mismatches`,
    );
    if ((c.mismatches ?? 0) > 0)
      lines.push(
        `  - WARNING: ${c.mismatches} audited hits differed when run again: shared results correlated samples`,
      );
  }
  return lines.length > 0
    ? [
        'Tool cache (calls answered from an identical call of the same problem; audited = run again and compared):',
        '',
        ...lines,
        '',
      ]
    : [];
}

export async function readReport(file: string): Promise<Report> {
  const text = await readText(file);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new DataError(`${file}: invalid JSON: ${(error as Error).message}`);
  }
  const parsed = Report.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new DataError(`${file}: ${issue.path.map(String).join('.') || '(report)'}: ${issue.message}`);
  }
  return parsed.data;
}

const signed = (d: number, digits: number): string => `${d >= 0 ? '+' : ''}${d.toFixed(digits)}`;

/** Both sides' per-problem records of a benchmark, where both eval folders have them. */
export type PairedProblems = Map<string, { a: PerProblem; b: PerProblem }>;

const perProblemPassAtK = (k: number) => (p: EvalProblem) => {
  const v = (p['pass@k'] as Record<string, unknown> | undefined)?.[String(k)];
  return typeof v === 'number' ? v : undefined;
};

/**
 * A column's name for a report: a `.../NAME/report.json` path is its run's folder NAME, less an
 * `eval-` prefix (`runs/demo/eval-sft/report.json` -> `sft`), so the header names runs, not paths.
 */
function columnLabel(label: string): string {
  const parts = label.split(/[\\/]/).filter((p) => p !== '');
  if (parts.length < 2 || parts[parts.length - 1] !== 'report.json') return label;
  return (parts[parts.length - 2] as string).replace(/^eval-(?=.)/, '');
}

/**
 * A markdown table of B - A per benchmark and metric (e.g. A = the SFT checkpoint, B = after RL).
 * `labels` name the two columns: report paths become their runs' names (both paths, should the
 * names coincide).
 * Percent metrics are shown in points; a benchmark present on one side only shows blanks. Where
 * `paired` holds both sides' per-problem records, avg@n, pass@k and maj@n get a paired bootstrap
 * 95% interval of the difference (problems resampled, the same problems on both sides).
 */
export function compareReports(
  a: Report,
  b: Report,
  labels = ['A', 'B'],
  paired: PairedProblems = new Map(),
): string {
  const byName = (r: Report) => new Map(r.benchmarks.map((s) => [s.benchmark, s]));
  const ma = byName(a);
  const mb = byName(b);
  const names = [...new Set([...ma.keys(), ...mb.keys()])];
  const ks = allKs([...a.benchmarks, ...b.benchmarks]);
  const metrics: {
    name: string;
    get: (s: EvalSummary) => unknown;
    percent: boolean;
    problem?: (p: EvalProblem) => number | undefined;
  }[] = [
    {
      name: 'avg@n (%)',
      get: (s) => s['avg@n'],
      percent: true,
      problem: (p) => (p.n > 0 ? p.correct / p.n : undefined),
    },
    ...ks.map((k) => ({
      name: `pass@${k} (%)`,
      get: (s: EvalSummary) => s['pass@k'][String(k)],
      percent: true,
      problem: perProblemPassAtK(k),
    })),
    {
      name: 'maj@n (%)',
      get: (s) => s['maj@n'],
      percent: true,
      problem: (p) => (typeof p['maj@n'] === 'number' ? p['maj@n'] : undefined),
    },
    { name: 'mean len', get: (s) => s.mean_tokens, percent: false },
    { name: 'tool calls/traj', get: (s) => s.tool_calls_per_traj, percent: false },
    { name: 'tool err (%)', get: (s) => s.tool_error_rate, percent: true },
    { name: 'unparsable (%)', get: (s) => s.unparsable_call_rate, percent: true },
    { name: 'multi-call (%)', get: (s) => s.multi_call_share, percent: true },
    { name: 'recovery (%)', get: (s) => s.recovery_rate, percent: true },
    { name: 'pos. tool err (%)', get: (s) => s.positive_tool_error_rate, percent: true },
    { name: 'format viol (%)', get: (s) => s.format_violation_rate, percent: true },
  ];
  const rows: string[][] = [];
  for (const name of names) {
    const sa = ma.get(name);
    const sb = mb.get(name);
    const pp = paired.get(name);
    for (const m of metrics) {
      const va = sa ? m.get(sa) : undefined;
      const vb = sb ? m.get(sb) : undefined;
      if (va === undefined && vb === undefined) continue;
      const scale = m.percent ? 100 : 1;
      const digits = m.percent ? 1 : m.name === 'mean len' ? 0 : 2;
      const fmt = (v: unknown) => (typeof v === 'number' ? (v * scale).toFixed(digits) : '');
      const delta = typeof va === 'number' && typeof vb === 'number' ? signed((vb - va) * scale, digits) : '';
      const ci = pp && m.problem ? compareMetric(pp.a, pp.b, m.problem) : undefined;
      const interval = ci ? `[${signed(ci.lo * scale, digits)}, ${signed(ci.hi * scale, digits)}]` : '';
      rows.push([name, m.name, fmt(va), fmt(vb), delta, interval]);
    }
    // The tool use of each problem family (curriculum benchmarks), then the multi-step ones together.
    const fa = sa ? familiesOf(sa) : {};
    const fb = sb ? familiesOf(sb) : {};
    const families = [...new Set([...Object.keys(fa), ...Object.keys(fb)])]
      .filter((f) => f !== MULTI_STEP)
      .sort();
    if (MULTI_STEP in fa || MULTI_STEP in fb) families.push(MULTI_STEP);
    for (const family of families) {
      for (const m of FAMILY_METRICS) {
        const va = fa[family]?.[m.key];
        const vb = fb[family]?.[m.key];
        if (typeof va !== 'number' && typeof vb !== 'number') continue;
        const scale = m.percent ? 100 : 1;
        const digits = m.percent ? 1 : 2;
        const fmt = (v: unknown) => (typeof v === 'number' ? (v * scale).toFixed(digits) : '');
        const delta =
          typeof va === 'number' && typeof vb === 'number' ? signed((vb - va) * scale, digits) : '';
        // Accuracy gets the interval of avg@n over the family's problems (those records name it).
        const ci =
          pp && m.key === 'accuracy'
            ? compareMetric(pp.a, pp.b, (p) => (inFamily(p, family) && p.n > 0 ? p.correct / p.n : undefined))
            : undefined;
        const interval = ci ? `[${signed(ci.lo * scale, digits)}, ${signed(ci.hi * scale, digits)}]` : '';
        rows.push([`${name} · ${family}`, m.name, fmt(va), fmt(vb), delta, interval]);
      }
    }
  }
  const pairs = [...paired.values()].map((p) => [...p.a.keys()].filter((id) => p.b.has(id)).length);
  const note =
    pairs.length > 0
      ? `\n95% intervals: paired bootstrap over the ${pairs.join(' / ')} problems both sides evaluated (4000 resamples); an interval that excludes 0 is a change beyond problem-sampling noise.\n`
      : '';
  const named = labels.map(columnLabel);
  const [la, lb] = named[0] === named[1] ? labels : named;
  // Reports written before the tool-use counts (issue 40) hold the older definitions.
  const legacy = [
    [la, a],
    [lb, b],
  ]
    .filter(([, r]) => (r as Report).benchmarks.some((s) => s.tool_counts === undefined))
    .map(([l]) => `\`${l as string}\``);
  const old =
    legacy.length > 0
      ? `\nNote: ${legacy.join(' and ')} predate${legacy.length > 1 ? '' : 's'} the tool calls' structured status: there tool err counts unparsable calls as failures (and misses failures whose marker the response truncation cut), and recovery ignores the order of the calls.\n`
      : '';
  return `${table(['benchmark', 'metric', la as string, lb as string, 'Δ', '95% CI of Δ'], rows)}\n${note}${old}`;
}

/**
 * `eval --compare A B` of two report.json files: the table of `compareReports`, with intervals
 * wherever both folders keep their per-problem records (the viewer shows the same table).
 */
export async function compareReportFiles(a: string, b: string): Promise<string> {
  const ra = await readReport(a);
  const rb = await readReport(b);
  const paired: PairedProblems = new Map();
  for (const s of ra.benchmarks) {
    const pa = await readPerProblem(a, s.benchmark);
    const pb = pa && (await readPerProblem(b, s.benchmark));
    if (pa && pb) paired.set(s.benchmark, { a: pa, b: pb });
  }
  return compareReports(ra, rb, [a, b], paired);
}
