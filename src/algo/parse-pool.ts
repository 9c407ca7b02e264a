/**
 * Parses and validates trajectory lines on worker threads, for the streaming commands whose cost is
 * almost all JSON.parse + schema validation of 8K-token records. Results come back in input order,
 * so the first bad line is still the one reported, and at most a small window of lines is in flight
 * (back-pressure and constant memory are kept). Small inputs never start a worker.
 *
 * This file is also the worker's entry point (see the bottom).
 */
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { DataError } from '../errors.js';
import { parseLine, type SourceLine } from '../ndjson/index.js';
import { Trajectory } from '../records/index.js';
import { branchGroupKey } from '../records/trajectory.js';
import { type PenaltyMode, type ScoredText, scoreText } from './penalty.js';
import { trajectoryToolUse } from './tool-use.js';

/**
 * Recovery by order as tool-use.ts defines it, less the reward (RoC applies it to positives only):
 * false for a record without `tool_status`, whose call order is not known.
 */
function recoveredCall(status: readonly ('ok' | 'failed' | 'unparsable')[] | undefined): boolean {
  if (status === undefined) return false;
  return (
    trajectoryToolUse({ tool_calls: status.length, tool_errors: 0, tool_status: status, reward: 1 })
      .recovered === true
  );
}

/** What a command needs computed per record, beyond validation. */
export type ParseTask =
  | { kind: 'roc'; penalty: PenaltyMode }
  /** `steps`: keep each record's tokens and mask, for step groups (advantage --step-weight). */
  | { kind: 'advantage'; steps?: boolean; branches?: boolean };

/** The fields a command adds, which it strips from a record that already had them. */
const ADDED: Record<ParseTask['kind'], readonly string[]> = {
  roc: ['penalty'],
  // a per-token `advantages` left over from an earlier run would disagree with the new `advantage`
  advantage: ['advantage', 'advantages'],
};

export interface ParsedRecord {
  problem_id: string;
  /** The group it is credited in: its problem, or its branch point (tree rollouts, `branchGroupKey`). */
  group: string;
  /** A branch's group size (its siblings, `branch.of`): a root sample's is the command's --group-size. */
  groupSize?: number;
  sample: number;
  id: string;
  reward: number;
  /** `finish`: `error` marks an infrastructure failure, left out of group statistics. */
  finish: string;
  /**
   * When the input already carried the field the command adds (`penalty` or `advantage`): the record
   * re-serialised without it, so the command can append the new value as it does to a raw line.
   */
  without?: string;
  scored?: ScoredText;
  /** roc: a failed call followed later by a successful one (tool_status), for --reserve-recovered. */
  recovered?: boolean;
  /** `response_ids.length`: the response's tokens against the budget (overlong penalty). */
  responseLength: number;
  /** advantage with `steps` (or `branches`, for the records of a tree): the response's tokens and loss mask. */
  tokens?: { response_ids: number[]; loss_mask: number[] };
  /** advantage with `branches`: where this sample branched (`branched`). */
  branched?: { offset: number; of: number };
}

interface Reply {
  seq: number;
  record?: ParsedRecord;
  error?: string;
}

/** Validates one line and extracts what the task needs; throws DataError naming FILE:LINE and field. */
export function parseTrajectory(entry: SourceLine, task: ParseTask): ParsedRecord {
  const record = parseLine(Trajectory, entry);
  const added = ADDED[task.kind];
  const had = added.some((f) => record[f] !== undefined);
  // A branch is scored on what it did after its branch point: the failed call it branched from is
  // its parent's, and every sibling shares it.
  const ownText = record.branch ? record.text.slice(record.branch.text_offset) : record.text;
  const ownStatus = record.branch ? record.tool_status?.slice(record.branch.calls) : record.tool_status;
  return {
    problem_id: record.problem_id,
    group: branchGroupKey(record),
    ...(record.branch ? { groupSize: record.branch.of } : {}),
    sample: record.sample,
    id: record.id,
    reward: record.reward,
    finish: record.finish,
    without: had
      ? JSON.stringify({ ...record, ...Object.fromEntries(added.map((f) => [f, undefined])) })
      : undefined,
    scored: task.kind === 'roc' ? scoreText(ownText, task.penalty) : undefined,
    recovered:
      task.kind === 'roc' ? recoveredCall(record.branch ? record.tool_status : ownStatus) : undefined,
    responseLength: record.response_ids.length,
    tokens:
      task.kind === 'advantage' &&
      (task.steps || (task.branches && (record.branched !== undefined || record.branch !== undefined)))
        ? { response_ids: record.response_ids, loss_mask: record.loss_mask }
        : undefined,
    ...(task.kind === 'advantage' && task.branches && record.branched ? { branched: record.branched } : {}),
  };
}

export interface PoolOptions {
  /**
   * Worker threads; 0 (the default) parses on the main thread. Workers pay off only with idle cores:
   * on a busy 2-core machine they cost ~30% more CPU and twice the memory for no gain (docs/roc.md).
   */
  threads?: number;
  /** Bytes parsed on the main thread before workers start (they cost ~0.1 s to boot). */
  warmup?: number;
}

const WORKER_FLAG = 'rstarParsePool';

/** Parsed records paired with their lines, in input order; blank lines are skipped. */
export async function* parseTrajectories(
  lines: AsyncIterable<SourceLine>,
  task: ParseTask,
  { threads = 0, warmup = Number(process.env.RSTAR_POOL_WARMUP_BYTES ?? 8 << 20) }: PoolOptions = {},
): AsyncGenerator<{ entry: SourceLine; record: ParsedRecord }> {
  const window = Math.max(1, threads) * 8;
  const pending: { entry: SourceLine; result: Promise<Reply> }[] = [];
  const waiting = new Map<number, (reply: Reply) => void>();
  let workers: Worker[] = [];
  let failure: Error | undefined;
  let seen = 0;
  let seq = 0;

  const start = () => {
    workers = Array.from({ length: threads }, () => {
      const worker = new Worker(new URL(import.meta.url), { workerData: { [WORKER_FLAG]: true, task } });
      worker.on('message', (reply: Reply) => {
        waiting.get(reply.seq)?.(reply);
        waiting.delete(reply.seq);
      });
      worker.on('error', (error) => {
        failure = error;
        for (const resolve of waiting.values()) resolve({ seq: -1, error: error.message });
        waiting.clear();
      });
      return worker;
    });
  };
  const settle = async (head: { entry: SourceLine; result: Promise<Reply> }) => {
    const reply = await head.result;
    if (failure) throw failure;
    if (reply.error !== undefined) throw new DataError(reply.error);
    return { entry: head.entry, record: reply.record as ParsedRecord };
  };

  try {
    for await (const entry of lines) {
      if (entry.text.charCodeAt(0) !== 123 && entry.text.trim() === '') continue;
      seen += entry.text.length;
      if (threads > 0 && workers.length === 0 && seen > warmup) start();
      if (workers.length === 0) {
        // Inline: still through the queue, so records stay in order once workers take over.
        pending.push({ entry, result: Promise.resolve(inline(seq, entry, task)) });
      } else {
        const id = seq;
        const result = new Promise<Reply>((resolve) => waiting.set(id, resolve));
        workers[id % workers.length].postMessage({ seq: id, entry });
        pending.push({ entry, result });
      }
      seq += 1;
      while (pending.length >= window || (workers.length === 0 && pending.length > 0)) {
        yield await settle(pending.shift() as (typeof pending)[number]);
      }
    }
    while (pending.length > 0) yield await settle(pending.shift() as (typeof pending)[number]);
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

function inline(seq: number, entry: SourceLine, task: ParseTask): Reply {
  try {
    return { seq, record: parseTrajectory(entry, task) };
  } catch (error) {
    if (error instanceof DataError) return { seq, error: error.message };
    throw error;
  }
}

// Worker side: answer each line with its parsed record or its error message.
if (!isMainThread && parentPort && (workerData as Record<string, unknown>)?.[WORKER_FLAG]) {
  const task = (workerData as { task: ParseTask }).task;
  const port = parentPort;
  port.on('message', ({ seq, entry }: { seq: number; entry: SourceLine }) => {
    port.postMessage(inline(seq, entry, task));
  });
}
