import { DataError } from '../../errors.js';
import type { Rng } from '../../random.js';
import type { SubmissionResult } from '../../records/sandbox.js';
import { scriptedTrajectory } from '../../rollout/agent.js';
import type { ConversationRenderer } from '../conversation.js';
import { mapLimit } from '../map-limit.js';
import type { SftRecord } from '../record.js';
import type { CodeCall, ToolRunner } from '../tool-runner.js';
import type { Family, Task, ToolStep } from './families.js';

/**
 * The agentic families (issue 32): problems whose next call depends on what the last one printed.
 *
 * - `inspect`: the numbers live in a file of the working directory, in one of five formats the
 *   prompt does not name (comma-separated, one per line, a header line, `key=value` lines, a
 *   two-column table with a header). The first call prints the file's head; the second is the
 *   parser that fits. The keys and the table's names contain digits, so a blind "every integer in
 *   the text" program fails on two formats, and a blind `split()` on three.
 * - `search`: a first program finds n (the smallest n with a property the wording states), which
 *   the quantity asked for needs and the wording does not give; the second computes it with the n
 *   the first printed (stateless: as a literal; a session's cell reuses the variable `n`).
 * - `recover`: the first parser is the obvious one (whitespace-separated integers) and fails on a
 *   format it did not expect (a header, commas, `key=value`, `N/A` entries); the traceback names
 *   the token it could not read, and the second call is the parser that handles it.
 *
 * Every task is two calls and the answer (three turns, the recipes' `--max-turns 3`). Answers are
 * computed here from the generated data (BigInt), never from a program's output; every step is
 * run for real by the demonstrations, which throw when a step does not print what it must.
 */

const big = (n: number) => BigInt(n);

/**
 * A file name of the working directory: the prompt names it, so prompts vary with it. One stem and
 * a number: the tiny model copies digits (one token each) but not a stem picked from a list, which
 * it swapped for another in most failed calls of the first SFT model (`FileNotFoundError`,
 * docs/experiments/2026-12-04-agentic-main-job.md); the lesson is the format, not the name.
 */
function fileName(rng: Rng): string {
  return `data${rng.int(1, 9999)}.txt`;
}

/** How a file's numbers are written. */
export type DataFormat = 'comma' | 'lines' | 'header' | 'keyvalue' | 'table' | 'missing';

const HEADERS = ['value', 'amount', 'count', 'score'];
const KEYS = ['item', 'id', 'row', 'k'];
const NAMES = ['a', 'b', 'c', 'x', 'p', 'q'];

/** The file's text for `xs` in `format` (the test reads the format back from the text). */
export function renderData(xs: number[], format: DataFormat, rng: Rng): string {
  if (format === 'comma') return `${xs.join(',')}\n`;
  if (format === 'lines') return xs.map((x) => `${x}\n`).join('');
  if (format === 'header') return `${rng.pick(HEADERS)}\n${xs.map((x) => `${x}\n`).join('')}`;
  if (format === 'keyvalue') {
    const key = rng.pick(KEYS);
    return xs.map((x, i) => `${key}${i + 1}=${x}\n`).join('');
  }
  if (format === 'table') {
    const name = rng.pick(NAMES);
    return `name,${rng.pick(HEADERS)}\n${xs.map((x, i) => `${name}${i + 1},${x}\n`).join('')}`;
  }
  // missing: some entries were not recorded
  throw new Error('renderData: missing is rendered by renderMissing');
}

/** `missing`: one number per line, `N/A` where a value was not recorded (at least one). */
function renderMissing(xs: number[], rng: Rng): string {
  const gaps = new Set<number>([rng.int(0, xs.length)]);
  if (rng.next() < 0.5) gaps.add(rng.int(0, xs.length));
  const out: string[] = [];
  for (let i = 0; i <= xs.length; i++) {
    if (gaps.has(i)) out.push('N/A\n');
    if (i < xs.length) out.push(`${xs[i]}\n`);
  }
  return out.join('');
}

/** The statement that reads `xs` out of `text` (a variable holding the file's contents). */
const PARSERS: Record<DataFormat, { say: string; parse: string }> = {
  comma: { say: 'The numbers are separated by commas.', parse: "[int(x) for x in text.split(',')]" },
  lines: { say: 'There is one number per line.', parse: '[int(x) for x in text.split()]' },
  header: {
    say: 'The first line is a header. I will skip it.',
    parse: '[int(x) for x in text.split()[1:]]',
  },
  keyvalue: {
    say: 'Each line is key=value. I will take the part after =.',
    parse: "[int(line.split('=')[1]) for line in text.split()]",
  },
  table: {
    say: 'It is a table with a header. I will take the second column.',
    parse: "[int(line.split(',')[1]) for line in text.split()[1:]]",
  },
  missing: {
    say: 'Some entries are N/A. I will skip them.',
    parse: "[int(x) for x in text.split() if x != 'N/A']",
  },
};

interface Aggregate {
  /** Wordings: `{f}` is the file's name. */
  questions: string[];
  code: string;
  answer: (xs: number[]) => bigint;
}

const AGGREGATES: Aggregate[] = [
  {
    questions: ['What is the sum of the numbers in {f}?', 'Add up the numbers stored in {f}.'],
    code: 'sum(xs)',
    answer: (xs) => xs.reduce((s, x) => s + big(x), 0n),
  },
  {
    questions: [
      'What is the largest number in {f}?',
      'The file {f} holds some numbers. Which is the largest?',
    ],
    code: 'max(xs)',
    answer: (xs) => big(Math.max(...xs)),
  },
  {
    questions: ['What is the smallest number in {f}?', 'Which number in {f} is the smallest?'],
    code: 'min(xs)',
    answer: (xs) => big(Math.min(...xs)),
  },
  {
    questions: [
      'What is the difference between the largest and the smallest number in {f}?',
      'How far apart are the largest and the smallest number in {f}?',
    ],
    code: 'max(xs) - min(xs)',
    answer: (xs) => big(Math.max(...xs) - Math.min(...xs)),
  },
  {
    questions: ['What is the sum of the squares of the numbers in {f}?'],
    code: 'sum(x * x for x in xs)',
    answer: (xs) => xs.reduce((s, x) => s + big(x) * big(x), 0n),
  },
];

const read = (file: string) => `text = open('${file}').read()`;
const LOOK = 'I will look at the file first.';

function numbers(rng: Rng): number[] {
  return Array.from({ length: rng.int(5, 12) }, () => rng.int(10, 999));
}

function inspect(rng: Rng): Task {
  const file = fileName(rng);
  const xs = numbers(rng);
  const format = rng.pick<DataFormat>(['comma', 'lines', 'header', 'keyvalue', 'table']);
  const text = renderData(xs, format, rng);
  const agg = rng.pick(AGGREGATES);
  const prompt = rng.pick(agg.questions).replace('{f}', file);
  const { say, parse } = PARSERS[format];
  const compute = `xs = ${parse}\nprint(${agg.code})`;
  const steps: ToolStep[] = [
    { reason: LOOK, code: `${read(file)}\nprint(text[:300])`, input: '', prints: text.slice(0, 300).trim() },
    { reason: say, code: `${read(file)}\n${compute}`, cell: compute, input: '' },
  ];
  return agenticTask('inspect', prompt, agg.answer(xs), { [file]: text }, steps, { format });
}

interface Search {
  /** The property, worded after "the smallest positive integer n". */
  property: (x: number) => string;
  /** The search program, printing n. */
  code: (x: number) => string;
  bound: (rng: Rng) => number;
  /** The smallest n with the property, computed here. */
  solve: (x: number) => number;
}

const SEARCHES: Search[] = [
  {
    property: (x) => `whose square is greater than ${x}`,
    code: (x) => `n = 1\nwhile n * n <= ${x}:\n    n += 1\nprint(n)`,
    bound: (rng) => rng.int(1000, 9_999_999),
    solve: (x) => {
      let n = Math.floor(Math.sqrt(x));
      while (n * n <= x) n += 1;
      while (n > 1 && (n - 1) * (n - 1) > x) n -= 1;
      return n;
    },
  },
  {
    property: (x) => `for which 1 + 2 + ... + n is greater than ${x}`,
    code: (x) => `n = 1\nwhile n * (n + 1) // 2 <= ${x}:\n    n += 1\nprint(n)`,
    bound: (rng) => rng.int(1000, 9_999_999),
    solve: (x) => {
      let n = 1;
      let s = 1;
      while (s <= x) {
        n += 1;
        s += n;
      }
      return n;
    },
  },
  {
    property: (x) => `for which 2 to the power n is greater than ${x}`,
    code: (x) => `n = 1\nwhile 2 ** n <= ${x}:\n    n += 1\nprint(n)`,
    bound: (rng) => rng.int(1000, 2_000_000_000),
    solve: (x) => {
      let n = 1;
      while (2n ** big(n) <= big(x)) n += 1;
      return n;
    },
  },
  {
    property: (x) => `greater than ${x} that is prime`,
    code: (x) =>
      `n = ${x} + 1\nwhile any(n % d == 0 for d in range(2, int(n ** 0.5) + 1)):\n    n += 1\nprint(n)`,
    bound: (rng) => rng.int(100, 999_999),
    solve: (x) => {
      const prime = (n: number) => {
        for (let d = 2; d * d <= n; d++) if (n % d === 0) return false;
        return n >= 2;
      };
      let n = x + 1;
      while (!prime(n)) n += 1;
      return n;
    },
  },
];

interface Use {
  question: (c: number, m: number) => string;
  /** Python for the quantity, `n` the value the search found (a literal or the session's variable). */
  code: (n: string, c: number, m: number) => string;
  answer: (n: number, c: number, m: number) => bigint;
}

const USES: Use[] = [
  {
    question: (c) => `What is n * (n + ${c})?`,
    code: (n, c) => `${n} * (${n} + ${c})`,
    answer: (n, c) => big(n) * big(n + c),
  },
  {
    question: (c, m) => `What is ${c} to the power n, modulo ${m}?`,
    code: (n, c, m) => `pow(${c}, ${n}, ${m})`,
    answer: (n, c, m) => {
      // square and multiply: n reaches a million (the prime search)
      let r = 1n;
      let b = big(c) % big(m);
      for (let e = n; e > 0; e = Math.floor(e / 2)) {
        if (e % 2 === 1) r = (r * b) % big(m);
        b = (b * b) % big(m);
      }
      return r;
    },
  },
  {
    question: () => 'What is the sum of the digits of 2 to the power n?',
    code: (n) => `sum(int(d) for d in str(2 ** ${n}))`,
    answer: (n) => [...String(2n ** big(n))].reduce((s, d) => s + BigInt(d), 0n),
  },
];

function search(rng: Rng): Task {
  const s = rng.pick(SEARCHES);
  const x = s.bound(rng);
  const n = s.solve(x);
  // 2 ** n stays under Python's 4300-digit str() limit (the prime search's n reaches a million)
  let use = rng.pick(USES);
  if (use === USES[2] && n > 5000) use = USES[0];
  // The wording must not happen to name n (a constant equal to it).
  let c = rng.int(3, 97);
  let m = rng.int(101, 9999);
  if (c === n) c += 1;
  if (m === n) m += 1;
  const prompt = `Let n be the smallest positive integer ${s.property(x)}. ${use.question(c, m)}`;
  const steps: ToolStep[] = [
    { reason: 'I will search for n first.', code: s.code(x), input: '', prints: String(n) },
    {
      reason: `n is ${n}. Now I will compute the quantity.`,
      code: `print(${use.code(String(n), c, m)})`,
      cell: `print(${use.code('n', c, m)})`,
      input: '',
    },
  ];
  return agenticTask('search', prompt, use.answer(n, c, m), {}, steps);
}

/** What the first parser's traceback shows for each format it does not expect. */
const BAD_TOKEN: Record<string, (text: string) => string> = {
  header: (text) => text.split('\n')[0],
  comma: (text) => text.trim(),
  keyvalue: (text) => text.split('\n')[0],
  missing: () => 'N/A',
};

function recover(rng: Rng): Task {
  const file = fileName(rng);
  const xs = numbers(rng);
  const format = rng.pick<DataFormat>(['header', 'comma', 'keyvalue', 'missing']);
  const text = format === 'missing' ? renderMissing(xs, rng) : renderData(xs, format, rng);
  const agg = rng.pick(AGGREGATES.slice(0, 3));
  const prompt = rng.pick(agg.questions).replace('{f}', file);
  const naive = `xs = [int(x) for x in text.split()]\nprint(${agg.code})`;
  const token = BAD_TOKEN[format](text);
  const { say, parse } = PARSERS[format];
  const fixed = `xs = ${parse}\nprint(${agg.code})`;
  const steps: ToolStep[] = [
    {
      reason: 'I will read the numbers from the file.',
      code: `${read(file)}\n${naive}`,
      input: '',
      fails: token,
    },
    {
      reason: `The error shows '${token}', which is not a number. ${say}`,
      code: `${read(file)}\n${fixed}`,
      cell: fixed,
      input: '',
    },
  ];
  return agenticTask('recover', prompt, agg.answer(xs), { [file]: text }, steps, { format });
}

/** A multi-step task; `code`/`input`/`reason` are the last step's, so single-call readers keep working. */
function agenticTask(
  family: string,
  prompt: string,
  answer: bigint,
  files: Record<string, string>,
  steps: ToolStep[],
  meta: Record<string, string> = {},
): Task {
  const last = steps[steps.length - 1];
  return {
    family,
    prompt,
    answer: String(answer),
    code: last.code,
    input: last.input,
    reason: last.reason,
    steps,
    ...(Object.keys(files).length > 0 ? { files } : {}),
    ...(Object.keys(meta).length > 0 ? { meta } : {}),
  };
}

export const AGENTIC_FAMILIES: Record<string, Family> = { inspect, search, recover };

/** The calls of a task in `mode`: stateless calls are self-contained, a session's cells reuse variables. */
export function stepCalls(task: Task, mode: 'stateless' | 'session'): CodeCall[] {
  const steps = task.steps ?? [{ reason: task.reason, code: task.code, input: task.input }];
  return steps.map((s) => ({ code: mode === 'session' ? (s.cell ?? s.code) : s.code, input: s.input }));
}

/** Runs a task's steps in `mode` and checks each result against what the step must do. */
export async function runSteps(
  task: Task,
  runner: ToolRunner,
  mode: 'stateless' | 'session',
): Promise<SubmissionResult[]> {
  const calls = stepCalls(task, mode);
  const results =
    mode === 'session'
      ? await runner.runCells(calls, task.files)
      : await runner.run(calls.map((c) => ({ ...c, files: task.files })));
  const steps = task.steps ?? [];
  results.forEach((r, i) => {
    const step = steps[i];
    const out = (r.stdout ?? '').trim();
    const last = i === results.length - 1;
    // A call stopped at its limit is no curriculum bug: the machine was too busy (the limit is wall time).
    const bug = (what: string) =>
      new DataError(
        r.reason === 'worker_timeout'
          ? `${JSON.stringify(task.prompt)}: step ${i + 1} (${mode}) ran past its time limit: is the machine overloaded?`
          : `curriculum bug: ${JSON.stringify(task.prompt)}: step ${i + 1} (${mode}) ${what}`,
      );
    if (step?.fails !== undefined) {
      if (r.run_success || !(r.stderr ?? '').includes(step.fails))
        throw bug(`should fail naming ${JSON.stringify(step.fails)}; got ${JSON.stringify(r.stderr ?? out)}`);
      return;
    }
    if (!r.run_success) throw bug(`failed: ${JSON.stringify(r.stderr)}`);
    const want = last ? task.answer : step?.prints;
    if (want !== undefined && out !== want)
      throw bug(`printed ${JSON.stringify(out)}, expected ${JSON.stringify(want)}`);
  });
  return results;
}

/** As index.ts shows a call's time: 0 for one that ran to its end. */
const steady = (r: SubmissionResult): SubmissionResult => ({
  ...r,
  cost: r.reason === 'worker_timeout' ? Math.floor(r.cost) : 0,
});

/**
 * Demonstrations of multi-step tasks: one assistant turn per step (its reason, `</reason>`, the
 * call), the real tool responses, then the boxed answer. Every turn is trained on, the failing
 * first call of `recover` too: it is the obvious parser, not a slip, and the lesson is the fix the
 * traceback asks for. In `session` mode the calls run as one session's cells (the second reuses
 * the first's variables); stateless, each call reads the files again.
 */
export async function agenticDemonstrations(
  tasks: Task[],
  runner: ToolRunner,
  renderer: ConversationRenderer,
  options: {
    name: string;
    mode?: 'stateless' | 'session';
    record: (task: Task) => { id: string; source: string };
  },
): Promise<SftRecord[]> {
  const mode = options.mode ?? 'stateless';
  const demonstrate = async (task: Task): Promise<SftRecord> => {
    const results = (await runSteps(task, runner, mode)).map(steady);
    const steps = task.steps ?? [];
    const calls = stepCalls(task, mode);
    const assistant = steps.map((s, i) =>
      renderer.assistantText(`${s.reason}</reason>`, [
        { name: 'python_code_with_standard_io', arguments: { code: calls[i].code, input: calls[i].input } },
      ]),
    );
    assistant.push(`The tool printed the answer.</reason>\n<answer>\\boxed{${task.answer}}</answer>`);
    const trajectory = await scriptedTrajectory(
      task.prompt,
      { assistant, toolResults: results },
      renderer.ctx,
    );
    if (trajectory.finish !== 'stop' || trajectory.turns !== assistant.length) {
      throw new DataError(
        `curriculum bug: ${JSON.stringify(task.prompt)}: replay ended with ${trajectory.finish}`,
      );
    }
    const { id, source } = options.record(task);
    return {
      v: 1,
      id: `${id}/sft`,
      problem_id: id,
      prompt_ids: trajectory.prompt_ids,
      response_ids: trajectory.response_ids,
      loss_mask: trajectory.loss_mask,
      text: trajectory.text,
      answer: task.answer,
      source,
    };
  };
  // Several tasks in flight keep every process of a pooled runner (or a sandbox's executors) busy.
  return mapLimit(tasks, DEMO_CONCURRENCY, demonstrate);
}

/** Tasks in flight while building demonstrations. */
export const DEMO_CONCURRENCY = 16;
