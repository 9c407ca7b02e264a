// Catches: RoC selection drifting from the release (rounding, minimum bounds `<=` at the boundary, penalty order, slicing).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatPenalty, scoreText, toolErrorPenalty } from '../../src/algo/penalty.js';
import { roundHalfEven } from '../../src/algo/py-round.js';
import {
  groupRandom,
  isClose32,
  type RocCandidate,
  type RocOptions,
  rocSelect,
  weightedOrder,
} from '../../src/algo/roc.js';

const TURN = (body: string) => `<|im_start|>assistant${body}<|im_end|>`;
const OK = '<tool_response>\nTool call success\nstdout: 4\n</tool_response>';
const ERR = '<tool_response>\nTool call failure\nreason: Traceback ... NameError\n</tool_response>';

describe('roundHalfEven (Python round)', () => {
  it('rounds ties to the even neighbour', () => {
    const cases: [number, number][] = [
      [0.5, 0],
      [1.5, 2],
      [2.5, 2],
      [3.5, 4],
      [4.5, 4],
      [7.5, 8],
      [-0.5, 0],
      [-1.5, -2],
      [2.4999999999999996, 2],
      [2.5000000000000004, 3],
      [(7 * 16) / 32, 4], // 3.5
      [(5 * 16) / 32, 2], // 2.5
      [(9 * 16) / 32, 4], // 4.5
      [(3 * 7) / 6, 4], // 3.5
      [(1 * 16) / 3, 5],
    ];
    for (const [x, want] of cases) assert.equal(roundHalfEven(x) + 0, want, `round(${x})`);
  });
});

describe('penalties (calc_error_ratio / calc_format penalty weights)', () => {
  it('tool error ratio: share of responses mentioning error in any case, 0.5 without responses', () => {
    assert.deepEqual(toolErrorPenalty('no tools'), { penalty: 0.5, errors: 0, responses: 0 });
    assert.equal(toolErrorPenalty(`${OK}${ERR}`).penalty, 0.5);
    assert.equal(toolErrorPenalty(`${OK}<tool_response>ERROR</tool_response>${OK}`).penalty, 1 / 3);
    assert.equal(toolErrorPenalty('<tool_response>StdErr: x</tool_response>').penalty, 0);
    assert.equal(toolErrorPenalty('<tool_response>stdERRor</tool_response>').penalty, 1);
    // Lazy match: the first closing tag ends the block; "error" outside any block does not count.
    assert.deepEqual(toolErrorPenalty('<tool_response>a</tool_response> error </tool_response>'), {
      penalty: 0,
      errors: 0,
      responses: 1,
    });
    // Blocks span lines (DOTALL); an unclosed block is not a response.
    assert.equal(
      toolErrorPenalty('<tool_response>\nerror\n</tool_response><tool_response>error').responses,
      1,
    );
  });

  it('format: missing or unbalanced tags cost 1; else (answers - 1) / turns capped at 1', () => {
    assert.deepEqual(formatPenalty('no answer'), { penalty: 1, answerTags: 0 });
    assert.deepEqual(formatPenalty('<answer>1'), { penalty: 1, answerTags: 0 });
    assert.deepEqual(formatPenalty('<answer>1</answer>'), { penalty: 1, answerTags: 1 }); // no delimited turn
    assert.deepEqual(formatPenalty(`${TURN('x')}<answer>1</answer>`), { penalty: 0, answerTags: 1 });
    assert.deepEqual(formatPenalty(`${TURN('<answer>1</answer>')}<answer>2</answer>`), {
      penalty: 1,
      answerTags: 2,
    });
    assert.deepEqual(
      formatPenalty(`${TURN('a')}${TURN('b')}${TURN('c')}<answer>1</answer><answer>2</answer>`),
      {
        penalty: 1 / 3,
        answerTags: 2,
      },
    );
    // Three answers over one turn: (3 - 1) / 1 = 2, capped at 1.
    assert.equal(
      formatPenalty(`${TURN('a')}<answer>1</answer><answer>2</answer><answer>3</answer>`).penalty,
      1,
    );
    // Unbalanced: an extra opening tag.
    assert.deepEqual(formatPenalty(`${TURN('a')}<answer><answer>1</answer>`), { penalty: 1, answerTags: 1 });
    // Nested tags: one lazy match, two openings -> unbalanced.
    assert.equal(formatPenalty(`${TURN('a')}<answer>x<answer>y</answer></answer>`).penalty, 1);
  });

  it('total follows --penalty', () => {
    const text = `${TURN('a')}${ERR}<answer>1</answer>`;
    assert.deepEqual(scoreText(text).penalty, { tool_error: 1, format: 0, total: 1 });
    assert.equal(scoreText('plain', 'rstar').penalty.total, 1.5);
    assert.equal(scoreText('plain', 'tool-error').penalty.total, 0.5);
    assert.equal(scoreText('plain', 'format').penalty.total, 1);
    assert.equal(scoreText('plain', 'none').penalty.total, 0);
  });
});

const OPTS: RocOptions = { keep: 16, minPos: 2, minNeg: 2, rejectEqual: true, positives: 'sorted' };
/** A group from a string of '+' and '-' with optional penalties. */
function group(pattern: string, penalties: number[] = []): RocCandidate[] {
  return [...pattern].map((c, i) => ({ sample: i, reward: c === '+' ? 1 : 0, penalty: penalties[i] ?? 0 }));
}

describe('rocSelect (resample_of_correct per uid)', () => {
  it('rejects equal rewards first, unless disabled', () => {
    assert.equal(rocSelect(group('+'.repeat(32)), OPTS).outcome, 'rejected-equal');
    assert.equal(rocSelect(group('-'.repeat(32)), OPTS).outcome, 'rejected-equal');
    const d = rocSelect(group('-'.repeat(32)), { ...OPTS, rejectEqual: false });
    assert.equal(d.outcome, 'sampled');
    assert.deepEqual(
      d.kept,
      Array.from({ length: 16 }, (_, i) => i),
    );
  });

  it('compares rewards as float32 with torch.allclose tolerances', () => {
    assert.equal(isClose32(1, 1 + 1e-6), true); // within rtol
    assert.equal(isClose32(1, 1.0001), false);
    assert.equal(isClose32(0, 1e-9), true); // within atol
    assert.equal(isClose32(0, 1e-7), false);
    // 1e-46 is 0 in float32, so it is neither positive nor different from 0.
    assert.equal(
      rocSelect(group('--'), { ...OPTS, keep: 1, minPos: 0, minNeg: 0 }).outcome,
      'rejected-equal',
    );
    const tiny = [
      { sample: 0, reward: 1e-46, penalty: 0 },
      { sample: 1, reward: 0, penalty: 0 },
      { sample: 2, reward: 1, penalty: 0 },
    ];
    const d = rocSelect(tiny, { ...OPTS, keep: 2, minPos: 1, minNeg: 1 });
    assert.deepEqual([d.positives, d.negatives], [1, 1]);
  });

  it('drops a group smaller than --keep and keeps one of exactly --keep whole', () => {
    assert.deepEqual(rocSelect(group('+-'.repeat(7)), OPTS), {
      outcome: 'too-small',
      kept: [],
      positives: 0,
      negatives: 0,
      sizeMismatch: false,
    });
    const whole = rocSelect(group(`${'+'.repeat(15)}-`), OPTS);
    assert.equal(whole.outcome, 'kept-whole');
    assert.equal(whole.kept.length, 16);
  });

  it('keeps the proportional split, positives by lowest penalty (stable), negatives in sample order', () => {
    // 16 positives with penalties, 16 negatives: 8 + 8.
    const pattern = '+-'.repeat(16);
    const penalties = pattern.split('').map((_, i) => (i % 4 === 0 ? 1 : 0.5));
    const d = rocSelect(group(pattern, penalties), OPTS);
    assert.equal(d.outcome, 'sampled');
    assert.deepEqual([d.positives, d.negatives], [8, 8]);
    // Positives with penalty 0.5 are the odd multiples of 2 (2, 6, 10, ...): the 8 of them, all kept.
    const pos = d.kept.filter((i) => i % 2 === 0);
    assert.deepEqual(pos, [2, 6, 10, 14, 18, 22, 26, 30]);
    const neg = d.kept.filter((i) => i % 2 === 1);
    assert.deepEqual(neg, [1, 3, 5, 7, 9, 11, 13, 15]);
  });

  it('breaks penalty ties by sample order', () => {
    const d = rocSelect(group(`${'+'.repeat(20)}${'-'.repeat(12)}`), OPTS);
    // round(20 * 16 / 32) = 10 positives: samples 0..9; 6 negatives: 20..25.
    assert.deepEqual(d.kept, [...Array.from({ length: 10 }, (_, i) => i), 20, 21, 22, 23, 24, 25]);
  });

  it('rounds half to even: 7 of 32 at keep 16 targets 4 (3.5), 9 targets 4 (4.5)', () => {
    const seven = rocSelect(group(`${'+'.repeat(7)}${'-'.repeat(25)}`), OPTS);
    // negatives: round(12.5) = 12, positives round(3.5) = 4 -> 16.
    assert.deepEqual([seven.positives, seven.negatives], [4, 12]);
    const nine = rocSelect(group(`${'+'.repeat(9)}${'-'.repeat(23)}`), OPTS);
    // positives: round(4.5) = 4, negatives: round(11.5) = 12.
    assert.deepEqual([nine.positives, nine.negatives], [4, 12]);
  });

  it('raises the negatives to --min-neg when their share rounds to it or below', () => {
    // 29 positives, 3 negatives: round(1.5) = 2 negatives <= min(2, 3) -> 2 negatives, 14 positives.
    const d = rocSelect(group(`${'+'.repeat(29)}${'-'.repeat(3)}`), OPTS);
    assert.deepEqual([d.positives, d.negatives], [14, 2]);
    // Only 1 negative: min(2, 1) = 1, so 15 positives.
    const one = rocSelect(group(`${'+'.repeat(31)}-`), OPTS);
    assert.deepEqual([one.positives, one.negatives], [15, 1]);
    assert.equal(one.kept.includes(31), true);
  });

  it('raises the positives to --min-pos when their share rounds to it or below', () => {
    // 3 positives of 32: round(1.5) = 2 <= min(2, 3) -> 2 positives, 14 negatives.
    const d = rocSelect(group(`${'-'.repeat(29)}${'+'.repeat(3)}`), OPTS);
    assert.deepEqual([d.positives, d.negatives], [2, 14]);
    const one = rocSelect(group(`+${'-'.repeat(31)}`), OPTS);
    assert.deepEqual([one.positives, one.negatives], [1, 15]);
  });

  it('keeps the whole group when both classes fall short of their minimums', () => {
    // With --min-pos + --min-neg <= --keep the rounded counts sum to at least keep - 1, so both can only
    // fall short when the minimums exceed --keep (the release asserts against that; rstar warns).
    const d = rocSelect(group('+-+-+-+-'), { ...OPTS, keep: 4, minPos: 3, minNeg: 3 });
    assert.equal(d.outcome, 'both-short');
    assert.deepEqual(d.kept, [0, 1, 2, 3, 4, 5, 6, 7]);
    // 6+/2-: negatives round(1) = 1 are raised to min(3, 2) = 2 and the positives get 4 - 2 = 2,
    // then the positives (2 <= min(3, 6)) are raised to 3 and the negatives cut to 4 - 3 = 1.
    const one = rocSelect(group('++++++--'), { ...OPTS, keep: 4, minPos: 3, minNeg: 3 });
    assert.equal(one.outcome, 'sampled');
    assert.deepEqual([one.positives, one.negatives], [3, 1]);
  });

  it('raises at exactly --min-neg / --min-pos (`<=`, not `<`): the boundary is where the rounded targets overshoot', () => {
    // A rounded count equal to its minimum changes the result only when both targets rounded the same way
    // (two .5 ties: odd --keep), so these use keep 7 on 7+/7-: round(3.5) = 4 each.
    const neg = rocSelect(group('+-'.repeat(7)), { ...OPTS, keep: 7, minPos: 0, minNeg: 4 });
    // negatives 4 <= min(4, 7): neg = 4, pos = 7 - 4 = 3; with `<` both stay 4 (8 kept).
    assert.deepEqual([neg.positives, neg.negatives, neg.sizeMismatch], [3, 4, false]);
    const pos = rocSelect(group('+-'.repeat(7)), { ...OPTS, keep: 7, minPos: 4, minNeg: 0 });
    // positives 4 <= min(4, 7): pos = 4, neg = 3.
    assert.deepEqual([pos.positives, pos.negatives, pos.sizeMismatch], [4, 3, false]);
    // min(min, n_class) bound by the class size: 4 negatives of 8 at keep 7 is round(3.5) = 4 = min(5, 4).
    const capped = rocSelect(group('++++----'), { ...OPTS, keep: 7, minPos: 0, minNeg: 5 });
    assert.deepEqual([capped.positives, capped.negatives, capped.sizeMismatch], [3, 4, false]);
    // One above the boundary leaves the targets alone (4 > min(3, 7)): the release's odd-keep overshoot.
    const above = rocSelect(group('+-'.repeat(7)), { ...OPTS, keep: 7, minPos: 3, minNeg: 3 });
    assert.deepEqual([above.positives, above.negatives, above.sizeMismatch], [4, 4, true]);
  });

  it('follows Python slicing when adjusted counts go negative', () => {
    // keep 2, mins 3/0, 1+ 3-: negatives round(1.5) = 2, positives round(0.5) = 0 <= min(3, 1) -> 1,
    // negatives 2 - 1 = 1: one each.
    const d = rocSelect(group('+---'), { ...OPTS, keep: 2, minPos: 3, minNeg: 0 });
    assert.deepEqual([d.positives, d.negatives], [1, 1]);
    // keep 1, mins 0/2, 3+ 1-: negatives round(0.25) = 0 <= min(2, 1) -> 1, positives 1 - 1 = 0;
    // positives 0 <= min(0, 3) -> 0, negatives 1. A count of keep - 2 = -1 would slice [: -1].
    const e = rocSelect(group('+++-'), { ...OPTS, keep: 1, minPos: 0, minNeg: 2 });
    assert.deepEqual([e.positives, e.negatives], [0, 1]);
    const f = rocSelect(group('+-----'), { ...OPTS, keep: 1, minPos: 2, minNeg: 0 });
    // positives round(1/6) = 0 <= min(2, 1) -> 1, negatives 1 - 1 = 0.
    assert.deepEqual([f.positives, f.negatives], [1, 0]);
    const g = rocSelect(group('++----'), { ...OPTS, keep: 1, minPos: 2, minNeg: 0 });
    // positives round(1/3) = 0 <= min(2, 2) -> 2, negatives 1 - 2 = -1: Python's [: -1] of 4 negatives
    // keeps 3 of them; the release would assert (5 != 1).
    assert.deepEqual([g.positives, g.negatives, g.sizeMismatch], [2, 3, true]);
  });

  it('flags the selections the release would assert on (odd --keep, tied halves)', () => {
    // keep 7 of 14 with 7+/7-: round(3.5) = 4 each -> 8 kept.
    const d = rocSelect(group('+-'.repeat(7)), { ...OPTS, keep: 7 });
    assert.equal(d.kept.length, 8);
    assert.equal(d.sizeMismatch, true);
  });
});

describe('--positives weighted', () => {
  const pattern = `${'+'.repeat(16)}${'-'.repeat(16)}`;
  const penalties = pattern.split('').map((_, i) => (i < 16 ? (i % 4) * 0.5 : 0));
  const weighted = (seed: number, key = 'p') =>
    rocSelect(group(pattern, penalties), { ...OPTS, positives: 'weighted', random: groupRandom(seed, key) });

  it('is deterministic for a seed and group, and varies with the seed', () => {
    assert.deepEqual(weighted(7).kept, weighted(7).kept);
    const distinct = new Set([1, 2, 3, 4, 5, 6, 7, 8].map((s) => weighted(s).kept.join(',')));
    assert.ok(distinct.size > 1, 'different seeds should pick different positives');
    // Same counts as sorted mode; negatives unaffected (first in sample order).
    const d = weighted(3);
    assert.deepEqual([d.positives, d.negatives], [8, 8]);
    assert.deepEqual(
      d.kept.filter((i) => i >= 16),
      [16, 17, 18, 19, 20, 21, 22, 23],
    );
  });

  it('prefers low penalties without excluding high ones', () => {
    const picked = [0, 0, 0, 0]; // by penalty class 0, 0.5, 1, 1.5
    for (let seed = 0; seed < 400; seed++) {
      for (const i of weighted(seed, `q${seed}`).kept) if (i < 16) picked[i % 4] += 1;
    }
    assert.ok(picked[0] > picked[1] && picked[1] > picked[2] && picked[2] > picked[3], `${picked}`);
    assert.ok(picked[3] > 0);
    // Penalty 0 items: 4 of them; with weight 10 against 2, 0.91, 0.625 they are nearly always in.
    assert.ok(picked[0] > 0.95 * 4 * 400, `${picked}`);
  });

  it('samples without replacement', () => {
    const order = weightedOrder([0, 0.5, 1, 2, 0], groupRandom(1, 'x'));
    assert.deepEqual(
      [...order].sort((a, b) => a - b),
      [0, 1, 2, 3, 4],
    );
  });
});
