import type { Budget } from './budget.js';
import type { Node } from './expr.js';

/**
 * Exact rational arithmetic for the strict verifier: the value of an expression as a fraction of
 * big integers when it has one that follows from its literals (`1/4`, `2.50`, `1e-3`, `\sqrt{2.25}`,
 * `2^{60}`, `\binom{10}{3}`, `8^{2/3}`), or null when it does not (π, `\sqrt{2}`, trig, logs) or
 * would be too large. A decimal such as `4.6667` is the fraction 46667/10000, never 14/3.
 */
export interface Q {
  n: bigint;
  /** Always positive. */
  d: bigint;
}

/** Bits beyond which a value is not tracked exactly (the comparison falls back to floats). */
const MAX_BITS = 20_000;

const abs = (x: bigint): bigint => (x < 0n ? -x : x);

function gcd(a: bigint, b: bigint): bigint {
  let x = abs(a);
  let y = abs(b);
  while (y !== 0n) [x, y] = [y, x % y];
  return x;
}

function bits(x: bigint): number {
  return abs(x).toString(16).length * 4;
}

export function q(n: bigint, d = 1n): Q | null {
  if (d === 0n) return null;
  const g = gcd(n, d);
  const s = d < 0n ? -1n : 1n;
  const out = g > 1n ? { n: (s * n) / g, d: (s * d) / g } : { n: s * n, d: s * d };
  return bits(out.n) > MAX_BITS || bits(out.d) > MAX_BITS ? null : out;
}

export const qEqual = (a: Q, b: Q): boolean => a.n * b.d === b.n * a.d;

/** The exact value of a numeric literal: `2.50` → 5/2, `1.5e3` → 1500, `.5` → 1/2. */
export function literalQ(text: string): Q | null {
  const m = /^(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (!m || (m[1] === '' && (m[2] ?? '') === '')) return null;
  const frac = m[2] ?? '';
  const exp = Number(m[3] ?? '0') - frac.length;
  if (Math.abs(exp) > 400) return null;
  const digits = BigInt(`${m[1]}${frac}` || '0');
  return exp >= 0 ? q(digits * 10n ** BigInt(exp)) : q(digits, 10n ** BigInt(-exp));
}

/** Significant digits of a literal's text (`0.00120` → 2, `4.6667` → 5, `1000` → 1). */
export function significantDigits(text: string): number {
  const mantissa = text.replace(/[eE].*$/, '').replace('.', '');
  return mantissa.replace(/^0+/, '').replace(/0+$/, '').length;
}

/** Decimal digits of a fraction's numerator (trailing zeros dropped) and denominator together. */
export function qDigits(x: Q): number {
  const n = abs(x.n).toString().replace(/0+$/, '');
  return n.length + (x.d === 1n ? 0 : x.d.toString().length);
}

/** The exact n-th root of a non-negative integer, or null. */
function intRoot(x: bigint, n: number): bigint | null {
  if (x < 2n) return x;
  const big = BigInt(n);
  // Newton's iteration from above decreases to the integer root.
  const f = Number(x);
  let r = Number.isFinite(f)
    ? BigInt(Math.ceil(f ** (1 / n) * (1 + 1e-12))) + 1n
    : 1n << BigInt(Math.ceil(bits(x) / n) + 1);
  for (let i = 0; i < 10_000; i++) {
    const next = ((big - 1n) * r + x / r ** (big - 1n)) / big;
    if (next >= r) break;
    r = next;
  }
  return r ** big === x ? r : null;
}

/** The exact n-th root of a fraction (negative only for odd n), or null. */
function qRoot(x: Q, n: number): Q | null {
  if (!Number.isInteger(n) || n < 1 || n > 64) return null;
  const neg = x.n < 0n;
  if (neg && n % 2 === 0) return null;
  const a = intRoot(abs(x.n), n);
  const b = intRoot(x.d, n);
  if (a === null || b === null) return null;
  return q(neg ? -a : a, b);
}

function qPow(a: Q, e: Q): Q | null {
  if (e.d === 1n) {
    if (abs(e.n) > 4096n) return null;
    if ((bits(a.n) + bits(a.d)) * Number(abs(e.n)) > MAX_BITS * 2) return null;
    if (e.n >= 0n) return q(a.n ** e.n, a.d ** e.n);
    return a.n === 0n ? null : q(a.d ** -e.n, a.n ** -e.n);
  }
  // A rational exponent: `8^{2/3}` is exact when the root is.
  if (e.d > 64n) return null;
  const root = qRoot(a, Number(e.d));
  return root === null ? null : qPow(root, { n: e.n, d: 1n });
}

function floorQ(x: Q): bigint {
  const f = x.n / x.d;
  return x.n < 0n && f * x.d !== x.n ? f - 1n : f;
}

/**
 * The exact value of `node` with the variables of `env`, or null. Throws nothing of its own; polls
 * the budget like the float evaluator.
 */
export function exactValue(node: Node, env: Map<string, Q> | null, budget: Budget): Q | null {
  budget.check();
  switch (node.t) {
    case 'num':
      return literalQ(node.text);
    case 'sym':
      return env?.get(node.name) ?? null;
    case 'neg': {
      const a = exactValue(node.a, env, budget);
      return a && { n: -a.n, d: a.d };
    }
    case 'pm':
      return null;
    case 'bin': {
      const a = exactValue(node.a, env, budget);
      if (a === null) return null;
      const b = exactValue(node.b, env, budget);
      if (b === null) return null;
      switch (node.op) {
        case '+':
          return q(a.n * b.d + b.n * a.d, a.d * b.d);
        case '-':
          return q(a.n * b.d - b.n * a.d, a.d * b.d);
        case '*':
          return q(a.n * b.n, a.d * b.d);
        case '/':
          return q(a.n * b.d, a.d * b.n);
        default:
          return qPow(a, b);
      }
    }
    case 'fn':
      return exactFunction(node, env, budget);
  }
}

function exactFunction(
  node: Extract<Node, { t: 'fn' }>,
  env: Map<string, Q> | null,
  budget: Budget,
): Q | null {
  const args: Q[] = [];
  for (const arg of node.args) {
    const v = exactValue(arg, env, budget);
    if (v === null) return null;
    args.push(v);
  }
  const [x, y] = args;
  switch (node.name) {
    case 'sqrt':
      return qRoot(x, 2);
    case 'root':
      return y.d === 1n && y.n > 0n && y.n <= 64n ? qRoot(x, Number(y.n)) : null;
    case 'abs':
      return { n: abs(x.n), d: x.d };
    case 'floor':
      return { n: floorQ(x), d: 1n };
    case 'ceil':
      return { n: -floorQ({ n: -x.n, d: x.d }), d: 1n };
    case 'fact': {
      if (x.d !== 1n || x.n < 0n || x.n > 1000n) return null;
      let r = 1n;
      for (let i = 2n; i <= x.n; i++) r *= i;
      return { n: r, d: 1n };
    }
    case 'binom': {
      if (x.d !== 1n || y.d !== 1n || y.n < 0n || x.n < 0n || y.n > x.n || x.n > 5000n) return null;
      let r = 1n;
      for (let i = 1n; i <= y.n; i++) r = (r * (x.n - y.n + i)) / i;
      return { n: r, d: 1n };
    }
    default:
      return null;
  }
}

export type RoundMode = 'nearest' | 'up' | 'down';

/** `x` rounded to a multiple of `step` (half away from zero for `nearest`). */
export function roundTo(x: Q, step: Q, mode: RoundMode): Q | null {
  const t = q(x.n * step.d, x.d * step.n);
  if (t === null) return null;
  let k: bigint;
  if (mode === 'down') k = floorQ(t);
  else if (mode === 'up') k = -floorQ({ n: -t.n, d: t.d });
  else {
    const twice = floorQ({ n: 2n * abs(t.n) + t.d, d: 2n * t.d });
    k = t.n < 0n ? -twice : twice;
  }
  return q(k * step.n, step.d);
}

/** `x` rounded to `n` significant digits. */
export function roundSignificant(x: Q, n: number, mode: RoundMode): Q | null {
  if (x.n === 0n) return x;
  // The decimal exponent of |x|: 10^e ≤ |x| < 10^(e+1).
  const a = abs(x.n);
  let e = a.toString().length - x.d.toString().length;
  const ge = (k: number): boolean => (k >= 0 ? a >= x.d * 10n ** BigInt(k) : a * 10n ** BigInt(-k) >= x.d);
  if (!ge(e)) e -= 1;
  const p = e - n + 1;
  const step = p >= 0 ? { n: 10n ** BigInt(p), d: 1n } : { n: 1n, d: 10n ** BigInt(-p) };
  return roundTo(x, step, mode);
}

/** A float as the fraction its 17 significant digits state (for rounding irrational values). */
export function floatQ(v: number): Q | null {
  if (!Number.isFinite(v)) return null;
  const [mantissa, exp] = Math.abs(v).toExponential(16).split('e');
  const m = literalQ(`${mantissa}e${exp}`);
  return m && (v < 0 ? { n: -m.n, d: m.d } : m);
}
