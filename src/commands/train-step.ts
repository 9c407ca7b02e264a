import { once } from 'node:events';
import { type AddressInfo, createServer } from 'node:net';
import { availableParallelism } from 'node:os';
import type { Writable } from 'node:stream';
import { execa } from 'execa';
import { readCheckpointConfig } from '../backend/checkpoint.js';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from '../backend/python.js';
import { DataError, UsageError } from '../errors.js';
import { NdjsonWriter, openInput, parseLine, readLines } from '../ndjson/index.js';
import { integer, number, parse, program } from '../program.js';
import { TrainRecord } from '../records/trajectory.js';
import { type EngineClient, type EngineKind, engineClient } from '../rollout/engines.js';

interface Options {
  loss: string;
  model: string;
  out: string;
  lr: number;
  optimizer: string;
  follow?: boolean;
  warmupSteps: number;
  weightDecay: number;
  maxGradNorm: number;
  clipLow: number;
  clipHigh: number;
  oldLogprobs: string;
  klCoef: number;
  ref?: string;
  entropyCoef: number;
  microBatchTokens: number;
  miniBatches: number;
  optimizerState: string;
  epochs: number;
  rolloutCorrection: string;
  rolloutCorrectionCap: number;
  sync?: string[];
  engineKind: string;
  weightVersion: number;
  maxStaleness?: number;
  maxShardBytes: number;
  policy?: string;
  device: string;
  seed: number;
  nproc: number;
}

/**
 * The end_batch line forwarded to the backend: what a driver may set for the step it closes, the
 * learning rate (`"lr"`, so the driver owns the schedule) and the step number (`"step"`, the `{step}`
 * of --out and --policy; rollout --steps numbers its batches).
 */
function endBatchLine(line: unknown, where: string): string {
  const { lr, step } = line as { lr?: unknown; step?: unknown };
  if (lr !== undefined && (typeof lr !== 'number' || !Number.isFinite(lr) || lr <= 0)) {
    throw new DataError(`${where}: lr: expected a positive number, got ${JSON.stringify(lr)}`);
  }
  if (step !== undefined && (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0)) {
    throw new DataError(`${where}: step: expected a non-negative integer, got ${JSON.stringify(step)}`);
  }
  return JSON.stringify({ v: 1, end_batch: true, lr, step });
}

function backendArgs(o: Options): string[] {
  const args = ['train', '--follow', '--loss', o.loss, '--model', o.model, '--out', o.out];
  const flag = (name: string, value: string | number | undefined) => {
    if (value !== undefined) args.push(name, String(value));
  };
  flag('--lr', o.lr);
  flag('--optimizer', o.optimizer);
  flag('--warmup-steps', o.warmupSteps);
  flag('--weight-decay', o.weightDecay);
  flag('--max-grad-norm', o.maxGradNorm);
  flag('--clip-low', o.clipLow);
  flag('--clip-high', o.clipHigh);
  flag('--old-logprobs', o.oldLogprobs);
  flag('--kl-coef', o.klCoef);
  flag('--ref', o.ref);
  flag('--entropy-coef', o.entropyCoef);
  flag('--micro-batch-tokens', o.microBatchTokens);
  flag('--mini-batches', o.miniBatches);
  flag('--optimizer-state', o.optimizerState);
  flag('--epochs', o.epochs);
  flag('--rollout-correction', o.rolloutCorrection);
  flag('--rollout-correction-cap', o.rolloutCorrectionCap);
  flag('--max-shard-bytes', o.maxShardBytes);
  flag('--policy', o.policy);
  flag('--device', o.device);
  flag('--seed', o.seed);
  return args;
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
async function distributedEnv(n: number): Promise<NodeJS.ProcessEnv[]> {
  const port = String(await freePort());
  // As torchrun does: ranks share the host's cores instead of each starting one thread per core
  // (OpenBLAS reads OMP_NUM_THREADS too). A value already set wins.
  const threads = process.env.OMP_NUM_THREADS ?? String(Math.max(1, Math.floor(availableParallelism() / n)));
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

interface StepRecord {
  step: number;
  checkpoint: string;
}

async function syncEngines(engines: EngineClient[], record: StepRecord): Promise<void> {
  try {
    await Promise.all(engines.map((e) => e.reload(record.checkpoint, String(record.step))));
  } catch (error) {
    throw new DataError(`--sync: step ${record.step}: ${(error as Error).message}`);
  }
}

/**
 * A trajectory of the batch that follows step `held` was generated by `policy_version`; more than
 * `max` steps behind is off-policy beyond what the run allows (rollout --max-staleness waits for the
 * engines to serve a recent enough version, so this catches a pipeline wired wrong).
 */
function checkStaleness(record: TrainRecord, where: string, held: number, max: number): void {
  const v = (record as { policy_version?: unknown }).policy_version;
  const version =
    typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : typeof v === 'number' ? v : undefined;
  if (version === undefined) {
    throw new DataError(
      `${where}: policy_version: required by --max-staleness (rollout --steps stamps it), got ${JSON.stringify(v)}`,
    );
  }
  if (held - version > max) {
    throw new DataError(
      `${where}: policy_version: generated by policy ${version}, ${held - version} steps behind the trainer's step-${held} weights (--max-staleness ${max})`,
    );
  }
}

async function send(stdin: Writable, line: string): Promise<void> {
  if (!stdin.write(`${line}\n`)) await once(stdin, 'drain');
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('train-step', 'one optimiser step (SFT or GRPO) per batch on the PyTorch backend')
    .argument('[file]', 'NDJSON trajectory-shaped records (default: stdin)')
    .requiredOption('--loss <kind>', 'sft | grpo')
    .requiredOption('--model <dir>', 'checkpoint to start from (its optimizer.safetensors continues AdamW)')
    .requiredOption('--out <dir>', 'checkpoint to write; `{step}` in it becomes the step number')
    .option('--lr <x>', 'peak learning rate', number(0), 1e-6)
    .option('--follow', 'stay resident: one step per batch; an empty line or {"end_batch":true} ends a batch')
    .option('--warmup-steps <n>', 'linear LR warm-up over the first N steps', integer(0), 0)
    .option('--optimizer <name>', 'adamw | sgd (sgd: the update is lr * gradient)', 'adamw')
    .option('--weight-decay <x>', 'weight decay', number(0), 0.01)
    .option('--max-grad-norm <x>', 'clip the global gradient norm (0: no clipping)', number(0), 1.0)
    .option('--clip-low <x>', 'GRPO: lower clip of the ratio (1 - x)', number(0, 1), 0.2)
    .option('--clip-high <x>', 'GRPO: upper clip of the ratio (1 + x)', number(0), 0.28)
    .option(
      '--old-logprobs <src>',
      "GRPO: recompute (current weights) | rollout (records' logprobs)",
      'recompute',
    )
    .option('--kl-coef <x>', 'GRPO: KL penalty to the reference model (0: off)', number(0), 0)
    .option('--ref <dir>', 'reference checkpoint for --kl-coef (default: --model)')
    .option('--entropy-coef <x>', 'entropy bonus (0: off)', number(0), 0)
    .option(
      '--micro-batch-tokens <n>',
      'padded tokens per micro-batch (gradient accumulation)',
      integer(1),
      16384,
    )
    .option(
      '--mini-batches <k>',
      'GRPO/SFT: optimiser updates per batch, on K shuffled mini-batches',
      integer(1),
      1,
    )
    .option(
      '--optimizer-state <mode>',
      "auto (continue --model's AdamW moments and step count when they come from the same --loss) | load | reset",
      'auto',
    )
    .option('--epochs <e>', 'passes over the batch (each pass makes --mini-batches updates)', integer(1), 1)
    .option(
      '--rollout-correction <mode>',
      'GRPO with recomputed old log-probs: token-tis | seq-mask | none (engine-vs-trainer mismatch)',
      'token-tis',
    )
    .option(
      '--rollout-correction-cap <c>',
      'the IS weight cap C (token-tis) or ratio bound (seq-mask)',
      number(1),
      2,
    )
    .option(
      '--sync <urls...>',
      'after each step, make these engines load the new checkpoint (weight_version = the step)',
    )
    .option('--engine-kind <kind>', '--sync engines: sglang (also engine-serve) | vllm', 'sglang')
    .option(
      '--weight-version <n>',
      "the policy version of --model (the first batch's step - 1)",
      integer(0),
      0,
    )
    .option(
      '--max-staleness <n>',
      "refuse a trajectory whose policy_version is more than N steps behind the trainer's weights",
      integer(0),
    )
    .option('--max-shard-bytes <n>', 'shard the written safetensors (0: one file)', integer(0), 0)
    .option('--policy <name>', 'policy id in the Step record (default: the checkpoint path)')
    .option('--device <name>', 'auto | cpu | cuda | cuda:N', 'auto')
    .option('--seed <n>', 'torch seed', integer(0), 0)
    .option('--nproc <n>', 'data-parallel processes through torch.distributed.run', integer(1), 1);
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<Options>();
  if (o.loss !== 'sft' && o.loss !== 'grpo')
    throw new UsageError(`--loss: expected sft or grpo, got '${o.loss}'`);
  if (o.optimizer !== 'adamw' && o.optimizer !== 'sgd') {
    throw new UsageError(`--optimizer: expected adamw or sgd, got '${o.optimizer}'`);
  }
  if (o.oldLogprobs !== 'recompute' && o.oldLogprobs !== 'rollout') {
    throw new UsageError(`--old-logprobs: expected recompute or rollout, got '${o.oldLogprobs}'`);
  }
  if (!['auto', 'load', 'reset'].includes(o.optimizerState)) {
    throw new UsageError(`--optimizer-state: expected auto, load or reset, got '${o.optimizerState}'`);
  }
  if (!['token-tis', 'seq-mask', 'none'].includes(o.rolloutCorrection)) {
    throw new UsageError(
      `--rollout-correction: expected token-tis, seq-mask or none, got '${o.rolloutCorrection}'`,
    );
  }
  if (o.engineKind !== 'sglang' && o.engineKind !== 'vllm') {
    throw new UsageError(`--engine-kind: expected sglang or vllm, got '${o.engineKind}'`);
  }
  const { vocab_size: vocab } = readCheckpointConfig(o.model);
  const engines = (o.sync ?? []).map((url) => engineClient(url, o.engineKind as EngineKind));
  if (o.ref) readCheckpointConfig(o.ref);
  const python = await findPython();
  const args = [BACKEND_SCRIPT, ...backendArgs(o)];
  const world = o.nproc > 1 ? await distributedEnv(o.nproc) : [{}];
  // Started before the input is read, so loading the model overlaps with the upstream producer.
  // Rank 0 reads the batches and broadcasts them; the other ranks need no stdio of ours.
  const child = execa(python, args, {
    env: { ...backendEnv(), ...world[0] },
    reject: false,
    stdin: 'pipe',
    stdout: 'pipe',
    stderr: 'pipe',
  });
  const peers = world.slice(1).map((env) =>
    execa(python, args, {
      env: { ...backendEnv(), ...env },
      reject: false,
      stdin: 'ignore',
      stdout: 'ignore',
    }),
  );
  const stopPeers = async () => {
    for (const peer of peers) peer.kill('SIGTERM');
    await Promise.all(peers);
  };
  child.stdin?.on('error', () => {}); // an early backend exit is reported from its exit status below
  const writer = new NdjsonWriter();
  const forwarded = (async () => {
    for await (const { text } of readLines(child.stdout!, 'backend')) {
      if (text.trim() === '') continue;
      // The engines load the step's checkpoint before its Step record goes downstream, so a reader
      // of the record (or a rollout waiting for this weight_version) finds them serving it.
      if (engines.length > 0) await syncEngines(engines, JSON.parse(text) as StepRecord);
      await writer.writeRaw(text);
    }
  })();
  // A failed sync stops the trainer: training on while the engines serve stale weights would make
  // every later batch off-policy without anyone noticing.
  forwarded.catch(() => {
    child.kill('SIGTERM');
    for (const peer of peers) peer.kill('SIGTERM');
  });

  const { stream, source } = openInput(cmd.args[0]);
  let inBatch = 0;
  let total = 0;
  let numberedSteps = 0;
  let held = o.weightVersion; // the step whose weights the trainer holds when this batch starts
  try {
    for await (const entry of readLines(stream, source)) {
      const blank = entry.text.trim() === '';
      if (blank || /"end_batch"\s*:\s*true/.test(entry.text)) {
        const line = blank
          ? '{"v":1,"end_batch":true}'
          : endBatchLine(JSON.parse(entry.text), `${source}:${entry.line}`);
        const numbered = (JSON.parse(line) as { step?: number }).step;
        // a numbered step goes to the backend even when empty: it still checkpoints and syncs
        if (o.follow && (inBatch > 0 || numbered !== undefined)) {
          await send(child.stdin!, line);
          inBatch = 0;
          total += numbered !== undefined ? 1 : 0;
          numberedSteps += numbered !== undefined ? 1 : 0;
          held = numbered ?? held + 1;
        }
        continue;
      }
      const record = parseLine(TrainRecord, entry);
      const where = `${source}:${entry.line}`;
      for (const key of ['prompt_ids', 'response_ids'] as const) {
        const i = record[key].findIndex((t) => t >= vocab);
        if (i >= 0) {
          throw new DataError(
            `${where}: ${key}.${i}: token id ${record[key][i]} is out of the vocabulary (vocab_size ${vocab})`,
          );
        }
      }
      if (o.loss === 'grpo' && record.advantage === undefined) {
        throw new DataError(`${where}: advantage: required by --loss grpo (run \`rstar advantage\` first)`);
      }
      if (o.loss === 'grpo' && o.oldLogprobs === 'rollout' && record.logprobs === undefined) {
        throw new DataError(`${where}: logprobs: required by --old-logprobs rollout`);
      }
      if (o.maxStaleness !== undefined) checkStaleness(record, where, held, o.maxStaleness);
      await send(child.stdin!, entry.text);
      inBatch += 1;
      total += 1;
    }
  } catch (error) {
    child.kill('SIGTERM');
    const result = await child;
    await stopPeers();
    if (error instanceof SyntaxError)
      throw new DataError(`${source}: invalid end_batch line: ${error.message}`);
    // a write that failed because the backend died (bad checkpoint, ...): report the backend's reason
    if (!(error instanceof DataError) && result.exitCode !== 0 && result.exitCode !== undefined) {
      throw new DataError(backendMessage(String(result.stderr), String(error)));
    }
    throw error;
  }
  if (o.follow && numberedSteps > 0 && inBatch > 0) {
    // rollout --steps closes every batch; records after the last end_batch are a step cut short:
    // the backend drops them and ends after the steps before, which stay trained and saved
    await send(child.stdin!, '{"v":1,"end_batch":true,"discard":true}');
    child.stdin?.end();
    await child;
    await Promise.all(peers);
    await forwarded.catch(() => {});
    await writer.end();
    throw new DataError(
      `${source}: the last ${inBatch} records have no end_batch line (the producer stopped mid-step): not trained`,
    );
  }
  if (total === 0) {
    child.kill('SIGTERM');
    await child;
    await stopPeers();
    throw new DataError(`${source}: empty batch: no records to train on`);
  }
  child.stdin?.end();
  const result = await child;
  const peerResults = await Promise.all(peers);
  await forwarded; // a sync failure is the reason the backend was stopped: it is thrown first
  await writer.end();
  if (result.exitCode !== 0) {
    throw new DataError(
      backendMessage(String(result.stderr), `backend exited with ${result.exitCode ?? result.signal}`),
    );
  }
  const failed = peerResults.find((r) => r.exitCode !== 0);
  if (failed)
    throw new DataError(
      backendMessage(String(failed.stderr), `a data-parallel rank exited with ${failed.exitCode}`),
    );
}
