/**
 * Collects records into groups by key (a trajectory's `problem_id`) while they stream in, in any
 * order and interleaved. With a declared group size a group is released the moment it is complete,
 * so memory holds only the groups still open; without one, every group waits for the end of input.
 */
import { DataError } from '../errors.js';
import { type NdjsonWriter, openInput, openOutput, readLines, type SourceLine } from '../ndjson/index.js';
import { type ParsedRecord, type ParseTask, type PoolOptions, parseTrajectories } from './parse-pool.js';

export interface Member<T> {
  item: T;
  sample: number;
  id: string;
  /** `FILE:LINE` of the record. */
  where: string;
}

export interface Group<T> {
  key: string;
  /** Members in ascending `sample` order (the release's batch order within a group). */
  members: Member<T>[];
}

export interface GrouperOptions {
  /** Expected records per group; a group is emitted as soon as it holds this many. */
  size?: number;
}

export class Grouper<T> {
  readonly #size: number | undefined;
  readonly #open = new Map<string, Member<T>[]>();
  /** The size each open group was declared with (a branch group's own). */
  readonly #sizes = new Map<string, { size: number | undefined; branch: boolean }>();
  /** Keys already emitted (a few bytes per group), so a straggler is an error, not a new group. */
  readonly #done = new Set<string>();

  constructor({ size }: GrouperOptions = {}) {
    this.#size = size;
  }

  /** Groups still waiting for members. */
  get openGroups(): number {
    return this.#open.size;
  }

  /**
   * Adds one record; returns its group when that record completed it (only with a size). A branch
   * of tree rollouts names its siblings (`siblings`, its `branch.of`): its group holds them all, or
   * as many as a --keep upstream left (roc-filter keeps min(siblings, keep)), so its size is the
   * smaller of the two; it streams only when a size is declared, like a problem's group.
   */
  add(key: string, member: Member<T>, siblings?: number): Group<T> | undefined {
    const size =
      siblings !== undefined && this.#size !== undefined ? Math.min(siblings, this.#size) : this.#size;
    if (this.#done.has(key)) {
      throw new DataError(
        siblings === undefined
          ? `${member.where}: problem_id: group '${key}' already had its ${this.#size} records (--group-size ${this.#size})`
          : `${member.where}: branch: branch group '${key}' already had its ${size} records (min of branch.of ${siblings} and --group-size ${this.#size})`,
      );
    }
    let members = this.#open.get(key);
    if (members === undefined) {
      members = [];
      this.#open.set(key, members);
      this.#sizes.set(key, { size, branch: siblings !== undefined });
    }
    for (const other of members) {
      if (other.sample === member.sample) {
        throw new DataError(
          `${member.where}: sample: duplicate sample ${member.sample} of problem '${key}' (first at ${other.where})`,
        );
      }
      if (other.id === member.id) {
        throw new DataError(`${member.where}: id: duplicate id '${member.id}' (first at ${other.where})`);
      }
    }
    members.push(member);
    if (size !== undefined && members.length === size) {
      this.#open.delete(key);
      this.#sizes.delete(key);
      this.#done.add(key);
      return { key, members: sorted(members) };
    }
    return undefined;
  }

  /**
   * At end of input: the remaining groups in order of first appearance. With a declared size an
   * incomplete group is an error naming its first record, since its missing samples would skew it.
   */
  finish(): Group<T>[] {
    const out: Group<T>[] = [];
    for (const [key, members] of this.#open) {
      const declared = this.#sizes.get(key);
      if (declared?.size !== undefined) {
        throw new DataError(
          declared.branch
            ? `${members[0].where}: branch: branch group '${key}' has ${members.length} records at end of input, expected ${declared.size}`
            : `${members[0].where}: problem_id: group '${key}' has ${members.length} records at end of input, --group-size says ${this.#size}`,
        );
      }
      out.push({ key, members: sorted(members) });
    }
    this.#open.clear();
    this.#sizes.clear();
    return out;
  }
}

function sorted<T>(members: Member<T>[]): Member<T>[] {
  return members.sort((a, b) => a.sample - b.sample);
}

/**
 * An `{"end_batch": true, ...}` line of the RL pipeline (rollout --steps): the groups of its batch
 * are all released before it, then the command writes the line on unchanged.
 */
export interface BatchEnd {
  endBatch: string;
  where: string;
}

export const isBatchEnd = <T>(item: Group<T> | BatchEnd): item is BatchEnd => 'endBatch' in item;

/** Writes a batch end on once its step's groups are all out; false when the reader has gone. */
export async function passBatchEnd(out: NdjsonWriter, end: BatchEnd): Promise<boolean> {
  await out.writeRaw(end.endBatch);
  return !out.closed;
}

const END_BATCH = /^\s*\{.*"end_batch"\s*:\s*true/;

function endBatchLine(line: SourceLine): boolean {
  if (!END_BATCH.test(line.text)) return false;
  try {
    const value = JSON.parse(line.text) as { end_batch?: unknown; id?: unknown };
    return value.end_batch === true && value.id === undefined;
  } catch {
    return false; // not JSON: the trajectory parser reports it with its line
  }
}

export interface GroupedInput<T> {
  /**
   * Groups in completion order (with a size) or first-appearance order (at the end of the input or
   * of a batch), and the batch ends between them.
   */
  groups: AsyncGenerator<Group<T> | BatchEnd>;
  /** Records read so far. */
  readonly records: () => number;
  /** Records read so far with `finish: "error"` (infrastructure failures). */
  readonly errors: () => number;
  /** Whether the whole input has been read. */
  readonly complete: () => boolean;
}

/** The counts of infrastructure failures that `roc-filter` and `advantage` report. */
export interface InfraCounts {
  /** Records with `finish: "error"`: in no group's statistics, never written. */
  infra_errors: number;
  /** Groups that had at least one such record (their statistics are over the rest). */
  infra_error_groups: number;
  /** Groups with nothing but such records: dropped. */
  infra_only_groups: number;
}

/**
 * The members of `group` that enter its statistics: infrastructure failures (`errored`) are left
 * out and counted in `counts`. Undefined when none is left (the group is dropped).
 */
export function scoredMembers<T>(
  group: Group<T>,
  errored: (item: T) => boolean,
  counts: InfraCounts,
): Member<T>[] | undefined {
  const members = group.members.filter((m) => !errored(m.item));
  if (members.length < group.members.length) {
    counts.infra_errors += group.members.length - members.length;
    counts.infra_error_groups += 1;
  }
  if (members.length > 0) return members;
  counts.infra_only_groups += 1;
  return undefined;
}

/**
 * `--max-error-share`: the returned check throws a DataError when more than `share` of the records
 * read are infrastructure failures. Call it before writing each group and once at the end: it
 * checks once, when the input is complete, which (without `--group-size`) is before anything is
 * written; with a group size, groups already written stay written.
 */
export function errorShareGate(
  command: string,
  input: Pick<GroupedInput<unknown>, 'records' | 'errors' | 'complete'>,
  share: number | undefined,
): () => void {
  let checked = share === undefined;
  return () => {
    if (checked || !input.complete()) return;
    checked = true;
    const errors = input.errors();
    const records = input.records();
    if (errors > (share as number) * records) {
      throw new DataError(
        `${command}: ${errors} of ${records} trajectories failed for infrastructure reasons (finish "error"), ` +
          `more than --max-error-share ${share}`,
      );
    }
  };
}

/**
 * Reads trajectories from FILE (or stdin), validates each against the Trajectory schema (on worker
 * threads for large inputs), turns it into what the command keeps per record (`build`, given the parsed
 * essentials and the raw line) and groups them by `problem_id`.
 */
export function readTrajectoryGroups<T>(
  file: string | undefined,
  options: GrouperOptions & PoolOptions & { task: ParseTask },
  build: (record: ParsedRecord, raw: string) => T,
): GroupedInput<T> {
  let count = 0;
  let errors = 0;
  let complete = false;
  const { stream, source } = openInput(file);
  const lines = readLines(stream, source)[Symbol.asyncIterator]();
  const at: { marker?: SourceLine; eof: boolean } = { eof: false };
  /** The input's lines up to the next end_batch line (kept in `marker`) or the end. */
  async function* batch(): AsyncGenerator<SourceLine> {
    for (;;) {
      const next = await lines.next();
      if (next.done) {
        at.eof = true;
        return;
      }
      if (endBatchLine(next.value)) {
        at.marker = next.value;
        return;
      }
      yield next.value;
    }
  }
  async function* groups(): AsyncGenerator<Group<T> | BatchEnd> {
    while (!at.eof) {
      at.marker = undefined;
      yield* batchGroups(batch());
      const m = at.marker as SourceLine | undefined;
      if (m) yield { endBatch: m.text.trim(), where: `${m.source}:${m.line}` };
    }
  }
  /** Groups never span a batch end: an incomplete group there is an error, as at the end of input. */
  async function* batchGroups(batchLines: AsyncIterable<SourceLine>): AsyncGenerator<Group<T>> {
    const grouper = new Grouper<T>(options);
    for await (const { entry, record } of parseTrajectories(batchLines, options.task, options)) {
      count += 1;
      if (record.finish === 'error') errors += 1;
      const member = {
        item: build(record, entry.text),
        sample: record.sample,
        id: record.id,
        where: `${entry.source}:${entry.line}`,
      };
      const done = grouper.add(record.group, member, record.groupSize);
      if (done) yield done;
    }
    if (at.eof) complete = true; // before the last groups go out: --max-error-share checks first
    yield* grouper.finish();
  }
  return { groups: groups(), records: () => count, errors: () => errors, complete: () => complete };
}

/**
 * The input line with one more top-level field, without re-serialising the (large) record: the
 * record is a JSON object, so its text ends in `}`. Callers use this only when the field is new.
 */
export function appendField(raw: string, name: string, value: unknown): string {
  const text = raw.trimEnd();
  return `${text.slice(0, -1)},${JSON.stringify(name)}:${JSON.stringify(value)}}`;
}

/** What both group stages keep of a record, besides their own fields. */
export interface StageItem {
  /** The input line (without the field the stage writes, if it had one), to which the new one is appended. */
  raw: string;
  reward: number;
  /** `finish: "error"`: an infrastructure failure, left out of its group and of the output. */
  errored: boolean;
}

/** The flags both group stages take (commands/group-options.ts). */
export interface GroupStageFlags {
  groupSize?: number;
  maxErrorShare?: number;
  parseThreads: number;
}

export interface GroupStage<T extends StageItem> {
  command: string;
  /** Trajectories (NDJSON); stdin when undefined or `-`. */
  file: string | undefined;
  flags: GroupStageFlags;
  task: ParseTask;
  /** The stage's own fields of a record, beside those of StageItem. */
  fields: (record: ParsedRecord) => Omit<T, keyof StageItem>;
  /** Infrastructure failures and groups in are counted here, and records in once the input is read. */
  counts: InfraCounts & { groups_in: number; records_in: number };
  /** Writes what the stage keeps of a group's scored members. */
  each: (group: Group<T>, members: Member<T>[], out: NdjsonWriter) => Promise<void>;
  /** Writes what the stage held back (groups waiting for others), before a batch end and at the end. */
  flush?: (out: NdjsonWriter) => Promise<void>;
}

/**
 * The loop both group stages (roc-filter, advantage) run: reads the trajectories grouped by problem,
 * checks `--max-error-share` before each group and at the end, passes batch ends on, and hands each
 * group's scored members (infrastructure failures counted) to `each`. Ends the output; false when
 * the reader has gone (the stage then stops without its stats).
 */
export async function runGroupStage<T extends StageItem>(stage: GroupStage<T>): Promise<boolean> {
  const { flags, counts } = stage;
  const input = readTrajectoryGroups<T>(
    stage.file,
    { size: flags.groupSize, threads: flags.parseThreads, task: stage.task },
    (record, raw) =>
      ({
        ...stage.fields(record),
        raw: record.without ?? raw,
        reward: record.reward,
        errored: record.finish === 'error',
      }) as T,
  );
  const out = openOutput();
  const gate = errorShareGate(stage.command, input, flags.maxErrorShare);
  for await (const group of input.groups) {
    gate();
    if (isBatchEnd(group)) {
      await stage.flush?.(out);
      if (out.closed || !(await passBatchEnd(out, group))) return false;
      continue;
    }
    counts.groups_in += 1;
    const members = scoredMembers(group, (i) => i.errored, counts);
    if (members === undefined) continue;
    await stage.each(group, members, out);
    if (out.closed) return false;
  }
  gate();
  await stage.flush?.(out);
  if (out.closed) return false;
  await out.end();
  counts.records_in = input.records();
  return true;
}
