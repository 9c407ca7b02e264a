/**
 * One epoch's order of SFT records, in batches of similar length.
 *
 * A batch is padded to its longest sequence, so a uniformly shuffled batch of demonstrations
 * (192 tokens on average, up to 330) spends about a third of its compute on padding. Here the
 * records are shuffled, cut into windows of `batch × window` records, sorted by length inside each
 * window and cut into batches, and the batches of all windows are shuffled again: every batch is
 * still a random draw from the data, only its members are alike in length.
 */
import { Rng } from '../random.js';

/** A record's line: the text itself, or a line of input that keeps its `FILE:LINE`. */
type Line = string | { readonly text: string };

const size = (line: Line): number => (typeof line === 'string' ? line : line.text).length;

/**
 * The records (one JSON line each) in epoch order: whole batches of `batch` lines, similar in
 * length, in a seeded random order. The length of a line stands in for its token count (token id
 * arrays make up nearly all of a record's bytes). A partial batch (when `batch` does not divide the
 * number of lines) comes last, so a reader that takes `batch` lines at a time stays aligned.
 * Window 1: a plain shuffle, every batch a uniform draw.
 */
export function epochOrder<L extends Line>(
  lines: readonly L[],
  seed: number,
  batch: number,
  window = 16,
): L[] {
  if (!Number.isInteger(batch) || batch < 1)
    throw new Error(`batch must be a positive integer, got ${batch}`);
  if (!Number.isInteger(window) || window < 1)
    throw new Error(`window must be a positive integer, got ${window}`);
  const rng = new Rng(seed);
  const shuffled = rng.shuffle([...lines]);
  const batches: L[][] = [];
  for (let start = 0; start < shuffled.length; start += batch * window) {
    const chunk = shuffled.slice(start, start + batch * window).sort((a, b) => size(a) - size(b));
    for (let i = 0; i < chunk.length; i += batch) batches.push(chunk.slice(i, i + batch));
  }
  const full = batches.filter((b) => b.length === batch);
  const partial = batches.filter((b) => b.length < batch);
  return [...rng.shuffle(full), ...partial].flat();
}
