import { type Box, balanced, findBoxes, findMath, type MathSpan } from './latex.js';

/**
 * Final-answer extraction. The policy is the rStar2-Agent convention: the last `\boxed{}` inside the
 * `<answer>…</answer>` block, else the last box anywhere, else an "answer is X" phrase. Boxes next
 * to each other (`\boxed{1}, \boxed{2}`) are one answer listing several values.
 *
 * Strict by default: an answer with unbalanced markup (a `\boxed{` that never closes before
 * `</answer>` or the end, `\frac{1}{2`, a stray `{` or `$`) is no answer. `lenient` keeps the
 * release's reading (`--compat rstar`): an unclosed box runs to the end of the text.
 */
export interface ExtractOptions {
  lenient?: boolean;
}

/** An answer whose markup is broken: extraction yields no answer (and does not look further). */
export const MALFORMED = Symbol('malformed');
export type Found = string | null | typeof MALFORMED;

/** A found answer, or MALFORMED when strict extraction finds its markup unbalanced. */
const checked = (s: string | null, lenient: boolean): Found =>
  s === null || lenient || balanced(s) ? s : MALFORMED;

/**
 * Between two boxes that belong together: punctuation, spacing, `and`/`or`, math delimiters and the
 * name of the next value (`y_1 = \boxed{…}` and `y_2 = \boxed{…}`).
 */
const JOINER =
  /^(?:[\s,;.+$]|\\[(),;:! ]|\\q?quad|\\text\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b|[a-zA-Z](?:_\{?\w+\}?)?\s*=)*$/;

function lastBoxGroup(boxes: Box[], text: string, strict: boolean): Found {
  if (boxes.length === 0) return null;
  const group = [boxes[boxes.length - 1]];
  for (let i = boxes.length - 2; i >= 0; i--) {
    if (!JOINER.test(text.slice(boxes[i].end, group[0].start))) break;
    group.unshift(boxes[i]);
  }
  if (strict && group.some((b) => !b.closed)) return MALFORMED;
  return group.map((b) => b.content.trim()).join(', ');
}

function answerBlock(text: string): string | null {
  const open = text.lastIndexOf('<answer>');
  if (open === -1) return null;
  const close = text.indexOf('</answer>', open);
  return text.slice(open + 8, close === -1 ? text.length : close);
}

const PHRASE = /(?:final answer|answer)\s*(?:is|:)\s*:?\s*/gi;

/** The text after the last "answer is" / "answer:", up to the end of its sentence or line. */
function answerPhrase(text: string): string | null {
  let last: RegExpExecArray | null = null;
  PHRASE.lastIndex = 0;
  for (let m = PHRASE.exec(text); m !== null; m = PHRASE.exec(text)) last = m;
  if (!last) return null;
  let rest = text.slice(last.index + last[0].length);
  rest = rest.replace(/^(?:the\s+)?(?:final\s+)?(?:answer\s+is\s*)?/i, '');
  const math = findMath(rest);
  if (math.length > 0 && /^\s*$/.test(rest.slice(0, math[0].start))) return math[0].content.trim();
  const line = rest.split('\n')[0];
  // The sentence ends at ". " (not at a decimal point) or at the end of the line.
  const sentence = line.split(/\.(?:\s|$)|\s+I hope/)[0];
  const out = sentence.trim();
  if (out === '') return null;
  // "The answer is that there are 19 points": prose around the value; keep its last math or number.
  if (isProse(out)) return lastStated(out) ?? out;
  return out;
}

/** Two or more words outside math and LaTeX commands mark prose, not a bare answer. */
export function isProse(s: string): boolean {
  const bare = s.replace(/\$[^$]*\$/g, ' ').replace(/\\[a-zA-Z]+(?:\{[^{}]*\})?/g, ' ');
  const words = bare.match(/(?<![a-zA-Z])[a-zA-Z]{2,}(?![a-zA-Z])/g) ?? [];
  return words.length >= 2 && words.some((w) => w.length >= 3);
}

/** The marked answer of a response (see the module comment), or MALFORMED. */
export function findMarked(text: string, lenient = false): Found {
  const block = answerBlock(text);
  if (block !== null) {
    const inBlock = lastBoxGroup(findBoxes(block, !lenient), block, !lenient);
    if (inBlock !== null) return inBlock === MALFORMED ? inBlock : checked(inBlock, lenient);
  }
  const boxed = lastBoxGroup(findBoxes(text, !lenient), text, !lenient);
  if (boxed !== null) return boxed === MALFORMED ? boxed : checked(boxed, lenient);
  return checked(answerPhrase(text), lenient);
}

export function extractAnswer(text: string, options: ExtractOptions = {}): string | null {
  const found = findMarked(text, options.lenient);
  return found === MALFORMED ? null : found;
}

/** Between two math spans that form one list: `$1$ and $2$`, `$x$, $y$`. */
const MATH_JOINER = /^\s*(?:,|;|\band\b|\bor\b)?\s*(?:,|\band\b|\bor\b)?\s*$/;

function lastMathGroup(spans: MathSpan[], text: string): string | null {
  const nonEmpty = spans.filter((s) => s.content.trim() !== '');
  if (nonEmpty.length === 0) return null;
  const group = [nonEmpty[nonEmpty.length - 1]];
  for (let i = nonEmpty.length - 2; i >= 0; i--) {
    if (!MATH_JOINER.test(text.slice(nonEmpty[i].end, group[0].start))) break;
    group.unshift(nonEmpty[i]);
  }
  return group.map((s) => s.content.trim()).join(', ');
}

/** The last number in prose: `1,000.99m²`, `2/3`, `-5`; not digits glued to letters (`AZYUK2A`). */
const NUMBER = /(?<![\w.])-?(?:\d{1,3}(?:[ ,]\d{3})+|\d+)(?:[.,]\d+)?(?:\/\d+)?(?![\d])/g;

function lastNumber(text: string): string | null {
  let last: string | null = null;
  NUMBER.lastIndex = 0;
  for (let m = NUMBER.exec(text); m !== null; m = NUMBER.exec(text)) last = m[0];
  if (last === null) return null;
  // `1 000` and `1,000.99` group thousands; a single `2,74` is a decimal comma.
  if (/^-?\d+,\d{1,2}$/.test(last)) return last.replace(',', '.');
  return last.replace(/[ ,](?=\d{3}(?:\D|$))/g, '');
}

/** The last formula (several in a row joined), unless prose after it states a number later. */
function lastStated(text: string): string | null {
  const spans = findMath(text);
  const math = lastMathGroup(spans, text);
  if (math === null) return lastNumber(text);
  return lastNumber(text.slice(spans[spans.length - 1].end)) ?? math;
}

/**
 * For free-form text whose answer is not marked (references written as `$3\sqrt{13}$`, short
 * predictions): the marked answer if there is one, else the last math span (several in a row
 * joined), else the whole text when it is short, else the last number.
 */
export function findLoose(text: string, lenient = false): Found {
  const marked = findMarked(text, lenient);
  if (marked !== null) return marked;
  if (findMath(text).length > 0) return checked(lastStated(text), lenient);
  const trimmed = text.trim();
  if (trimmed === '') return null;
  const strayDollar = (trimmed.match(/(?<!\\)\$/g) ?? []).length % 2 === 1;
  if (!isProse(trimmed) && !strayDollar) return checked(trimmed, lenient);
  // A bare answer with a stray `$` (`$\frac12`, `12$`) is broken markup; a price inside words
  // (`Soucis : 2,74 $ a..`) is not.
  if (!lenient && !isProse(trimmed) && /^\$|\$$|[\\{}]/.test(trimmed)) return MALFORMED;
  return lastNumber(trimmed);
}

export function extractLoose(text: string, options: ExtractOptions = {}): string | null {
  const found = findLoose(text, options.lenient);
  return found === MALFORMED ? null : found;
}
