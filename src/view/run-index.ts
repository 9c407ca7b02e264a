import { mkdir, readFile, rename, stat, unlink, utimes, writeFile } from 'node:fs/promises';
import { basename, dirname, join, relative } from 'node:path';
import type { z } from 'zod';
import { CurvePoint } from '../eval/curve.js';
import { Report } from '../records/eval.js';
import { EndBatch, Step } from '../records/step.js';
import { type EvalDir, emptyLayout, hasRecords, type RunLayout, readManifest, scanLayout } from './layout.js';
import { familyOf, type ProblemInfo, readProblems } from './problems.js';
import { branchRule, type RocSettings, rocSettings, rocVerdict, rootRule } from './roc.js';
import { type Row, type RowFields, summarize } from './row.js';
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
 * Bump when a row's fields (row.ts) or what they mean change: an older cache is then ignored.
 * 2: `branch` (tree rollouts), and a branch's penalty and verdict are its own part's and group's.
 */
export const CACHE_FORMAT = 2;
/** A live run's cache is written again at most this often (a file of ~4 MB per 25,000 rows). */
const CACHE_EVERY_MS = 30_000;

/** A row's cached fields: one array per field and file (columns parse 2-3x faster than a row each). */
const COLUMNS = [
  'offset',
  'length',
  'line',
  'id',
  'problem_id',
  'sample',
  'step',
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
  'penalty_tool',
  'penalty_format',
  'penalty_total',
  'branch',
  'roc',
  'roc_outcome',
] as const;
type Column = (typeof COLUMNS)[number];

interface CachedFile {
  /** Relative to the run folder. */
  path: string;
  size: number;
  mtimeMs: number;
  /** Bytes and lines indexed (a last line without its newline is not). */
  offset: number;
  lines: number;
  columns: Record<Column, unknown[]>;
  /** Unreadable lines: the first MAX_ISSUES as [line, message], and how many there were. */
  issues: [number, string][];
  issueCount: number;
}

interface Cache {
  format: number;
  /** The run folder (a file named by a hash of another folder's path is not this run's). */
  root: string;
  /** The stages' RoC settings the verdicts were decided with (other settings: decided again). */
  stages: string;
  files: CachedFile[];
}

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
  /** Branch rows by their parent (`branchesOf`): step or evaluation, and the parent's id. */
  #branches = new Map<string, number[]>();
  #running: Promise<boolean> | undefined;
  /** Unreadable lines of each trajectory file (for the cache). */
  #fileIssues = new Map<string, { list: [number, string][]; count: number }>();
  /** The cache read from the run folder, by path, until each file is indexed (undefined: not read yet). */
  #cached: Map<string, CachedFile> | undefined;
  /** The cache's RoC verdicts hold (decided under the stage settings read now). */
  #cachedVerdicts = false;
  /** Rows or issues were read from a file since the cache was written (what came from it is in it). */
  #cacheDirty = false;
  #cacheSavedAt = 0;
  /** The index cache's file (cache.ts), or undefined: no cache. */
  readonly #cacheFile: string | undefined;

  /**
   * Awaited before each trajectory file is read: the server pauses the indexing while a page opens
   * (both want the same two cores, and the page is what someone is waiting for).
   */
  pace: () => Promise<void> = () => Promise.resolve();

  constructor(
    readonly name: string,
    readonly root: string,
    { cacheFile }: { cacheFile?: string } = {},
  ) {
    this.#cacheFile = cacheFile;
  }

  /** Rows taken from the index cache (the rest were read from their files). */
  cachedRows = 0;

  /** True once every trajectory file present was indexed (a first open indexes them after listening). */
  indexed = false;

  /**
   * Reads what changed since the last call; true when anything did. Calls never overlap. With
   * `rows: false` only the layout and the small files (steps, curves, reports) are read: enough for
   * the overview, so a server can listen before the trajectories are indexed. With `rows: 'cached'`
   * the trajectory files the index cache holds unchanged are taken from it (in order, up to the
   * first it does not hold), none is read.
   */
  refresh({ rows = true }: { rows?: boolean | 'cached' } = {}): Promise<boolean> {
    const run = (this.#running ?? Promise.resolve(false)).then(() => this.#refresh(rows));
    this.#running = run.catch(() => false);
    return run;
  }

  /** True once the folder showed anything recognisable. */
  get recognised(): boolean {
    return hasRecords(this.layout);
  }

  async #refresh(rows: boolean | 'cached'): Promise<boolean> {
    const before = this.version;
    this.layout = await scanLayout(this.root);
    await this.#readSmall();
    if (!rows) return this.version !== before;
    const files: { path: string; step: number | null; evalName: string | null }[] = [
      ...this.layout.trajectories.map(({ path, step }) => ({ path, step, evalName: null })),
      ...this.layout.evals.flatMap((e) =>
        e.trajectories.map((path) => ({ path, step: null, evalName: e.name })),
      ),
    ];
    if (this.#cacheFile && this.#cached === undefined) this.#cached = await this.#readCache(this.#cacheFile);
    let reset = false;
    for (const { path, step, evalName } of files) {
      if (!this.#tails.has(path) && (await this.#fromCache(path, step, evalName))) continue;
      if (rows === 'cached') return this.version !== before;
      if (!this.#tails.has(path)) await this.pace();
      reset = (await this.#tailRows(path, step, evalName)) || reset;
    }
    if (reset) {
      // A trajectories file was rewritten: rows after it would point at bytes that moved.
      this.rows = [];
      this.files = [];
      this.#groups.clear();
      this.#branches.clear();
      for (const path of [...this.#tails.keys()]) {
        if (this.#isRowFile(path)) {
          this.#tails.delete(path);
          this.#fileIssues.delete(path);
        }
      }
      this.generation += 1;
      this.version += 1;
      this.#cacheDirty = true;
      return this.#refresh(true).then(() => true);
    }
    if (!this.indexed) {
      this.indexed = true;
      this.version += 1;
    }
    this.#cached = new Map();
    await this.#saveCache();
    return this.version !== before;
  }

  /** The cache's files that are unchanged since (same size and mtime), by path. */
  async #readCache(target: string): Promise<Map<string, CachedFile>> {
    const files = new Map<string, CachedFile>();
    let cache: Cache;
    try {
      cache = JSON.parse(await readFile(target, 'utf8')) as Cache;
    } catch {
      return files; // no cache yet, or one cut short: index the files
    }
    if (cache?.format !== CACHE_FORMAT || cache.root !== this.root || !Array.isArray(cache.files))
      return files;
    // used: not pruned (cache.ts)
    await utimes(target, new Date(), new Date()).catch(() => {});
    this.#cachedVerdicts = cache.stages === JSON.stringify(this.stages);
    await Promise.all(
      cache.files.map(async (f) => {
        const path = join(this.root, f.path);
        const info = await stat(path).catch(() => undefined);
        if (info && info.size === f.size && info.mtimeMs === f.mtimeMs) files.set(path, f);
      }),
    );
    return files;
  }

  /** Takes a file's rows from the cache when it holds the file unchanged. */
  async #fromCache(path: string, step: number | null, evalName: string | null): Promise<boolean> {
    const hit = this.#cached?.get(path);
    if (!hit) return false;
    this.#cached?.delete(path);
    const tail = new FileTail(path);
    tail.resume(hit.offset, hit.lines, hit.size, hit.mtimeMs);
    this.#tails.set(path, tail);
    const file = this.#fileOf(path);
    const c = hit.columns as Record<Column, never[]>;
    for (let i = 0; i < c.offset.length; i++) {
      const fields: RowFields = {
        id: c.id[i],
        problem_id: c.problem_id[i],
        sample: c.sample[i],
        step: c.step[i],
        reward: c.reward[i],
        finish: c.finish[i],
        turns: c.turns[i],
        tool_calls: c.tool_calls[i],
        tool_errors: c.tool_errors[i],
        answer_tags: c.answer_tags[i],
        answer: c.answer[i],
        tokens: c.tokens[i],
        model_tokens: c.model_tokens[i],
        policy_version: c.policy_version[i],
        turn_versions: c.turn_versions[i],
        penalty: { tool_error: c.penalty_tool[i], format: c.penalty_format[i], total: c.penalty_total[i] },
        branch: c.branch[i],
      };
      // a complete group's verdict comes with it (deciding 3,000 groups again was half the load time)
      const verdict =
        this.#cachedVerdicts && c.roc[i] !== null ? { roc: c.roc[i], outcome: c.roc_outcome[i] } : null;
      this.#addRow(
        fields,
        file,
        { offset: c.offset[i], length: c.length[i], line: c.line[i] },
        step,
        evalName,
        verdict,
      );
    }
    this.cachedRows += c.offset.length;
    this.#fileIssues.set(path, { list: hit.issues, count: hit.issueCount });
    for (const [line, message] of hit.issues) this.#issue(this.#where(path, line), message);
    this.issueCount += hit.issueCount - hit.issues.length;
    this.version += 1;
    // a server reads the cache while the page loads: its scripts are answered between two files
    await new Promise((next) => setImmediate(next));
    return true;
  }

  /**
   * Writes the cache when rows changed: after the first indexing, then at most every 30 s. Written
   * whole to a temporary name and renamed (a reader never sees half of it); a folder that cannot be
   * written to only logs why, once.
   */
  async #saveCache(): Promise<void> {
    const target = this.#cacheFile;
    if (!target || !this.#cacheDirty) return;
    if (Date.now() - this.#cacheSavedAt < CACHE_EVERY_MS) return;
    this.#cacheDirty = false;
    this.#cacheSavedAt = Date.now();
    const byFile = this.files.map(
      () => Object.fromEntries(COLUMNS.map((k) => [k, []])) as unknown as Record<Column, unknown[]>,
    );
    for (const r of this.rows) {
      const c = byFile[r.file];
      for (const k of COLUMNS) {
        if (k === 'penalty_tool') c[k].push(r.penalty.tool_error);
        else if (k === 'penalty_format') c[k].push(r.penalty.format);
        else if (k === 'penalty_total') c[k].push(r.penalty.total);
        else c[k].push(r[k]);
      }
    }
    const files: CachedFile[] = [];
    this.files.forEach((path, i) => {
      const tail = this.#tails.get(path);
      if (!tail || tail.seen.size < 0) return;
      files.push({
        path: relative(this.root, path),
        ...tail.seen,
        offset: tail.offset,
        lines: tail.line,
        columns: byFile[i],
        issues: this.#fileIssues.get(path)?.list ?? [],
        issueCount: this.#fileIssues.get(path)?.count ?? 0,
      });
    });
    const temp = `${target}.${process.pid}.tmp`;
    try {
      await mkdir(dirname(target), { recursive: true });
      const cache: Cache = {
        format: CACHE_FORMAT,
        root: this.root,
        stages: JSON.stringify(this.stages),
        files,
      };
      await writeFile(temp, JSON.stringify(cache));
      await rename(temp, target);
    } catch (error) {
      await unlink(temp).catch(() => {});
      if (!this.cacheError) this.cacheError = `${target}: ${(error as Error).message}`;
    }
  }

  /** Why the index cache could not be written (logged by the command), if it could not. */
  cacheError: string | undefined;

  #isRowFile(path: string): boolean {
    return (
      this.layout.trajectories.some((t) => t.path === path) ||
      this.layout.evals.some((e) => e.trajectories.includes(path))
    );
  }

  #issue(where: string, message: string): void {
    this.issueCount += 1;
    // an fs error names the file by its absolute path, which the page (maybe served beyond this
    // machine) must not learn: the run's name stands for its folder
    const shown = message.replaceAll(this.root, this.name);
    if (this.issues.length < MAX_ISSUES) this.issues.push({ where, message: shown });
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

  #fileOf(path: string): number {
    let file = this.files.indexOf(path);
    if (file === -1) {
      file = this.files.length;
      this.files.push(path);
    }
    return file;
  }

  #addRow(
    fields: RowFields,
    file: number,
    at: { offset: number; length: number; line: number },
    step: number | null,
    evalName: string | null,
    verdict: { roc: IndexedRow['roc']; outcome: string | null } | null = null,
  ): void {
    const problem = this.problems.get(fields.problem_id);
    // every field named (a spread made a slower object shape, and cached rows pass through here)
    const row: IndexedRow = {
      id: fields.id,
      problem_id: fields.problem_id,
      sample: fields.sample,
      reward: fields.reward,
      finish: fields.finish,
      turns: fields.turns,
      tool_calls: fields.tool_calls,
      tool_errors: fields.tool_errors,
      answer_tags: fields.answer_tags,
      answer: fields.answer,
      tokens: fields.tokens,
      model_tokens: fields.model_tokens,
      policy_version: fields.policy_version,
      turn_versions: fields.turn_versions,
      penalty: fields.penalty,
      branch: fields.branch,
      step: fields.step ?? step,
      n: this.rows.length,
      file,
      offset: at.offset,
      length: at.length,
      line: at.line,
      eval: evalName,
      roc: verdict?.roc ?? null,
      roc_outcome: verdict?.outcome ?? null,
      family: problem?.family ?? familyOf(fields.problem_id),
    };
    this.rows.push(row);
    if (row.branch) {
      const key = treeKey(row, row.branch.parent);
      const list = this.#branches.get(key);
      if (list) list.push(row.n);
      else this.#branches.set(key, [row.n]);
    }
    if (evalName === null && row.step !== null && !verdict) this.#group(row);
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
        let fields: RowFields;
        try {
          fields = summarize(l.bytes);
        } catch (error) {
          const message = (error as Error).message;
          this.#issue(this.#where(path, l.line), message);
          const issues = this.#fileIssues.get(path) ?? { list: [], count: 0 };
          if (issues.list.length < MAX_ISSUES) issues.list.push([l.line, message]);
          issues.count += 1;
          this.#fileIssues.set(path, issues);
          this.#cacheDirty = true;
          return;
        }
        this.#cacheDirty = true;
        if (file === -1) file = this.#fileOf(path);
        this.#addRow(
          fields,
          file,
          { offset: l.offset, length: l.bytes.length, line: l.line },
          step,
          evalName,
        );
      },
      () => {},
    );
  }

  /**
   * Adds a training row to its group and decides RoC once the group is complete: a root sample's
   * group is its (step, problem), complete at the stage's n; a branch's is its siblings from the same
   * branch point (step and `branchGroupKey`), complete at its `of` (as roc-filter groups them).
   */
  #group(row: IndexedRow): void {
    const settings = this.settingsAt(row.step as number);
    if (!settings) return;
    // \u0001 keeps a branch point's key apart from any problem id's
    const key = row.branch
      ? `${row.step}\u0000\u0001${row.branch.parent}@${row.branch.offset}`
      : `${row.step}\u0000${row.problem_id}`;
    const members = this.#groups.get(key) ?? [];
    members.push(row.n);
    this.#groups.set(key, members);
    if (members.length !== (row.branch ? row.branch.of : settings.n)) return;
    const rows = members.map((n) => this.rows[n]);
    const verdict = rocVerdict(
      rows.map((r) => ({ sample: r.sample, reward: r.reward, penalty: r.penalty.total, finish: r.finish })),
      row.branch ? branchRule(settings, row.branch.of) : rootRule(settings),
    );
    rows.forEach((r, i) => {
      r.roc = verdict.kept[i] ? 'kept' : 'dropped';
      r.roc_outcome = verdict.outcome;
    });
  }

  /** The rows branched from `parent` (tree rollouts), in the order indexed. */
  branchesOf(parent: IndexedRow): IndexedRow[] {
    return (this.#branches.get(treeKey(parent, parent.id)) ?? []).map((n) => this.rows[n]);
  }

  /** The row a branch came from: the trajectory of its step (or evaluation) with the parent's id. */
  parentOf(row: IndexedRow): IndexedRow | undefined {
    if (!row.branch) return undefined;
    const parent = row.branch.parent;
    const same = (r: IndexedRow) => r.id === parent && r.step === row.step && r.eval === row.eval;
    // rollout writes a step's trajectories together: look near the branch first
    for (let i = row.n - 1; i >= 0; i--) if (same(this.rows[i])) return this.rows[i];
    for (let i = row.n + 1; i < this.rows.length; i++) if (same(this.rows[i])) return this.rows[i];
    return undefined;
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

/** Where a trajectory's branches are found: its step (or evaluation) and the parent's id. */
function treeKey(row: { step: number | null; eval: string | null }, parent: string): string {
  return `${row.step ?? ''}\u0000${row.eval ?? ''}\u0000${parent}`;
}
