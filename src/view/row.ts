import { scoreText } from '../algo/penalty.js';

/**
 * The index's view of one trajectory: the fields the pages filter and sort on, and where its line
 * is. A main-job run holds ~25,000 trajectories of ~13 KB each, nearly all of it token ids, masks and
 * log-probs, so a row is read without parsing those arrays (see `summarize`).
 */
export interface Row {
  /** Position in the run's row list: the trajectory's handle in every route. */
  n: number;
  /** Index of its file in the run's file list. */
  file: number;
  offset: number;
  length: number;
  line: number;
  id: string;
  problem_id: string;
  sample: number;
  /** RL step, or null for an evaluation's trajectory. */
  step: number | null;
  /** The evaluation it belongs to (`eval-sft`, ...), or null for a training step's. */
  eval: string | null;
  reward: number;
  finish: string;
  turns: number;
  tool_calls: number;
  tool_errors: number;
  answer_tags: number;
  answer: string | null;
  /** Response tokens (model and tool), and those the model generated. */
  tokens: number;
  model_tokens: number;
  policy_version: string | null;
  turn_versions: string[] | null;
  /** RoC's penalties (tool-error ratio, format; total), from the text as roc-filter computes them. */
  penalty: { tool_error: number; format: number; total: number };
  /**
   * Tree rollouts: the trajectory it branched from and where (response token `offset`), its index
   * among its `of` siblings; null for a root sample. Its penalty is its own part's (after the
   * branch point, as roc-filter scores it), and its RoC group is its siblings, not its problem.
   */
  branch: RowBranch | null;
  /** RoC's decision for training trajectories: kept, dropped, or null (evaluation, or unknown). */
  roc: 'kept' | 'dropped' | null;
  /** The group's RoC outcome (`sampled`, `rejected-equal`, ...), null where there is none. */
  roc_outcome: string | null;
}

export interface RowBranch {
  parent: string;
  offset: number;
  index: number;
  of: number;
}

/** The long numeric arrays of a trajectory line; their keys cannot occur inside a JSON string unescaped. */
const ARRAYS = ['prompt_ids', 'response_ids', 'loss_mask', 'logprobs'].map((k) => Buffer.from(`"${k}":[`));

interface Cut {
  start: number;
  end: number;
  key: number;
}

/** Counts elements and `1`s of a compact or spaced JSON array of numbers, from its bytes. */
function countArray(bytes: Buffer, start: number, end: number): { count: number; ones: number } {
  let count = 0;
  let ones = 0;
  let any = false;
  for (let i = start; i < end; i++) {
    const c = bytes[i];
    if (c === 44) count += 1;
    else if (c !== 32) {
      any = true;
      // a lone `1` element (loss_mask): preceded by `[`, `,` or space and followed by `,`, `]` or space
      if (c === 49 && (i + 1 === end || bytes[i + 1] === 44 || bytes[i + 1] === 32)) ones += 1;
    }
  }
  return { count: any ? count + 1 : 0, ones };
}

export type RowFields = Omit<
  Row,
  'n' | 'file' | 'offset' | 'length' | 'line' | 'eval' | 'roc' | 'roc_outcome'
>;

/**
 * Reads a trajectory line's scalar fields: the numeric arrays are cut out by byte search (an array
 * of numbers holds no `]`) and only the rest is parsed, ~10x less than the whole line. Throws on a
 * line that is not a trajectory, with a message naming the field.
 */
export function summarize(bytes: Buffer): RowFields {
  const cuts: Cut[] = [];
  for (let key = 0; key < ARRAYS.length; key++) {
    const at = bytes.indexOf(ARRAYS[key]);
    if (at === -1) continue;
    const open = at + ARRAYS[key].length;
    const close = bytes.indexOf(93, open);
    if (close === -1) throw new Error(`${ARRAYS[key].toString().slice(1, -3)}: unterminated array`);
    cuts.push({ start: open, end: close, key });
  }
  cuts.sort((a, b) => a.start - b.start);
  const parts: Buffer[] = [];
  let at = 0;
  let tokens = 0;
  let modelTokens = -1;
  for (const cut of cuts) {
    parts.push(bytes.subarray(at, cut.start));
    if (cut.key === 2) {
      const counted = countArray(bytes, cut.start, cut.end);
      tokens = counted.count;
      modelTokens = counted.ones;
    }
    at = cut.end;
  }
  parts.push(bytes.subarray(at));
  const record = JSON.parse(Buffer.concat(parts).toString('utf8')) as Record<string, unknown>;
  if (record === null || typeof record !== 'object') throw new Error('not a JSON object');
  const str = (k: string): string => {
    const v = record[k];
    if (typeof v !== 'string') throw new Error(`${k}: expected a string`);
    return v;
  };
  const num = (k: string): number => {
    const v = record[k];
    if (typeof v !== 'number') throw new Error(`${k}: expected a number`);
    return v;
  };
  const step = record.step;
  const branch = branchOf(record.branch);
  const versions = record.turn_versions;
  const answer = record.answer;
  return {
    id: str('id'),
    problem_id: str('problem_id'),
    sample: num('sample'),
    step: typeof step === 'number' ? step : null,
    reward: num('reward'),
    finish: str('finish'),
    turns: num('turns'),
    tool_calls: num('tool_calls'),
    tool_errors: num('tool_errors'),
    answer_tags: num('answer_tags'),
    answer: typeof answer === 'string' ? answer : null,
    tokens,
    model_tokens: modelTokens < 0 ? tokens : modelTokens,
    policy_version: typeof record.policy_version === 'string' ? record.policy_version : null,
    turn_versions: Array.isArray(versions) ? versions.map(String) : null,
    // a branch is scored on what it did after its branch point (src/algo/parse-pool.ts): the failed
    // call it branched from is its parent's, and every sibling shares it
    penalty: scoreText(branch ? str('text').slice(branch.text_offset) : str('text')).penalty,
    branch: branch
      ? { parent: branch.parent, offset: branch.offset, index: branch.index, of: branch.of }
      : null,
  };
}

/** A record's `branch` (src/records/trajectory.ts `Branch`), checked field by field; undefined when absent. */
function branchOf(value: unknown): (RowBranch & { text_offset: number }) | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) throw new Error('branch: expected an object');
  const b = value as Record<string, unknown>;
  if (typeof b.parent !== 'string' || b.parent === '')
    throw new Error('branch.parent: expected a trajectory id');
  const count = (k: string, least: number): number => {
    const v = b[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < least)
      throw new Error(`branch.${k}: expected an integer >= ${least}`);
    return v;
  };
  const branch = {
    parent: b.parent,
    offset: count('offset', 0),
    text_offset: count('text_offset', 0),
    index: count('index', 0),
    of: count('of', 1),
  };
  if (branch.index >= branch.of) throw new Error(`branch.index: ${branch.index} of ${branch.of} siblings`);
  return branch;
}
