import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { extractAnswer, isEquivalent, parseRounding, scoreResponse } from '../../src/reward/index.js';

/** Strict-mode rules of the reward (docs/verify.md): exact decimals, rounding, broken markup. */

const both = (a: string, b: string, options = {}) => [
  isEquivalent(a, b, options),
  isEquivalent(b, a, options),
];

describe('decimals against exact values', () => {
  const equal: [string, string][] = [
    ['0.25', '\\frac{1}{4}'],
    ['0.5', '\\frac12'],
    ['\\frac12', '1/2'],
    ['2.50', '5/2'],
    ['1e-3', '0.001'],
    ['1.5\\times 10^{-2}', '\\frac{3}{200}'],
    ['3.14', '3.140'],
    ['0.125', '2^{-3}'],
    ['1.5', '\\sqrt{2.25}'],
    ['0.5', '\\sin\\frac{\\pi}{6}'],
    ['4.\\overline{6}', '\\frac{14}{3}'],
    ['0.\\overline{3}', '\\frac13'],
    ['-0.75', '-\\frac{3}{4}'],
    ['12', '12.0'],
  ];
  for (const [a, b] of equal) it(`${a} = ${b}`, () => assert.deepEqual(both(a, b), [true, true]));
  const different: [string, string][] = [
    ['4.6667', '\\frac{14}{3}'],
    ['4.67', '\\frac{14}{3}'],
    ['4.666666666666667', '\\frac{14}{3}'],
    ['4.66666666666666666667', '14/3'],
    ['0.3333', '1/3'],
    ['0.0833333333333333', '\\frac{1}{12}'],
    ['2.6667', '\\frac{8}{3}'],
    ['3.14', '3.1416'],
    ['3.1416', '3.14159'],
    ['1.0001', '1'],
    ['\\frac{46667}{10000}', '\\frac{14}{3}'],
  ];
  for (const [a, b] of different) it(`${a} != ${b}`, () => assert.deepEqual(both(a, b), [false, false]));
});

describe('approximations of π multiples and surds', () => {
  const different: [string, string][] = [
    ['14.6608', '\\frac{14\\pi}{3}'],
    ['14.660765716752367', '\\frac{14\\pi}{3}'],
    ['3.1416', '\\pi'],
    ['6.2832', '2\\pi'],
    ['4.6667\\pi', '\\frac{14}{3}\\pi'],
    ['4.666666666666667\\pi', '\\frac{14\\pi}{3}'],
    ['10.8167', '3\\sqrt{13}'],
    ['10.816653826391969', '3\\sqrt{13}'],
    ['\\frac{10816653826391969}{1000000000000000}', '3\\sqrt{13}'],
    ['3.6056', '\\sqrt{13}'],
    ['1.4142135623730951', '\\sqrt{2}'],
    ['0.7071', '\\frac{\\sqrt2}{2}'],
    ['1.4142135623730951x', '\\sqrt{2}x'],
    ['0.333333333333333x', '\\frac{x}{3}'],
    ['2.718281828459045', 'e'],
  ];
  for (const [a, b] of different) it(`${a} != ${b}`, () => assert.deepEqual(both(a, b), [false, false]));
  const equal: [string, string][] = [
    ['\\sqrt{12}', '2\\sqrt3'],
    ['\\frac{\\pi}{2}', '\\pi/2'],
    ['3\\sqrt{13}', '\\sqrt{117}'],
    ['0.5\\pi', '\\frac{\\pi}{2}'],
    ['0.5x', '\\frac{x}{2}'],
    ['2', '\\log_2 4'],
  ];
  for (const [a, b] of equal) it(`${a} = ${b}`, () => assert.deepEqual(both(a, b), [true, true]));
});

describe('tuples, intervals, sets and relations, element-wise', () => {
  const different: [string, string][] = [
    ['(4.6667, 2)', '(\\frac{14}{3}, 2)'],
    ['(2, 10.8167)', '(2, 3\\sqrt{13})'],
    ['[4.6667, 5)', '[\\frac{14}{3}, 5)'],
    ['(-\\infty, 14.6608]', '(-\\infty, \\frac{14\\pi}{3}]'],
    ['\\{4.6667, 1\\}', '\\{\\frac{14}{3}, 1\\}'],
    ['4.6667, 1', '1, \\frac{14}{3}'],
    ['x > 4.666666666666667', 'x > \\frac{14}{3}'],
    ['x \\ge 4.6667', '[\\frac{14}{3}, \\infty)'],
    ['x = 4.666666666666667', 'x = \\frac{14}{3}'],
    ['\\begin{pmatrix}0.3333\\\\1\\end{pmatrix}', '\\begin{pmatrix}\\frac13\\\\1\\end{pmatrix}'],
  ];
  for (const [a, b] of different) it(`${a} != ${b}`, () => assert.deepEqual(both(a, b), [false, false]));
  const equal: [string, string][] = [
    ['(0.25, 2.5)', '(\\frac14, \\frac52)'],
    ['[0.5, \\infty)', 'x \\ge \\frac12'],
    ['\\{0.5, 1\\}', '\\{1, \\frac{1}{2}\\}'],
    ['x = 0.25', 'x=\\frac14'],
  ];
  for (const [a, b] of equal) it(`${a} = ${b}`, () => assert.deepEqual(both(a, b), [true, true]));
});

describe('rounding asked by the problem', () => {
  const accepted: [string, string, string][] = [
    ['4.67', '\\frac{14}{3}', 'Express your answer as a decimal to the nearest hundredth.'],
    ['4.7', '\\frac{14}{3}', 'Round your answer to the nearest tenth.'],
    ['5', '\\frac{14}{3}', 'Round to the nearest integer.'],
    ['5', '\\frac{14}{3}', 'What is x, to the nearest whole number?'],
    ['14.66', '\\frac{14\\pi}{3}', 'Give the area to the nearest hundredth of a square unit.'],
    ['10.82', '3\\sqrt{13}', 'Give your answer to 2 decimal places.'],
    ['10.817', '3\\sqrt{13}', 'Answer correct to three decimal places.'],
    ['10.8', '3\\sqrt{13}', 'to 3 significant figures'],
    ['(4.67, 2)', '(\\frac{14}{3}, 2)', 'Round each coordinate to the nearest hundredth.'],
    ['\\{4.67, 1\\}', '\\{\\frac{14}{3}, 1\\}', 'rounded to the nearest hundredth'],
    ['3.14', '3.1416', 'Round to the nearest hundredth.'],
    ['4.667', '\\frac{14}{3}', 'nearest thousandth'],
    ['1230', '1234.4', 'Round to the nearest ten.'],
    ['5', '\\frac92', 'to the nearest integer'],
    ['-5', '-\\frac92', 'to the nearest integer'],
    ['4.67', '\\frac{14}{3}', 'Round your answer.'],
    ['33.3', '\\frac{100}{3}', 'to the nearest tenth of a percent'],
    ['4.5', '\\frac{14}{3}', 'to the nearest 0.5'],
    ['5', '\\frac{14}{3}', 'rounded up to the nearest integer'],
  ];
  for (const [a, b, prompt] of accepted) {
    it(`${a} for ${b}: "${prompt}"`, () => assert.equal(isEquivalent(a, b, { prompt }), true));
  }
  const rejected: [string, string, string][] = [
    ['4.67', '\\frac{14}{3}', 'Round your answer to the nearest tenth.'],
    ['4.66', '\\frac{14}{3}', 'to the nearest hundredth'],
    ['4.6', '\\frac{14}{3}', 'to the nearest tenth'],
    ['14.67', '\\frac{14\\pi}{3}', 'to the nearest hundredth'],
    ['3.1416', '3.14', 'Round to the nearest hundredth.'],
    ['4', '\\frac92', 'to the nearest integer'],
    ['4.7', '\\frac{14}{3}', 'Round your answer.'],
    ['4.67', '\\frac{14}{3}', 'Express your answer as a decimal.'],
    ['4.67', '\\frac{14}{3}', 'A round table seats 14 people in 3 rows.'],
    ['5', '\\frac{14}{3}', 'Let f(x) be the nearest integer to x. Find f(14)/3.'],
    ['4', '\\frac{14}{3}', 'rounded up to the nearest integer'],
    ['4.67', '\\frac{14}{3}', 'Express your answer as a common fraction.'],
  ];
  for (const [a, b, prompt] of rejected) {
    it(`not ${a} for ${b}: "${prompt}"`, () => assert.equal(isEquivalent(a, b, { prompt }), false));
  }
  it('without the prompt, the rounded value is not the answer', () => {
    assert.equal(isEquivalent('4.67', '\\frac{14}{3}'), false);
  });
  it('scoreResponse applies the problem prompt', () => {
    const problem = { answer: '\\frac{14}{3}', prompt: 'Round to the nearest hundredth.' };
    assert.equal(scoreResponse('<answer>\\boxed{4.67}</answer>', problem).reward, 1);
    assert.equal(scoreResponse('<answer>\\boxed{4.6667}</answer>', problem).reward, 0);
    assert.equal(scoreResponse('<answer>\\boxed{4.67}</answer>', { answer: '\\frac{14}{3}' }).reward, 0);
  });
  it('reads the precisions a prompt asks for', () => {
    const of = (p: string) => {
      const r = parseRounding(p);
      return (
        r && { steps: r.steps.map((s) => `${s.n}/${s.d}`), sig: r.significant, free: r.free, mode: r.mode }
      );
    };
    assert.deepEqual(of('Round to the nearest tenth.'), {
      steps: ['1/10'],
      sig: [],
      free: false,
      mode: 'nearest',
    });
    assert.deepEqual(of('to two decimal places')?.steps, ['1/100']);
    assert.deepEqual(of('to the nearest whole number')?.steps, ['1/1']);
    assert.deepEqual(of('to the nearest hundred')?.steps, ['100/1']);
    assert.deepEqual(of('to 4 significant digits')?.sig, [4]);
    assert.equal(of('Round your answer.')?.free, true);
    assert.equal(of('Find the closest integer to x.'), null);
    assert.equal(of('A round pizza is cut into 8 slices.'), null);
    assert.equal(of('Express your answer as a decimal.'), null);
  });
});

describe('unbalanced markup is no answer', () => {
  const responses = [
    '<answer>\\boxed{12</answer>',
    '<answer>The answer is \\boxed{12</answer><|im_end|>',
    '<answer>\\boxed{\\frac{1}{2}</answer>',
    'so \\boxed{12',
    '\\boxed{3} and then \\boxed{4',
    '<answer>\\boxed{\\{1, 2}</answer>',
    '<answer>\\boxed{$12}</answer>',
    'The answer is $\\frac{1}{2',
    'The answer is $12',
    'The answer is \\frac{1}{2.',
  ];
  for (const text of responses) {
    it(JSON.stringify(text), () => {
      assert.equal(extractAnswer(text), null);
      assert.deepEqual(scoreResponse(text, { answer: '12' }), { answer: null, reward: 0 });
      assert.equal(scoreResponse(text, { answer: '\\frac12' }).reward, 0);
    });
  }
  for (const pred of ['\\frac{1}{2', '{12', '12}', '$12', '12$', '\\sqrt{4', '\\boxed{12']) {
    it(`pred ${pred}`, () => assert.equal(isEquivalent(pred, pred.includes('frac') ? '1/2' : '12'), false));
  }
  it('balanced answers still count', () => {
    assert.equal(extractAnswer('<answer>\\boxed{\\frac{1}{2}}</answer>'), '\\frac{1}{2}');
    assert.equal(extractAnswer('\\boxed{3 oops. Final: \\boxed{4}'), '4');
    assert.equal(extractAnswer('<answer>\\boxed{\\{1,2\\}}</answer>'), '\\{1,2\\}');
    assert.equal(extractAnswer('The answer is $12$.'), '12');
    assert.equal(isEquivalent('$\\frac12$', '0.5'), true);
    assert.equal(isEquivalent('Soucis : 2,74 $ a..', '2.74'), true);
  });
});

describe('--compat rstar keeps the release verdicts', () => {
  const lenient: [string, string][] = [
    ['4.6667', '\\frac{14}{3}'],
    ['2.6667', '\\frac{8}{3}'],
    ['3.1416', '\\pi'],
    ['3.14', '\\pi'],
    ['10.8167', '3\\sqrt{13}'],
    ['0.0833333333333333', '\\frac{1}{12}'],
    ['(4.6667, 2)', '(\\frac{14}{3}, 2)'],
  ];
  for (const [a, b] of lenient) {
    it(`${a} vs ${b}: strict rejects, rstar accepts`, () => {
      assert.equal(isEquivalent(a, b), false);
      assert.equal(isEquivalent(a, b, { compat: 'rstar' }), true);
    });
  }
  it('reads an unclosed box as the release does', () => {
    const text = '<answer>\\boxed{12</answer>';
    assert.equal(extractAnswer(text, { lenient: true }), '12');
    assert.deepEqual(scoreResponse(text, { answer: '12' }, { compat: 'rstar' }), { answer: '12', reward: 1 });
    assert.equal(isEquivalent('\\boxed{12', '12', { compat: 'rstar' }), true);
  });
  it('ignores the prompt', () => {
    const prompt = 'Round to the nearest tenth.';
    assert.equal(isEquivalent('4.7', '\\frac{14}{3}', { compat: 'rstar', prompt }), false);
  });
});
