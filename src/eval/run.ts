import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { familyOf, isMultiStep } from '../algo/tool-use.js';
import { DataError } from '../errors.js';
import { writeFileAtomic } from '../ndjson/index.js';
import type { Problem } from '../records/problem.js';
import { isInfraError, outcomeReward, type Trajectory } from '../records/trajectory.js';
import {
  type EvalProblemRecord,
  type EvalSummaryRecord,
  problemRecord,
  type Sample,
  summarize,
  toSample,
} from './metrics.js';
import { lengthSpec, passAtKSpec, renderSvg } from './plots.js';
import { makeReport, markdownReport } from './report.js';
import type { Verifier } from './verifier.js';

/** A trajectory and where it came from (`FILE:LINE` or `rollout:BENCH`), for error messages. */
export interface Sourced {
  trajectory: Trajectory;
  where: string;
}

export interface BenchmarkResult {
  benchmark: string;
  records: EvalProblemRecord[];
  summary: EvalSummaryRecord;
  samples: Sample[];
}

export interface EvaluateOptions {
  /** The benchmark's problems: checks coverage, orders the records, and is needed to re-verify. */
  problems?: readonly Problem[];
  verifier: Verifier;
  /** Re-score each trajectory's text against its problem instead of trusting its `reward`. */
  reverify?: boolean;
  /** With `reverify`: keep the verifier's reward for truncated trajectories (default 0). */
  rewardTruncated?: boolean;
  /**
   * Fail (DataError) when more than this share of the trajectories ended with `finish: "error"`
   * (default 1: never; rolling out, `rollout` stops the run earlier with the same threshold).
   */
  maxErrorShare?: number;
  /** Sees every trajectory (re-verified if asked) as it streams past, e.g. to save it. */
  onTrajectory?: (trajectory: Trajectory) => Promise<void>;
}

/** Streams one benchmark's trajectories into per-problem records and its summary. */
export async function evaluateBenchmark(
  benchmark: string,
  trajectories: AsyncIterable<Sourced>,
  options: EvaluateOptions,
): Promise<BenchmarkResult> {
  const byId = options.problems ? new Map(options.problems.map((p) => [p.id, p])) : undefined;
  const groups = new Map<string, Sample[]>();
  const seen = new Set<string>();
  const samples: Sample[] = [];
  const infra = new Map<string, number>();
  let total = 0;
  for await (const { trajectory, where } of trajectories) {
    total += 1;
    const problem = byId?.get(trajectory.problem_id);
    if (byId && !problem) {
      throw new DataError(
        `${where}: problem_id: '${trajectory.problem_id}' is not a problem of ${benchmark}`,
      );
    }
    if (trajectory.branch !== undefined) {
      throw new DataError(
        `${where}: branch: '${trajectory.id}' is a branch of '${trajectory.branch.parent}' (rollout --branch), not a sample of its problem: evaluate root samples only`,
      );
    }
    const key = `${trajectory.problem_id}\u0000${trajectory.sample}`;
    if (seen.has(key)) {
      throw new DataError(
        `${where}: sample: duplicate sample ${trajectory.sample} of '${trajectory.problem_id}'`,
      );
    }
    seen.add(key);
    let t = trajectory;
    if (options.reverify) {
      if (!problem) throw new DataError(`${where}: --reverify needs the problem (pass --problems)`);
      const { answer, reward } = await options.verifier.score(t.text, problem);
      t = { ...t, answer, reward: outcomeReward(t.finish, reward, options.rewardTruncated) };
    }
    await options.onTrajectory?.(t);
    if (isInfraError(t)) {
      // Not the model's failure: counted apart, in no metric.
      infra.set(t.problem_id, (infra.get(t.problem_id) ?? 0) + 1);
      continue;
    }
    const sample = toSample(t, familyOf(t.problem_id, problem?.meta), isMultiStep(problem?.meta));
    samples.push(sample);
    const group = groups.get(sample.problem_id);
    if (group) group.push(sample);
    else groups.set(sample.problem_id, [sample]);
  }
  const errors = [...infra.values()].reduce((a, b) => a + b, 0);
  const share = options.maxErrorShare ?? 1;
  if (errors > share * total) {
    throw new DataError(
      `${benchmark}: ${errors} of ${total} trajectories failed for infrastructure reasons (finish "error"), ` +
        `more than --max-error-share ${share}`,
    );
  }
  const order = options.problems
    ? options.problems.map((p) => p.id)
    : [...new Set([...groups.keys(), ...infra.keys()])];
  const records: EvalProblemRecord[] = [];
  for (const id of order) {
    const group = groups.get(id) ?? [];
    const failed = infra.get(id) ?? 0;
    if (group.length === 0 && failed === 0)
      throw new DataError(`${benchmark}: problem '${id}' has no trajectories`);
    const kind = byId?.get(id)?.kind;
    const same = (a: string, b: string) => options.verifier.same(a, b, kind);
    records.push(await problemRecord(benchmark, id, group, same, failed));
  }
  if (records.length === 0) throw new DataError(`${benchmark}: no trajectories`);
  const summary = summarize(benchmark, records, samples, {
    equivalence: options.verifier.equivalence,
    reverified: Boolean(options.reverify),
  });
  return { benchmark, records, summary, samples };
}

/** Safe in file names: benchmark names come from user file names. */
export const slug = (name: string) => name.replace(/[^A-Za-z0-9._-]+/g, '_');

/**
 * Writes report.json, report.md, eval-<bench>.jsonl (per-problem records + summary) and the plots
 * (passk.svg, lengths-<bench>.svg) into `dir`. Returns the files written, relative to `dir`.
 */
export async function writeReport(
  dir: string,
  results: readonly BenchmarkResult[],
  extra: Record<string, unknown> = {},
): Promise<string[]> {
  await mkdir(dir, { recursive: true });
  const written: string[] = [];
  const put = (name: string, data: string) => {
    writeFileAtomic(join(dir, name), data);
    written.push(name);
  };
  for (const r of results) {
    put(
      `eval-${slug(r.benchmark)}.jsonl`,
      [...r.records, r.summary].map((x) => `${JSON.stringify(x)}\n`).join(''),
    );
  }
  const points = results.flatMap((r) =>
    Object.entries(r.summary['pass@k']).map(([k, pass]) => ({ benchmark: r.benchmark, k: Number(k), pass })),
  );
  put('passk.svg', await renderSvg(passAtKSpec(points)));
  const lengths: Record<string, string> = {};
  for (const r of results) {
    const name = `lengths-${slug(r.benchmark)}.svg`;
    put(name, await renderSvg(lengthSpec(r.benchmark, r.samples)));
    lengths[r.benchmark] = name;
  }
  const report = makeReport(
    results.map((r) => r.summary),
    extra,
  );
  put('report.json', `${JSON.stringify(report, null, 2)}\n`);
  put('report.md', markdownReport(report, { passAtK: 'passk.svg', lengths }));
  return written;
}
