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
}

const BOX = /\\+(?:boxed|fbox)\s*(\{)?/g;

/**
 * Every `\boxed{...}`/`\fbox{...}` with balanced braces, in order. Also accepts `\boxed 5` (one token)
 * and the doubled backslash of JSON-escaped text; an unclosed box runs to the end of the text.
 */
export function findBoxes(s: string): Box[] {
  const out: Box[] = [];
  BOX.lastIndex = 0;
  for (let m = BOX.exec(s); m !== null; m = BOX.exec(s)) {
    const start = m.index;
    if (m[1] === '{') {
      const open = m.index + m[0].length - 1;
      const end = matchBrace(s, open);
      if (end === -1) {
        out.push({ start, end: s.length, content: s.slice(open + 1).replace(/\$+\s*$/, '') });
        break;
      }
      out.push({ start, end, content: s.slice(open + 1, end - 1) });
      BOX.lastIndex = end;
    } else {
      const rest = /^\s*([^\s$]+)/.exec(s.slice(m.index + m[0].length));
      if (rest) {
        const end = m.index + m[0].length + rest[0].length;
        out.push({ start, end, content: rest[1] });
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
