import { readFile, stat } from 'node:fs/promises';
import { basename, relative } from 'node:path';
import type { z } from 'zod';
import { CurvePoint } from '../eval/curve.js';
import { Report } from '../records/eval.js';
import { EndBatch, Step } from '../records/step.js';
import { type EvalDir, emptyLayout, hasRecords, type RunLayout, readManifest, scanLayout } from './layout.js';
import { familyOf, type ProblemInfo, readProblems } from './problems.js';
import { type RocSettings, rocSettings, rocVerdict } from './roc.js';
import { type Row, summarize } from './row.js';
import { FileTail, type TailLine } from './tail.js';

/** A line the index could not read: reported in the page and the log, never a crash. */
export interface Issue {
  where: string;
  message: string;
}

export interface IndexedRow extends Row {
  family: string;
}

/** One evaluation folder as the page shows it. */
export interface EvalInfo {
  name: string;
  report: z.output<typeof Report> | undefined;
  /** Per-problem records of each benchmark (`eval-<bench>.jsonl`), summaries left out. */
  problems: Record<string, Record<string, unknown>[]>;
}

const MAX_ISSUES = 200;

/**
 * Everything the viewer knows of one run folder, kept current by `refresh()`: the folder is walked
 * again (cheap: a few directories) and each NDJSON file is read from where the last refresh stopped.
 * Trajectories become `rows` (see row.ts); only a row's place in its file is kept, so a trajectory
 * page reads its one line again.
 */
export class RunIndex {
  /** Bumped whenever anything the page shows changed. */
  version = 0;
  /** Bumped when a file shrank (a resumed run rewrote it): rows were rebuilt, handles changed. */
  generation = 0;
  layout: RunLayout = emptyLayout();
  rows: IndexedRow[] = [];
  /** Files rows point into (`Row.file`). */
  files: string[] = [];
  issues: Issue[] = [];
  issueCount = 0;
  problems = new Map<string, ProblemInfo>();
  steps = new Map<string, Map<number, Step>>();
  rollout = new Map<string, Map<number, NonNullable<EndBatch['stats']>>>();
  curves = new Map<string, CurvePoint[]>();
  evals = new Map<string, EvalInfo>();
  stages: { first: number; settings: RocSettings | undefined }[] = [];
  #tails = new Map<string, FileTail>();
  #sizes = new Map<string, number>();
  #groups = new Map<string, number[]>();
  #running: Promise<boolean> | undefined;

  /**
   * Awaited before each trajectory file is read: the server pauses the indexing while a page opens
   * (both want the same two cores, and the page is what someone is waiting for).
   */
  pace: () => Promise<void> = () => Promise.resolve();

  constructor(
    readonly name: string,
    readonly root: string,
  ) {}

  /** True once every trajectory file present was indexed (a first open indexes them after listening). */
  indexed = false;

  /**
   * Reads what changed since the last call; true when anything did. Calls never overlap. With
   * `rows: false` only the layout and the small files (steps, curves, reports) are read: enough for
   * the overview, so a server can listen before the trajectories are indexed.
   */
  refresh({ rows = true } = {}): Promise<boolean> {
    const run = (this.#running ?? Promise.resolve(false)).then(() => this.#refresh(rows));
    this.#running = run.catch(() => false);
    return run;
  }

  /** True once the folder showed anything recognisable. */
  get recognised(): boolean {
    return hasRecords(this.layout);
  }

  async #refresh(rows: boolean): Promise<boolean> {
    const before = this.version;
    this.layout = await scanLayout(this.root);
    await this.#readSmall();
    if (!rows) return this.version !== before;
    let reset = false;
    for (const { path, step } of this.layout.trajectories) {
      if (!this.#tails.has(path)) await this.pace();
      reset = (await this.#tailRows(path, step, null)) || reset;
    }
    for (const e of this.layout.evals) {
      for (const path of e.trajectories) {
        if (!this.#tails.has(path)) await this.pace();
        reset = (await this.#tailRows(path, null, e.name)) || reset;
      }
    }
    if (reset) {
      // A trajectories file was rewritten: rows after it would point at bytes that moved.
      this.rows = [];
      this.files = [];
      this.#groups.clear();
      for (const path of [...this.#tails.keys()]) if (this.#isRowFile(path)) this.#tails.delete(path);
      this.generation += 1;
      this.version += 1;
      return this.#refresh(true).then(() => true);
    }
    if (!this.indexed) {
      this.indexed = true;
      this.version += 1;
    }
    return this.version !== before;
  }

  #isRowFile(path: string): boolean {
    return (
      this.layout.trajectories.some((t) => t.path === path) ||
      this.layout.evals.some((e) => e.trajectories.includes(path))
    );
  }

  #issue(where: string, message: string): void {
    this.issueCount += 1;
    if (this.issues.length < MAX_ISSUES) this.issues.push({ where, message });
    this.version += 1;
  }

  #where(path: string, line: number): string {
    return `${this.name}/${relative(this.root, path)}:${line}`;
  }

  /** Files read whole when their size changes: they are small (one line per step or problem). */
  async #changed(path: string): Promise<boolean> {
    const info = await stat(path).catch(() => undefined);
    const size = info ? info.size + info.mtimeMs : -1;
    if (this.#sizes.get(path) === size) return false;
    this.#sizes.set(path, size);
    return true;
  }

  async #readSmall(): Promise<void> {
    for (const path of this.layout.problems) {
      if (!(await this.#changed(path))) continue;
      for (const bad of await readProblems(path, this.problems))
        this.#issue(this.#where(path, bad.line), bad.message);
      this.version += 1;
    }
    const stages = [];
    for (const s of this.layout.stages)
      stages.push({ first: s.first, settings: rocSettings(await readManifest(s.path)) });
    this.stages = stages;
    for (const path of this.layout.steps) await this.#tailRecords(path, Step, this.steps, (r) => r.step);
    for (const path of this.layout.rolloutSteps) {
      await this.#tailRecords(
        path,
        EndBatch,
        this.rollout,
        (r) => r.step,
        (r) => r.stats,
      );
    }
    for (const path of this.layout.curves) {
      const points = this.curves.get(path) ?? [];
      this.curves.set(path, points);
      await this.#tail(
        path,
        ({ bytes, line }) => {
          const p = this.#parse(CurvePoint, bytes, path, line);
          if (p) points.push(p);
        },
        () => points.splice(0),
      );
    }
    for (const e of this.layout.evals) await this.#readEval(e);
  }

  async #tailRecords<S extends z.ZodType, V>(
    path: string,
    schema: S,
    into: Map<string, Map<number, V>>,
    key: (r: z.output<S>) => number | undefined,
    value: (r: z.output<S>) => V | undefined = (r) => r as V,
  ): Promise<void> {
    const map = into.get(path) ?? new Map<number, V>();
    into.set(path, map);
    await this.#tail(
      path,
      ({ bytes, line }) => {
        const r = this.#parse(schema, bytes, path, line);
        const k = r === undefined ? undefined : key(r);
        const v = r === undefined ? undefined : value(r);
        if (k !== undefined && v !== undefined) map.set(k, v);
      },
      () => map.clear(),
    );
  }

  #parse<S extends z.ZodType>(schema: S, bytes: Buffer, path: string, line: number): z.output<S> | undefined {
    const text = bytes.toString('utf8');
    if (text.trim() === '') return undefined;
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (error) {
      this.#issue(this.#where(path, line), `invalid JSON: ${(error as Error).message}`);
      return undefined;
    }
    const parsed = schema.safeParse(value);
    if (parsed.success) return parsed.data;
    const issue = parsed.error.issues[0];
    this.#issue(
      this.#where(path, line),
      `${issue.path.map(String).join('.') || '(record)'}: ${issue.message}`,
    );
    return undefined;
  }

  /** Tails one file; `onReset` forgets what an earlier read of it gave. Returns true on a reset. */
  async #tail(path: string, each: (line: TailLine) => void, onReset: () => void): Promise<boolean> {
    let tail = this.#tails.get(path);
    if (!tail) {
      tail = new FileTail(path);
      this.#tails.set(path, tail);
    }
    const { reset, lines } = await tail.read((l) => {
      each(l);
    });
    if (reset) onReset();
    if (lines > 0 || reset) this.version += 1;
    return reset;
  }

  async #tailRows(path: string, step: number | null, evalName: string | null): Promise<boolean> {
    let file = this.files.indexOf(path);
    const tail = this.#tails.get(path);
    // Rows of a rewritten file cannot be dropped in place (handles are positions): rebuild instead.
    const offset = tail?.offset ?? 0;
    const info = await stat(path).catch(() => undefined);
    if (info && info.size < offset) return true;
    return this.#tail(
      path,
      (l) => {
        if (l.bytes.length === 0 || (l.bytes.length < 4 && l.bytes.toString().trim() === '')) return;
        // rollout's end_batch lines are not trajectories (a file of the whole stream holds them)
        if (l.bytes.length < 4096 && l.bytes.includes('"end_batch"')) return;
        let fields: ReturnType<typeof summarize>;
        try {
          fields = summarize(l.bytes);
        } catch (error) {
          this.#issue(this.#where(path, l.line), (error as Error).message);
          return;
        }
        if (file === -1) {
          file = this.files.length;
          this.files.push(path);
        }
        const problem = this.problems.get(fields.problem_id);
        const row: IndexedRow = {
          ...fields,
          step: fields.step ?? step,
          n: this.rows.length,
          file,
          offset: l.offset,
          length: l.bytes.length,
          line: l.line,
          eval: evalName,
          roc: null,
          roc_outcome: null,
          family: problem?.family ?? familyOf(fields.problem_id),
        };
        this.rows.push(row);
        if (evalName === null && row.step !== null) this.#group(row);
      },
      () => {},
    );
  }

  /** Adds a training row to its (step, problem) group and decides RoC once the group is complete. */
  #group(row: IndexedRow): void {
    const settings = this.settingsAt(row.step as number);
    if (!settings) return;
    const key = `${row.step}\u0000${row.problem_id}`;
    const members = this.#groups.get(key) ?? [];
    members.push(row.n);
    this.#groups.set(key, members);
    if (members.length !== settings.n) return;
    const rows = members.map((n) => this.rows[n]);
    const verdict = rocVerdict(
      rows.map((r) => ({ sample: r.sample, reward: r.reward, penalty: r.penalty.total, finish: r.finish })),
      settings,
    );
    rows.forEach((r, i) => {
      r.roc = verdict.kept[i] ? 'kept' : 'dropped';
      r.roc_outcome = verdict.outcome;
    });
  }

  /** The RoC settings of the stage holding `step` (the last stage starting at or before it). */
  settingsAt(step: number): RocSettings | undefined {
    let found: RocSettings | undefined;
    for (const s of this.stages) if (s.first <= step) found = s.settings;
    return found;
  }

  /** The stage number (1-based) holding `step`, or null without stage manifests. */
  stageAt(step: number): number | null {
    let found: number | null = null;
    this.stages.forEach((s, i) => {
      if (s.first <= step) found = i + 1;
    });
    return found;
  }

  async #readEval(e: EvalDir): Promise<void> {
    const files = [e.report, ...e.perProblem];
    let changed = false;
    for (const f of files) changed = (await this.#changed(f)) || changed;
    if (!changed && this.evals.has(e.name)) return;
    let report: EvalInfo['report'];
    try {
      const parsed = Report.safeParse(JSON.parse(await readFile(e.report, 'utf8')));
      if (parsed.success) report = parsed.data;
      else
        this.#issue(
          this.#where(e.report, 1),
          `${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`,
        );
    } catch (error) {
      this.#issue(this.#where(e.report, 1), (error as Error).message);
    }
    const problems: EvalInfo['problems'] = {};
    for (const path of e.perProblem) {
      const bench = basename(path)
        .replace(/^eval-/, '')
        .replace(/\.jsonl$/, '');
      const list: Record<string, unknown>[] = [];
      const text = await readFile(path, 'utf8').catch(() => '');
      text.split('\n').forEach((raw, i) => {
        if (raw.trim() === '') return;
        try {
          const r = JSON.parse(raw) as Record<string, unknown>;
          if (r.summary !== true) list.push(r);
        } catch (error) {
          this.#issue(this.#where(path, i + 1), `invalid JSON: ${(error as Error).message}`);
        }
      });
      problems[bench] = list;
    }
    this.evals.set(e.name, { name: e.name, report, problems });
    this.version += 1;
  }
}
