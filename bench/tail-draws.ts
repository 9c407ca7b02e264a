// Rare draws against format violations: for each trajectory file (rollout or eval output), how many
// trajectories violate the answer format (eval's definition), what share of the sampled tokens were
// drawn at under 1% and under 0.1% of the behaviour policy's probability, and how many violating and
// valid trajectories hold such a draw; then how the violations ended (`finish`).
// docs/experiments/2026-12-06-format-violations.md reads its figures from this.
//
//   npm run bench:tail-draws -- RUN/eval-ms-sft/trajectories-problems.jsonl ...

import { isFormatViolation, toSample } from '../src/eval/metrics.js';
import { openInput, readRecords } from '../src/ndjson/read.js';
import { Trajectory } from '../src/records/trajectory.js';

const CUTS = [Math.log(0.01), Math.log(0.001)] as const;
const pct = (a: number, b: number, digits = 1) => (b === 0 ? '–' : `${((100 * a) / b).toFixed(digits)}%`);

async function tally(file: string): Promise<void> {
  let trajectories = 0;
  let violations = 0;
  let tokens = 0;
  const rareTokens = [0, 0];
  const withRare = { violating: [0, 0], valid: [0, 0] };
  const finish: Record<string, number> = {};
  const { stream, source } = openInput(file);
  for await (const { record: t } of readRecords(stream, source, Trajectory)) {
    trajectories += 1;
    const bad = isFormatViolation(toSample(t));
    if (bad) {
      violations += 1;
      finish[t.finish] = (finish[t.finish] ?? 0) + 1;
    }
    const seen = [false, false];
    t.logprobs.forEach((lp, i) => {
      if (t.loss_mask[i] !== 1) return;
      tokens += 1;
      CUTS.forEach((cut, c) => {
        if (lp < cut) {
          rareTokens[c] += 1;
          seen[c] = true;
        }
      });
    });
    seen.forEach((s, c) => {
      if (s) withRare[bad ? 'violating' : 'valid'][c] += 1;
    });
  }
  const valid = trajectories - violations;
  const ends = Object.entries(finish)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  console.log(
    `| ${file} | ${trajectories} | ${pct(violations, trajectories)} | ${pct(rareTokens[0], tokens, 2)} | ` +
      `${pct(withRare.violating[0], violations)} | ${pct(withRare.valid[0], valid)} | ` +
      `${pct(rareTokens[1], tokens, 2)} | ${pct(withRare.violating[1], violations)} | ` +
      `${pct(withRare.valid[1], valid)} | ${ends} |`,
  );
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: npm run bench:tail-draws -- TRAJECTORIES.jsonl...');
  process.exit(2);
}
console.log(
  '| file | trajectories | format violations | tokens drawn at p < 1% | violations with one | valid with one | ' +
    'tokens drawn at p < 0.1% | violations with one | valid with one | how the violations ended |',
);
console.log('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |');
try {
  for (const file of files) await tally(file);
} catch (error) {
  // a bad line names its file, line and field (readRecords); no stack trace for bad input
  console.error(`tail-draws: ${(error as Error).message}`);
  process.exit(1);
}
