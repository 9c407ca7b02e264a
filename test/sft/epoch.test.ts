import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { epochOrder } from '../../src/sft/epoch.js';

// Lines of varied length, each unique: `{"id":N,"pad":"xxx..."}`.
const lines = Array.from({ length: 203 }, (_, i) =>
  JSON.stringify({ id: i, pad: 'x'.repeat((i * 37) % 301) }),
);
const spread = (batch: string[]) =>
  Math.max(...batch.map((l) => l.length)) - Math.min(...batch.map((l) => l.length));

describe('epochOrder', () => {
  it('is a permutation of the lines, the same for the same seed and another for another seed', () => {
    const a = epochOrder(lines, 1, 8);
    assert.deepEqual([...a].sort(), [...lines].sort());
    assert.deepEqual(epochOrder(lines, 1, 8), a);
    assert.notDeepEqual(epochOrder(lines, 2, 8), a);
  });

  it('puts records of similar length together, far less spread than a plain shuffle', () => {
    const order = epochOrder(lines, 3, 8);
    const batches = Array.from({ length: 25 }, (_, i) => order.slice(i * 8, i * 8 + 8));
    const mean = batches.reduce((s, b) => s + spread(b), 0) / batches.length;
    // A random batch of 8 from lengths spread over ~300 characters has a range near 230.
    assert.ok(mean < 60, `mean length range within a batch: ${mean}`);
  });

  it('keeps the batches themselves in a random order (not sorted by length overall)', () => {
    const order = epochOrder(lines, 4, 8);
    const firsts = Array.from({ length: 25 }, (_, i) => (order[i * 8] as string).length);
    const sorted = [...firsts].sort((x, y) => x - y);
    assert.notDeepEqual(firsts, sorted);
  });

  it('puts the one partial batch last, so fixed-size reads stay aligned', () => {
    const order = epochOrder(lines, 5, 8);
    const tail = order.slice(200); // 203 = 25 × 8 + 3
    assert.equal(tail.length, 3);
    for (let i = 0; i < 25; i++) {
      const batch = order.slice(i * 8, i * 8 + 8);
      assert.ok(spread(batch) < 150, `batch ${i} mixes lengths: ${spread(batch)}`);
    }
  });

  it('with window 1 is a plain shuffle: batches as mixed in length as the data', () => {
    const order = epochOrder(lines, 3, 8, 1);
    assert.deepEqual([...order].sort(), [...lines].sort());
    const batches = Array.from({ length: 25 }, (_, i) => order.slice(i * 8, i * 8 + 8));
    const mean = batches.reduce((s, b) => s + spread(b), 0) / batches.length;
    assert.ok(mean > 150, `mean length range within a batch: ${mean}`);
  });

  it('rejects a batch size or window that is not a positive integer', () => {
    assert.throws(() => epochOrder(lines, 1, 0), /batch must be a positive integer/);
    assert.throws(() => epochOrder(lines, 1, 2.5), /batch must be a positive integer/);
    assert.throws(() => epochOrder(lines, 1, 8, 0), /window must be a positive integer/);
  });
});
