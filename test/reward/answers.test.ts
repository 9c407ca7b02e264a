import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { choiceLetter, extractAnswer, isEquivalent, scoreResponse } from '../../src/reward/index.js';
import { ROOT } from '../support/helpers.js';

interface Case {
  pred: string;
  ref: string;
  equal: boolean;
}

const jsonl = <T>(file: string): T[] =>
  readFileSync(`${ROOT}${file}`, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as T);

describe('extractAnswer', () => {
  const cases: [string, string | null][] = [
    ['so the result is \\boxed{42}.', '42'],
    ['\\boxed{1} then later \\boxed{\\frac{1}{2}}', '\\frac{1}{2}'],
    ['nested \\boxed{\\frac{\\sqrt{3}}{2}} ok', '\\frac{\\sqrt{3}}{2}'],
    ['\\fbox{7}', '7'],
    ['\\boxed 5 is it', '5'],
    ['<reason>try \\boxed{3}</reason><answer>so \\boxed{4}</answer> and \\boxed{5}', '4'],
    ['<answer>The answer is 12.</answer> \\boxed{5}', '5'],
    ['\\boxed{1}, \\boxed{2} and \\boxed{3}', '1, 2, 3'],
    ['\\boxed{1} no no no \\boxed{2}', '2'],
    ['Thus the answer is $\\frac{3}{4}$.', '\\frac{3}{4}'],
    ['The final answer is 7.78. I hope it is correct.', '7.78'],
    ['the answer is C', 'C'],
    ['no answer here at all', null],
    // An unbalanced box is no answer (it used to run to the end of the text: gameable).
    ['unclosed \\boxed{12', null],
  ];
  for (const [text, want] of cases) {
    it(JSON.stringify(text), () => assert.equal(extractAnswer(text), want));
  }
});

describe('isEquivalent (strict)', () => {
  const equal: [string, string][] = [
    ['025', '25'],
    ['\\frac{1}{2}', '0.5'],
    ['\\dfrac{3}{4}', '3/4'],
    ['\\tfrac12', '\\frac{1}{2}'],
    ['2\\sqrt{2}', '\\sqrt{8}'],
    ['\\sqrt[3]{27}', '3'],
    ['2\\pi', '\\pi \\cdot 2'],
    ['1.5 \\times 10^{3}', '1500'],
    ['1.5e3', '1500'],
    ['50\\%', '50'],
    ['30^\\circ', '30'],
    ['5 \\text{ cm}', '5'],
    ['12,345', '12345'],
    ['11,\\! 111', '11111'],
    ['(-\\infty, 3]', 'x \\le 3'],
    ['[1,2) \\cup (3,4]', '[1,2)\\cup(3,4]'],
    ['x \\in [-2,7]', '-2 \\le x \\le 7'],
    ['(1, \\frac{9}{2})', '(1,4.5)'],
    ['\\{1,2,3\\}', '\\{3,2,1\\}'],
    ['3, 1, 2', '1,2,3'],
    ['\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}', '\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}'],
    ['x=3', '3'],
    ['(x+1)^2', 'x^2+2x+1'],
    ['\\sin^2 x + \\cos^2 x', '1'],
    ['\\frac{x+2}{7}', '\\frac{x}{7}+\\frac{2}{7}'],
    ['2x+4y-3=0', 'y=-\\frac{1}{2}x+\\frac{3}{4}'],
    ['1 \\pm \\sqrt{5}', '\\{1+\\sqrt{5}, 1-\\sqrt{5}\\}'],
    ['\\text{Evelyn}', 'evelyn'],
    ['2^{60}', '1152921504606846976'],
    ['x_{1}=10^{\\frac{-5+\\sqrt{13}}{6}},\\quad x_{2}=3', '3, 10^{\\frac{\\sqrt{13} - 5}{6}}'],
    ['(0;-2;6)', '(0,-2,6)'],
    ['V_1:V_2=11:21', '\\frac{11}{21}'],
    ['1000,99', '1000.99'],
  ];
  for (const [a, b] of equal) {
    it(`${a} = ${b}`, () => {
      assert.equal(isEquivalent(a, b), true);
      assert.equal(isEquivalent(b, a), true);
    });
  }
  const different: [string, string][] = [
    ['5', '500'],
    ['0.5', '50'],
    ['(3,4)', '(3,4]'],
    ['y=3', 'x=3'],
    ['25', '-25'],
    ['1', '01.5'],
    ['(1,2)', '(2,1)'],
    ['[1,2]', '(1,2)'],
    ['x<3', 'x \\le 3'],
    ['x+1', 'x+2'],
    ['3.14', '\\pi'],
    // A 4-place approximation of a non-terminating value used to count (gameable).
    ['2.6667', '\\frac{8}{3}'],
    ['0', '5x - 7y + 11z + 4 = 0'],
    ['1,2', '1,2,3'],
    ['f(y)', 'f(x)'],
    ['2^{60}', '1152921504606846977'],
    ['10^{400}', '10^{401}'],
    ['100!', '100!+1'],
    ['', '0'],
  ];
  for (const [a, b] of different) {
    it(`${a} != ${b}`, () => {
      assert.equal(isEquivalent(a, b), false);
      assert.equal(isEquivalent(b, a), false);
    });
  }
});

describe('multiple choice', () => {
  for (const pred of ['C', '(C)', '\\text{(C)}', '\\textbf{C}', 'C)', 'the answer is C', 'Option C']) {
    it(`${pred} is C`, () => assert.equal(isEquivalent(pred, 'C', { kind: 'choice' }), true));
  }
  it('reads the choice from short prose', () => {
    assert.equal(choiceLetter('The answer is A.'), 'A');
    assert.equal(choiceLetter('Final answer is B'), 'B');
    assert.equal(choiceLetter('A. Because B is not valid'), 'A');
    assert.equal(choiceLetter('Because B is valid'), 'B');
    assert.equal(choiceLetter('No valid answer here'), null);
  });
  it('a different letter or a name is not the choice', () => {
    assert.equal(isEquivalent('(B)', 'C', { kind: 'choice' }), false);
    assert.equal(isEquivalent('Carla', 'C', { kind: 'choice' }), false);
  });
  it('scores a choice answered by its text', () => {
    const problem = { answer: 'B', kind: 'choice' as const, choices: ['1/3', '1/2', '2/3', '3/4'] };
    assert.deepEqual(scoreResponse('so \\boxed{\\frac{1}{2}}', problem), {
      answer: '\\frac{1}{2}',
      reward: 1,
    });
    assert.deepEqual(scoreResponse('so \\boxed{(B)}', problem), { answer: '(B)', reward: 1 });
    assert.equal(scoreResponse('so \\boxed{(A)}', problem).reward, 0);
  });
});

describe('scoreResponse', () => {
  it('scores the boxed answer in the <answer> block', () => {
    const text = '<reason>maybe \\boxed{12}</reason>\n<answer>\\boxed{025}</answer><|im_end|>';
    assert.deepEqual(scoreResponse(text, { answer: '25' }), { answer: '025', reward: 1 });
    assert.deepEqual(scoreResponse(text, { answer: '12' }), { answer: '025', reward: 0 });
  });
  it('gives 0 without an answer', () => {
    assert.deepEqual(scoreResponse('I do not know', { answer: '3' }), { answer: null, reward: 0 });
  });
  it('in rstar compat, grades an unboxed response as the release does', () => {
    const text = 'We find the total is 7.78 dollars. Final Answer: The final answer is 7.78.';
    assert.equal(scoreResponse(text, { answer: '7.78' }).reward, 1);
    assert.equal(scoreResponse('so x = 12', { answer: '12' }).reward, 0);
    assert.equal(scoreResponse('so x = 12', { answer: '12' }, { compat: 'rstar' }).reward, 1);
  });
  it('is lenient in rstar compat only', () => {
    assert.equal(scoreResponse('\\boxed{5}', { answer: '500' }).reward, 0);
    assert.equal(scoreResponse('\\boxed{5}', { answer: '500' }, { compat: 'rstar' }).reward, 1);
  });
});

describe('Math-Verify cases (fixtures/verify-cases.jsonl)', () => {
  it('agree with at least 90% of the expected verdicts', () => {
    const cases = jsonl<Case>('fixtures/verify-cases.jsonl');
    assert.equal(cases.length, 147);
    const wrong = cases.filter((c) => isEquivalent(c.pred, c.ref) !== c.equal);
    const agreement = 1 - wrong.length / cases.length;
    assert.ok(
      agreement >= 0.9,
      `agreement ${agreement.toFixed(3)}; wrong: ${JSON.stringify(wrong.slice(0, 20))}`,
    );
  });
  it('rstar compat accepts everything strict accepts', () => {
    for (const c of jsonl<Case>('fixtures/verify-cases.jsonl')) {
      if (isEquivalent(c.pred, c.ref))
        assert.equal(isEquivalent(c.pred, c.ref, { compat: 'rstar' }), true, c.pred);
    }
  });
});

describe('gameable pairs (fixtures/verify-gameable.jsonl)', () => {
  const pairs = jsonl<{ pred: string; ref: string; rstar: boolean; why: string }>(
    'fixtures/verify-gameable.jsonl',
  );
  for (const p of pairs) {
    it(`${p.pred} vs ${p.ref}: ${p.why}`, () => {
      assert.equal(isEquivalent(p.pred, p.ref), false, 'strict must reject');
      assert.equal(isEquivalent(`\\boxed{${p.pred}}`, p.ref), false, 'strict must reject the boxed form');
      assert.equal(isEquivalent(p.pred, p.ref, { compat: 'rstar' }), p.rstar, 'rstar compat verdict');
    });
  }
});

describe('reference answers are self-consistent', () => {
  for (const file of ['fixtures/aime_2024.jsonl', 'fixtures/aime_2025.jsonl', 'fixtures/math500.jsonl']) {
    it(file, () => {
      const rows = jsonl<{ id: string; answer: string }>(file);
      assert.ok(rows.length >= 30);
      for (const { id, answer } of rows) {
        assert.ok(isEquivalent(answer, answer), `${id}: ${answer} vs itself`);
        assert.ok(isEquivalent(`\\boxed{${answer}}`, answer), `${id}: boxed ${answer}`);
        assert.ok(
          isEquivalent(`The answer is $\\boxed{${answer}}$.`, `\\boxed{${answer}}`),
          `${id}: in text`,
        );
      }
    });
  }
  it('neighbouring MATH-500 answers are told apart', () => {
    const rows = jsonl<{ answer: string }>('fixtures/math500.jsonl');
    const clash: string[] = [];
    for (let i = 0; i + 1 < rows.length; i++) {
      const [a, b] = [rows[i].answer, rows[i + 1].answer];
      if (a.replace(/\s/g, '') !== b.replace(/\s/g, '') && isEquivalent(a, b)) clash.push(`${a} ~ ${b}`);
    }
    // `x=5` names the value 5 (MATH-500 has both spellings next to each other).
    assert.deepEqual(clash, ['5 ~ x=5']);
  });
});

describe('near misses of MATH-500 answers', () => {
  /** A changed digit, a flipped sign, a swapped bracket, a dropped element, a renamed variable. */
  const perturb = (a: string): string[] => {
    const out: string[] = [];
    for (const m of [...a.matchAll(/\d/g)].slice(0, 4)) {
      const i = m.index ?? 0;
      out.push(a.slice(0, i) + String((Number(m[0]) + 1) % 10) + a.slice(i + 1));
    }
    if (/^\d+$/.test(a)) out.push(`${a}0`, String(Number(a) / 100), String(Number(a) * 100));
    if (a.startsWith('(') && a.endsWith(')')) out.push(`[${a.slice(1)}`, `${a.slice(0, -1)}]`);
    if (a.startsWith('[')) out.push(`(${a.slice(1)}`);
    if (a.includes('-')) out.push(a.replace('-', '+'));
    if (a.includes('+')) out.push(a.replace('+', '-'));
    if (a.includes('x')) out.push(a.replaceAll('x', 'y'));
    if (a.includes(',')) out.push(a.slice(0, a.lastIndexOf(',')) + (a.endsWith(')') ? ')' : ''));
    if (a.includes('\\le')) out.push(a.replace('\\le', '<'));
    if (a.includes('\\sqrt')) out.push(a.replace('\\sqrt', ''));
    if (a.includes('\\pi')) out.push(a.replace('\\pi', ''));
    out.push(`-${a}`);
    return out.filter((p) => p !== a);
  };
  /** Changes that do not change the answer: -0 and 00, a unit's exponent, a bracket at infinity. */
  const harmless = (p: string, a: string): boolean =>
    (/^-?0+$/.test(p) && a === '0') ||
    p.replace(/\^\d/g, '') === a.replace(/\^\d/g, '') ||
    (a.includes('\\infty') && p.replace(/[[\]()]/g, '') === a.replace(/[[\]()]/g, ''));

  it('are all rejected', () => {
    const accepted: string[] = [];
    let n = 0;
    for (const { answer } of jsonl<{ answer: string }>('fixtures/math500.jsonl')) {
      for (const p of perturb(answer)) {
        n += 1;
        if (isEquivalent(p, answer) && !harmless(p, answer)) accepted.push(`${p} ~ ${answer}`);
      }
    }
    assert.ok(n > 2000);
    assert.deepEqual(accepted, []);
  });
});

describe('random input', () => {
  it('never throws, whatever the text', () => {
    const atoms = [
      '\\frac',
      '\\sqrt',
      '{',
      '}',
      '(',
      ')',
      '[',
      ']',
      '\\{',
      '\\}',
      ',',
      '=',
      '<',
      '\\le',
      '\\pm',
    ];
    atoms.push(
      '^',
      '_',
      'x',
      'y',
      '2',
      '0',
      '1.5',
      '\\pi',
      '\\infty',
      '\\cup',
      '$',
      '\\boxed{',
      '\\text{',
      ' and ',
    );
    atoms.push(
      '\\\\',
      '&',
      '\\begin{pmatrix}',
      '\\end{pmatrix}',
      '!',
      '%',
      '-',
      '+',
      '/',
      '|',
      ':',
      '\\in',
      ' ',
      '\\',
    );
    atoms.push('answer is ', '<answer>', '</answer>', 'e', '\\sin', '.', "'", '\\left', '\\right');
    let seed = 12345;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    const gen = () =>
      Array.from(
        { length: 1 + Math.floor(rand() * 25) },
        () => atoms[Math.floor(rand() * atoms.length)],
      ).join('');
    for (let i = 0; i < 1500; i++) {
      const a = gen();
      const b = gen();
      extractAnswer(a);
      assert.equal(typeof isEquivalent(a, b, { timeoutMs: 50 }), 'boolean');
      assert.equal(typeof isEquivalent(a, a, { compat: 'rstar', timeoutMs: 50 }), 'boolean');
      assert.equal(typeof scoreResponse(a, { answer: b }).reward, 'number');
    }
  });
});

describe('time bound', () => {
  const nasty = [
    `${'\\frac{1}{'.repeat(3000)}1${'}'.repeat(3000)}`,
    `${'('.repeat(5000)}x${')'.repeat(5000)}`,
    '9^{9^{9^{9^{9}}}}',
    '100000!',
    Array.from({ length: 3000 }, (_, i) => `x_{${i}}`).join('+'),
    Array.from({ length: 400 }, (_, i) => `(${i}, ${i + 1})`).join(', '),
    '\\boxed{'.repeat(2000),
  ];
  for (const s of nasty) {
    it(`returns quickly on ${s.slice(0, 30)}…`, () => {
      const t = performance.now();
      const got = isEquivalent(s, `${s}+1`, { timeoutMs: 50 });
      assert.equal(typeof got, 'boolean');
      assert.ok(performance.now() - t < 1000, `took ${performance.now() - t} ms`);
      assert.equal(typeof scoreResponse(s, { answer: s }).reward, 'number');
    });
  }
});
