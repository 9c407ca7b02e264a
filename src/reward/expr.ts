import type { Budget } from './budget.js';

/**
 * A small parser and evaluator for the expressions that appear in final answers, written in LaTeX
 * (`\frac{1}{2}`, `\sqrt[3]{x}`, `\sin^2 x`) or plain text (`1/2`, `sqrt(2)`, `x^2+1`). It does no
 * symbolic algebra: equivalence is decided by evaluating both sides at sampled points.
 */
export type Node =
  | { t: 'num'; v: number; text: string }
  | { t: 'sym'; name: string }
  | { t: 'bin'; op: '+' | '-' | '*' | '/' | '^'; a: Node; b: Node }
  | { t: 'neg'; a: Node }
  | { t: 'pm'; a: Node | null; b: Node }
  | { t: 'fn'; name: string; args: Node[] };

export class ParseError extends Error {
  override name = 'ParseError';
}

type Tok =
  | { k: 'num'; text: string }
  | { k: 'sym'; name: string }
  | { k: 'fn'; name: string }
  | { k: 'cmd'; name: string }
  | { k: 'op'; v: string };

/** Function names read as LaTeX commands (`\sin x`) and as plain text (`sin(x)`, `sin x`). */
const FUNCTION_NAMES = [
  'sin',
  'cos',
  'tan',
  'sec',
  'csc',
  'cot',
  'arcsin',
  'arccos',
  'arctan',
  'sinh',
  'cosh',
  'tanh',
  'ln',
  'log',
  'exp',
];
/** `\floor` and `\ceil` are functions; plain `floor` stays a run of symbols. */
const FUNCTIONS = new Set([...FUNCTION_NAMES, 'floor', 'ceil']);
const GREEK = new Set([
  'alpha',
  'beta',
  'gamma',
  'delta',
  'epsilon',
  'varepsilon',
  'zeta',
  'eta',
  'theta',
  'vartheta',
  'iota',
  'kappa',
  'lambda',
  'mu',
  'nu',
  'xi',
  'rho',
  'sigma',
  'tau',
  'upsilon',
  'phi',
  'varphi',
  'chi',
  'psi',
  'omega',
  'Gamma',
  'Delta',
  'Theta',
  'Lambda',
  'Xi',
  'Pi',
  'Sigma',
  'Phi',
  'Psi',
  'Omega',
]);
/** Commands that take arguments and are parsed specially. */
const STRUCTURAL = new Set(['frac', 'sqrt', 'binom', 'text', 'operatorname']);
/** Commands that vanish (spacing, sizing, fonts whose argument is parsed as is). */
const IGNORED = new Set([
  'left',
  'right',
  'big',
  'Big',
  'bigl',
  'bigr',
  'Bigl',
  'Bigr',
  'displaystyle',
  'mathrm',
  'mathbf',
  'mathit',
  'boldsymbol',
  'textbf',
  'textit',
  'textrm',
  'mbox',
  'rm',
  'quad',
  'qquad',
  'limits',
  'overline',
]);
/** Words read without a backslash; at most one matches at a position (see tokenize), so order is free. */
const PLAIN_NAMES = [...FUNCTION_NAMES, 'sqrt', 'pi', 'inf'];

/** Operators written another way: a ratio `7:32` is the quotient; U+2212 is a minus. */
const OP_ALIASES: Record<string, string | undefined> = { ':': '/', '−': '-' };

export function tokenize(s: string, budget: Budget): Tok[] {
  const out: Tok[] = [];
  let i = 0;
  while (i < s.length) {
    budget.check();
    const c = s[i];
    if (c === ' ' || c === '\t' || c === '\n') {
      i += 1;
      continue;
    }
    if ((c >= '0' && c <= '9') || (c === '.' && s[i + 1] >= '0' && s[i + 1] <= '9')) {
      const m = /^(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![a-zA-Z]))?/.exec(s.slice(i, i + 400));
      if (!m) throw new ParseError('bad number');
      out.push({ k: 'num', text: m[0] });
      i += m[0].length;
      continue;
    }
    if (c === '\\') {
      const m = /^\\([a-zA-Z]+|.)/.exec(s.slice(i, i + 40));
      if (!m) throw new ParseError('lone backslash');
      i += m[0].length;
      const name = m[1];
      if (IGNORED.has(name)) continue;
      if (name === '{' || name === '}') out.push({ k: 'op', v: name === '{' ? '(' : ')' });
      else if (name === ',' || name === ';' || name === ':' || name === '!' || name === ' ') continue;
      else if (name === 'dfrac' || name === 'tfrac' || name === 'cfrac') out.push({ k: 'cmd', name: 'frac' });
      else if (STRUCTURAL.has(name)) out.push({ k: 'cmd', name });
      else if (FUNCTIONS.has(name)) out.push({ k: 'fn', name });
      else if (name === 'pi') out.push({ k: 'sym', name: 'π' });
      else if (name === 'infty') out.push({ k: 'sym', name: '∞' });
      else if (name === 'cdot' || name === 'times' || name === 'ast') out.push({ k: 'op', v: '*' });
      else if (name === 'div') out.push({ k: 'op', v: '/' });
      else if (name === 'pm' || name === 'mp') out.push({ k: 'op', v: '±' });
      else if (name === '%') out.push({ k: 'op', v: '%' });
      else if (name === 'lvert' || name === 'rvert' || name === 'vert' || name === '|')
        out.push({ k: 'op', v: '|' });
      else if (GREEK.has(name)) out.push({ k: 'sym', name });
      else throw new ParseError(`unknown command \\${name}`);
      continue;
    }
    if (/[a-zA-Z]/.test(c)) {
      // Plain-text function names and constants; any other run of letters is a product of symbols.
      const rest = s.slice(i, i + 8);
      const name = PLAIN_NAMES.find((n) => rest.startsWith(n) && !/[a-zA-Z]/.test(s[i + n.length] ?? ''));
      const prefix = PLAIN_NAMES.find((n) => rest.startsWith(n) && (s[i + n.length] === '(' || n === 'sqrt'));
      const hit = name ?? prefix;
      if (hit !== undefined) {
        if (hit === 'pi') out.push({ k: 'sym', name: 'π' });
        else if (hit === 'inf') out.push({ k: 'sym', name: '∞' });
        else if (hit === 'sqrt') out.push({ k: 'cmd', name: 'sqrt' });
        else out.push({ k: 'fn', name: hit });
        i += hit.length;
        continue;
      }
      out.push({ k: 'sym', name: c });
      i += 1;
      continue;
    }
    const op = "+-*/^_!()[]{}|%±'".includes(c) ? c : OP_ALIASES[c];
    if (op !== undefined) {
      out.push({ k: 'op', v: op });
      i += 1;
      continue;
    }
    throw new ParseError(`unexpected '${c}'`);
  }
  return out;
}

const MAX_DEPTH = 120;

class Parser {
  #toks: Tok[];
  #pos = 0;
  #depth = 0;
  #budget: Budget;

  constructor(toks: Tok[], budget: Budget) {
    this.#toks = toks;
    this.#budget = budget;
  }

  peek(): Tok | undefined {
    return this.#toks[this.#pos];
  }

  isOp(v: string): boolean {
    const t = this.peek();
    return t !== undefined && t.k === 'op' && t.v === v;
  }

  next(): Tok {
    const t = this.#toks[this.#pos];
    if (t === undefined) throw new ParseError('unexpected end');
    this.#pos += 1;
    return t;
  }

  expectOp(v: string): void {
    const t = this.next();
    if (t.k !== 'op' || t.v !== v) throw new ParseError(`expected '${v}'`);
  }

  done(): boolean {
    return this.#pos >= this.#toks.length;
  }

  enter(): void {
    this.#budget.check();
    this.#depth += 1;
    if (this.#depth > MAX_DEPTH) throw new ParseError('nested too deeply');
  }

  leave(): void {
    this.#depth -= 1;
  }

  expr(): Node {
    this.enter();
    let left: Node | null = null;
    if (this.isOp('±')) {
      this.next();
      left = { t: 'pm', a: null, b: this.term() };
    } else {
      left = this.term();
    }
    for (;;) {
      if (this.isOp('+') || this.isOp('-')) {
        const op = (this.next() as { v: '+' | '-' }).v;
        left = { t: 'bin', op, a: left, b: this.term() };
      } else if (this.isOp('±')) {
        this.next();
        left = { t: 'pm', a: left, b: this.term() };
      } else break;
    }
    this.leave();
    return left;
  }

  term(): Node {
    let left = this.unary();
    for (;;) {
      if (this.isOp('*') || this.isOp('/')) {
        const op = (this.next() as { v: '*' | '/' }).v;
        left = { t: 'bin', op, a: left, b: this.unary() };
      } else if (this.startsPrimary(left)) {
        left = { t: 'bin', op: '*', a: left, b: this.power() };
      } else break;
    }
    return left;
  }

  /** Implicit multiplication: `2x`, `3\sqrt{2}`, `x(x+1)`, `2\pi`; never two bare numbers (`1 000`). */
  startsPrimary(left: Node): boolean {
    const t = this.peek();
    if (t === undefined) return false;
    if (t.k === 'num') return left.t !== 'num';
    if (t.k === 'sym' || t.k === 'fn') return true;
    if (t.k === 'cmd') return t.name !== 'text';
    return t.k === 'op' && (t.v === '(' || t.v === '{');
  }

  unary(): Node {
    this.enter();
    let node: Node;
    if (this.isOp('-')) {
      this.next();
      node = { t: 'neg', a: this.unary() };
    } else if (this.isOp('+')) {
      this.next();
      node = this.unary();
    } else {
      node = this.power();
    }
    this.leave();
    return node;
  }

  power(): Node {
    const base = this.postfix(this.primary());
    if (!this.isOp('^')) return base;
    this.next();
    return this.postfix({ t: 'bin', op: '^', a: base, b: this.exponent() });
  }

  /** `x^2`, `x^{2n}`, `x^-1`; an unbraced multi-digit exponent is one digit, as in TeX (`x^23` = x²·3). */
  exponent(): Node {
    if (this.isOp('-')) {
      this.next();
      return { t: 'neg', a: this.exponent() };
    }
    const t = this.peek();
    if (t?.k === 'num' && t.text.length > 1 && /^\d+$/.test(t.text)) {
      this.#toks[this.#pos] = { k: 'num', text: t.text.slice(1) };
      return num(t.text[0]);
    }
    return this.power();
  }

  postfix(node: Node): Node {
    let n = node;
    for (;;) {
      if (this.isOp('!')) {
        this.next();
        n = { t: 'fn', name: 'fact', args: [n] };
      } else if (this.isOp('%')) {
        this.next();
        n = { t: 'bin', op: '/', a: n, b: num('100') };
      } else if (this.isOp("'")) {
        this.next();
        if (n.t !== 'sym') throw new ParseError('prime on a non-symbol');
        n = { t: 'sym', name: `${n.name}'` };
      } else return n;
    }
  }

  /** A `{...}` group or a single token (`\frac12`, `\sqrt2`). */
  arg(): Node {
    if (this.isOp('{')) {
      this.next();
      const e = this.expr();
      this.expectOp('}');
      return e;
    }
    const t = this.next();
    if (t.k === 'num') {
      if (t.text.length > 1 && /^\d+$/.test(t.text)) {
        this.#pos -= 1;
        this.#toks[this.#pos] = { k: 'num', text: t.text.slice(1) };
        return num(t.text[0]);
      }
      return num(t.text);
    }
    if (t.k === 'sym') return { t: 'sym', name: t.name };
    throw new ParseError('bad argument');
  }

  primary(): Node {
    this.enter();
    const t = this.next();
    let node: Node;
    if (t.k === 'num') node = num(t.text);
    else if (t.k === 'sym') node = this.subscripted(t.name);
    else if (t.k === 'fn') node = this.func(t.name);
    else if (t.k === 'cmd') node = this.command(t.name);
    else if (t.v === '(' || t.v === '[' || t.v === '{') {
      const close = t.v === '(' ? ')' : t.v === '[' ? ']' : '}';
      const e = this.expr();
      this.expectOp(close);
      node = e;
    } else if (t.v === '|') {
      const e = this.expr();
      this.expectOp('|');
      node = { t: 'fn', name: 'abs', args: [e] };
    } else throw new ParseError(`unexpected '${t.v}'`);
    this.leave();
    return node;
  }

  subscripted(name: string): Node {
    if (!this.isOp('_')) return { t: 'sym', name };
    this.next();
    const sub = this.next();
    let label: string;
    if (sub.k === 'num' || sub.k === 'sym') label = sub.k === 'num' ? sub.text : sub.name;
    else if (sub.k === 'op' && sub.v === '{') {
      const parts: string[] = [];
      for (let t = this.next(); !(t.k === 'op' && t.v === '}'); t = this.next()) {
        parts.push(t.k === 'num' ? t.text : t.k === 'op' ? t.v : t.name);
      }
      label = parts.join('');
    } else throw new ParseError('bad subscript');
    return { t: 'sym', name: `${name}_${label}` };
  }

  func(name: string): Node {
    let exponent: Node | null = null;
    let base: Node | null = null;
    if (name === 'log' && this.isOp('_')) {
      this.next();
      base = this.arg();
    }
    if (this.isOp('^')) {
      this.next();
      exponent = this.exponent();
    }
    let argument: Node;
    if (this.isOp('(')) {
      this.next();
      argument = this.expr();
      this.expectOp(')');
    } else {
      argument = this.power();
    }
    let node: Node = { t: 'fn', name, args: base ? [argument, base] : [argument] };
    // `\sin^{-1} x` is the inverse function, `\sin^2 x` a power of the value.
    if (exponent) {
      if (
        exponent.t === 'neg' &&
        exponent.a.t === 'num' &&
        exponent.a.v === 1 &&
        /^(sin|cos|tan)$/.test(name)
      ) {
        node = { t: 'fn', name: `arc${name}`, args: [argument] };
      } else node = { t: 'bin', op: '^', a: node, b: exponent };
    }
    return node;
  }

  command(name: string): Node {
    if (name === 'frac') {
      const a = this.arg();
      const b = this.arg();
      return { t: 'bin', op: '/', a, b };
    }
    if (name === 'binom') {
      const a = this.arg();
      const b = this.arg();
      return { t: 'fn', name: 'binom', args: [a, b] };
    }
    if (name === 'sqrt') {
      let index: Node | null = null;
      if (this.isOp('[')) {
        this.next();
        index = this.expr();
        this.expectOp(']');
      }
      let a: Node;
      if (this.isOp('(')) a = this.primary();
      else a = this.arg();
      return index ? { t: 'fn', name: 'root', args: [a, index] } : { t: 'fn', name: 'sqrt', args: [a] };
    }
    if (name === 'operatorname') {
      this.expectOp('{');
      const parts: string[] = [];
      for (let t = this.next(); !(t.k === 'op' && t.v === '}'); t = this.next()) {
        if (t.k !== 'sym') throw new ParseError('bad operator name');
        parts.push(t.name);
      }
      const fname = parts.join('');
      if (!FUNCTIONS.has(fname)) throw new ParseError(`unknown operator ${fname}`);
      return this.func(fname);
    }
    throw new ParseError(`\\${name} inside an expression`);
  }
}

function num(text: string): Node {
  return { t: 'num', v: Number(text), text };
}

/** Parses one expression; throws ParseError on anything it does not understand. */
export function parseExpr(s: string, budget: Budget): Node {
  const p = new Parser(tokenize(s, budget), budget);
  const node = p.expr();
  if (!p.done()) throw new ParseError('trailing input');
  return node;
}

/** Free symbols (π, e and ∞ are constants). */
export function symbols(node: Node, out: Set<string> = new Set()): Set<string> {
  switch (node.t) {
    case 'sym':
      if (!CONSTANTS.has(node.name)) out.add(node.name);
      break;
    case 'bin':
      symbols(node.a, out);
      symbols(node.b, out);
      break;
    case 'neg':
      symbols(node.a, out);
      break;
    case 'pm':
      if (node.a) symbols(node.a, out);
      symbols(node.b, out);
      break;
    case 'fn':
      for (const a of node.args) symbols(a, out);
      break;
  }
  return out;
}

const CONSTANTS = new Map<string, number>([
  ['π', Math.PI],
  ['e', Math.E],
  ['∞', Infinity],
]);

/** Every reading of the `±` signs (`1 ± √5` is two values), at most 16. */
export function expandPm(node: Node): Node[] {
  switch (node.t) {
    case 'pm': {
      const out: Node[] = [];
      const bs = expandPm(node.b);
      const as = node.a ? expandPm(node.a) : [null];
      for (const a of as) {
        for (const b of bs) {
          out.push(a ? { t: 'bin', op: '+', a, b } : b);
          out.push(a ? { t: 'bin', op: '-', a, b } : { t: 'neg', a: b });
        }
      }
      return out.slice(0, 16);
    }
    case 'bin': {
      const as = expandPm(node.a);
      const bs = expandPm(node.b);
      if (as.length === 1 && bs.length === 1) return [node];
      return as.flatMap((a) => bs.map((b): Node => ({ ...node, a, b }))).slice(0, 16);
    }
    case 'neg':
      return expandPm(node.a).map((a): Node => ({ t: 'neg', a }));
    case 'fn': {
      let variants: Node[][] = [[]];
      for (const arg of node.args) {
        const options = expandPm(arg);
        variants = variants.flatMap((v) => options.map((o) => [...v, o])).slice(0, 16);
      }
      return variants.length === 1 ? [node] : variants.map((args): Node => ({ ...node, args }));
    }
    default:
      return [node];
  }
}

export function hasPm(node: Node): boolean {
  switch (node.t) {
    case 'pm':
      return true;
    case 'bin':
      return hasPm(node.a) || hasPm(node.b);
    case 'neg':
      return hasPm(node.a);
    case 'fn':
      return node.args.some(hasPm);
    default:
      return false;
  }
}

function factorial(n: number): number {
  if (!Number.isInteger(n) || n < 0 || n > 170) return Number.NaN;
  let r = 1;
  for (let i = 2; i <= n; i++) r *= i;
  return r;
}

function power(a: number, b: number): number {
  const r = a ** b;
  if (!Number.isNaN(r) || a >= 0) return r;
  // A negative base with a rational exponent of odd denominator (x^{2/3}) has a real value.
  for (const q of [3, 5, 7]) {
    const p = b * q;
    if (Math.abs(p - Math.round(p)) < 1e-9) {
      const mag = Math.abs(a) ** b;
      return Math.round(p) % 2 === 0 ? mag : -mag;
    }
  }
  return Number.NaN;
}

/** Evaluates at one point; NaN where the expression is undefined or not real. */
export function evaluate(node: Node, env: Map<string, number>, budget: Budget): number {
  budget.check();
  switch (node.t) {
    case 'num':
      return node.v;
    case 'sym': {
      const c = CONSTANTS.get(node.name);
      if (c !== undefined) return c;
      const v = env.get(node.name);
      return v === undefined ? Number.NaN : v;
    }
    case 'neg':
      return -evaluate(node.a, env, budget);
    case 'pm':
      return Number.NaN;
    case 'bin': {
      const a = evaluate(node.a, env, budget);
      const b = evaluate(node.b, env, budget);
      switch (node.op) {
        case '+':
          return a + b;
        case '-':
          return a - b;
        case '*':
          return a * b;
        case '/':
          return b === 0 ? Number.NaN : a / b;
        case '^':
          return power(a, b);
      }
      return Number.NaN;
    }
    case 'fn': {
      const xs = node.args.map((x) => evaluate(x, env, budget));
      const x = xs[0];
      switch (node.name) {
        case 'sin':
          return Math.sin(x);
        case 'cos':
          return Math.cos(x);
        case 'tan':
          return Math.tan(x);
        case 'sec':
          return 1 / Math.cos(x);
        case 'csc':
          return 1 / Math.sin(x);
        case 'cot':
          return 1 / Math.tan(x);
        case 'arcsin':
          return Math.asin(x);
        case 'arccos':
          return Math.acos(x);
        case 'arctan':
          return Math.atan(x);
        case 'sinh':
          return Math.sinh(x);
        case 'cosh':
          return Math.cosh(x);
        case 'tanh':
          return Math.tanh(x);
        case 'ln':
          return x > 0 ? Math.log(x) : Number.NaN;
        case 'log':
          if (!(x > 0)) return Number.NaN;
          return xs.length > 1 ? Math.log(x) / Math.log(xs[1]) : Math.log10(x);
        case 'exp':
          return Math.exp(x);
        case 'floor':
          return Math.floor(x);
        case 'ceil':
          return Math.ceil(x);
        case 'abs':
          return Math.abs(x);
        case 'sqrt':
          return x >= 0 ? Math.sqrt(x) : Number.NaN;
        case 'root': {
          const n = xs[1];
          if (x >= 0) return x ** (1 / n);
          return Number.isInteger(n) && n % 2 === 1 ? -((-x) ** (1 / n)) : Number.NaN;
        }
        case 'fact':
          return factorial(x);
        case 'binom': {
          const k = xs[1];
          if (!Number.isInteger(x) || !Number.isInteger(k) || k < 0 || x < 0 || k > x || x > 1000)
            return Number.NaN;
          let r = 1;
          for (let i = 1; i <= k; i++) r = (r * (x - k + i)) / i;
          return Math.round(r);
        }
      }
      return Number.NaN;
    }
  }
}
