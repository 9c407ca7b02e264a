import type { Budget } from './budget.js';
import { type Node, ParseError, parseExpr } from './expr.js';
import { normalizeAnswer } from './normalize.js';

/**
 * The structure of a final answer: a value, a list/set, a tuple or interval, a union of intervals,
 * a matrix, a relation chain (`x = 3`, `-2 ≤ x ≤ 7`, `x ∈ [a, b]`), or free text when nothing parses.
 */
export type Answer =
  | { k: 'expr'; node: Node; text: string }
  | { k: 'text'; text: string }
  | { k: 'set'; items: Answer[] }
  | { k: 'tuple'; open: '(' | '['; close: ')' | ']'; items: Answer[] }
  | { k: 'union'; parts: Answer[] }
  | { k: 'matrix'; rows: Answer[][] }
  | { k: 'rel'; terms: Answer[]; ops: Rel[] };

export type Rel = '=' | '<' | '>' | '≤' | '≥' | '≠' | '∈';
const RELS = new Set<string>(['=', '<', '>', '≤', '≥', '≠', '∈']);

const OPEN = '([{';
const CLOSE = ')]}';

/**
 * Walks `s` keeping the bracket depth (`\{` and `\}` count as braces): `visit(i, depth, bracket)`
 * sees each character, or escaped brace (at its brace), with the depth after it; returning false
 * stops the walk. The final depth, or undefined when `visit` stopped it.
 */
function scanBrackets(
  s: string,
  budget: Budget,
  visit: (i: number, depth: number, bracket: boolean) => boolean,
): number | undefined {
  let depth = 0;
  for (let i = 0; i < s.length; i++) {
    budget.check();
    const c = s[i];
    let bracket = true;
    if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) {
      depth += s[i + 1] === '{' ? 1 : -1;
      i += 1;
    } else if (OPEN.includes(c)) depth += 1;
    else if (CLOSE.includes(c)) depth -= 1;
    else bracket = false;
    if (!visit(i, depth, bracket)) return undefined;
  }
  return depth;
}

/** Splits at top-level separators (depth 0 outside any bracket), keeping the separators. */
function splitTop(
  s: string,
  isSep: (c: string) => boolean,
  budget: Budget,
): { parts: string[]; seps: string[] } {
  const parts: string[] = [];
  const seps: string[] = [];
  let start = 0;
  scanBrackets(s, budget, (i, depth, bracket) => {
    if (!bracket && depth === 0 && isSep(s[i])) {
      parts.push(s.slice(start, i));
      seps.push(s[i]);
      start = i + 1;
    }
    return true;
  });
  parts.push(s.slice(start));
  return { parts, seps };
}

/** True when `s` is one bracketed group from its first to its last character. */
function wrapped(s: string, budget: Budget): boolean {
  return scanBrackets(s, budget, (i, depth) => depth !== 0 || i === s.length - 1) === 0;
}

const MATRIX =
  /^[([]?\s*\\begin\{([pbBvV]?matrix|array)\}(?:\{[^}]*\})?((?:(?!\\begin\{).)*)\\end\{\1\}\s*[)\]]?$/s;

export function parseAnswer(raw: string, budget: Budget): Answer {
  return structure(normalizeAnswer(raw), budget, 0);
}

function structure(s0: string, budget: Budget, depth: number): Answer {
  budget.check();
  if (depth > 20) throw new ParseError('nested too deeply');
  const s = s0
    .trim()
    .replace(/^[,;]+|[,;]+$/g, '')
    .trim();
  const matrix = MATRIX.exec(s);
  if (matrix) {
    const rows = matrix[2]
      .split(/\\\\/)
      .map((r) => r.trim())
      .filter((r) => r !== '')
      .map((r) => r.split('&').map((c) => structure(c, budget, depth + 1)));
    return { k: 'matrix', rows };
  }
  if (s.includes('\\begin{')) {
    // A sum of matrices (`A + B` written out) is the matrix of the sums.
    const terms = splitTop(s, (c) => c === '+', budget).parts.map((p) => p.trim());
    if (terms.length > 1 && terms.every((t) => MATRIX.test(t))) {
      const ms = terms.map((t) => structure(t, budget, depth + 1)) as Extract<Answer, { k: 'matrix' }>[];
      return addMatrices(ms) ?? { k: 'text', text: s };
    }
  }
  // `p=5, q=2; p=7, q=2`: solutions as groups of named values are the tuples (5, 2), (7, 2).
  const groups = splitTop(s, (c) => c === ';', budget).parts;
  if (groups.length > 1) {
    const tuples = groups.map((g) => namedTuple(g, budget, depth));
    if (tuples.every((t) => t !== null)) return { k: 'set', items: tuples as Answer[] };
  }
  // `a, b and c` or `a; b`: a list, compared as a set (order-free), as Math-Verify does.
  const words = s.replace(/\s*\b(?:and|or)\b\s*/g, ',');
  const list = splitTop(words, (c) => c === ',' || c === ';', budget);
  if (list.parts.length > 1) {
    const items = list.parts.filter((p) => p.trim() !== '').map((p) => structure(p, budget, depth + 1));
    return items.length === 1 ? items[0] : { k: 'set', items };
  }
  const rel = splitTop(s, (c) => RELS.has(c), budget);
  if (rel.parts.length > 1) {
    return {
      k: 'rel',
      terms: rel.parts.map((p) => structure(p, budget, depth + 1)),
      ops: rel.seps as Rel[],
    };
  }
  const union = splitTop(s, (c) => c === '∪', budget);
  if (union.parts.length > 1)
    return { k: 'union', parts: union.parts.map((p) => structure(p, budget, depth + 1)) };
  if (s.startsWith('\\{') && s.endsWith('\\}') && wrapped(s, budget)) {
    const inner = splitTop(s.slice(2, -2), (c) => c === ',' || c === ';', budget);
    return {
      k: 'set',
      items: inner.parts.filter((p) => p.trim() !== '').map((p) => structure(p, budget, depth + 1)),
    };
  }
  if (s.length >= 2 && '(['.includes(s[0]) && ')]'.includes(s[s.length - 1]) && wrapped(s, budget)) {
    let inner = splitTop(s.slice(1, -1), (c) => c === ',', budget);
    // `(0;-2;6)`: semicolons separate coordinates where there are no commas.
    if (inner.parts.length === 1) inner = splitTop(s.slice(1, -1), (c) => c === ';', budget);
    if (inner.parts.length > 1) {
      return {
        k: 'tuple',
        open: s[0] as '(' | '[',
        close: s[s.length - 1] as ')' | ']',
        items: inner.parts.map((p) => structure(p, budget, depth + 1)),
      };
    }
    if (s[0] === '(' && s.endsWith(')') && MATRIX.test(s))
      return structure(s.slice(1, -1), budget, depth + 1);
  }
  if (s.startsWith('{') && s.endsWith('}') && wrapped(s, budget)) {
    const inner = splitTop(s.slice(1, -1), (c) => c === ',', budget);
    if (inner.parts.length > 1) {
      return { k: 'set', items: inner.parts.map((p) => structure(p, budget, depth + 1)) };
    }
  }
  // Words (`Even`, `Evelyn`, `no solution`) are text, not a product of single-letter symbols.
  if (
    /^[A-Za-z][a-z]{2,}(?:\s+[A-Za-z][a-z]*)*$/.test(s) &&
    !/^(?:sin|cos|tan|pi|sqrt|log|ln|exp)\b/.test(s)
  ) {
    return { k: 'text', text: s };
  }
  try {
    return { k: 'expr', node: parseExpr(s, budget), text: s };
  } catch (error) {
    if (!(error instanceof ParseError)) throw error;
    return { k: 'text', text: s };
  }
}

/** `p=5, q=2` as the tuple (5, 2), when every item names a different variable. */
function namedTuple(group: string, budget: Budget, depth: number): Answer | null {
  const items = splitTop(group, (c) => c === ',', budget).parts;
  if (items.length < 2) return null;
  const names = new Set<string>();
  const values: Answer[] = [];
  for (const item of items) {
    const m = /^\s*([a-zA-Z](?:_\{?\w+\}?)?)\s*=([^=]+)$/.exec(item);
    if (!m || names.has(m[1])) return null;
    names.add(m[1]);
    values.push(structure(m[2], budget, depth + 1));
  }
  return { k: 'tuple', open: '(', close: ')', items: values };
}

function addMatrices(ms: Extract<Answer, { k: 'matrix' }>[]): Answer | null {
  const [first, ...rest] = ms;
  const rows = first.rows.map((row, i) =>
    row.map((cell, j): Answer | null => {
      let node = cell.k === 'expr' ? cell.node : null;
      for (const m of rest) {
        const other = m.rows[i]?.[j];
        if (
          !node ||
          other?.k !== 'expr' ||
          m.rows.length !== first.rows.length ||
          m.rows[i].length !== row.length
        ) {
          return null;
        }
        node = { t: 'bin', op: '+', a: node, b: other.node };
      }
      return node ? { k: 'expr', node, text: '' } : null;
    }),
  );
  if (rows.some((r) => r.some((c) => c === null))) return null;
  return { k: 'matrix', rows: rows as Answer[][] };
}
