/**
 * The one driver of the resident Python trainer (`run.py train`), used by `train-step`, `sft-train`
 * and the tests. The model is loaded once; each batch is a run of record lines closed by an end_batch
 * line, answered by one Step record once its checkpoint is written.
 *
 * The protocol on the backend's stdin: one JSON line per record (already checked here: the backend
 * trusts it), then `{"v":1,"end_batch":true,"lr"?,"step"?}` per batch. End of input ends the process;
 * records after the last end_batch line are dropped (a step cut short is never trained).
 */
import { once } from 'node:events';
import { type AddressInfo, createServer } from 'node:net';
import { availableParallelism } from 'node:os';
import { execa, type ResultPromise } from 'execa';
import { DataError, UsageError } from '../errors.js';
import { readLines, type SourceLine } from '../ndjson/index.js';
import { Step } from '../records/step.js';
import type { TrainRecord } from '../records/trajectory.js';
import { readCheckpointConfig } from './checkpoint.js';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from './python.js';
import { backendTrainArgv, type TrainOptions } from './train-options.js';
import { checkTrainRecord, type TrainRecordContext } from './train-record.js';

/** What an end_batch line may set for the step it closes. */
export interface BatchEnd {
  /** This step's learning rate (a driver owning the schedule); default: --lr after --warmup-steps. */
  lr?: number;
  /** The step number (`{step}` of --out and --policy); a numbered step is taken even when empty. */
  step?: number;
}

export interface TrainedStep {
  record: Step;
  /** The backend's line as printed, passed on unchanged by `train-step`. */
  line: string;
}

export interface ResidentTrainer {
  /** Records added since the last end of batch. */
  readonly open: number;
  /** Checks one record line (`checkTrainRecord`) and sends it into the open batch. */
  add(entry: SourceLine): Promise<void>;
  /** Closes the open batch: resolves with its Step record once its checkpoint is written. */
  endBatch(end?: BatchEnd): Promise<TrainedStep>;
  /**
   * One whole batch: `records` (all checked before any is sent), then the end of the batch. For
   * callers that hold whole batches; streaming callers use add() and endBatch(), not both.
   */
  step(records: readonly TrainRecord[], end?: BatchEnd): Promise<TrainedStep>;
  /**
   * Ends the input (an open batch is dropped) and waits for the process and its ranks; throws the
   * backend's own reason if one of them failed.
   */
  close(): Promise<void>;
  /** Stops the process and its ranks now. */
  kill(): Promise<void>;
}

/** A free TCP port on 127.0.0.1 for the process group's rendezvous. */
async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  server.close();
  await once(server, 'close');
  return port;
}

/**
 * The environment torchrun gives each rank (RANK, WORLD_SIZE, MASTER_ADDR, ...). We launch the ranks
 * ourselves: Debian's torch 1.13 torchrun fails under Python 3.11 (its Std flag parsing returns None),
 * and launching directly lets rank 0 read our pipe while the others stay silent.
 */
async function distributedEnv(n: number, threadsPerRank: number): Promise<NodeJS.ProcessEnv[]> {
  // --threads wins; else, as torchrun does, ranks share the host's cores instead of each starting
  // one thread per core (OpenBLAS reads OMP_NUM_THREADS too), unless OMP_NUM_THREADS is already set.
  const given = threadsPerRank > 0 ? String(threadsPerRank) : undefined;
  if (n === 1) return [given ? { OMP_NUM_THREADS: given } : {}];
  const port = String(await freePort());
  const threads =
    given ?? process.env.OMP_NUM_THREADS ?? String(Math.max(1, Math.floor(availableParallelism() / n)));
  return Array.from({ length: n }, (_, rank) => ({
    OMP_NUM_THREADS: threads,
    RANK: String(rank),
    LOCAL_RANK: String(rank),
    WORLD_SIZE: String(n),
    LOCAL_WORLD_SIZE: String(n),
    MASTER_ADDR: '127.0.0.1',
    MASTER_PORT: port,
  }));
}

/**
 * Starts the trainer for `options` (every train-step value; `trainOptions()` fills the defaults).
 * Returns as soon as the processes are spawned, so loading the model overlaps with whatever the
 * caller does next. Steps run one after another, in the order their batches were closed.
 */
export async function startTrainer(options: TrainOptions): Promise<ResidentTrainer> {
  const { vocab_size: vocab } = readCheckpointConfig(options.model);
  if (options.ref) readCheckpointConfig(options.ref);
  const python = await findPython();
  const argv = [BACKEND_SCRIPT, ...backendTrainArgv(options)];
  const world = await distributedEnv(options.nproc, options.threads);
  // Rank 0 reads the batches and broadcasts them; the other ranks need no stdio of ours.
  const child: ResultPromise = execa(python, argv, {
    env: { ...backendEnv(), ...world[0] },
    reject: false,
    stdin: 'pipe',
    stdout: 'pipe',
    stderr: 'pipe',
  });
  const peers = world.slice(1).map((env) =>
    execa(python, argv, {
      env: { ...backendEnv(), ...env },
      reject: false,
      stdin: 'ignore',
      stdout: 'ignore',
    }),
  );
  const stdin = child.stdin!;
  stdin.on('error', () => {}); // an early exit is reported from the exit status
  const waiting: { resolve: (s: TrainedStep) => void; reject: (e: Error) => void }[] = [];
  let failure: Error | undefined;
  const fail = (error: Error) => {
    failure ??= error;
    for (const w of waiting.splice(0)) w.reject(failure);
  };
  (async () => {
    for await (const { text } of readLines(child.stdout!, 'backend')) {
      if (text.trim() === '') continue;
      const value: unknown = JSON.parse(text);
      const next = waiting.shift();
      if (!next) continue;
      // the record as the backend wrote it (its field order), once it is known to be a Step record
      if (Step.safeParse(value).success) next.resolve({ record: value as Step, line: text });
      else next.reject(new DataError(`backend: unexpected output: ${text}`));
    }
  })().catch((error: Error) => fail(error));
  const exited = child.then((result) => {
    const message =
      result.exitCode === 0
        ? 'the trainer exited'
        : backendMessage(String(result.stderr), `backend exited with ${result.exitCode ?? result.signal}`);
    // exit 2: a setup the backend refused before training (--dtype/--shard this torch or device cannot run)
    fail(result.exitCode === 2 ? new UsageError(message) : new DataError(message));
    if (result.exitCode !== 0) for (const peer of peers) peer.kill('SIGTERM');
    return result;
  });
  const context: TrainRecordContext = {
    vocab,
    loss: options.loss,
    oldLogprobs: options.oldLogprobs,
  };
  let held = options.weightVersion; // the step whose weights the trainer holds when the open batch starts
  let open = 0;

  const write = (line: string): boolean => {
    if (failure) throw failure;
    return stdin.write(`${line}\n`);
  };
  // Room in the pipe, or the backend's reason for dying while we waited for it.
  const drained = async () => {
    try {
      await Promise.race([once(stdin, 'drain'), exited]);
    } catch {
      await exited; // the write failed because the backend died (bad checkpoint, ...)
    }
    if (failure) throw failure;
  };
  const add = async (entry: SourceLine) => {
    const staleness = options.maxStaleness === undefined ? undefined : { held, max: options.maxStaleness };
    checkTrainRecord(entry, { ...context, staleness });
    open += 1;
    if (!write(entry.text)) await drained();
  };
  // Not async: the end_batch line is written at once (the next add() waits for room in the pipe), and
  // the caller goes on streaming the next batch while this step computes.
  const endBatch = ({ lr, step }: BatchEnd = {}): Promise<TrainedStep> => {
    if (open === 0 && step === undefined)
      return Promise.reject(new DataError('empty batch: no records to train on'));
    if (failure) return Promise.reject(failure);
    const result = new Promise<TrainedStep>((resolve, reject) => waiting.push({ resolve, reject }));
    result.catch(() => {}); // a caller that stops early need not await every step
    write(JSON.stringify({ v: 1, end_batch: true, lr, step }));
    open = 0;
    held = step ?? held + 1;
    return result;
  };
  let queue: Promise<unknown> = Promise.resolve();
  let stopped = false;
  const stopAll = () => {
    stopped = true;
    child.kill('SIGTERM');
    for (const peer of peers) peer.kill('SIGTERM');
  };
  return {
    get open() {
      return open;
    },
    add,
    endBatch,
    step(records, end) {
      const lines = records.map((r) => JSON.stringify(r));
      try {
        lines.forEach((text, i) => {
          checkTrainRecord({ text, line: i + 1, source: 'batch' }, context);
        });
      } catch (error) {
        return Promise.reject(error);
      }
      // batches go in the order step() was called; the next is sent while this one computes
      const sending = queue.then(async () => {
        for (const text of lines) {
          open += 1;
          if (!write(text)) await drained();
        }
        return { pending: endBatch(end) };
      });
      queue = sending.catch(() => {});
      return sending.then((s) => s.pending);
    },
    async close() {
      stdin.end();
      const result = await exited;
      const peerResults = await Promise.all(peers);
      if (stopped) return;
      if (result.exitCode !== 0) throw failure;
      const rank = peerResults.find((r) => r.exitCode !== 0);
      if (rank) {
        throw new DataError(
          backendMessage(
            String(rank.stderr),
            `a data-parallel rank exited with ${rank.exitCode ?? rank.signal}`,
          ),
        );
      }
    },
    async kill() {
      stopAll();
      await exited;
      await Promise.all(peers);
    },
  };
}
