/**
 * Verifier throughput on this machine: checks per second of
 *  - isEquivalent on AIME-style answers (integers, `025` against `25`: the integer fast path),
 *  - scoreResponse on AIME-style responses (extraction from a ~2 KB response, then the check),
 *  - isEquivalent on MATH-500 reference answers against a boxed copy and against a neighbour's
 *    answer (fractions, radicals, tuples, intervals, matrices, expressions),
 *  - the same MATH-500 pairs with a prompt that asks for rounding, and with --compat rstar.
 * Usage: npm run bench (or node dist/bench/verify.bench.js [--seconds N] [--json FILE])
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { isEquivalent, scoreResponse } from '../src/reward/index.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const secondsAt = process.argv.indexOf('--seconds');
const SECONDS = secondsAt > 0 ? Number(process.argv[secondsAt + 1]) : 1.5;
const jsonAt = process.argv.indexOf('--json');

const answers = (file: string): string[] =>
  readFileSync(`${ROOT}fixtures/${file}`, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => (JSON.parse(l) as { answer: string }).answer);

/** Runs `check(i)` over and over for SECONDS (after a warm-up) and returns checks per second. */
function rate(check: (i: number) => unknown): number {
  for (let i = 0; i < 2000; i++) check(i);
  let n = 0;
  const start = performance.now();
  const end = start + SECONDS * 1000;
  while (performance.now() < end) {
    for (let k = 0; k < 200; k++) check(n++);
  }
  return n / ((performance.now() - start) / 1000);
}

const aime = [...answers('aime_2024.jsonl'), ...answers('aime_2025.jsonl')];
const aimePred = aime.map((a, i) => (i % 2 === 0 ? a.padStart(3, '0') : String((Number(a) + 1) % 1000)));
const filler = 'We compute the sum step by step, checking each case with the tool. '.repeat(30);
const aimeText = aimePred.map(
  (p) => `<reason>${filler}</reason>\n<answer>The answer is \\boxed{${p}}.</answer><|im_end|>`,
);
const math = answers('math500.jsonl');
const mathPred = math.map((a, i) => (i % 2 === 0 ? `\\boxed{${a}}` : math[(i + 1) % math.length]));

/** A prompt with a rounding instruction (parsed once, then cached). */
const ROUND = 'Express your answer as a decimal to the nearest hundredth.';

const results = {
  aime_isEquivalent: rate((i) => isEquivalent(aimePred[i % aime.length], aime[i % aime.length])),
  aime_scoreResponse: rate((i) =>
    scoreResponse(aimeText[i % aime.length], { answer: aime[i % aime.length] }),
  ),
  math500_isEquivalent: rate((i) => isEquivalent(mathPred[i % math.length], math[i % math.length])),
  math500_isEquivalent_rounding: rate((i) =>
    isEquivalent(mathPred[i % math.length], math[i % math.length], { prompt: ROUND }),
  ),
  math500_isEquivalent_rstar: rate((i) =>
    isEquivalent(mathPred[i % math.length], math[i % math.length], { compat: 'rstar' }),
  ),
};

const fmt = (x: number) => Math.round(x).toLocaleString('en-US').padStart(12);
process.stdout.write('verifier checks per second (one core)\n');
process.stdout.write(
  `  AIME answers, isEquivalent            ${fmt(results.aime_isEquivalent)} /s  (goal >= 20,000)\n`,
);
process.stdout.write(`  AIME responses (~2 KB), scoreResponse ${fmt(results.aime_scoreResponse)} /s\n`);
process.stdout.write(`  MATH-500 answers, isEquivalent        ${fmt(results.math500_isEquivalent)} /s\n`);
process.stdout.write(
  `  MATH-500, prompt asks for rounding    ${fmt(results.math500_isEquivalent_rounding)} /s\n`,
);
process.stdout.write(
  `  MATH-500 answers, --compat rstar      ${fmt(results.math500_isEquivalent_rstar)} /s\n`,
);
if (jsonAt > 0) writeFileSync(process.argv[jsonAt + 1], `${JSON.stringify(results, null, 2)}\n`);
