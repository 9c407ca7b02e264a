import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { groupRandom } from '../src/algo/roc.js';
import { pairedBootstrap } from '../src/eval/bootstrap.js';
import { fnv1a, mulberry32, Rng, seededRandom, shuffled } from '../src/random.js';
import type { Problem } from '../src/records/problem.js';
import { stepProblems } from '../src/rollout/steps.js';
import { problemOf, split } from '../src/sft/curriculum/index.js';
import { epochOrder } from '../src/sft/epoch.js';

// Every seeded sequence the toolchain draws, pinned: data sets, curriculum splits, epoch orders,
// step batches, eval draws and RoC's picks must not change when the code behind them moves.
const take = (random: () => number, n: number) => Array.from({ length: n }, () => random());

describe('seeded randomness stays bit-identical', () => {
  test('mulberry32', () => {
    assert.deepEqual(
      take(mulberry32(0), 3),
      [0.26642920868471265, 0.0003297457005828619, 0.2232720274478197],
    );
    assert.deepEqual(take(mulberry32(12345), 3), [0.9797282677609473, 0.3067522644996643, 0.484205421525985]);
    assert.deepEqual(
      take(mulberry32(0xffffffff), 3),
      [0.8964226141106337, 0.189478256739676, 0.7156526781618595],
    );
  });

  test('fnv1a (UTF-16 code units)', () => {
    const texts = ['', 'a', 'rstar', 'héllo 🎲'];
    const pinned = [2166136261, 3826002220, 261013921, 569760419];
    assert.deepEqual(texts.map(fnv1a), pinned);
  });

  test('Rng: next, int, digits, pick, shuffle', () => {
    const rng = new Rng(7);
    assert.equal(rng.next(), 0.9823943767696619);
    assert.deepEqual(
      Array.from({ length: 5 }, () => rng.int(1, 6)),
      [3, 5, 1, 2, 2],
    );
    assert.equal(rng.digits(3), 888);
    assert.equal(rng.pick(['a', 'b', 'c', 'd']), 'a');
    assert.deepEqual(rng.shuffle([1, 2, 3, 4, 5, 6, 7, 8]), [1, 4, 7, 2, 8, 6, 5, 3]);
  });

  test('seededRandom and shuffled (GPQA decks, bootstrap)', () => {
    assert.deepEqual(
      take(seededRandom('gpqa:0'), 3),
      [0.4551996532827616, 0.4976867148652673, 0.017847626470029354],
    );
    assert.deepEqual(take(seededRandom(3), 2), [0.9084857956040651, 0.5646736130584031]);
    assert.deepEqual(shuffled([0, 1, 2, 3, 0, 1, 2, 3], seededRandom('gpqa:1')), [3, 2, 1, 2, 1, 3, 0, 0]);
  });

  test('curriculum split, epoch order, step batches, RoC group draws, bootstrap', () => {
    const s = split('mix', { train: 4, test: 2, seed: 0 });
    assert.deepEqual(
      s.train.map((t) => problemOf(t, 'mix', 'train').id),
      ['mod-c7f62353', 'count-9e4842a2', 'mod-42ff6ea1', 'word-288d33af'],
    );
    assert.deepEqual(
      s.test.map((t) => problemOf(t, 'mix', 'test').id),
      ['mod-a4b524fe', 'word-1aded92f'],
    );
    const lines = Array.from({ length: 10 }, (_, i) => 'x'.repeat(i + 1));
    assert.deepEqual(
      epochOrder(lines, 3, 2, 2).map((l) => l.length),
      [8, 10, 4, 6, 2, 3, 5, 7, 1, 9],
    );
    const problems = Array.from(
      { length: 5 },
      (_, i): Problem => ({ v: 1, id: `p${i}`, prompt: `${i}?`, answer: String(i), kind: 'math' }),
    );
    assert.deepEqual(
      [1, 2, 3].map((k) => stepProblems(problems, k, 3, 0).map((p) => p.id)),
      [
        ['p4', 'p3', 'p1'],
        ['p2', 'p0', 'p4'],
        ['p4', 'p1', 'p0'],
      ],
    );
    assert.deepEqual(
      take(groupRandom(0, 'p1'), 3),
      [0.39116057427600026, 0.7240588718559593, 0.553330602357164],
    );
    assert.deepEqual(pairedBootstrap([0, 1, 0, 1, 0, 0], [1, 1, 0, 1, 1, 0], { resamples: 200, seed: 0 }), {
      delta: 0.3333333333333333,
      lo: 0,
      hi: 0.8333333333333334,
      problems: 6,
    });
  });
});
