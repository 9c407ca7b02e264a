import { literalQ, type Q, type RoundMode } from './exact.js';

/**
 * What a problem's text says about rounding its answer: the precisions it asks for (`steps`: round
 * to a multiple of 1/10, 1/100, 1, 10 …; `significant`: n significant figures), or `free` when it
 * asks for a rounded or decimal answer without saying how precise (then any correctly rounded
 * value with at least three significant digits counts). Null when the text asks for no rounding.
 */
export interface Rounding {
  steps: Q[];
  significant: number[];
  free: boolean;
  mode: RoundMode;
}

const WORDS: Record<string, number> = {
  one: 1,
  two: 2,
  three: 3,
  four: 4,
  five: 5,
  six: 6,
  seven: 7,
  eight: 8,
  nine: 9,
  ten: 10,
  a: 1,
  'a single': 1,
  single: 1,
  first: 1,
  second: 2,
  third: 3,
  fourth: 4,
  fifth: 5,
  sixth: 6,
};

const COUNT = `(\\d+|${Object.keys(WORDS)
  .sort((a, b) => b.length - a.length)
  .join('|')})`;

/** Place-value words after "nearest": decimal places (negative: tens, hundreds …). */
const PLACES: [RegExp, number][] = [
  [/^(?:ten[- ]?thousandths?|10,?000ths?)\b/, 4],
  [/^(?:hundred[- ]?thousandths?)\b/, 5],
  [/^millionths?\b/, 6],
  [/^(?:tenths?|10ths?)\b/, 1],
  [/^(?:hundredths?|100ths?)\b/, 2],
  [/^(?:thousandths?|1000ths?)\b/, 3],
  [/^cents?\b/, 2],
  [/^ten[- ]thousands?\b/, -4],
  [/^(?:tens?)\b/, -1],
  [/^hundreds?\b/, -2],
  [/^thousands?\b/, -3],
  [/^millions?\b/, -6],
];
/** Fractions of a unit: "nearest half", "nearest quarter inch". */
const PARTS: [RegExp, Q][] = [
  [/^half\b/, { n: 1n, d: 2n }],
  [/^(?:quarter|fourth)\b/, { n: 1n, d: 4n }],
  [/^(?:third)\b/, { n: 1n, d: 3n }],
];

const place = (p: number): Q => (p >= 0 ? { n: 1n, d: 10n ** BigInt(p) } : { n: 10n ** BigInt(-p), d: 1n });

/** The step a "nearest …" phrase names: a place word, a number (`0.01`, `10`), or a whole unit. */
function nearestStep(rest: string): Q | null {
  const words = rest.replace(/^(?:whole\s+|single\s+)/, '');
  for (const [re, p] of PLACES) if (re.test(words)) return place(p);
  for (const [re, step] of PARTS) if (re.test(words)) return step;
  const number = /^(\d*\.?\d+)\b/.exec(words);
  if (number) {
    const step = literalQ(number[1]);
    return step && step.n > 0n ? step : null;
  }
  // "nearest integer", "nearest whole number", "nearest dollar", "nearest degree", "nearest percent".
  return /^[a-z]/.test(words) ? place(0) : null;
}

const NEAREST = /\b(?:to|round(?:ed|ing)?(?:\s+(?:off|up|down))?(?:\s+to)?)\s+(?:the\s+)?nearest\s+/g;
/** Place words are rounding instructions wherever "nearest" precedes them. */
const NEAREST_PLACE =
  /\bnearest\s+(?:(?:ten|hundred)[- ]?thousandths?|tenths?|hundredths?|thousandths?|millionths?)\b/g;
const DECIMAL_PLACES = new RegExp(
  `\\b${COUNT}\\s+(?:decimal\\s+(?:places?|digits?)|digits?\\s+after\\s+the\\s+decimal(?:\\s+point)?|places?\\s+after\\s+the\\s+decimal(?:\\s+point)?|d\\.\\s?p\\.)`,
  'g',
);
const SIGNIFICANT = new RegExp(
  `\\b${COUNT}\\s+(?:significant\\s+(?:figures?|digits?)|sig\\.?\\s*figs?)\\b`,
  'g',
);
/**
 * A rounding instruction without a precision: "round your answer", "rounded", "a decimal
 * approximation". "Express as a decimal" alone asks for the exact decimal (`0.375`, `0.\overline{3}`),
 * and "a round table" is no instruction.
 */
const FREE =
  /\bround(?:ing)?(?:\s+off)?\s+(?:to\b|your\b|the\s+(?:answer|result|value|number|final)|it\b|up\b|down\b|off\b|each\b|all\b|this\b|that\b|answers?\b)|\brounded\b(?!\s+(?:corners?|edges?|shape|rectangle|square|end))|\bdecimal\s+approximation\b|\bapproximate\s+(?:your|the)\s+answer\b/;

function count(word: string): number | null {
  const n = /^\d+$/.test(word) ? Number(word) : WORDS[word];
  return n !== undefined && n >= 0 && n <= 12 ? n : null;
}

/** Reads the rounding a problem's text asks for (see Rounding), or null. */
export function parseRounding(prompt: string): Rounding | null {
  const text = prompt
    .toLowerCase()
    .replace(/\\text\{([^{}]*)\}/g, '$1')
    .replace(/\\?\$/g, '')
    .replace(/\s+/g, ' ');
  if (!/round|nearest|decimal|significant|sig\.? ?fig|approximate/.test(text)) return null;
  const steps: Q[] = [];
  const significant: number[] = [];
  for (const m of text.matchAll(NEAREST)) {
    const step = nearestStep(text.slice((m.index ?? 0) + m[0].length));
    if (step) steps.push(step);
  }
  for (const m of text.matchAll(NEAREST_PLACE)) {
    const step = nearestStep(m[0].replace(/^nearest\s+/, ''));
    if (step) steps.push(step);
  }
  for (const m of text.matchAll(DECIMAL_PLACES)) {
    const n = count(m[1]);
    if (n !== null) steps.push(place(n));
  }
  for (const m of text.matchAll(SIGNIFICANT)) {
    const n = count(m[1]);
    if (n !== null && n > 0) significant.push(n);
  }
  const free = steps.length === 0 && significant.length === 0 && FREE.test(text);
  if (steps.length === 0 && significant.length === 0 && !free) return null;
  const mode: RoundMode = /\bround(?:ed|ing)?\s+up\b/.test(text)
    ? 'up'
    : /\bround(?:ed|ing)?\s+down\b/.test(text)
      ? 'down'
      : 'nearest';
  const unique = [...new Map(steps.map((x) => [`${x.n}/${x.d}`, x])).values()];
  return { steps: unique, significant: [...new Set(significant)], free, mode };
}

const cache = new Map<string, Rounding | null>();

/** parseRounding, remembered per prompt (rollout scores many responses to one problem). */
export function roundingOf(prompt: string | undefined): Rounding | null {
  if (prompt === undefined || prompt === '') return null;
  let r = cache.get(prompt);
  if (r === undefined) {
    r = parseRounding(prompt);
    if (cache.size >= 4096) cache.clear();
    cache.set(prompt, r);
  }
  return r;
}
