import type { Rng } from '../../random.js';
import { AGENTIC_FAMILIES } from './agentic.js';

/**
 * One synthetic task: the problem text, its exact answer (computed here with BigInt, independent
 * of the code), and the program + stdin a tool-using solver would write. The families are chosen
 * so a tiny model cannot do them in its head but can with a short program, and each family words
 * its problems several ways: which operation to write, and in which order the numbers go into it,
 * must be read from the wording (some wordings name the numbers in the opposite order to the
 * program's), not only copied. That reading is where a format-perfect model still errs, and where
 * RL has room to improve it (docs/sft.md).
 */
export interface Task {
  family: string;
  prompt: string;
  answer: string;
  code: string;
  input: string;
  /** The short `<reason>` text before the tool call. */
  reason: string;
  /**
   * Multi-step tasks (src/sft/curriculum/agentic.ts): the calls in order, each decided by what the
   * one before printed; `code`/`input`/`reason` are then the last step's. Absent: one call.
   */
  steps?: ToolStep[];
  /** Files of the working directory every call finds (name -> UTF-8 text): the Problem's `files`. */
  files?: Record<string, string>;
  /** Extra Problem `meta` (e.g. the data file's `format`). */
  meta?: Record<string, string>;
}

/** One call of a multi-step task and the `<reason>` text before it. */
export interface ToolStep {
  reason: string;
  /** Stateless: a self-contained program (it reads the files again, names values as literals). */
  code: string;
  input: string;
  /** Session mode's cell, when it differs: it reuses the variables of the cells before it. */
  cell?: string;
  /** What the step must print (trimmed), checked when the step runs. */
  prints?: string;
  /** The step must fail, its error naming this text (a format the parser did not expect). */
  fails?: string;
}

export type Family = (rng: Rng) => Task;

const big = (n: number) => BigInt(n);
const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b));

/** A task whose program prints one expression. */
function printTask(family: string, prompt: string, answer: bigint, expr: string, reason: string): Task {
  return { family, prompt, answer: String(answer), code: `print(${expr})`, input: '', reason };
}

function arith(rng: Rng): Task {
  const task = (prompt: string, answer: bigint, expr: string, reason: string) =>
    printTask('arith', prompt, answer, expr, reason);
  const kind = rng.int(0, 5);
  if (kind <= 1) {
    const a = rng.digits(rng.int(3, 4));
    const b = rng.digits(rng.int(2, 3));
    const prompt = kind === 0 ? `What is ${a} * ${b}?` : `What is the product of ${a} and ${b}?`;
    return task(prompt, big(a) * big(b), `${a} * ${b}`, 'I will multiply with Python.');
  }
  if (kind === 2) {
    const a = rng.digits(rng.int(3, 5));
    const b = rng.digits(rng.int(3, 5));
    const c = rng.digits(rng.int(2, 4));
    return task(
      `What is ${a} + ${b} - ${c}?`,
      big(a) + big(b) - big(c),
      `${a} + ${b} - ${c}`,
      'I will add and subtract with Python.',
    );
  }
  if (kind === 3) {
    // The number named first is subtracted: the program takes them in the other order.
    const a = rng.digits(rng.int(4, 5));
    const b = rng.digits(rng.int(3, 4));
    return task(`Subtract ${b} from ${a}.`, big(a) - big(b), `${a} - ${b}`, 'I will subtract with Python.');
  }
  const a = rng.digits(rng.int(2, 3));
  const b = rng.digits(2);
  const c = rng.digits(rng.int(3, 4));
  const prompt =
    kind === 4 ? `What is ${c} more than the product of ${a} and ${b}?` : `Compute ${a} * ${b} + ${c}.`;
  return task(prompt, big(a) * big(b) + big(c), `${a} * ${b} + ${c}`, 'I will compute it with Python.');
}

function mod(rng: Rng): Task {
  const task = (prompt: string, answer: bigint, expr: string, reason: string) =>
    printTask('mod', prompt, answer, expr, reason);
  const kind = rng.int(0, 3);
  if (kind <= 1) {
    const a = rng.digits(rng.int(5, 7));
    const m = rng.int(7, 997);
    const prompt = kind === 0 ? `Find the remainder when ${a} is divided by ${m}.` : `What is ${a} mod ${m}?`;
    return task(prompt, big(a) % big(m), `${a} % ${m}`, 'I will compute the remainder with Python.');
  }
  const b = rng.int(2, 99);
  const e = rng.int(10, 999);
  const m = rng.int(7, 9999);
  let r = 1n;
  for (let i = 0; i < e; i++) r = (r * big(b)) % big(m);
  // The second wording names the modulus first.
  const prompt = kind === 2 ? `What is ${b}^${e} mod ${m}?` : `Modulo ${m}, what is ${b} to the power ${e}?`;
  return task(prompt, r, `pow(${b}, ${e}, ${m})`, 'I will use pow with a modulus in Python.');
}

function count(rng: Rng): Task {
  const n = rng.int(100, 9999);
  const a = rng.int(2, 19);
  let b = rng.int(2, 19);
  if (b === a) b = a + 1;
  const kind = rng.int(0, 3);
  const task = (prompt: string, condition: (i: number) => boolean, test: string): Task => {
    let answer = 0;
    for (let i = 1; i <= n; i++) if (condition(i)) answer += 1;
    return {
      family: 'count',
      prompt,
      answer: String(answer),
      code: `print(sum(1 for i in range(1, ${n} + 1) if ${test}))`,
      input: '',
      reason: 'I will count them with a loop in Python.',
    };
  };
  if (kind === 0) {
    // When b divides a the count is 0 whatever n is: a free answer a degenerate program also gets.
    while (a % b === 0) b = rng.int(2, 19);
    return task(
      `How many integers from 1 to ${n} are divisible by ${a} but not by ${b}?`,
      (i) => i % a === 0 && i % b !== 0,
      `i % ${a} == 0 and i % ${b} != 0`,
    );
  }
  if (kind === 1) {
    return task(
      `How many integers from 1 to ${n} are divisible by ${a} or ${b}?`,
      (i) => i % a === 0 || i % b === 0,
      `i % ${a} == 0 or i % ${b} == 0`,
    );
  }
  if (kind === 2) {
    // Both divide i exactly when lcm(a, b) does: keep lcm(a, b) <= n so the count is never 0.
    while ((a * b) / gcd(a, b) > n) b = rng.int(2, 19);
    // A redraw can land on a ("both 7 and 7"); no new draw, so the rest of the stream is unchanged.
    if (b === a) b = a === 2 ? 3 : 2;
    return task(
      `How many integers from 1 to ${n} are divisible by both ${a} and ${b}?`,
      (i) => i % a === 0 && i % b === 0,
      `i % ${a} == 0 and i % ${b} == 0`,
    );
  }
  return task(
    `How many integers from 1 to ${n} are not divisible by ${a}?`,
    (i) => i % a !== 0,
    `i % ${a} != 0`,
  );
}

interface StdinKind {
  question: string;
  code: string;
  answer: (xs: number[]) => bigint;
}

const STDIN_KINDS: StdinKind[] = [
  {
    question: 'the sum of',
    code: 'print(sum(map(int, input().split())))',
    answer: (xs) => xs.reduce((s, x) => s + big(x), 0n),
  },
  {
    question: 'the product of',
    code: 'import math\nprint(math.prod(map(int, input().split())))',
    answer: (xs) => xs.reduce((p, x) => p * big(x), 1n),
  },
  {
    question: 'the sum of the squares of',
    code: 'print(sum(x * x for x in map(int, input().split())))',
    answer: (xs) => xs.reduce((s, x) => s + big(x) * big(x), 0n),
  },
  {
    question: 'the largest of',
    code: 'print(max(map(int, input().split())))',
    answer: (xs) => big(Math.max(...xs)),
  },
  {
    question: 'the smallest of',
    code: 'print(min(map(int, input().split())))',
    answer: (xs) => big(Math.min(...xs)),
  },
  {
    question: 'the difference between the largest and the smallest of',
    code: 'xs = list(map(int, input().split()))\nprint(max(xs) - min(xs))',
    answer: (xs) => big(Math.max(...xs) - Math.min(...xs)),
  },
];

function stdin(rng: Rng): Task {
  const k = rng.int(3, 5);
  const xs = Array.from({ length: k }, () => rng.int(10, 999));
  const input = xs.join(' ');
  const kind = rng.pick(STDIN_KINDS);
  return {
    family: 'stdin',
    prompt: `What is ${kind.question} the numbers ${input}?`,
    answer: String(kind.answer(xs)),
    code: kind.code,
    input,
    reason: 'I will pass the numbers as input to Python.',
  };
}

const NAMES = ['Ann', 'Ben', 'Cal', 'Dee', 'Eve', 'Fay', 'Gus', 'Hal'];
const THINGS = ['apples', 'pens', 'books', 'coins', 'cards', 'marbles', 'stamps', 'tickets'];

/** Short word problems: the operation and the order of its numbers come from the story. */
function word(rng: Rng): Task {
  const who = rng.pick(NAMES);
  const what = rng.pick(THINGS);
  const kind = rng.int(0, 5);
  const task = (prompt: string, answer: bigint, expr: string) =>
    printTask('word', prompt, answer, expr, 'I will compute it with Python.');
  if (kind === 0) {
    const a = rng.digits(rng.int(3, 4));
    const b = rng.digits(rng.int(2, 3));
    return task(
      `${who} has ${a} ${what} and gets ${b} more. How many ${what} does ${who} have now?`,
      big(a) + big(b),
      `${a} + ${b}`,
    );
  }
  if (kind === 1) {
    const a = rng.digits(rng.int(3, 4));
    const b = rng.int(10, Math.min(a - 1, 999));
    return task(
      `${who} has ${a} ${what} and gives away ${b}. How many ${what} are left?`,
      big(a) - big(b),
      `${a} - ${b}`,
    );
  }
  if (kind === 2) {
    // The smaller number comes first and is the one subtracted.
    const a = rng.digits(rng.int(3, 4));
    const b = rng.int(10, Math.min(a - 1, 999));
    return task(
      `${who} has ${b} ${what} but needs ${a}. How many more ${what} does ${who} need?`,
      big(a) - big(b),
      `${a} - ${b}`,
    );
  }
  if (kind === 3) {
    const a = rng.digits(rng.int(2, 3));
    const b = rng.digits(2);
    return task(
      `A box holds ${a} ${what}. How many ${what} are in ${b} boxes?`,
      big(a) * big(b),
      `${a} * ${b}`,
    );
  }
  const a = rng.digits(rng.int(3, 4));
  const b = rng.int(3, 99);
  if (kind === 4) {
    return task(
      `${who} packs ${a} ${what} into boxes of ${b}. How many boxes are full?`,
      big(a) / big(b),
      `${a} // ${b}`,
    );
  }
  return task(
    `${who} packs ${a} ${what} into boxes of ${b}. How many ${what} are left over?`,
    big(a) % big(b),
    `${a} % ${b}`,
  );
}

export const FAMILIES: Record<string, Family> = { arith, mod, count, stdin, word };

/** The families a curriculum draws from, by name (a single family: itself), or undefined. */
export function familiesOf(name: string): Record<string, Family> | undefined {
  const pool: Record<string, Record<string, Family>> = {
    mix: FAMILIES,
    agentic: AGENTIC_FAMILIES,
    'mix-agentic': { ...FAMILIES, ...AGENTIC_FAMILIES },
  };
  const one = FAMILIES[name] ?? AGENTIC_FAMILIES[name];
  return pool[name] ?? (one === undefined ? undefined : { [name]: one });
}

/**
 * `mix` draws each task from a uniformly chosen one-call family, `agentic` from the multi-step
 * families (agentic.ts), `mix-agentic` from all of them. `weights` (family -> weight, an absent
 * family weighing 1) draws the families in those proportions instead.
 */
export function family(name: string, weights?: Readonly<Record<string, number>>): Family | undefined {
  const pool = familiesOf(name);
  if (pool === undefined) return undefined;
  const all = Object.entries(pool);
  if (all.length === 1) return all[0][1];
  if (weights === undefined) return (rng) => rng.pick(all)[1](rng);
  const cumulative: number[] = [];
  let total = 0;
  for (const [key] of all) {
    total += weights[key] ?? 1;
    cumulative.push(total);
  }
  return (rng) => {
    const x = rng.next() * total;
    // the first family whose cumulative weight passes x (a weight of 0 is never drawn)
    const at = cumulative.findIndex((c) => x < c);
    return all[at < 0 ? all.length - 1 : at][1](rng);
  };
}

/**
 * `--family-weights` (`inspect=2,search=2`): the weight of each named family of `curriculum`, the
 * others weighing 1. Unknown families, malformed or negative weights, and weights that leave
 * nothing to draw are refused, naming the entry.
 */
export function parseFamilyWeights(spec: string, curriculum: string): Record<string, number> {
  const pool = familiesOf(curriculum);
  if (pool === undefined) throw new Error(`unknown curriculum '${curriculum}'`);
  const known = Object.keys(pool);
  const weights: Record<string, number> = {};
  for (const entry of spec.split(',')) {
    const m = /^\s*([a-z-]+)\s*=\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*$/.exec(entry);
    if (m === null) throw new Error(`'${entry}': expected FAMILY=WEIGHT (a number >= 0), e.g. inspect=2`);
    const [, key, value] = m;
    if (!known.includes(key))
      throw new Error(`'${key}' is not a family of ${curriculum} (its families: ${known.join(', ')})`);
    if (key in weights) throw new Error(`'${key}' is named twice`);
    weights[key] = Number(value);
  }
  if (known.every((k) => (weights[k] ?? 1) === 0)) throw new Error('every family weighs 0: nothing to draw');
  return weights;
}

export const CURRICULA = [
  ...Object.keys(FAMILIES),
  'mix',
  ...Object.keys(AGENTIC_FAMILIES),
  'agentic',
  'mix-agentic',
];

/**
 * A first attempt that fails the way small slips do: a misspelt name (NameError) or an unclosed
 * parenthesis (SyntaxError). The demonstration then reads the traceback and fixes it.
 */
export function brokenCode(code: string, rng: Rng): string {
  const slips: ((c: string) => string)[] = [
    (c) => c.replace('print(', 'prnt('),
    (c) => c.replace('print(', 'pritn('),
    (c) => (c.endsWith(')') ? c.slice(0, -1) : c.replace('print(', 'print((')),
  ];
  return rng.pick(slips)(code);
}
