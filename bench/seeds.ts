// The main job over seeds, as docs/results.md reports it: for each run folder of `recipes/demo.sh`,
// SFT -> RL held-out avg@n overall and on the multi-step problems (paired bootstrap 95% intervals),
// how agentic the RL model is there (calls per trajectory, 2+-call share), the recovery rate, and the
// tool-error rate in positive rollouts along training (the paper's RoC figure); then the mean.
// With `--vs RUN...` (as many, in the same seed order) it compares two arms at their RL checkpoints
// (e.g. plain GRPO against GRPO-RoC, sessions against stateless, a credit lever against none):
// B - A per seed, with intervals, and each arm's generated tokens per RL step (arms are compared at
// equal tokens, or side by side).
//
// `--at NAME` takes the run's eval-NAME as its RL side instead of eval-rl (e.g. `--at stage1`, step 30,
// for arms stopped after stage 1), and only the steps up to that evaluation's.
// `--set SET` reads the evaluations recipes/heldout.sh made on a larger held-out set instead (eval-SET-sft
// and eval-SET-rl, or eval-SET-NAME with --at).
//
//   npm run bench:seeds -- runs/seed0 runs/seed1 runs/seed2 [--vs runs/grpo0 runs/grpo1 runs/grpo2] [--at stage1] [--set ms]
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { compareMetric, type PerProblem, readPerProblem } from '../src/eval/bootstrap.js';
import { readReport } from '../src/eval/report.js';
import type { EvalProblem, EvalSummary } from '../src/records/eval.js';

interface Side {
  summary: EvalSummary;
  problems: PerProblem;
}

interface Run {
  dir: string;
  sft: Side;
  rl: Side;
  steps: Record<string, unknown>[];
}

async function side(dir: string, name: string): Promise<Side> {
  const file = join(dir, `eval-${name}`, 'report.json');
  const report = await readReport(file);
  const summary = report.benchmarks[0];
  if (!summary) throw new Error(`${file}: no benchmark`);
  const problems = await readPerProblem(file, summary.benchmark);
  if (!problems) throw new Error(`${file}: no per-problem records beside it`);
  return { summary, problems };
}

const jsonLines = (file: string): Record<string, unknown>[] =>
  existsSync(file)
    ? readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => JSON.parse(l) as Record<string, unknown>)
    : [];

async function load(dir: string, at: string, set: string | undefined): Promise<Run> {
  let steps = jsonLines(join(dir, 'rl', 'rollout-steps.jsonl'));
  if (at !== 'rl') {
    // the curve names the step each evaluation was of
    const point = jsonLines(join(dir, 'rl', 'curve.jsonl')).find((p) => p.eval === at);
    if (typeof point?.step !== 'number') throw new Error(`${dir}/rl/curve.jsonl: no point for eval-${at}`);
    const last = point.step;
    steps = steps.filter((s) => typeof s.step === 'number' && s.step <= last);
  }
  const name = (eval_: string) => (set === undefined ? eval_ : `${set}-${eval_}`);
  return { dir, sft: await side(dir, name('sft')), rl: await side(dir, name(at)), steps };
}

const all = (p: EvalProblem) => (p.n > 0 ? p.correct / p.n : undefined);
const multi = (p: EvalProblem) => (p.multi_step === true && p.n > 0 ? p.correct / p.n : undefined);
const mean = (xs: number[]) => (xs.length === 0 ? Number.NaN : xs.reduce((a, b) => a + b, 0) / xs.length);
const pts = (x: number | null | undefined, d = 1) => (typeof x === 'number' ? (100 * x).toFixed(d) : '–');
const signed = (x: number) => `${x >= 0 ? '+' : ''}${(100 * x).toFixed(1)}`;

function delta(a: PerProblem, b: PerProblem, metric: (p: EvalProblem) => number | undefined): string {
  const ci = compareMetric(a, b, metric);
  return ci ? `${signed(ci.delta)} [${signed(ci.lo)}, ${signed(ci.hi)}]` : '–';
}

/** Mean of a per-problem metric over the problems it applies to. */
function avg(side: PerProblem, metric: (p: EvalProblem) => number | undefined): number {
  return mean([...side.values()].map(metric).filter((x): x is number => x !== undefined));
}

type Use = Record<string, number | null>;
const multiUse = (s: EvalSummary): Use | undefined => s.multi_step as Use | undefined;

/** Per-step positive tool-error rate (rollouts, before RoC) over windows of the run's steps. */
function positiveErrors(run: Run, pick: (stats: Record<string, unknown>) => Use | undefined): string {
  const values = run.steps
    .map((s) => pick((s.stats ?? {}) as Record<string, unknown>)?.positive_tool_error_rate)
    .map((v) => (typeof v === 'number' ? v : undefined));
  const windows: string[] = [];
  const size = Math.max(1, Math.ceil(values.length / 5));
  for (let i = 0; i < values.length; i += size) {
    const w = values.slice(i, i + size).filter((v): v is number => v !== undefined);
    windows.push(w.length === 0 ? '–' : pts(mean(w)));
  }
  return windows.join(' → ');
}

/**
 * Mean generated tokens per RL step (rollout's `generated_tokens`: the model's tokens, a branch's
 * own part only), the budget arms are compared at; with tree rollouts, the branch samples too.
 */
function perStep(run: Run): string {
  const tokens = run.steps.map((s) => (s.stats as Record<string, unknown> | undefined)?.generated_tokens);
  const known = tokens.filter((t): t is number => typeof t === 'number');
  if (known.length === 0) return '–';
  const branches = run.steps
    .map((s) => (s.stats as { branches?: { samples: number } } | undefined)?.branches?.samples)
    .filter((b): b is number => typeof b === 'number');
  const tail = branches.length > 0 ? ` (${mean(branches).toFixed(0)} branch samples)` : '';
  return `${mean(known).toFixed(0)}${tail}`;
}

const formatRate = (s: EvalSummary) => s.format_violation_rate as number | undefined;

function table(header: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

function arm(runs: Run[]): string {
  const rows = runs.map((r) => {
    const ms = multiUse(r.rl.summary);
    const msSft = multiUse(r.sft.summary);
    return [
      r.dir,
      `${pts(r.sft.summary['avg@n'])} → ${pts(r.rl.summary['avg@n'])}`,
      delta(r.sft.problems, r.rl.problems, all),
      `${pts(avg(r.sft.problems, multi))} → ${pts(avg(r.rl.problems, multi))}`,
      delta(r.sft.problems, r.rl.problems, multi),
      `${(msSft?.tool_calls_per_traj ?? Number.NaN).toFixed(2)} → ${(ms?.tool_calls_per_traj ?? Number.NaN).toFixed(2)}`,
      `${pts(msSft?.multi_call_share)} → ${pts(ms?.multi_call_share)}`,
      `${pts(r.sft.summary.recovery_rate)} → ${pts(r.rl.summary.recovery_rate)}`,
      `${pts(msSft?.recovery_rate)} → ${pts(ms?.recovery_rate)}`,
      `${pts(r.sft.summary.tool_error_rate)} → ${pts(r.rl.summary.tool_error_rate)}`,
      `${(r.sft.summary.mean_tokens as number).toFixed(0)} → ${(r.rl.summary.mean_tokens as number).toFixed(0)}`,
      `${pts(formatRate(r.sft.summary))} → ${pts(formatRate(r.rl.summary))}`,
      perStep(r),
      positiveErrors(r, (s) => s.tool_use as Use | undefined),
      positiveErrors(r, (s) => s.tool_use_multi_step as Use | undefined),
    ];
  });
  const d = (f: (r: Run) => number) => mean(runs.map(f));
  rows.push([
    '**mean**',
    `${pts(d((r) => r.sft.summary['avg@n']))} → ${pts(d((r) => r.rl.summary['avg@n']))}`,
    `**${signed(d((r) => r.rl.summary['avg@n'] - r.sft.summary['avg@n']))}**`,
    `${pts(d((r) => avg(r.sft.problems, multi)))} → ${pts(d((r) => avg(r.rl.problems, multi)))}`,
    `**${signed(d((r) => avg(r.rl.problems, multi) - avg(r.sft.problems, multi)))}**`,
    `${d((r) => multiUse(r.sft.summary)?.tool_calls_per_traj ?? Number.NaN).toFixed(2)} → ${d((r) => multiUse(r.rl.summary)?.tool_calls_per_traj ?? Number.NaN).toFixed(2)}`,
    `${pts(d((r) => multiUse(r.sft.summary)?.multi_call_share ?? Number.NaN))} → ${pts(d((r) => multiUse(r.rl.summary)?.multi_call_share ?? Number.NaN))}`,
    `${pts(d((r) => r.sft.summary.recovery_rate ?? Number.NaN))} → ${pts(d((r) => r.rl.summary.recovery_rate ?? Number.NaN))}`,
    `${pts(d((r) => multiUse(r.sft.summary)?.recovery_rate ?? Number.NaN))} → ${pts(d((r) => multiUse(r.rl.summary)?.recovery_rate ?? Number.NaN))}`,
    `${pts(d((r) => r.sft.summary.tool_error_rate))} → ${pts(d((r) => r.rl.summary.tool_error_rate))}`,
    `${d((r) => r.sft.summary.mean_tokens as number).toFixed(0)} → ${d((r) => r.rl.summary.mean_tokens as number).toFixed(0)}`,
    `${pts(d((r) => formatRate(r.sft.summary) ?? Number.NaN))} → ${pts(d((r) => formatRate(r.rl.summary) ?? Number.NaN))}`,
    '',
    '',
    '',
  ]);
  return table(
    [
      'run',
      'avg@n SFT → RL',
      'Δ (95% CI)',
      'multi-step avg@n',
      'multi-step Δ (95% CI)',
      'multi-step calls/traj',
      'multi-step 2+ calls (%)',
      'recovery (%)',
      'multi-step recovery (%)',
      'tool err (%)',
      'mean len',
      'format viol (%)',
      'generated tokens / RL step',
      'pos. tool err (%) of the rollouts, fifths of training',
      'same, multi-step',
    ],
    rows,
  );
}

function versus(a: Run[], b: Run[]): string {
  const rows = a.map((ra, i) => {
    const rb = b[i] as Run;
    const ua = multiUse(ra.rl.summary);
    const ub = multiUse(rb.rl.summary);
    return [
      `${ra.dir} vs ${rb.dir}`,
      `${pts(ra.rl.summary['avg@n'])} / ${pts(rb.rl.summary['avg@n'])}`,
      delta(ra.rl.problems, rb.rl.problems, all),
      `${pts(avg(ra.rl.problems, multi))} / ${pts(avg(rb.rl.problems, multi))}`,
      delta(ra.rl.problems, rb.rl.problems, multi),
      `${(ra.rl.summary.mean_tokens as number).toFixed(0)} / ${(rb.rl.summary.mean_tokens as number).toFixed(0)}`,
      `${(ra.rl.summary.tool_calls_per_traj as number).toFixed(2)} / ${(rb.rl.summary.tool_calls_per_traj as number).toFixed(2)}`,
      `${(ua?.tool_calls_per_traj ?? Number.NaN).toFixed(2)} / ${(ub?.tool_calls_per_traj ?? Number.NaN).toFixed(2)}`,
      `${pts(ra.rl.summary.positive_tool_error_rate)} / ${pts(rb.rl.summary.positive_tool_error_rate)}`,
      `${pts(ra.rl.summary.recovery_rate)} / ${pts(rb.rl.summary.recovery_rate)}`,
      `${perStep(ra)} / ${perStep(rb)}`,
    ];
  });
  const gap = mean(a.map((ra, i) => (b[i] as Run).rl.summary['avg@n'] - ra.rl.summary['avg@n']));
  const gapMulti = mean(a.map((ra, i) => avg((b[i] as Run).rl.problems, multi) - avg(ra.rl.problems, multi)));
  rows.push([
    '**mean B − A**',
    '',
    `**${signed(gap)}**`,
    '',
    `**${signed(gapMulti)}**`,
    '',
    '',
    '',
    '',
    '',
    '',
  ]);
  return table(
    [
      'A vs B',
      'avg@n A / B',
      'B − A (95% CI)',
      'multi-step A / B',
      'multi-step B − A (95% CI)',
      'mean len A / B',
      'calls/traj A / B',
      'multi-step calls/traj A / B',
      'pos. tool err (%) A / B',
      'recovery (%) A / B',
      'generated tokens / RL step A / B',
    ],
    rows,
  );
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  let evalName = 'rl';
  const atFlag = args.indexOf('--at');
  if (atFlag >= 0) {
    evalName = args[atFlag + 1] ?? '';
    args.splice(atFlag, 2);
  }
  let set: string | undefined;
  const setFlag = args.indexOf('--set');
  if (setFlag >= 0) {
    set = args[setFlag + 1] ?? '';
    args.splice(setFlag, 2);
  }
  const at = args.indexOf('--vs');
  const dirsA = at < 0 ? args : args.slice(0, at);
  const dirsB = at < 0 ? [] : args.slice(at + 1);
  if (
    dirsA.length === 0 ||
    (at >= 0 && dirsB.length !== dirsA.length) ||
    !/^[\w-]+$/.test(evalName) ||
    (set !== undefined && !/^[\w-]+$/.test(set))
  ) {
    process.stderr.write(
      'usage: seeds RUN... [--vs RUN... (as many, same seed order)] [--at EVAL (default rl)] [--set SET]\n',
    );
    process.exit(2);
  }
  const a = await Promise.all(dirsA.map((d) => load(d, evalName, set)));
  process.stdout.write(`${arm(a)}\n`);
  if (dirsB.length > 0) {
    const b = await Promise.all(dirsB.map((d) => load(d, evalName, set)));
    process.stdout.write(`\n${arm(b)}\n\n${versus(a, b)}\n`);
  }
}

main().catch((error: Error) => {
  process.stderr.write(`seeds: ${error.message}\n`);
  process.exit(1);
});
