import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, join, relative } from 'node:path';

/**
 * Where a run folder keeps what the viewer reads. The recipes write three shapes, all found by the
 * same walk: the main job's folder (`runs/demo`: `rl/`, `eval-*`, `sft/data`), one RL stage
 * (`recipes/rl.sh OUT`: `steps.jsonl`, `rollout-steps.jsonl`, `trajectories/step-K.jsonl`), and one
 * `rstar eval --out` folder (`report.json`, `trajectories-*.jsonl`). docs/architecture.md has the layout.
 */
export interface RunLayout {
  /** train-step's Step records (`steps.jsonl`). */
  steps: string[];
  /** rollout's end_batch lines (`rollout-steps.jsonl`). */
  rolloutSteps: string[];
  /** `curve.jsonl`: training reward and held-out avg@n per step. */
  curves: string[];
  /** `trajectories/step-K.jsonl`, in step order. */
  trajectories: { path: string; step: number }[];
  /** Evaluation folders (a `report.json` inside), named by their folder. */
  evals: EvalDir[];
  /** Problem records (`*problems*.jsonl`): prompts, reference answers, families. */
  problems: string[];
  /** `manifest-stage-FIRST.txt` of each RL stage. */
  stages: { first: number; path: string }[];
  /** `compare.md` (`eval --compare` of the SFT and RL evaluations). */
  compare: string | undefined;
}

export interface EvalDir {
  name: string;
  dir: string;
  report: string;
  /** `eval-<bench>.jsonl`: per-problem records and the summary. */
  perProblem: string[];
  /** `trajectories-<bench>.jsonl`: what the evaluation scored. */
  trajectories: string[];
}

/** Folders never holding records: checkpoints, engine logs, an evaluation still being written. */
const SKIP = /^(step-\d+|ckpt|engine.*|node_modules|\..*|.*\.partial)$/;
const DEPTH = 4;

export function emptyLayout(): RunLayout {
  return {
    steps: [],
    rolloutSteps: [],
    curves: [],
    trajectories: [],
    evals: [],
    problems: [],
    stages: [],
    compare: undefined,
  };
}

/** Walks a run folder (a few levels deep) and sorts what it finds by role. */
export async function scanLayout(root: string): Promise<RunLayout> {
  const out = emptyLayout();
  await walk(root, root, 0, out);
  out.trajectories.sort((a, b) => a.step - b.step || a.path.localeCompare(b.path));
  out.evals.sort((a, b) => evalOrder(a.name) - evalOrder(b.name) || a.name.localeCompare(b.name));
  out.stages.sort((a, b) => a.first - b.first);
  return out;
}

/** sft first, then stepK / stageN by number, rl last: the order the main job runs them in. */
function evalOrder(name: string): number {
  const n = /(\d+)$/.exec(name);
  if (/(^|-)sft$/.test(name)) return -1;
  if (/(^|-)rl$/.test(name)) return 1e9;
  return n ? Number(n[1]) + (/stage/.test(name) ? 0.5 : 0) : 1e8;
}

async function walk(root: string, dir: string, depth: number, out: RunLayout): Promise<void> {
  let names: string[];
  try {
    names = (await readdir(dir)).sort();
  } catch {
    return;
  }
  if (names.includes('report.json')) out.evals.push(evalDir(root, dir, names));
  for (const name of names) {
    const path = join(dir, name);
    const info = await stat(path).catch(() => undefined);
    if (!info) continue;
    if (info.isDirectory()) {
      if (depth < DEPTH && !SKIP.test(name)) await walk(root, path, depth + 1, out);
      continue;
    }
    const step = /^step-(\d+)\.jsonl$/.exec(name);
    if (step && basename(dir) === 'trajectories') out.trajectories.push({ path, step: Number(step[1]) });
    else if (name === 'steps.jsonl') out.steps.push(path);
    else if (name === 'rollout-steps.jsonl') out.rolloutSteps.push(path);
    else if (name === 'curve.jsonl') out.curves.push(path);
    else if (name === 'compare.md') out.compare ??= path;
    else if (/problems.*\.jsonl$/.test(name) && !/^(eval|trajectories)-/.test(name)) out.problems.push(path);
    else {
      const stage = /^manifest-stage-(\d+)\.txt$/.exec(name);
      if (stage) out.stages.push({ first: Number(stage[1]), path });
    }
  }
}

function evalDir(root: string, dir: string, names: string[]): EvalDir {
  const name = relative(root, dir) || basename(dir);
  return {
    name,
    dir,
    report: join(dir, 'report.json'),
    perProblem: names.filter((n) => /^eval-.*\.jsonl$/.test(n)).map((n) => join(dir, n)),
    trajectories: names.filter((n) => /^trajectories-.*\.jsonl$/.test(n)).map((n) => join(dir, n)),
  };
}

/** `NAME=VALUE` lines of a recipe's manifest (recipes/lib.sh check_manifest). */
export async function readManifest(path: string): Promise<Record<string, string>> {
  const text = await readFile(path, 'utf8').catch(() => '');
  const out: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const eq = line.indexOf('=');
    if (eq > 0) out[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return out;
}

/** True when the layout holds anything the viewer can show. */
export function hasRecords(layout: RunLayout): boolean {
  return (
    layout.steps.length + layout.rolloutSteps.length + layout.trajectories.length + layout.evals.length > 0
  );
}
