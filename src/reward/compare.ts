import { mulberry32 } from '../random.js';
import type { Answer, Rel } from './answer.js';
import type { Budget } from './budget.js';
import {
  exactValue,
  floatQ,
  literalQ,
  type Q,
  qDigits,
  qEqual,
  roundSignificant,
  roundTo,
  significantDigits,
} from './exact.js';
import { evaluate, expandPm, hasPm, type Node, symbols } from './expr.js';
import type { Rounding } from './rounding.js';

/**
 * Strict equivalence of two parsed answers. Values are compared exactly (see Policy: a decimal is
 * the fraction it states; a rounded value counts only where the problem asks for rounding); expressions with variables by evaluating
 * both at seeded random points; intervals, inequalities and unions by membership at the endpoints,
 * just beside them and at random points. Nothing here trades correctness for recall: two answers
 * with different values, different brackets or different variables are different.
 */

/** mulberry32: a tiny seeded PRNG so verdicts are reproducible. */
const rng = mulberry32;

const SAMPLES = 14;

function close(a: number, b: number, rel = 1e-9): boolean {
  if (a === b) return true;
  if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
  const d = Math.abs(a - b);
  return d <= rel * Math.max(Math.abs(a), Math.abs(b)) || d <= 1e-12;
}

/** Fractional digits of a plain decimal literal (`-0.33` → 2), or -1 when the node is not one. */
function decimals(node: Node): number {
  const n = node.t === 'neg' ? node.a : node;
  if (n.t !== 'num') return -1;
  const m = /\.(\d+)$/.exec(n.text);
  return m ? m[1].length : -1;
}

function isLiteral(node: Node): boolean {
  const n = node.t === 'neg' ? node.a : node;
  return n.t === 'num';
}

const MIN_PLACES = 4;

/**
 * Exact value of an integer expression (`2^{64}`, `10! - 1`), or null. Floats lose integers above
 * 2^53, where `2^{60}` and `2^{60} + 1` would compare equal.
 */
function bigValue(node: Node, budget: Budget): bigint | null {
  budget.check();
  switch (node.t) {
    case 'num':
      return /^\d+$/.test(node.text) ? BigInt(node.text) : null;
    case 'neg': {
      const a = bigValue(node.a, budget);
      return a === null ? null : -a;
    }
    case 'bin': {
      const a = bigValue(node.a, budget);
      const b = bigValue(node.b, budget);
      if (a === null || b === null) return null;
      if (node.op === '+') return a + b;
      if (node.op === '-') return a - b;
      if (node.op === '*') return a * b;
      if (node.op === '^' && b >= 0n && b <= 4096n && (a < 0n ? -a : a) < 2n ** 64n) return a ** b;
      return null;
    }
    case 'fn': {
      if (node.name !== 'fact') return null;
      const n = bigValue(node.args[0], budget);
      if (n === null || n < 0n || n > 2000n) return null;
      let r = 1n;
      for (let i = 2n; i <= n; i++) r *= i;
      return r;
    }
    default:
      return null;
  }
}

const SAFE = 2 ** 53;

function mentionsInfinity(node: Node): boolean {
  switch (node.t) {
    case 'sym':
      return node.name === '∞';
    case 'bin':
      return mentionsInfinity(node.a) || mentionsInfinity(node.b);
    case 'neg':
      return mentionsInfinity(node.a);
    case 'fn':
      return node.args.some(mentionsInfinity);
    default:
      return false;
  }
}

function constantEqual(a: Node, b: Node, va: number, vb: number, budget: Budget): boolean {
  if (Number.isNaN(va) || Number.isNaN(vb)) return false;
  if (Math.abs(va) >= SAFE || Math.abs(vb) >= SAFE) {
    const x = bigValue(a, budget);
    const y = bigValue(b, budget);
    if (x !== null && y !== null) return x === y;
    // An overflow to Infinity is not the symbol ∞: `10^{400}` is not `10^{401}`.
    if (!Number.isFinite(va) || !Number.isFinite(vb))
      return va === vb && mentionsInfinity(a) && mentionsInfinity(b);
  }
  if (va === vb) return true;
  const la = isLiteral(a);
  const lb = isLiteral(b);
  if (la && lb) {
    return close(va, vb, 1e-12);
  }
  // A correctly rounded decimal against an exact value (2.6667 for 8/3, 0.0833333 for 1/12) with at
  // least four places: `3.14` is not `\pi`, `0.33` is not `1/3`.
  const da = decimals(a);
  const db = decimals(b);
  const d = la && da >= MIN_PLACES ? da : lb && db >= MIN_PLACES ? db : -1;
  if (d >= MIN_PLACES) return Math.abs(va - vb) <= 0.5 * 10 ** -d * (1 + 1e-9) + 1e-12 * Math.abs(vb);
  return close(va, vb, 1e-9);
}

function points(vars: string[], seed: number, n: number): Map<string, number>[] {
  const r = rng(seed);
  const out: Map<string, number>[] = [];
  for (let i = 0; i < n; i++) {
    const env = new Map<string, number>();
    for (const v of vars) {
      const mag = 0.3 + 2.7 * r();
      env.set(v, i % 3 === 2 ? -mag : mag);
    }
    out.push(env);
  }
  return out;
}

// ---- strict mode: exact values, literals that claim no more than they state, rounding ----

/**
 * How values compare. `exact` (strict mode): rational values are compared as fractions, so a
 * decimal equals an exact value only when it is that value (`0.25` = 1/4, `4.6667` ≠ 14/3), and a
 * float comparison is trusted only where no literal could be a long approximation. `rounding`: the
 * precisions the problem asks for (a prediction that is the reference correctly rounded counts).
 * Without `exact` (the `--compat rstar` base) a decimal with 4+ places stands for what it rounds.
 */
export interface Policy {
  exact: boolean;
  rounding: Rounding | null;
}

export const LEGACY: Policy = { exact: false, rounding: null };

/** Most significant digits of a literal that a float comparison takes at its word. */
const MAX_TRUSTED_DIGITS = 8;

function literalTexts(node: Node, out: string[] = []): string[] {
  switch (node.t) {
    case 'num':
      out.push(node.text);
      break;
    case 'bin':
      literalTexts(node.a, out);
      literalTexts(node.b, out);
      break;
    case 'neg':
      literalTexts(node.a, out);
      break;
    case 'pm':
      if (node.a) literalTexts(node.a, out);
      literalTexts(node.b, out);
      break;
    case 'fn':
      for (const a of node.args) literalTexts(a, out);
      break;
  }
  return out;
}

const isDecimalText = (t: string): boolean => /[.eE]/.test(t);

/** A literal's exact value as a key: `2.50` and `2.5` are the same literal. */
function literalKey(t: string): string {
  const v = literalQ(t);
  return v ? `${v.n}/${v.d}` : t;
}

/**
 * Whether a float comparison of `a` and `b` can be trusted: every long literal (more than 8
 * significant digits, `4.666666666666667`, `10816653826391969`) also appears on the other side.
 * Otherwise the literal is an approximation that floats cannot tell from the exact value.
 */
function floatTrusted(a: Node, b: Node): { ok: boolean; decimals: boolean } {
  const la = literalTexts(a);
  const lb = literalTexts(b);
  const keysA = new Set(la.map(literalKey));
  const keysB = new Set(lb.map(literalKey));
  const long = (t: string) => significantDigits(t) > MAX_TRUSTED_DIGITS;
  const ok =
    la.every((t) => !long(t) || keysB.has(literalKey(t))) &&
    lb.every((t) => !long(t) || keysA.has(literalKey(t)));
  return { ok, decimals: la.some(isDecimalText) || lb.some(isDecimalText) };
}

function closeAbs(a: number, b: number, rel: number, abs: number): boolean {
  if (a === b) return true;
  if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
  const d = Math.abs(a - b);
  return d <= rel * Math.max(Math.abs(a), Math.abs(b)) || d <= abs;
}

function bareLiteral(node: Node): string | null {
  if (node.t === 'num') return node.text;
  if (node.t === 'neg' && node.a.t === 'num') return `-${node.a.text}`;
  return null;
}

/** The correctly rounded values of the reference that the problem's rounding allows. */
function roundedMatch(pred: string, p: Q, ref: Q | null, vb: number, r: Rounding): boolean {
  let target = ref;
  if (target === null) {
    // An irrational reference: its float, unless a step boundary is too close to tell.
    target = floatQ(vb);
    if (target === null) return false;
  }
  const exactTarget = ref !== null;
  const ambiguous = (step: number): boolean => {
    if (exactTarget) return false;
    const x = Math.abs(vb / step);
    const frac = x - Math.floor(x);
    const boundary = r.mode === 'nearest' ? Math.abs(frac - 0.5) : Math.min(frac, 1 - frac);
    return boundary <= 1e-9 * Math.max(1, x);
  };
  const matches = (step: Q): boolean => {
    if (ambiguous(Number(step.n) / Number(step.d))) return false;
    const rounded = roundTo(target, step, r.mode);
    return rounded !== null && qEqual(rounded, p);
  };
  if (r.steps.some(matches)) return true;
  for (const n of r.significant) {
    const rounded = roundSignificant(target, n, r.mode);
    if (rounded !== null && qEqual(rounded, p) && (exactTarget || !ambiguousSignificant(vb, n))) return true;
  }
  if (r.free && !/[eE]/.test(pred) && significantDigits(pred.replace('-', '')) >= 3) {
    const places = /\.(\d+)$/.exec(pred)?.[1].length ?? 0;
    return matches({ n: 1n, d: 10n ** BigInt(places) });
  }
  return false;
}

function ambiguousSignificant(v: number, n: number): boolean {
  const a = Math.abs(v);
  if (a === 0) return false;
  const step = 10 ** (Math.floor(Math.log10(a)) - n + 1);
  const frac = a / step - Math.floor(a / step);
  return Math.abs(frac - 0.5) <= 1e-9 * (a / step) || Math.min(frac, 1 - frac) <= 1e-12;
}

/** Strict comparison of two constants (see Policy). `a` is the prediction. */
function exactConstantEqual(
  a: Node,
  b: Node,
  va: number,
  vb: number,
  budget: Budget,
  r: Rounding | null,
): boolean {
  const qa = exactValue(a, null, budget);
  const qb = exactValue(b, null, budget);
  if (qa !== null && qb !== null && qEqual(qa, qb)) return true;
  const literal = r ? bareLiteral(a) : null;
  if (r && literal !== null && qa !== null && roundedMatch(literal, qa, qb, vb, r)) return true;
  if (qa !== null && qb !== null) return false;
  // One side has no rational value that follows from its literals (π, √13, sin, log): floats.
  if (Number.isNaN(va) || Number.isNaN(vb)) return false;
  if (!Number.isFinite(va) || !Number.isFinite(vb))
    return va === vb && mentionsInfinity(a) && mentionsInfinity(b);
  const trust = floatTrusted(a, b);
  if (!trust.ok) return false;
  const rational = qa ?? qb;
  // A rational against an irrational-looking value (`1/2` and `\sin(\pi/6)`) only when it is short
  // and agrees to the last bits: `10816653826391969/10^15` is not 3√13.
  if (rational !== null && qDigits(rational) > 2 * MAX_TRUSTED_DIGITS) return false;
  const tight = rational !== null || trust.decimals;
  return closeAbs(va, vb, tight ? 1e-12 : 1e-9, tight ? 1e-15 : 1e-12);
}

/** Rational sample points (for exact evaluation) near the float ones. */
function exactPoints(envs: Map<string, number>[]): Map<string, Q>[] {
  return envs.map((env) => {
    const out = new Map<string, Q>();
    for (const [k, v] of env) out.set(k, { n: BigInt(Math.round(v * 97)), d: 97n });
    return out;
  });
}

/** Both sides evaluated exactly at rational points, or null when either has no rational value. */
function exactSamples(a: Node, b: Node, envs: Map<string, number>[], budget: Budget): [Q, Q][] | null {
  const out: [Q, Q][] = [];
  for (const env of exactPoints(envs)) {
    budget.check();
    const x = exactValue(a, env, budget);
    const y = x === null ? null : exactValue(b, env, budget);
    if (x === null || y === null) return null;
    out.push([x, y]);
  }
  return out;
}

export function exprEqual(a: Node, b: Node, budget: Budget, policy: Policy): boolean {
  const vars = [...symbols(b, symbols(a))].sort();
  if (vars.length === 0) {
    const va = evaluate(a, new Map(), budget);
    const vb = evaluate(b, new Map(), budget);
    if (policy.exact) return exactConstantEqual(a, b, va, vb, budget, policy.rounding);
    return constantEqual(a, b, va, vb, budget);
  }
  const envs = points(vars, 7, SAMPLES);
  let rel = 1e-8;
  if (policy.exact) {
    const exact = exactSamples(a, b, envs, budget);
    if (exact !== null) return exact.every(([x, y]) => qEqual(x, y));
    const trust = floatTrusted(a, b);
    if (!trust.ok) return false;
    if (trust.decimals) rel = 1e-11;
  }
  let agree = 0;
  for (const env of envs) {
    budget.check();
    const x = evaluate(a, env, budget);
    const y = evaluate(b, env, budget);
    if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
    if (!close(x, y, rel)) return false;
    agree += 1;
  }
  return agree >= 3;
}

/** `d1 = c · d2` for a non-zero constant c: `2x + 4y - 3 = 0` is the line `y = -x/2 + 3/4`. */
function proportional(d1: Node, d2: Node, budget: Budget, policy: Policy): boolean {
  const vars = [...symbols(d2, symbols(d1))].sort();
  if (vars.length === 0) return false;
  const envs = points(vars, 11, SAMPLES);
  let rel = 1e-8;
  if (policy.exact) {
    const exact = exactSamples(d1, d2, envs, budget);
    if (exact !== null) {
      const live = exact.filter(([x, y]) => x.n !== 0n || y.n !== 0n);
      if (live.some(([x, y]) => x.n === 0n || y.n === 0n) || live.length < 3) return false;
      // x1/y1 = xi/yi for every point.
      const [x1, y1] = live[0];
      return live.every(([x, y]) => x1.n * y1.d * y.n * x.d === x.n * y.d * y1.n * x1.d);
    }
    const trust = floatTrusted(d1, d2);
    if (!trust.ok) return false;
    if (trust.decimals) rel = 1e-11;
  }
  let ratio: number | null = null;
  let agree = 0;
  for (const env of envs) {
    budget.check();
    const x = evaluate(d1, env, budget);
    const y = evaluate(d2, env, budget);
    if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
    if (Math.abs(y) < 1e-12 || Math.abs(x) < 1e-12) {
      if (Math.abs(y) < 1e-12 && Math.abs(x) < 1e-12) continue;
      return false;
    }
    const r = x / y;
    if (ratio === null) ratio = r;
    else if (!close(r, ratio, rel)) return false;
    agree += 1;
  }
  return agree >= 3;
}

const sub = (a: Node, b: Node): Node => ({ t: 'bin', op: '-', a, b });

/** `1 ± √5` becomes the set {1 + √5, 1 - √5}. */
function expand(x: Answer): Answer {
  if (x.k === 'expr' && hasPm(x.node)) {
    return { k: 'set', items: expandPm(x.node).map((node) => ({ k: 'expr', node, text: x.text })) };
  }
  return x;
}

const squash = (s: string): string => s.toLowerCase().replace(/\s+|\\(?=[a-z])/g, '');

const isEquation = (x: Answer): x is Extract<Answer, { k: 'rel' }> =>
  x.k === 'rel' && x.ops.every((o) => o === '=');

export function answersEqual(pred: Answer, ref: Answer, budget: Budget, policy: Policy): boolean {
  budget.check();
  const a = expand(pred);
  const b = expand(ref);
  if (a.k === 'text' || b.k === 'text') {
    const ta = a.k === 'text' || a.k === 'expr' ? a.text : null;
    const tb = b.k === 'text' || b.k === 'expr' ? b.text : null;
    return ta !== null && tb !== null && squash(ta) === squash(tb);
  }
  if (isEquation(a) && isEquation(b)) return equationsEqual(a, b, budget, policy);
  // `x = 3` against `3`: the value the equation gives a name; `2x + 1 = 0` is not the value 0.
  if (isEquation(a)) return namesValue(a) && answersEqual(a.terms[a.terms.length - 1], b, budget, policy);
  if (isEquation(b)) return namesValue(b) && answersEqual(a, b.terms[b.terms.length - 1], budget, policy);
  if (a.k === 'expr' && b.k === 'expr') return exprEqual(a.node, b.node, budget, policy);
  if (a.k === 'set' || b.k === 'set') return setsEqual(a, b, budget, policy);
  if (a.k === 'tuple' && b.k === 'tuple') {
    return (
      a.open === b.open &&
      a.close === b.close &&
      a.items.length === b.items.length &&
      a.items.every((x, i) => answersEqual(x, b.items[i], budget, policy))
    );
  }
  if (a.k === 'matrix' || b.k === 'matrix') return matricesEqual(a, b, budget, policy);
  if (isRegion(a) && isRegion(b)) return regionsEqual(a, b, budget, policy);
  return false;
}

/** A name for a value: `x`, `y_1`, `f(x)`, `|AB|`, `\\frac{NO}{BO}`, `(p, q)`; no numbers, no sums. */
function isLabel(x: Answer): boolean {
  if (x.k === 'tuple') return x.items.every(isLabel);
  if (x.k !== 'expr') return false;
  const walk = (n: Node): boolean =>
    n.t === 'sym' ||
    (n.t === 'bin' && (n.op === '*' || n.op === '/') && walk(n.a) && walk(n.b)) ||
    (n.t === 'fn' && n.name === 'abs' && walk(n.args[0]));
  return walk(x.node) && symbols(x.node).size > 0;
}

/** `x = 3`, `x = 5 + 6 = 11`, `1 = \\zzz = x = 0`: the side next to the value, or the first, is a name. */
function namesValue(eq: Extract<Answer, { k: 'rel' }>): boolean {
  return isLabel(eq.terms[0]) || isLabel(eq.terms[eq.terms.length - 2]);
}

function setsEqual(a: Answer, b: Answer, budget: Budget, policy: Policy): boolean {
  const xs = a.k === 'set' ? a.items : [a];
  const ys = b.k === 'set' ? b.items : [b];
  if (xs.length === 1 && ys.length === 1) return answersEqual(xs[0], ys[0], budget, policy);
  // Order-free with duplicates ignored: every element has an equal on the other side.
  return (
    xs.every((x) => ys.some((y) => answersEqual(x, y, budget, policy))) &&
    ys.every((y) => xs.some((x) => answersEqual(x, y, budget, policy)))
  );
}

function cells(x: Answer): Answer[][] | null {
  if (x.k === 'matrix') return x.rows;
  if (x.k === 'tuple' && x.open === '(' && x.close === ')') return x.items.map((i) => [i]);
  return null;
}

function matricesEqual(a: Answer, b: Answer, budget: Budget, policy: Policy): boolean {
  const x = cells(a);
  const y = cells(b);
  if (!x || !y) return false;
  // A column vector may be written as a tuple, and a 1×n row matrix as one too.
  const flat = (m: Answer[][]) => (m.length === 1 ? m[0].map((c) => [c]) : m);
  const p = flat(x);
  const q = flat(y);
  if (p.length !== q.length) return false;
  return p.every(
    (row, i) => row.length === q[i].length && row.every((c, j) => answersEqual(c, q[i][j], budget, policy)),
  );
}

function equationsEqual(
  a: Extract<Answer, { k: 'rel' }>,
  b: Extract<Answer, { k: 'rel' }>,
  budget: Budget,
  policy: Policy,
): boolean {
  const [l1, r1] = [a.terms[0], a.terms[a.terms.length - 1]];
  const [l2, r2] = [b.terms[0], b.terms[b.terms.length - 1]];
  if (answersEqual(l1, l2, budget, policy) && answersEqual(r1, r2, budget, policy)) return true;
  if (l1.k === 'expr' && r1.k === 'expr' && l2.k === 'expr' && r2.k === 'expr') {
    return proportional(sub(l1.node, r1.node), sub(l2.node, r2.node), budget, policy);
  }
  return false;
}

// ---- intervals, inequalities and unions, compared as subsets of the real line ----

type Region = (env: Map<string, number>, t: number) => boolean | null;

function isRegion(x: Answer): boolean {
  if (x.k === 'tuple') return x.items.length === 2 && x.items.every((i) => i.k === 'expr');
  if (x.k === 'union') return x.parts.every(isRegion);
  if (x.k === 'rel')
    return x.ops.every((o) => o !== '=') && x.terms.every((t) => t.k === 'expr' || isRegion(t));
  return false;
}

function holds(op: Rel, x: number, y: number): boolean {
  switch (op) {
    case '<':
      return x < y;
    case '>':
      return x > y;
    case '≤':
      return x <= y;
    case '≥':
      return x >= y;
    case '≠':
      return x !== y;
    default:
      return x === y;
  }
}

interface Shape {
  test: Region;
  /** The one variable the region is about, when it names one (`x` in `x ≤ 5`). */
  variable: string | null;
  /** Constants worth probing: endpoints and bounds. */
  marks: number[];
  /** The expressions of those constants. */
  nodes: Node[];
}

function constant(x: Answer, budget: Budget): number | null {
  if (x.k !== 'expr' || symbols(x.node).size > 0) return null;
  const v = evaluate(x.node, new Map(), budget);
  return Number.isNaN(v) ? null : v;
}

function shape(x: Answer, budget: Budget): Shape | null {
  if (x.k === 'tuple') {
    const lo = constant(x.items[0], budget);
    const hi = constant(x.items[1], budget);
    if (lo === null || hi === null) return null;
    const lc = x.open === '[';
    const hc = x.close === ']';
    return {
      test: (_env, t) => (lc ? t >= lo : t > lo) && (hc ? t <= hi : t < hi),
      variable: null,
      marks: [lo, hi],
      nodes: x.items.flatMap((i) => (i.k === 'expr' ? [i.node] : [])),
    };
  }
  if (x.k === 'union') {
    const parts = x.parts.map((p) => shape(p, budget));
    if (parts.some((p) => p === null)) return null;
    const ps = parts as Shape[];
    return {
      test: (env, t) => ps.some((p) => p.test(env, t) === true),
      variable: null,
      marks: ps.flatMap((p) => p.marks),
      nodes: ps.flatMap((p) => p.nodes),
    };
  }
  if (x.k !== 'rel') return null;
  // A chain of comparisons; `∈` tests membership of the left term in the region on its right.
  const vars = new Set<string>();
  const marks: number[] = [];
  const nodes: Node[] = [];
  const nonConstant: Node[] = [];
  for (const term of x.terms) {
    if (term.k === 'expr') {
      symbols(term.node, vars);
      const c = constant(term, budget);
      if (c === null) nonConstant.push(term.node);
      else {
        marks.push(c);
        nodes.push(term.node);
      }
    }
  }
  let variable: string | null = null;
  let substitute: Node | null = null;
  if (vars.size === 1) variable = [...vars][0];
  else if (nonConstant.length === 1) substitute = nonConstant[0];
  else return null;
  const subShapes = x.terms.map((t) => (t.k === 'expr' ? null : shape(t, budget)));
  if (subShapes.some((s, i) => s === null && x.terms[i].k !== 'expr')) return null;
  for (const s of subShapes) {
    if (s) {
      marks.push(...s.marks);
      nodes.push(...s.nodes);
    }
  }
  const test: Region = (env, t) => {
    const local = new Map(env);
    if (variable) local.set(variable, t);
    const value = (i: number): number => {
      const term = x.terms[i];
      if (term.k !== 'expr') return Number.NaN;
      if (substitute && term.node === substitute) return t;
      return evaluate(term.node, local, budget);
    };
    for (let i = 0; i < x.ops.length; i++) {
      const op = x.ops[i];
      if (op === '∈') {
        const region = subShapes[i + 1];
        if (!region) return null;
        const v = value(i);
        if (Number.isNaN(v)) return null;
        if (!region.test(local, v)) return false;
        continue;
      }
      const l = value(i);
      const r = value(i + 1);
      if (Number.isNaN(l) || Number.isNaN(r)) return null;
      if (!holds(op, l, r)) return false;
    }
    return true;
  };
  return { test, variable, marks, nodes };
}

/**
 * Endpoints that floats cannot tell apart must be equal exactly: `x > 4.666666666666667` is not
 * `x > \frac{14}{3}`, though no probe falls between them.
 */
function endpointsExact(xs: Node[], ys: Node[], budget: Budget): boolean {
  const value = (n: Node) => evaluate(n, new Map(), budget);
  return xs.every((x) => {
    const vx = value(x);
    return ys.every((y) => {
      const vy = value(y);
      return !close(vx, vy, 1e-9) || exactConstantEqual(x, y, vx, vy, budget, null);
    });
  });
}

function regionsEqual(a: Answer, b: Answer, budget: Budget, policy: Policy): boolean {
  const p = shape(a, budget);
  const q = shape(b, budget);
  if (!p || !q) return false;
  // Two inequalities about different variables (`y < 3`, `x < 3`) are different answers.
  if (p.variable && q.variable && p.variable !== q.variable) return false;
  const marks = [...p.marks, ...q.marks].filter(Number.isFinite);
  const probes = new Set<number>([0, 1e6, -1e6]);
  for (const m of marks) {
    const d = 1e-7 * Math.max(1, Math.abs(m));
    probes.add(m);
    probes.add(m - d);
    probes.add(m + d);
  }
  const lo = marks.length > 0 ? Math.min(...marks) - 5 : -10;
  const hi = marks.length > 0 ? Math.max(...marks) + 5 : 10;
  const r = rng(3);
  for (let i = 0; i < 40; i++) probes.add(lo + (hi - lo) * r());
  const env = new Map<string, number>();
  let decided = 0;
  for (const t of probes) {
    budget.check();
    const x = p.test(env, t);
    const y = q.test(env, t);
    if (x === null || y === null) continue;
    if (x !== y) return false;
    decided += 1;
  }
  return decided >= 3 && (!policy.exact || endpointsExact(p.nodes, q.nodes, budget));
}
