import { matchBrace, undoubleBackslashes } from './latex.js';

/**
 * Answer-level clean-up before parsing: math delimiters, spacing commands, `\left`/`\right`,
 * degrees, percent, currency, units in `\text{}`, thousands separators, relation spellings.
 * Each rule removes only notation that never changes the value of a final answer.
 */

const UNITS = [
  'cm',
  'mm',
  'km',
  'm',
  'meters?',
  'metres?',
  'centimeters?',
  'millimeters?',
  'kilometers?',
  'inch(?:es)?',
  'in',
  'feet',
  'foot',
  'ft',
  'yards?',
  'miles?',
  'mi',
  'units?',
  'sq(?:uare)? ?units?',
  'seconds?',
  'secs?',
  's',
  'minutes?',
  'mins?',
  'hours?',
  'hrs?',
  'h',
  'days?',
  'weeks?',
  'months?',
  'years?',
  'degrees?',
  'deg',
  'radians?',
  'rad',
  'dollars?',
  'cents?',
  'kg',
  'g',
  'grams?',
  'kilograms?',
  'pounds?',
  'lbs?',
  'liters?',
  'litres?',
  'ml',
  'L',
  'mph',
  'km/h',
  'm/s',
  'people',
  'ways',
  'students',
  'times',
];
const SHORT = new Set(['m', 'in', 's', 'h', 'g', 'L', 'mi', 'ft', 'rad', 'deg']);
const POWER = '(?:\\^?\\{?[23]\\}?|²|³)?';
/** Word units after a number or a closing bracket: `5 \\text{ cm}`, `12 meters`. */
const UNIT_RE = new RegExp(
  `(?<=[\\d}).])\\s*(?:${UNITS.filter((u) => !SHORT.has(u)).join('|')})${POWER}\\s*$`,
);
/** Short units only after a bare number (`5 m`), where they cannot be a variable of an expression. */
const SHORT_UNIT_RE = new RegExp(`^(-?[\\d.,]+)\\s*(?:${[...SHORT].join('|')})${POWER}$`);

const TEXT_WRAPPERS =
  /\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|boldsymbol|bf|rm)\s*\{/g;

/** `\text{...}` and font wrappers become their content; `\text{ and }` becomes a list separator. */
export function unwrapText(s: string): string {
  let out = s;
  for (let guard = 0; guard < 50; guard++) {
    TEXT_WRAPPERS.lastIndex = 0;
    const m = TEXT_WRAPPERS.exec(out);
    if (!m) break;
    const open = m.index + m[0].length - 1;
    const end = matchBrace(out, open);
    if (end === -1) break;
    const inner = out.slice(open + 1, end - 1);
    const word = /^\s*(and|or)\s*$/i.test(inner) ? ', ' : inner;
    out = out.slice(0, m.index) + word + out.slice(end);
  }
  return out;
}

export function stripDelimiters(s: string): string {
  let out = s.trim();
  for (let guard = 0; guard < 5; guard++) {
    const before = out;
    out = out.replace(/^\$+|\$+$/g, '').trim();
    out = out.replace(/^\\\(|\\\)$/g, '').trim();
    out = out.replace(/^\\\[|\\\]$/g, '').trim();
    out = out.replace(/[.。]+$/, '').trim();
    if (out === before) break;
  }
  return out;
}

/** The clean-up shared by every comparison; the result is still LaTeX-ish text. */
export function normalizeAnswer(raw: string): string {
  let s = undoubleBackslashes(raw);
  s = stripDelimiters(s);
  s = s.replace(/\$/g, ' ');
  s = s.replace(/\\(?:displaystyle|textstyle|left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])/g, '');
  s = s.replace(/(?<!\\)\\!\s*/g, '');
  s = s.replace(/(?<!\\)\\[,;: ]|\\q?quad|~/g, ' ');
  s = s.replace(/\{,\s*\}/g, '');
  s = s.replace(/\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree(?![a-zA-Z])/g, '');
  s = s.replace(/\\?%/g, '');
  s = s.replace(/\\\$/g, '');
  s = s.replace(/\\(?:dfrac|tfrac|cfrac)(?![a-zA-Z])/g, '\\frac');
  s = unwrapText(s);
  s = s.replace(/\s*\b(?:percentage|percent|pct)\s*$/i, '');
  s = s.replace(/\\(?:leqslant|leq|le)(?![a-zA-Z])|<=|≤/g, '≤');
  s = s.replace(/\\(?:geqslant|geq|ge)(?![a-zA-Z])|>=|≥/g, '≥');
  s = s.replace(/\\(?:neq|ne)(?![a-zA-Z])|!=|≠/g, '≠');
  s = s.replace(/\\lt(?![a-zA-Z])/g, '<').replace(/\\gt(?![a-zA-Z])/g, '>');
  s = s.replace(/\\in(?![a-zA-Z])|∈/g, '∈');
  // `x = 1/3 \approx 0.33`: the exact value is the answer, the approximation a remark.
  // `x \approx 11` alone states the value.
  s = /=/.test(s)
    ? s.replace(/\s*(?:\\approx(?![a-zA-Z])|≈).*$/s, '')
    : s.replace(/\\approx(?![a-zA-Z])|≈/g, '=');
  s = s.replace(/\\cup(?![a-zA-Z])|∪/g, '∪');
  s = s.replace(/π/g, '\\pi ').replace(/∞/g, '\\infty ').replace(/√/g, '\\sqrt');
  s = s.replace(/[−–]/g, '-').replace(/[×·]/g, '*').replace(/÷/g, '/');
  s = s.replace(/²/g, '^2').replace(/³/g, '^3');
  s = s.replace(/\s+/g, ' ').trim();
  s = s.replace(UNIT_RE, '').trim().replace(SHORT_UNIT_RE, '$1');
  // 12,345,678 (and 1,000.5) is one number when the whole answer is.
  if (/^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$/.test(s) || /^-?\d{1,3}(?: \d{3})+(?:\.\d+)?$/.test(s)) {
    s = s.replace(/[, ]/g, '');
  }
  // A decimal comma (`1000,99`, `0,111`) when the whole answer is one such number.
  else if (/^-?(?:\d+,\d{2}|0,\d{2,})$/.test(s)) s = s.replace(',', '.');
  return s;
}
