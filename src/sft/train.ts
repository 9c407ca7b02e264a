/**
 * The SFT loop over a fixed data set with one resident trainer: seeded epochs in `epochOrder`,
 * batches of `batch` records, a wall-clock and/or step budget, the learning-rate schedule, snapshots
 * and one metrics line per step. One batch is always queued ahead of the one training, so the
 * trainer never waits for this loop (its metrics and logging run while the next step computes).
 */
import { cpSync, rmSync } from 'node:fs';
import { readCheckpointConfig } from '../backend/checkpoint.js';
import type { TrainOptions } from '../backend/train-options.js';
import { checkTrainRecord } from '../backend/train-record.js';
import { startTrainer, type TrainedStep } from '../backend/trainer.js';
import { DataError } from '../errors.js';
import { openInput, readLines, type SourceLine } from '../ndjson/index.js';
import type { Step } from '../records/step.js';
import { epochOrder } from './epoch.js';

export interface SftTrainOptions {
  /** SFT records (`sft-data`'s sft.jsonl). */
  data: string;
  /** The trainer's settings (loss `sft`); `out` is rewritten every step. */
  trainer: TrainOptions;
  batch: number;
  /** epochOrder's window: 1 = uniform batches, N > 1 = batches of similar length. */
  window: number;
  /** The last fraction of the budget over which the LR decays linearly to 2% (0: constant). */
  decay: number;
  /** Wall-clock budget in seconds from the trainer's start (0: none). */
  seconds: number;
  /** Step budget (0: none). */
  maxSteps: number;
  /** Copy `out` to `out-N` after every K-th step (0: never). */
  snapshotEvery: number;
  /** Called with each step's metrics line, in step order. */
  onStep(metrics: StepMetrics): Promise<void>;
  log(message: string): void;
}

/** A metrics.jsonl line: the Step record, the wall clock since the trainer started, the step's tokens/s. */
export type StepMetrics = Step & { elapsed: number; tokens_per_s: number };

export interface SftTrainSummary {
  steps: number;
  /** Epochs started (the last one usually cut short by the budget). */
  epochs: number;
  seconds: number;
}

/** The floor of the decay, as a fraction of the peak learning rate. */
const FLOOR = 0.02;

/**
 * The learning rate to send with the batch about to go, or undefined for the trainer's own schedule
 * (--warmup-steps, then constant). Over the last `decay` fraction of the budget (the larger of the
 * wall-clock and the step fraction used so far) the rate decays linearly to 2% of `lr`: annealing
 * sharpens what the budget has taught. Rounded to 6 significant digits.
 */
export function scheduledLr(at: {
  lr: number;
  decay: number;
  elapsed: number;
  seconds: number;
  sent: number;
  maxSteps: number;
}): number | undefined {
  let progress = at.seconds > 0 ? at.elapsed / at.seconds : 0;
  if (at.maxSteps > 0) progress = Math.max(progress, at.sent / at.maxSteps);
  if (at.decay <= 0 || progress <= 1 - at.decay) return undefined;
  const factor = Math.max(FLOOR, (1 - progress) / at.decay);
  return Number((at.lr * factor).toPrecision(6));
}

/** The non-blank lines of FILE, each checked as a record the trainer will take (before any step). */
async function readRecords(file: string, trainer: TrainOptions): Promise<SourceLine[]> {
  const { vocab_size: vocab } = readCheckpointConfig(trainer.model);
  const { stream, source } = openInput(file);
  const lines: SourceLine[] = [];
  for await (const entry of readLines(stream, source)) {
    if (entry.text.trim() === '') continue;
    checkTrainRecord(entry, { vocab, loss: trainer.loss, oldLogprobs: trainer.oldLogprobs });
    lines.push(entry);
  }
  return lines;
}

const round = (x: number, digits: number) => Math.round(x * 10 ** digits) / 10 ** digits;

export async function sftTrain(o: SftTrainOptions): Promise<SftTrainSummary> {
  const start = performance.now();
  // Started first: loading the model overlaps with reading and checking the data.
  const trainer = await startTrainer(o.trainer);
  let steps = 0; // Step records received
  let sent = 0; // batches sent
  let epoch = 0;
  let elapsed = 0; // seconds since start, as of the last Step record
  const inFlight: Promise<TrainedStep>[] = [];
  const outOfBudget = () => (o.seconds > 0 && elapsed >= o.seconds) || (o.maxSteps > 0 && sent >= o.maxSteps);
  const snapshotStep = (n: number) => o.snapshotEvery > 0 && n % o.snapshotEvery === 0;

  const receive = async () => {
    const { record } = await inFlight.shift()!;
    steps += 1;
    elapsed = round((performance.now() - start) / 1000, 3);
    const tokensPerS = record.seconds > 0 ? round(record.tokens / record.seconds, 1) : 0;
    await o.onStep({ ...record, elapsed, tokens_per_s: tokensPerS });
    o.log(`step ${steps}  loss ${record.loss}  ${elapsed}s`);
    // A snapshot only when no step is in flight (the trainer rewrites `out` every step).
    if (inFlight.length === 0 && snapshotStep(steps)) {
      const snapshot = `${o.trainer.out}-${steps}`;
      rmSync(snapshot, { recursive: true, force: true });
      cpSync(o.trainer.out, snapshot, { recursive: true });
    }
  };

  try {
    const records = await readRecords(o.data, o.trainer);
    while (!outOfBudget()) {
      const order = epochOrder(records, o.trainer.seed + epoch, o.batch, o.window);
      epoch += 1;
      const sentBefore = sent;
      for (let i = 0; i + o.batch <= order.length; i += o.batch) {
        // the step finishing next is a snapshot step: let it finish before queueing another
        if (inFlight.length > 0 && snapshotStep(steps + 1)) await receive();
        for (const entry of order.slice(i, i + o.batch)) await trainer.add(entry);
        const lr = scheduledLr({
          lr: o.trainer.lr,
          decay: o.decay,
          elapsed,
          seconds: o.seconds,
          sent,
          maxSteps: o.maxSteps,
        });
        inFlight.push(trainer.endBatch({ lr }));
        sent += 1;
        if (inFlight.length > 1) await receive();
        if (outOfBudget()) break;
      }
      if (sent === sentBefore) {
        throw new DataError(`${o.data}: fewer than ${o.batch} records, not one batch`);
      }
    }
    while (inFlight.length > 0) await receive();
    await trainer.close();
  } catch (error) {
    await trainer.kill();
    throw error;
  }
  return { steps, epochs: epoch, seconds: elapsed };
}
