// Catches: wrong pass@k / avg@n / maj@n arithmetic (maj@n tie rules: half-rewarded winner, first-seen class), CSV and GPQA parsing slips.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { avgAtN, majorityVote, passAtK, passAtKCurve, reportedKs } from '../../src/algo/pass-at-k.js';
import { DataError } from '../../src/errors.js';
import { parseCsv } from '../../src/eval/csv.js';
import { gpqaProblems, LETTERS } from '../../src/eval/gpqa.js';
import { problemRecord, type Sample, summarize } from '../../src/eval/metrics.js';
import { makeReport, markdownReport } from '../../src/eval/report.js';
import { median, percentile } from '../../src/eval/stats.js';

/** Exact 1 - C(n-c,k)/C(n,k) with BigInt, to check the product form against. */
function exactPassAtK(n: number, c: number, k: number): number {
  const choose = (a: number, b: number): bigint => {
    if (b < 0 || b > a) return 0n;
    let r = 1n;
    for (let i = 1; i <= b; i += 1) r = (r * BigInt(a - b + i)) / BigInt(i);
    return r;
  };
  const num = choose(n - c, k);
  const den = choose(n, k);
  // Scale before dividing so the ratio keeps 15 significant digits.
  return 1 - Number((num * 10n ** 15n) / den) / 1e15;
}

describe('pass@k', () => {
  test('hand-computed values', () => {
    assert.equal(passAtK(4, 2, 1), 0.5);
    assert.ok(Math.abs((passAtK(4, 2, 2) ?? 0) - 5 / 6) < 1e-12); // 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert.ok(Math.abs((passAtK(10, 3, 4) ?? 0) - 5 / 6) < 1e-12); // 1 - C(7,4)/C(10,4) = 1 - 35/210
    assert.ok(Math.abs((passAtK(16, 1, 8) ?? 0) - 0.5) < 1e-12); // one correct in 16, draw half
    assert.equal(passAtK(5, 4, 2), 1); // fewer than k wrong samples: any k-subset holds a correct one
  });

  test('all correct, none correct', () => {
    for (const k of [1, 2, 4, 8, 16]) {
      assert.equal(passAtK(16, 16, k), 1);
      assert.equal(passAtK(16, 0, k), 0);
    }
  });

  test('k > n is undefined and left out of the curve', () => {
    assert.equal(passAtK(3, 1, 4), undefined);
    assert.equal(passAtK(0, 0, 1), undefined);
    assert.deepEqual(Object.keys(passAtKCurve(3, 1)), ['1', '2', '3']);
    assert.deepEqual(Object.keys(passAtKCurve(3, 1, [1, 2, 4, 8])), ['1', '2']);
  });

  test('matches the exact binomial form where binomials are huge', () => {
    for (const [n, c, k] of [
      [200, 50, 16],
      [200, 3, 64],
      [64, 10, 32],
      [1000, 1, 1],
    ]) {
      const p = passAtK(n, c, k) as number;
      assert.ok(Number.isFinite(p));
      assert.ok(Math.abs(p - exactPassAtK(n, c, k)) < 1e-12, `${n},${c},${k}: ${p}`);
    }
  });

  test('pass@1 equals avg@n', () => {
    for (let c = 0; c <= 16; c += 1)
      assert.ok(Math.abs((passAtK(16, c, 1) ?? -1) - (avgAtN(16, c) ?? -2)) < 1e-12);
  });

  test('reported k are powers of two up to n, plus n', () => {
    assert.deepEqual(reportedKs(16), [1, 2, 4, 8, 16]);
    assert.deepEqual(reportedKs(12), [1, 2, 4, 8, 12]);
    assert.deepEqual(reportedKs(1), [1]);
    assert.deepEqual(reportedKs(0), []);
  });

  test('rejects impossible counts', () => {
    assert.throws(() => passAtK(4, 5, 1), RangeError);
    assert.throws(() => passAtK(4, 1, 0), RangeError);
    assert.throws(() => avgAtN(2, -1), RangeError);
  });
});

describe('majority vote', () => {
  test('counts votes, ignores null answers, breaks ties by first seen', () => {
    assert.deepEqual(majorityVote(['3', null, '5', '5', null, null]), {
      answer: '5',
      votes: 2,
      members: [2, 3],
    });
    assert.equal(majorityVote(['1', '2', '2', '1'])?.answer, '1');
    assert.equal(majorityVote([null, null]), null);
  });

  test('groups answers with the equivalence it is given', () => {
    const value = (s: string) => {
      const [a, b] = s.split('/').map(Number);
      return b === undefined ? a : a / b;
    };
    const result = majorityVote(['1/2', '3', '0.5', '3', '2/4'], (a, b) => value(a) === value(b));
    assert.equal(result?.answer, '1/2');
    assert.equal(result?.votes, 3);
  });
});

function sample(problem: string, i: number, over: Partial<Sample> = {}): Sample {
  return {
    problem_id: problem,
    sample: i,
    policy: 'p',
    reward: 0,
    answer: null,
    tokens: 100,
    model_tokens: 80,
    tool_calls: 0,
    tool_errors: 0,
    answer_tags: 1,
    finish: 'stop',
    ...over,
  };
}

const exactSame = async (a: string, b: string) => a === b;

describe('per-problem records and summaries', () => {
  test('maj@n is right when most of the winning class was rewarded', async () => {
    const samples = [
      sample('q', 3, { answer: '7', reward: 0 }),
      sample('q', 0, { answer: '12', reward: 1 }),
      sample('q', 1, { answer: '12', reward: 1 }),
      sample('q', 2, { answer: null, answer_tags: 0, finish: 'length' }),
    ];
    const r = await problemRecord('b', 'q', samples, exactSame);
    assert.equal(r.n, 4);
    assert.equal(r.correct, 2);
    assert.equal(r['maj@n'], 1);
    assert.equal(r.maj_answer, '12');
    assert.equal(r.format_violations, 1);
    assert.deepEqual(r.finish, { stop: 3, length: 1 });
    const wrong = await problemRecord(
      'b',
      'q',
      [
        sample('q', 0, { answer: '7' }),
        sample('q', 1, { answer: '7' }),
        sample('q', 2, { answer: '9', reward: 1 }),
      ],
      exactSame,
    );
    assert.equal(wrong['maj@n'], 0);
    assert.equal(wrong.correct, 1);
  });

  test('maj@n tie rules: exactly half the winning class rewarded counts; tied classes go to the first seen', async () => {
    // "at least half of the winning class's samples were rewarded" (docs/eval.md): 1 of 2 is enough.
    const half = await problemRecord(
      'b',
      'q',
      [
        sample('q', 0, { answer: '4', reward: 1 }),
        sample('q', 1, { answer: '4', reward: 0 }),
        sample('q', 2, { answer: '5', reward: 0 }),
      ],
      exactSame,
    );
    assert.deepEqual([half.maj_answer, half.maj_votes, half['maj@n']], ['4', 2, 1]);
    // Two classes of two votes: the one seen first in sample order wins, whatever its reward.
    const tied = (first: string) =>
      problemRecord(
        'b',
        'q',
        [
          sample('q', 0, { answer: first, reward: first === '8' ? 1 : 0 }),
          sample('q', 1, { answer: first === '8' ? '9' : '8', reward: first === '8' ? 0 : 1 }),
          sample('q', 2, { answer: first, reward: first === '8' ? 1 : 0 }),
          sample('q', 3, { answer: first === '8' ? '9' : '8', reward: first === '8' ? 0 : 1 }),
        ],
        exactSame,
      );
    const right = await tied('8');
    assert.deepEqual([right.maj_answer, right['maj@n']], ['8', 1]);
    const wrong = await tied('9');
    assert.deepEqual([wrong.maj_answer, wrong['maj@n']], ['9', 0]);
  });

  test('summary: macro averages, pass@k up to the smallest n, tool and length statistics', async () => {
    const a = [0, 1, 2, 3].map((i) =>
      sample('a', i, { reward: 1, answer: '1', tokens: 100 * (i + 1), tool_calls: 2, tool_errors: 1 }),
    );
    const b = [0, 1].map((i) =>
      sample('b', i, { answer: null, answer_tags: i, tokens: 1000, tool_calls: 1 }),
    );
    const records = [
      await problemRecord('x', 'a', a, exactSame),
      await problemRecord('x', 'b', b, exactSame),
    ];
    const s = summarize('x', records, [...a, ...b], { equivalence: false, reverified: false });
    assert.equal(s['avg@n'], 0.5); // (4/4 + 0/2) / 2
    assert.deepEqual(Object.keys(s['pass@k']), ['1', '2']); // n = min(4, 2)
    assert.equal(s['pass@k']['2'], 0.5);
    assert.equal(s['maj@n'], 0.5);
    assert.equal(s.n, 2);
    assert.equal(s.n_max, 4);
    assert.equal(s.tool_calls, 10);
    assert.equal(s.tool_errors, 4);
    assert.equal(s.tool_error_rate, 0.4);
    assert.equal(s.tool_calls_per_traj, 10 / 6);
    assert.equal(s.format_violations, 2);
    assert.equal(s.mean_tokens, (100 + 200 + 300 + 400 + 2000) / 6);
    assert.equal(s.median_tokens, 350);
    assert.equal(s.p90_tokens, 1000);
    assert.equal(s.policy, 'p');
    assert.equal(s.trajectories, 6);
  });

  test('format violations by finish reason and by their last call', async () => {
    const samples = [
      sample('a', 0, { answer: '1', reward: 1, tool_status: ['failed', 'ok'] }), // answered: no violation
      sample('a', 1, { finish: 'length', tool_calls: 3, tool_status: ['ok', 'failed', 'failed'] }),
      sample('a', 2, { finish: 'length', tool_calls: 2, tool_status: ['failed', 'ok'] }), // recovered, then ran out
      sample('b', 0, { finish: 'max_turns', tool_calls: 1, tool_status: ['unparsable'] }),
      sample('b', 1, { answer_tags: 0 }), // stopped without an answer, no call
      sample('b', 2, { answer: '2', answer_tags: 0, finish: 'stop', tool_status: ['failed'] }),
    ];
    const records = [
      await problemRecord('x', 'a', samples.slice(0, 3), exactSame),
      await problemRecord('x', 'b', samples.slice(3), exactSame),
    ];
    const s = summarize('x', records, samples, { equivalence: false, reverified: false });
    assert.equal(s.format_violations, 5);
    assert.deepEqual(s.format_violations_by_finish, { length: 2, max_turns: 1, stop: 2 });
    assert.equal(s.format_violations_after_failed_call, 2);
    assert.equal(s.format_violations_after_unparsable_call, 1);
    const md = markdownReport(makeReport([s]), { lengths: {} });
    assert.match(md, /- x: length 2, max_turns 1, stop 2; last call failed 2, unparsable 1/);
  });

  test('median and nearest-rank percentile', () => {
    assert.equal(median([3, 1, 2]), 2);
    assert.equal(median([4, 1, 3, 2]), 2.5);
    assert.equal(percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9), 9);
    assert.equal(percentile([5], 0.9), 5);
    assert.equal(median([]), 0);
  });
});

describe('CSV', () => {
  test('quotes, doubled quotes, embedded newlines and commas, CRLF, BOM', () => {
    const rows = parseCsv('\ufeffa,b\r\n"x, ""y""","line1\nline2"\r\n\r\nlast,\n', 'f.csv');
    assert.deepEqual(
      rows.map((r) => r.fields),
      [
        ['a', 'b'],
        ['x, "y"', 'line1\nline2'],
        ['last', ''],
      ],
    );
    assert.deepEqual(
      rows.map((r) => r.line),
      [1, 2, 5],
    );
  });

  test('unterminated quote names the line where the record starts', () => {
    assert.throws(() => parseCsv('a,b\n1,2\n"open,3\n4\n', 'f.csv'), /f\.csv:3: invalid CSV: unterminated/);
  });
});

const HEADER =
  'Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3,Subdomain,Record ID';

function gpqaCsv(rows: number): string {
  const lines = [HEADER];
  for (let i = 0; i < rows; i += 1)
    lines.push(`"Question ${i}, which?",right${i},wrong${i}a,wrong${i}b,wrong${i}c,Sub${i % 3},rec${i}`);
  return `${lines.join('\n')}\n`;
}

describe('GPQA', () => {
  test('the answer letter points at the correct answer; choices hold all four options', () => {
    const problems = gpqaProblems(gpqaCsv(12), 'g.csv', { seed: 1 });
    assert.equal(problems.length, 12);
    problems.forEach((p, i) => {
      assert.equal(p.kind, 'choice');
      const slot = LETTERS.indexOf(p.answer as (typeof LETTERS)[number]);
      assert.ok(slot >= 0);
      assert.equal(p.choices?.[slot], `right${i}`);
      assert.deepEqual(
        [...(p.choices ?? [])].sort(),
        [`right${i}`, `wrong${i}a`, `wrong${i}b`, `wrong${i}c`].sort(),
      );
      assert.ok(p.prompt.startsWith(`Question ${i}, which?\n\nA) `));
      assert.ok(p.prompt.includes(`${p.answer}) right${i}`));
      assert.equal(p.id, `gpqa-rec${i}`);
      assert.equal(p.meta?.Subdomain, `Sub${i % 3}`);
    });
  });

  test('seeded: the same seed gives the same problems, another seed another order', () => {
    const text = gpqaCsv(40);
    assert.deepEqual(gpqaProblems(text, 'g.csv', { seed: 7 }), gpqaProblems(text, 'g.csv', { seed: 7 }));
    const a = gpqaProblems(text, 'g.csv', { seed: 7 }).map((p) => p.choices?.join('|'));
    const b = gpqaProblems(text, 'g.csv', { seed: 8 }).map((p) => p.choices?.join('|'));
    assert.notDeepEqual(a, b);
  });

  test('balanced: each letter is correct equally often (within one)', () => {
    for (const [rows, seed] of [
      [8, 0],
      [103, 3],
      [198, 42],
    ]) {
      const counts = new Map<string, number>(LETTERS.map((l) => [l, 0]));
      for (const p of gpqaProblems(gpqaCsv(rows), 'g.csv', { seed }))
        counts.set(p.answer, (counts.get(p.answer) ?? 0) + 1);
      const values = [...counts.values()];
      assert.ok(Math.max(...values) - Math.min(...values) <= 1, `${rows} rows: ${values}`);
    }
  });

  test('missing columns and ragged rows are errors naming FILE:LINE', () => {
    assert.throws(
      () => gpqaProblems('Question,Correct Answer\nq,a\n', 'g.csv'),
      (e: Error) =>
        e instanceof DataError && /^g\.csv:1: Incorrect Answer 1: missing GPQA column/.test(e.message),
    );
    const ragged = `${HEADER}\n"multi\nline",r,w1,w2,w3,S,rec0\nq,r,w1,w2\n`;
    assert.throws(
      () => gpqaProblems(ragged, 'g.csv'),
      /^DataError: g\.csv:4: \(record\): 4 fields, the header has 7/,
    );
    assert.throws(
      () => gpqaProblems(`${HEADER}\nq,,w1,w2,w3,S,r\n`, 'g.csv'),
      /g\.csv:2: Correct Answer: empty/,
    );
  });
});
