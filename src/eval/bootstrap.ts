import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { DataError } from '../errors.js';
import { openInput, parseLine, readLines } from '../ndjson/index.js';
import { seededRandom } from '../random.js';
import { EvalProblem } from '../records/eval.js';

/** A difference B - A of a per-problem mean, with its paired bootstrap interval. */
export interface PairedInterval {
  delta: number;
  lo: number;
  hi: number;
  /** Problems present on both sides: the pairs resampled. */
  problems: number;
}

/**
 * Paired bootstrap of mean(b) - mean(a) over the same problems: each resample draws problems with
 * replacement and takes both sides' values of the drawn problems, so the problem-to-problem spread
 * (most of the noise of a 100-problem eval) cancels and only the change is measured. Percentile
 * interval; seeded, so a report is reproducible.
 */
export function pairedBootstrap(
  a: readonly number[],
  b: readonly number[],
  options: { resamples?: number; level?: number; seed?: number } = {},
): PairedInterval {
  if (a.length !== b.length) throw new Error('pairedBootstrap: a and b must pair up');
  const n = a.length;
  const d = a.map((x, i) => b[i] - x);
  const mean = (xs: readonly number[]) => xs.reduce((s, x) => s + x, 0) / Math.max(1, xs.length);
  const delta = mean(d);
  if (n === 0) return { delta: 0, lo: 0, hi: 0, problems: 0 };
  const resamples = options.resamples ?? 4000;
  const random = seededRandom(options.seed ?? 0);
  const stats = new Float64Array(resamples);
  for (let r = 0; r < resamples; r += 1) {
    let s = 0;
    for (let i = 0; i < n; i += 1) s += d[Math.floor(random() * n)];
    stats[r] = s / n;
  }
  stats.sort();
  const tail = (1 - (options.level ?? 0.95)) / 2;
  const at = (q: number) => stats[Math.min(resamples - 1, Math.max(0, Math.round(q * (resamples - 1))))];
  return { delta, lo: at(tail), hi: at(1 - tail), problems: n };
}

/** The per-problem records of one benchmark of an eval run, by problem id. */
export type PerProblem = Map<string, EvalProblem>;

/**
 * The per-problem records `eval --out DIR` wrote beside DIR/report.json (`eval-<benchmark>.jsonl`),
 * or undefined when the file is not there (a report copied alone still compares, without intervals).
 */
export async function readPerProblem(report: string, benchmark: string): Promise<PerProblem | undefined> {
  const file = join(dirname(report), `eval-${benchmark}.jsonl`);
  if (!existsSync(file)) return undefined;
  const out: PerProblem = new Map();
  const { stream, source } = openInput(file);
  for await (const entry of readLines(stream, source)) {
    if (entry.text.trim() === '' || /"summary"\s*:\s*true/.test(entry.text)) continue; // the closing summary
    const record = parseLine(EvalProblem, entry);
    if (out.has(record.problem_id)) {
      throw new DataError(`${source}:${entry.line}: problem_id: '${record.problem_id}' appears twice`);
    }
    out.set(record.problem_id, record);
  }
  return out;
}

/** The per-problem value of a compared metric, or undefined where the record does not carry it. */
export type ProblemMetric = (p: EvalProblem) => number | undefined;

/** The interval of one metric over the problems both sides evaluated. */
export function compareMetric(
  a: PerProblem,
  b: PerProblem,
  metric: ProblemMetric,
  seed = 0,
): PairedInterval | undefined {
  const xs: number[] = [];
  const ys: number[] = [];
  for (const [id, pa] of a) {
    const pb = b.get(id);
    if (!pb) continue;
    const x = metric(pa);
    const y = metric(pb);
    if (x === undefined || y === undefined) continue;
    xs.push(x);
    ys.push(y);
  }
  return xs.length === 0 ? undefined : pairedBootstrap(xs, ys, { seed });
}
