import { pruneCheckpoints } from '../backend/checkpoint.js';
import { addTrainFlags, type TrainOptions } from '../backend/train-options.js';
import { type BatchEnd, startTrainer, type TrainedStep } from '../backend/trainer.js';
import { DataError, UsageError } from '../errors.js';
import { NdjsonWriter, openInput, readLines, type SourceLine } from '../ndjson/index.js';
import { addDeprecatedAlias, parse, program } from '../program.js';
import type { Step } from '../records/step.js';
import {
  adapterName,
  type EngineClient,
  EngineError,
  engineClient,
  isAdapterFolder,
  serveCheckpoint,
} from '../rollout/engines.js';

/**
 * An end_batch line of the input: what a driver may set for the step it closes, the learning rate
 * (`"lr"`, so the driver owns the schedule) and the step number (`"step"`, the `{step}` of --out and
 * --policy; rollout --steps numbers its batches).
 */
function batchEnd({ text, line, source }: SourceLine): BatchEnd {
  const where = `${source}:${line}`;
  let value: { lr?: unknown; step?: unknown };
  try {
    value = JSON.parse(text) as typeof value;
  } catch (error) {
    throw new DataError(`${source}: invalid end_batch line: ${(error as Error).message}`);
  }
  const { lr, step } = value;
  if (lr !== undefined && (typeof lr !== 'number' || !Number.isFinite(lr) || lr <= 0)) {
    throw new DataError(`${where}: lr: expected a positive number, got ${JSON.stringify(lr)}`);
  }
  if (step !== undefined && (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0)) {
    throw new DataError(`${where}: step: expected a non-negative integer, got ${JSON.stringify(step)}`);
  }
  return { lr, step };
}

/**
 * Makes the engines serve a step's checkpoint. A LoRA step's checkpoint is an adapter folder
 * (adapter_config.json): the engines load the adapter alone under a new name per step
 * (rstar-lora-step-N), never the base, and unload those older than the `keep` newest (rollout
 * --max-staleness N asks for adapters up to N steps old: keep N + 1).
 */
function engineSync(engines: EngineClient[], keep: number, resumed: number[]) {
  const loaded = [...resumed]; // adapter steps the engines may hold, oldest first
  return async (record: Step): Promise<void> => {
    try {
      await Promise.all(engines.map((e) => serveCheckpoint(e, record.checkpoint, String(record.step))));
      if (!isAdapterFolder(record.checkpoint)) return;
      loaded.push(record.step);
      const old = loaded.splice(0, Math.max(0, loaded.length - keep));
      // an engine that no longer holds one (restarted since) answers 4xx: nothing to unload
      const unload = (e: EngineClient, step: number) =>
        e.unloadAdapter(adapterName(step)).catch((error: unknown) => {
          if (!(error instanceof EngineError) || error.retryable) throw error;
        });
      for (const step of old) await Promise.all(engines.map((e) => unload(e, step)));
    } catch (error) {
      throw new DataError(`--sync: step ${record.step}: ${(error as Error).message}`);
    }
  };
}

export async function run(argv: string[]): Promise<void> {
  const cmd = addTrainFlags(
    program('train-step', 'one optimiser step (SFT or GRPO) per batch on the PyTorch backend').argument(
      '[file]',
      'NDJSON trajectory-shaped records (default: stdin)',
    ),
  );
  addDeprecatedAlias(cmd, '--epochs <e>', '--passes-per-batch');
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<TrainOptions>();
  if (o.keepCheckpoints > 0 && !o.out.includes('{step}')) {
    throw new UsageError("--keep-checkpoints: --out must name each step's folder with {step}");
  }
  const engines = (o.sync ?? []).map((url) => engineClient(url, o.engineKind));
  // a LoRA run resumed from step K's adapter (--lora-init): the engines hold it as rstar-lora-step-K
  const resumed = o.loraInit !== undefined && o.weightVersion > 0 ? [o.weightVersion] : [];
  const syncEngines = engineSync(engines, (o.maxStaleness ?? 0) + 1, resumed);
  // Started before the input is read, so loading the model overlaps with the upstream producer.
  const trainer = await startTrainer(o);
  const writer = new NdjsonWriter();
  // Step records go downstream in order. The engines load a step's checkpoint before its record goes
  // on, so a reader of the record (or a rollout waiting for this weight_version) finds them serving it.
  let output: Promise<void> = Promise.resolve();
  let syncFailure: Error | undefined;
  const forward = (step: Promise<TrainedStep>) => {
    output = output.then(async () => {
      const { record, line } = await step;
      if (engines.length > 0) {
        await syncEngines(record).catch((error: Error) => {
          // training on while the engines serve stale weights would make every later batch
          // off-policy without anyone noticing: a failed sync stops the trainer
          syncFailure = error;
          void trainer.kill();
          // stop reading too: upstream (rollout waiting for this very policy) may send nothing more
          stream.destroy();
          throw error;
        });
      }
      await writer.writeRaw(line);
      // after the record: a reader that saw step K's record finds checkpoint K; older ones may go
      if (o.keepCheckpoints > 0) {
        pruneCheckpoints(o.out, record.step, {
          last: o.keepCheckpoints,
          every: o.keepEvery,
          // a warm start's adapter may be one of this template's folders (a resumed LoRA run)
          protect: o.loraInit ? [o.model, o.loraInit] : [o.model],
        });
      }
    });
    output.catch(() => {}); // awaited after the input ends; a failure meanwhile stops the trainer
  };

  const { stream, source } = openInput(cmd.args[0]);
  let total = 0; // records, plus numbered (possibly empty) steps
  let numbered = 0;
  let unterminated = 0;
  let failure: unknown;
  try {
    for await (const entry of readLines(stream, source)) {
      const blank = entry.text.trim() === '';
      if (blank || /"end_batch"\s*:\s*true/.test(entry.text)) {
        const end = blank ? {} : batchEnd(entry);
        // a numbered step goes to the backend even when empty: it still checkpoints and syncs
        if (o.follow && (trainer.open > 0 || end.step !== undefined)) {
          if (end.step !== undefined) {
            numbered += 1;
            total += 1;
          }
          forward(trainer.endBatch(end));
        }
        continue;
      }
      await trainer.add(entry);
      total += 1;
    }
    if (trainer.open > 0) {
      // rollout --steps closes every batch; records after the last end_batch are a step cut short:
      // the backend drops them and ends after the steps before, which stay trained and saved
      if (o.follow && numbered > 0) unterminated = trainer.open;
      else forward(trainer.endBatch());
    }
    if (total === 0) throw new DataError(`${source}: empty batch: no records to train on`);
    await trainer.close();
  } catch (error) {
    failure = error;
    await trainer.kill();
  }
  // a sync failure is the reason the backend was stopped: it is reported first
  const outputFailure = await output.then(
    () => undefined,
    (error: unknown) => error,
  );
  if (syncFailure ?? failure ?? outputFailure) throw syncFailure ?? failure ?? outputFailure;
  await writer.end();
  if (unterminated > 0) {
    throw new DataError(
      `${source}: the last ${unterminated} records have no end_batch line (the producer stopped mid-step): not trained`,
    );
  }
}
