import { execa, type ResultPromise } from 'execa';
import { DataError } from '../errors.js';
import { readLines } from '../ndjson/index.js';
import { Step } from '../records/step.js';
import type { TrainRecord } from '../records/trajectory.js';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from './python.js';

export interface TrainerOptions {
  loss: 'sft' | 'grpo';
  /** Checkpoint to start from. */
  model: string;
  /** Where each step's checkpoint goes; `{step}` becomes the step number. */
  out: string;
  /** More backend flags, as `train-step` spells them: `['--lr', '1e-6', '--warmup-steps', '20']`. */
  args?: string[];
}

export interface ResidentTrainer {
  /** One optimiser step on `records`; resolves with its Step record once the checkpoint is written. */
  step(records: TrainRecord[]): Promise<Step>;
  /** Ends the process (after the steps already asked for). */
  close(): Promise<void>;
}

/**
 * A resident `train-step --follow` process for orchestrators written in TypeScript: the model is
 * loaded once and every `step()` is one batch of the follow protocol. Steps run one after another.
 */
export async function startTrainer(options: TrainerOptions): Promise<ResidentTrainer> {
  const python = await findPython();
  const argv = [BACKEND_SCRIPT, 'train', '--follow', '--loss', options.loss, '--model', options.model];
  argv.push('--out', options.out, ...(options.args ?? []));
  const child: ResultPromise = execa(python, argv, {
    env: backendEnv(),
    stdin: 'pipe',
    stdout: 'pipe',
    stderr: 'pipe',
    reject: false,
  });
  child.stdin?.on('error', () => {});
  const waiting: { resolve: (s: Step) => void; reject: (e: Error) => void }[] = [];
  let failure: Error | undefined;
  const fail = (error: Error) => {
    failure ??= error;
    for (const w of waiting.splice(0)) w.reject(failure);
  };
  (async () => {
    for await (const { text } of readLines(child.stdout!, 'train-step')) {
      if (text.trim() === '') continue;
      const parsed = Step.safeParse(JSON.parse(text));
      const next = waiting.shift();
      if (!next) continue;
      if (parsed.success) next.resolve(parsed.data);
      else next.reject(new DataError(`train-step: unexpected output: ${text}`));
    }
  })().catch((error: Error) => fail(error));
  child.then((result) => {
    const why =
      result.exitCode === 0 ? 'the trainer exited' : backendMessage(String(result.stderr), 'trainer died');
    fail(new DataError(why));
  });
  let chain: Promise<unknown> = Promise.resolve();
  return {
    step(records) {
      const run = chain.then(
        () =>
          new Promise<Step>((resolve, reject) => {
            if (failure) return reject(failure);
            if (records.length === 0) return reject(new DataError('empty batch: no records to train on'));
            waiting.push({ resolve, reject });
            const lines = records.map((r) => JSON.stringify(r)).join('\n');
            child.stdin!.write(`${lines}\n{"v":1,"end_batch":true}\n`);
          }),
      );
      chain = run.catch(() => {});
      return run;
    },
    async close() {
      await chain;
      child.stdin?.end();
      await child;
    },
  };
}
