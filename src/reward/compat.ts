import { parseAnswer } from './answer.js';
import type { Budget } from './budget.js';
import { exprEqual, LEGACY } from './compare.js';
import { findBoxes } from './latex.js';

/**
 * `--compat rstar`: the extra verdicts of the rStar2-Agent release's reward, which accepts a
 * response when either PRIME's grader (prm800k normalisation + a lenient `math_equal`) or
 * Math-Verify does. Our strict check stands in for Math-Verify; this module adds PRIME's
 * leniencies, re-implemented from their documented behaviour:
 *
 *  - extraction: text after the last "answer is"/"answer:", then the last box, then the text after
 *    the last "is ", "=", ": " … of what is left (so `y = 3` yields `3`);
 *  - normalisation: a `k =` prefix of at most two characters is dropped (so `y=3` matches `x=3`),
 *    units after `\text{ `, `\%`, `^\circ`, `\$` and spaces are dropped;
 *  - numbers equal within a relative 1e-4, and equal to the reference ×100 or ÷100 (so `5` matches
 *    `500` and `0.5` matches `50`);
 *  - brackets stripped when either end differs (so `(3,4)` matches `(3,4]`), braces and parentheses
 *    removed before a string comparison;
 *  - a base subscript dropped (`204_5` matches `204`); `\pi` also tried as 3.14.
 */

function lastBoxed(s: string): string | null {
  const boxes = findBoxes(s);
  return boxes.length > 0 ? boxes[boxes.length - 1].content.trim() : null;
}

/** PRIME's `match_answer`: where the release looks for the answer in a response. */
export function primeExtract(response: string): string {
  let r = response;
  for (const marker of ['answer:', 'answer is', 'answers are']) {
    const i = r.toLowerCase().lastIndexOf(marker);
    if (i !== -1) r = r.slice(i + marker.length).trim();
  }
  for (const marker of ['is answer', 'is the answer', 'are answers', 'are the answers']) {
    const i = r.toLowerCase().lastIndexOf(marker);
    if (i !== -1) r = r.slice(0, i).trim();
  }
  const boxed = lastBoxed(r);
  if (boxed) r = boxed;
  const dot = r.lastIndexOf('. ');
  if (dot !== -1) r = r.slice(0, dot).trim();
  for (const marker of ['be ', 'is ', 'are ', '=', ': ', 'get ', 'be\n', 'is\n', 'are\n', ':\n', 'get\n']) {
    const i = r.toLowerCase().lastIndexOf(marker);
    if (i !== -1) r = r.slice(i + marker.length).trim();
  }
  return r;
}

function fixFracs(s: string): string {
  const parts = s.split('\\frac');
  let out = parts[0];
  for (const p of parts.slice(1)) {
    out += '\\frac';
    if (p.startsWith('{') || p.length < 2) out += p;
    else if (p[1] !== '{') out += `{${p[0]}}{${p[1]}}${p.slice(2)}`;
    else out += `{${p[0]}}${p.slice(1)}`;
  }
  return out;
}

/** prm800k's `_strip_string` (the MATH dataset's string normalisation). */
export function mathdNormalize(answer: string): string {
  let s = answer.trim();
  const text = /^\\text\{(.+?)\}$/.exec(s);
  if (text) s = text[1].trim();
  s = s.replace(/\n/g, '').replace(/\\!/g, '').replace(/\\\\/g, '\\');
  s = s.replace(/tfrac/g, 'frac').replace(/dfrac/g, 'frac');
  s = s.replace(/\\left/g, '').replace(/\\right/g, '');
  s = s.replace(/\^\{\\circ\}/g, '').replace(/\^\\circ/g, '');
  s = s.replace(/\\\$/g, '');
  if (s.includes('\\text{ ')) s = s.split('\\text{ ')[0];
  s = s.replace(/\\%/g, '');
  s = s.replace(/ \./g, ' 0.').replace(/\{\./g, '{0.');
  if (s === '') return s;
  if (s.startsWith('.')) s = `0${s}`;
  const eq = s.split('=');
  if (eq.length === 2 && eq[0].length <= 2) s = eq[1];
  s = s.replace(/\\sqrt(?!\{)(.)/g, '\\sqrt{$1}');
  s = s.replace(/ /g, '');
  s = fixFracs(s);
  if (s === '0.5') s = '\\frac{1}{2}';
  const slash = /^(\d+)\/(\d+)$/.exec(s);
  if (slash) s = `\\frac{${slash[1]}}{${slash[2]}}`;
  return s;
}

function toNumber(s: string): number | null {
  const t = s.replace(/\{,\}/g, '').replace(/,/g, '').trim();
  if (!/^[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?$/i.test(t)) return null;
  return Number(t);
}

function isclose(a: number, b: number, rel: number): boolean {
  return Math.abs(a - b) <= rel * Math.max(Math.abs(a), Math.abs(b));
}

/** PRIME's `normalize` inside `math_equal`: `$5`, `5%`, a base subscript, `\pi` as a number. */
function primeValue(s: string, pi: number): string {
  if (/^\$\d+(\.\d+)?/.test(s)) return s.slice(1);
  if (/^\d+(\.\d+)?(\\)?%$/.test(s)) return s.replace(/\\?%/, '');
  if (s.includes('_')) {
    const n = toNumber(s.split('_')[0]);
    if (n === null) throw new Error('not a number before the base subscript');
    return String(Math.trunc(n));
  }
  if (s.includes('\\pi')) return s.replace(/(\d?)\\pi/g, (_m, d: string) => `${d || '1'}*${pi}`);
  return s;
}

/** PRIME's `math_equal`, on the leniencies that matter (see the module comment). */
function mathEqual(prediction: string, reference: string, budget: Budget, pi: number, depth = 0): boolean {
  budget.check();
  if (depth > 4) return false;
  const p = primeValue(prediction, pi).slice(0, 1000);
  const r = primeValue(reference, pi);
  if (p.trim().toLowerCase() === r.trim().toLowerCase()) return true;
  if (p.replace(/ /g, '') === r.replace(/ /g, '')) return true;
  const pn = toNumber(p);
  const rn = toNumber(r);
  if (pn !== null && rn !== null) return [rn / 100, rn, rn * 100].some((x) => isclose(x, pn, 1e-4));
  if (p.trim() === '') return false;
  const pt = p.trim();
  const rt = r.trim();
  let ps = pt;
  let rs = rt;
  if (
    (pt.startsWith('[') && pt.endsWith(']') && !rt.startsWith('(')) ||
    (pt.startsWith('(') && pt.endsWith(')') && !rt.startsWith('['))
  ) {
    ps = ps.replace(/^[[\]()]+|[[\]()]+$/g, '');
    rs = rs.replace(/^[[\]()]+|[[\]()]+$/g, '');
  }
  ps = ps.replace(/[{}()]/g, '');
  rs = rs.replace(/[{}()]/g, '');
  if (ps === rs) return true;
  if (
    pt.length > 1 &&
    rt.length > 1 &&
    '(['.includes(pt[0]) &&
    ')]'.includes(pt[pt.length - 1]) &&
    pt[0] === rt[0] &&
    pt[pt.length - 1] === rt[rt.length - 1]
  ) {
    const a = pt.slice(1, -1).split(',');
    const b = rt.slice(1, -1).split(',');
    if (a.length === b.length && a.every((x, i) => mathEqual(x, b[i], budget, pi, depth + 1))) return true;
  }
  if (pt.includes(',') && rt.includes(',')) {
    const a = pt.split(',').map((x) => x.trim());
    const b = rt.split(',').map((x) => x.trim());
    if (a.length === b.length) return a.every((x, i) => mathEqual(x, b[i], budget, pi, depth + 1));
  }
  // sympy's simplify/N with a relative 1e-4, approximated by evaluating both sides.
  try {
    const x = parseAnswer(pt, budget);
    const y = parseAnswer(rt, budget);
    if (x.k === 'expr' && y.k === 'expr') {
      if (exprEqual(x.node, y.node, budget, LEGACY)) return true;
      const vx = Number(x.text) || null;
      const vy = Number(y.text) || null;
      if (vx !== null && vy !== null) return isclose(vx, vy, 1e-4);
    }
  } catch {
    return false;
  }
  return false;
}

/** The release's extra acceptances beyond the strict check (callers run the strict check first). */
export function rstarLenient(response: string, reference: string, budget: Budget): boolean {
  const given = primeExtract(response);
  if (given === '') return false;
  if (mathdNormalize(given) === mathdNormalize(reference)) return true;
  try {
    const pis = given.includes('\\pi') || reference.includes('\\pi') ? [Math.PI, 3.14] : [Math.PI];
    return pis.some((pi) => mathEqual(given, reference, budget, pi));
  } catch (error) {
    if (error instanceof Error && error.name === 'Timeout') throw error;
    return false;
  }
}
