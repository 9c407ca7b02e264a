/** Small LaTeX string helpers shared by extraction and normalisation: balanced groups, boxes. */

/** Index just past the group that opens at `open` (a `{`), or -1 when it never closes. */
export function matchBrace(s: string, open: number, left = '{', right = '}'): number {
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    const c = s[i];
    if (c === '\\' && i + 1 < s.length && (s[i + 1] === left || s[i + 1] === right)) {
      i += 1; // an escaped brace such as `\{` does not count
      continue;
    }
    if (c === left) depth += 1;
    else if (c === right) {
      depth -= 1;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

export interface Box {
  /** Where `\boxed` (or `\fbox`) starts and where its group ends. */
  start: number;
  end: number;
  content: string;
  /** False for a `\boxed{` whose group never closes (it runs to the end of the text). */
  closed: boolean;
}

const BOX = /\\+(?:boxed|fbox)\s*(\{)?/g;

/** For each `{` the index just past its `}` (-1 when it never closes), in one pass. */
function braceEnds(s: string): Int32Array {
  const ends = new Int32Array(s.length).fill(-1);
  const stack: number[] = [];
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) i += 1;
    else if (c === '{') stack.push(i);
    else if (c === '}' && stack.length > 0) ends[stack.pop() as number] = i + 1;
  }
  return ends;
}

/**
 * Every `\boxed{...}`/`\fbox{...}` with balanced braces, in order. Also accepts `\boxed 5` (one token)
 * and the doubled backslash of JSON-escaped text. An unclosed box runs to the end of the text; with
 * `all`, the scan goes on inside it (so a later closed box is still found) and the unclosed box is
 * reported with `closed: false` and no content.
 */
export function findBoxes(s: string, all = false): Box[] {
  const out: Box[] = [];
  const ends = all ? braceEnds(s) : null;
  BOX.lastIndex = 0;
  for (let m = BOX.exec(s); m !== null; m = BOX.exec(s)) {
    const start = m.index;
    if (m[1] === '{') {
      const open = m.index + m[0].length - 1;
      const end = ends ? ends[open] : matchBrace(s, open);
      if (end === -1) {
        if (ends) {
          out.push({ start, end: open + 1, content: '', closed: false });
          continue;
        }
        out.push({ start, end: s.length, content: s.slice(open + 1).replace(/\$+\s*$/, ''), closed: false });
        break;
      }
      out.push({ start, end, content: s.slice(open + 1, end - 1), closed: true });
      BOX.lastIndex = end;
    } else {
      const rest = /^\s*([^\s$]+)/.exec(s.slice(m.index + m[0].length));
      if (rest) {
        const end = m.index + m[0].length + rest[0].length;
        out.push({ start, end, content: rest[1], closed: true });
        BOX.lastIndex = end;
      }
    }
  }
  return out;
}

export interface MathSpan {
  start: number;
  end: number;
  content: string;
}

/** Inline and display math: `$..$`, `$$..$$`, `\(..\)`, `\[..\]`, in order of appearance. */
export function findMath(s: string): MathSpan[] {
  const out: MathSpan[] = [];
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === '\\' && s[i - 1] !== '\\' && (s[i + 1] === '(' || s[i + 1] === '[')) {
      const close = s[i + 1] === '(' ? '\\)' : '\\]';
      const end = s.indexOf(close, i + 2);
      if (end === -1) break;
      const content = s.slice(i + 2, end);
      if (close === '\\)' && content.includes('\n')) {
        i = end + 2;
        continue;
      }
      out.push({ start: i, end: end + 2, content });
      i = end + 2;
      continue;
    }
    if (c === '$' && s[i - 1] !== '\\') {
      const delim = s[i + 1] === '$' ? '$$' : '$';
      let end = s.indexOf(delim, i + delim.length);
      while (end !== -1 && s[end - 1] === '\\') end = s.indexOf(delim, end + 1);
      if (end === -1) break;
      const content = s.slice(i + delim.length, end);
      // Inline math does not span lines; display math may.
      if (delim === '$' && content.includes('\n')) {
        i += 1;
        continue;
      }
      out.push({ start: i, end: end + delim.length, content });
      i = end + delim.length;
      continue;
    }
    i += 1;
  }
  return out;
}

/** Commands that JSON-escaped text sometimes carries with a doubled backslash (`\\frac`). */
const DOUBLED =
  /(?<!\\)\\\\(?=(?:frac|dfrac|tfrac|sqrt|boxed|left|right|le|leq|ge|geq|lt|gt|ne|neq|pi|cdot|times|text|mathrm|mathbf|infty|in|cup|cap|pm|mp|circ|begin|end|sin|cos|tan|log|ln|div|approx|dots|cdots|quad)(?![a-zA-Z]))/g;

export function undoubleBackslashes(s: string): string {
  return s.includes('\\\\') ? s.replace(DOUBLED, '\\') : s;
}

/**
 * True when the answer's markup is balanced: every `{` closed in order (`\{`/`\}` pairs too, unless
 * `\right.` ends a `\left\{`) and an even number of unescaped `$`: `\frac{1}{2`, `{12`, `$\frac12`
 * are not answers.
 */
export function balanced(s: string): boolean {
  let braces = 0;
  let sets = 0;
  let dollars = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '\\') {
      const next = s[i + 1];
      if (next === '{') sets += 1;
      else if (next === '}' && --sets < 0) return false;
      i += 1;
    } else if (c === '{') braces += 1;
    else if (c === '}' && --braces < 0) return false;
    else if (c === '$') dollars += 1;
  }
  return braces === 0 && (sets === 0 || s.includes('\\right.')) && dollars % 2 === 0;
}
