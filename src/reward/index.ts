import { type Answer, parseAnswer } from './answer.js';
import { Budget, Timeout } from './budget.js';
import { choiceLetter } from './choice.js';
import { answersEqual, LEGACY, type Policy } from './compare.js';
import { rstarLenient } from './compat.js';
import { extractAnswer, extractLoose, findLoose, MALFORMED } from './extract.js';
import { normalizeAnswer } from './normalize.js';
import { roundingOf } from './rounding.js';

export { choiceLetter } from './choice.js';
export { type ExtractOptions, extractAnswer, extractLoose } from './extract.js';
export { parseRounding, type Rounding } from './rounding.js';

export type AnswerKind = 'math' | 'choice';
export type Compat = 'strict' | 'rstar';

export interface EquivalenceOptions {
  kind?: AnswerKind;
  compat?: Compat;
  /** Upper bound for one comparison; on expiry the answers count as different. Default 200 ms. */
  timeoutMs?: number;
  /**
   * The problem's text. When it asks for a rounded answer ("to the nearest tenth", "to 2 decimal
   * places", "round your answer"), strict mode also accepts the reference correctly rounded so.
   */
  prompt?: string;
}

const DEFAULT_TIMEOUT_MS = 200;
const MAX_LENGTH = 4000;
const INTEGER = /^\s*\$?\s*(-?)0*(\d+)\s*\$?\s*$/;

/** The answer a free-form string states (see extractLoose), the string itself, or null when broken. */
function answerOf(s: string, lenient: boolean): string | null {
  const found = findLoose(s, lenient);
  return found === MALFORMED ? null : (found ?? s);
}

/** `0.\overline{3}` and `4.1\overline{6}`: repeating decimals as the fractions they are. */
function repeating(s: string): string {
  if (!s.includes('\\overline')) return s;
  return s.replace(
    /(\d*)\.(\d*)\\overline\s*\{\s*(\d+)\s*\}/g,
    (_m, int: string, fixed: string, rep: string) => {
      const whole = BigInt(`${int}${fixed}${rep}`) - BigInt(`${int}${fixed}` || '0');
      const den = BigInt(`${'9'.repeat(rep.length)}${'0'.repeat(fixed.length)}`);
      return `\\frac{${whole}}{${den}}`;
    },
  );
}

const STRICT: Policy = { exact: true, rounding: null };

function strictEqual(pred: string, ref: string, budget: Budget, policy: Policy): boolean {
  // Integer fast path (AIME): `025` is 25, nothing else is parsed.
  const pi = INTEGER.exec(pred);
  const ri = INTEGER.exec(ref);
  if (pi && ri) return pi[2] === ri[2] && (pi[1] === ri[1] || pi[2] === '0');
  const np = normalizeAnswer(pred);
  const nr = normalizeAnswer(ref);
  if (np === '' || nr === '') return false;
  if (np === nr) return true;
  let a: Answer;
  let b: Answer;
  try {
    a = parseAnswer(policy.exact ? repeating(pred) : pred, budget);
    b = parseAnswer(policy.exact ? repeating(ref) : ref, budget);
  } catch (error) {
    if (error instanceof Timeout) throw error;
    return false;
  }
  return answersEqual(a, b, budget, policy);
}

/**
 * True when `pred` states the same answer as `ref`. Both may be bare answers or text with a
 * `\boxed{}`/`<answer>` block. Never throws; parsing and comparison stop at `timeoutMs` (extraction
 * before them is a linear scan).
 */
export function isEquivalent(pred: string, ref: string, options: EquivalenceOptions = {}): boolean {
  const budget = new Budget(options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
  try {
    if (pred.length > 100_000 || ref.length > 100_000) return false;
    const rstar = options.compat === 'rstar';
    // The prediction is read strictly (broken markup is no answer); the reference is data.
    const p = answerOf(pred, rstar);
    const r = answerOf(ref, true);
    if (p === null || r === null) return false;
    if (options.kind === 'choice') {
      const lp = choiceLetter(p);
      return lp !== null && lp === choiceLetter(r);
    }
    if (p.length > MAX_LENGTH || r.length > MAX_LENGTH) return p.trim() === r.trim();
    if (rstar) {
      // The release's verdicts, unchanged: the lenient base comparison, then PRIME's leniencies.
      if (strictEqual(p, r, budget, LEGACY)) return true;
      budget.checkNow();
      return rstarLenient(pred, ref, budget);
    }
    const rounding = roundingOf(options.prompt);
    return strictEqual(p, r, budget, rounding ? { exact: true, rounding } : STRICT);
  } catch {
    // A timeout, a stack overflow on absurd nesting, or a bug on some odd input: the comparison
    // fails closed and rollout goes on.
    return false;
  }
}

export interface ScoredProblem {
  answer: string;
  /** The problem's text: its rounding instructions apply (see EquivalenceOptions.prompt). */
  prompt?: string;
  kind?: AnswerKind;
  choices?: string[];
}

/** The letter of the choice whose text the answer states, for `choice` problems answered in words. */
function letterFromChoices(answer: string, choices: string[] | undefined, compat: Compat): string | null {
  const letter = choiceLetter(answer);
  if (letter !== null || !choices) return letter;
  const i = choices.findIndex((c) => isEquivalent(answer, c, { compat }));
  return i === -1 ? null : String.fromCharCode(65 + i);
}

/** Extracts the final answer of a response and scores it 1 (correct) or 0 against the problem. */
export function scoreResponse(
  text: string,
  problem: ScoredProblem,
  options: { compat?: Compat } = {},
): { answer: string | null; reward: 0 | 1 } {
  const compat = options.compat ?? 'strict';
  let answer: string | null;
  try {
    answer = extractAnswer(text, { lenient: compat === 'rstar' });
  } catch {
    answer = null;
  }
  if (problem.kind === 'choice') {
    if (answer === null) return { answer: null, reward: 0 };
    const got = letterFromChoices(answer, problem.choices, compat);
    const want = letterFromChoices(problem.answer, problem.choices, compat);
    return { answer, reward: got !== null && got === want ? 1 : 0 };
  }
  if (compat === 'rstar') {
    // The release grades the whole response with its own extraction (Math-Verify's last formula or
    // number, PRIME's "answer is"/last "="), so an unboxed answer can still score.
    const ok =
      (answer !== null && isEquivalent(answer, problem.answer, { compat })) ||
      isEquivalent(text, problem.answer, { compat });
    return { answer: answer ?? safeLoose(text), reward: ok ? 1 : 0 };
  }
  if (answer === null) return { answer: null, reward: 0 };
  const ok = isEquivalent(answer, problem.answer, { compat, prompt: problem.prompt });
  return { answer, reward: ok ? 1 : 0 };
}

function safeLoose(text: string): string | null {
  try {
    return extractLoose(text, { lenient: true });
  } catch {
    return null;
  }
}
