import { addTrainFlags, type TrainOptions, trainOptions } from '../backend/train-options.js';
import { UsageError } from '../errors.js';
import { NdjsonWriter } from '../ndjson/index.js';
import { addDeprecatedAlias, integer, number, parse, program } from '../program.js';
import { type SftTrainOptions, sftTrain } from '../sft/train.js';

/** The loop's own flags: sftTrain's settings (the trainer's come from train-step's table), plus the data. */
type Options = Pick<SftTrainOptions, 'window' | 'decay' | 'seconds' | 'maxSteps' | 'snapshotEvery'> & {
  data: string;
  batchRecords: number;
};

const HELP = `
Trains on --data with one resident trainer (train-step's backend, loss sft) until the budget
(--seconds and/or --max-steps, whichever ends first) is spent. An epoch is one pass over the data
set: epoch k visits the records in a seeded order (seed --seed + k, batches of similar length with
--window > 1); a partial last batch is left out. Each batch trains --passes-per-batch times. The LR warms up over --warmup-steps, stays at --lr, then decays linearly to 2% of it over
the last --decay fraction of the budget (the larger of the wall-clock and the step fraction spent).
Writes one line per step to stdout: the Step record plus "elapsed" (seconds since the trainer
started) and "tokens_per_s" (the step's tokens over its seconds). --out is rewritten every step;
--snapshot-every K copies it to OUT-N after step N = K, 2K, ... (taken with no step in flight).`;

export async function run(argv: string[]): Promise<void> {
  const cmd = program('sft-train', 'SFT over a data set with a wall-clock/step budget and an LR schedule')
    .requiredOption('--data <file>', 'SFT records (sft-data --out DIR: DIR/sft.jsonl)')
    .option('--batch-records <n>', 'records per step', integer(1), 8)
    .option(
      '--window <n>',
      'batches of similar length from windows of N batches (1: uniform draws)',
      integer(1),
      1,
    )
    .option(
      '--decay <f>',
      'decay the LR over this last fraction of the budget (0: constant)',
      number(0, 1),
      0,
    )
    .option('--seconds <s>', 'wall-clock budget from the trainer start (0: none)', number(0), 0)
    .option('--max-steps <n>', 'step budget (0: none)', integer(0), 0)
    .option('--snapshot-every <k>', 'copy --out to OUT-N every K steps (0: never)', integer(0), 0)
    .addHelpText('after', HELP);
  // the trainer's flags, as train-step declares them: the general ones (no GRPO or pipeline flags)
  addTrainFlags(cmd, (name, flag) => name !== 'loss' && flag.group === undefined);
  addDeprecatedAlias(cmd, '--batch <n>', '--batch-records');
  addDeprecatedAlias(cmd, '--epochs <e>', '--passes-per-batch');
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<Options & Omit<TrainOptions, 'loss'>>();
  if (o.seconds === 0 && o.maxSteps === 0)
    throw new UsageError('give a budget: --seconds and/or --max-steps');
  if (o.snapshotEvery > 0 && o.out.includes('{step}')) {
    throw new UsageError('--snapshot-every: --out must be one folder (no {step}) to copy');
  }
  const writer = new NdjsonWriter();
  const summary = await sftTrain({
    data: o.data,
    trainer: trainOptions({ ...o, loss: 'sft' }),
    batch: o.batchRecords,
    window: o.window,
    decay: o.decay,
    seconds: o.seconds,
    maxSteps: o.maxSteps,
    snapshotEvery: o.snapshotEvery,
    onStep: (metrics) => writer.write(metrics),
    log: (message) => process.stderr.write(`sft-train: ${message}\n`),
  });
  await writer.end();
  process.stderr.write(
    `sft-train: trained ${summary.steps} steps (${summary.epochs} epochs started) in ${summary.seconds}s\n`,
  );
}
