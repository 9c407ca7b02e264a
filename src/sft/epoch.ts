/**
 * One epoch's order of SFT records, in batches of similar length.
 *
 * A batch is padded to its longest sequence, so a uniformly shuffled batch of demonstrations
 * (192 tokens on average, up to 330) spends about a third of its compute on padding. Here the
 * records are shuffled, cut into windows of `batch × window` records, sorted by length inside each
 * window and cut into batches, and the batches of all windows are shuffled again: every batch is
 * still a random draw from the data, only its members are alike in length.
 */
import { readFileSync } from 'node:fs';
import { Rng } from '../random.js';

/**
 * The records (one JSON line each) in epoch order: whole batches of `batch` lines, similar in
 * length, in a seeded random order. The length of a line stands in for its token count (token id
 * arrays make up nearly all of a record's bytes). A partial batch (when `batch` does not divide the
 * number of lines) comes last, so a reader that takes `batch` lines at a time stays aligned.
 */
export function epochOrder(lines: string[], seed: number, batch: number, window = 16): string[] {
  if (!Number.isInteger(batch) || batch < 1)
    throw new Error(`batch must be a positive integer, got ${batch}`);
  if (!Number.isInteger(window) || window < 1)
    throw new Error(`window must be a positive integer, got ${window}`);
  const rng = new Rng(seed);
  const shuffled = rng.shuffle([...lines]);
  const batches: string[][] = [];
  for (let start = 0; start < shuffled.length; start += batch * window) {
    const chunk = shuffled.slice(start, start + batch * window).sort((a, b) => a.length - b.length);
    for (let i = 0; i < chunk.length; i += batch) batches.push(chunk.slice(i, i + batch));
  }
  const full = batches.filter((b) => b.length === batch);
  const partial = batches.filter((b) => b.length < batch);
  return [...rng.shuffle(full), ...partial].flat();
}

/**
 * `node dist/src/sft/epoch.js FILE SEED BATCH [WINDOW]` prints FILE's non-empty lines in epoch order
 * (WINDOW 1: a plain shuffle, every batch a uniform draw).
 */
if (process.argv[1]?.endsWith('epoch.js')) {
  const [file, seed, batch, window = '16'] = process.argv.slice(2);
  if (!file || seed === undefined || batch === undefined) {
    process.stderr.write('usage: node dist/src/sft/epoch.js FILE SEED BATCH [WINDOW]\n');
    process.exit(2);
  }
  const lines = readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.length > 0);
  const out = epochOrder(lines, Number(seed), Number(batch), Number(window));
  process.stdout.write(out.length ? `${out.join('\n')}\n` : '');
}
