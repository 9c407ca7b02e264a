import type { Rng } from '../rng.js';

/**
 * One synthetic task: the problem text, its exact answer (computed here with BigInt, independent
 * of the code), and the program + stdin a tool-using solver would write. The families are chosen
 * so a tiny model cannot do them in its head but can by copying numbers into a short program.
 */
export interface Task {
  family: string;
  prompt: string;
  answer: string;
  code: string;
  input: string;
  /** The short `<reason>` text before the tool call. */
  reason: string;
}

export type Family = (rng: Rng) => Task;

const big = (n: number) => BigInt(n);

function arith(rng: Rng): Task {
  const kind = rng.int(0, 2);
  if (kind === 0) {
    const a = rng.digits(rng.int(3, 5));
    const b = rng.digits(rng.int(2, 4));
    return {
      family: 'arith',
      prompt: `What is ${a} * ${b}?`,
      answer: String(big(a) * big(b)),
      code: `print(${a} * ${b})`,
      input: '',
      reason: 'I will multiply with Python.',
    };
  }
  if (kind === 1) {
    const a = rng.digits(rng.int(4, 6));
    const b = rng.digits(rng.int(4, 6));
    const c = rng.digits(rng.int(3, 5));
    return {
      family: 'arith',
      prompt: `What is ${a} + ${b} - ${c}?`,
      answer: String(big(a) + big(b) - big(c)),
      code: `print(${a} + ${b} - ${c})`,
      input: '',
      reason: 'I will add and subtract with Python.',
    };
  }
  const a = rng.digits(rng.int(2, 3));
  const b = rng.digits(2);
  const c = rng.digits(rng.int(3, 4));
  return {
    family: 'arith',
    prompt: `Compute ${a} * ${b} + ${c}.`,
    answer: String(big(a) * big(b) + big(c)),
    code: `print(${a} * ${b} + ${c})`,
    input: '',
    reason: 'I will compute it with Python.',
  };
}

function mod(rng: Rng): Task {
  if (rng.next() < 0.5) {
    const a = rng.digits(rng.int(6, 9));
    const m = rng.int(7, 997);
    return {
      family: 'mod',
      prompt: `Find the remainder when ${a} is divided by ${m}.`,
      answer: String(big(a) % big(m)),
      code: `print(${a} % ${m})`,
      input: '',
      reason: 'I will compute the remainder with Python.',
    };
  }
  const b = rng.int(2, 99);
  const e = rng.int(10, 999);
  const m = rng.int(7, 9999);
  let r = 1n;
  for (let i = 0; i < e; i++) r = (r * big(b)) % big(m);
  return {
    family: 'mod',
    prompt: `What is ${b}^${e} mod ${m}?`,
    answer: String(r),
    code: `print(pow(${b}, ${e}, ${m}))`,
    input: '',
    reason: 'I will use pow with a modulus in Python.',
  };
}

function count(rng: Rng): Task {
  const n = rng.int(100, 9999);
  const a = rng.int(2, 19);
  let b = rng.int(2, 19);
  if (b === a) b = a + 1;
  let answer = 0;
  if (rng.next() < 0.5) {
    // When b divides a the count is 0 whatever n is: a free answer a degenerate program also gets.
    while (a % b === 0) b = rng.int(2, 19);
    for (let i = 1; i <= n; i++) if (i % a === 0 && i % b !== 0) answer += 1;
    return {
      family: 'count',
      prompt: `How many integers from 1 to ${n} are divisible by ${a} but not by ${b}?`,
      answer: String(answer),
      code: `print(sum(1 for i in range(1, ${n} + 1) if i % ${a} == 0 and i % ${b} != 0))`,
      input: '',
      reason: 'I will count them with a loop in Python.',
    };
  }
  for (let i = 1; i <= n; i++) if (i % a === 0 || i % b === 0) answer += 1;
  return {
    family: 'count',
    prompt: `How many integers from 1 to ${n} are divisible by ${a} or ${b}?`,
    answer: String(answer),
    code: `print(sum(1 for i in range(1, ${n} + 1) if i % ${a} == 0 or i % ${b} == 0))`,
    input: '',
    reason: 'I will count them with a loop in Python.',
  };
}

function stdin(rng: Rng): Task {
  const k = rng.int(4, 7);
  const xs = Array.from({ length: k }, () => rng.int(10, 999));
  const input = xs.join(' ');
  const kind = rng.int(0, 2);
  if (kind === 0) {
    return {
      family: 'stdin',
      prompt: `What is the sum of the numbers ${input}?`,
      answer: String(xs.reduce((s, x) => s + x, 0)),
      code: 'print(sum(map(int, input().split())))',
      input,
      reason: 'I will pass the numbers as input to Python.',
    };
  }
  if (kind === 1) {
    return {
      family: 'stdin',
      prompt: `What is the product of the numbers ${input}?`,
      answer: String(xs.reduce((p, x) => p * big(x), 1n)),
      code: 'import math\nprint(math.prod(map(int, input().split())))',
      input,
      reason: 'I will pass the numbers as input to Python.',
    };
  }
  return {
    family: 'stdin',
    prompt: `What is the sum of the squares of the numbers ${input}?`,
    answer: String(xs.reduce((s, x) => s + x * x, 0)),
    code: 'print(sum(x * x for x in map(int, input().split())))',
    input,
    reason: 'I will pass the numbers as input to Python.',
  };
}

export const FAMILIES: Record<string, Family> = { arith, mod, count, stdin };

/** `mix` draws each task from a uniformly chosen family. */
export function family(name: string): Family | undefined {
  if (name === 'mix') {
    const all = Object.values(FAMILIES);
    return (rng) => rng.pick(all)(rng);
  }
  return FAMILIES[name];
}

export const CURRICULA = [...Object.keys(FAMILIES), 'mix'];

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
