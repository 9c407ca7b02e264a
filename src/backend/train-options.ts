/**
 * train-step's flags, declared once. The commander options of `rstar train-step` (and the trainer
 * flags of `rstar sft-train`), the options type and the config the Python trainer receives are all
 * derived from TRAIN_FLAGS. The backend has no defaults of its own: it gets every `backend` value
 * explicitly (null for an optional flag not given).
 *
 * Adding a flag: one entry here, then its use in src/backend/rstar_backend/train.py (`cfg.<backend>`).
 */
import { type Command, InvalidArgumentError, Option } from 'commander';
import { choice, integer, number } from '../program.js';

interface Flag {
  /** Commander's spelling: `--lr <x>`, `--sync <urls...>`, `--follow`. */
  readonly flags: string;
  readonly description: string;
  /** Parses (and range-checks) the value; without one the value is the string as given. */
  readonly parse?: (value: string) => unknown;
  /** An enum flag (declared through `choice()`). */
  readonly choices?: readonly string[];
  readonly default?: unknown;
  readonly required?: true;
  /** The key of the backend's config that carries this value; absent: the TypeScript driver's own. */
  readonly backend?: string;
  /** `grpo`: meaningless for SFT; `pipeline`: the RL pipeline's (streaming, engines, staleness). */
  readonly group?: 'grpo' | 'pipeline';
}

const LORA_MODULES = ['q', 'k', 'v', 'o', 'gate', 'up', 'down'] as const;

/**
 * --lora-targets: `all-linear`, or a comma list of the short names (q,k,v,o,gate,up,down) or the
 * Hugging Face module names they stand for (q_proj, ..., down_proj). Returns the HF names, in the
 * model's order, joined by commas (what the backend and adapter_config.json's target_modules use).
 */
export function loraTargets(value: string): string {
  if (value === 'all-linear') return LORA_MODULES.map((m) => `${m}_proj`).join(',');
  const names = new Set<string>();
  for (const part of value.split(',').map((p) => p.trim())) {
    const short = part.endsWith('_proj') ? part.slice(0, -'_proj'.length) : part;
    if (!(LORA_MODULES as readonly string[]).includes(short)) {
      throw new InvalidArgumentError(
        `${JSON.stringify(part)} is not a LoRA target (expected all-linear or a comma list of ${LORA_MODULES.join(',')})`,
      );
    }
    names.add(short);
  }
  return LORA_MODULES.filter((m) => names.has(m))
    .map((m) => `${m}_proj`)
    .join(',');
}

function positive(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0) {
    throw new InvalidArgumentError(`${value} is not a number > 0`);
  }
  return n;
}

export const TRAIN_FLAGS = {
  loss: {
    flags: '--loss <kind>',
    description: 'the objective',
    choices: ['sft', 'grpo'],
    required: true,
    backend: 'loss',
  },
  model: {
    flags: '--model <dir>',
    description: 'checkpoint to start from (its optimizer.safetensors continues AdamW)',
    required: true,
    backend: 'model',
  },
  out: {
    flags: '--out <dir>',
    description: 'checkpoint to write; `{step}` in it becomes the step number',
    required: true,
    backend: 'out',
  },
  lr: {
    flags: '--lr <x>',
    description: 'peak learning rate',
    parse: number(0),
    default: 1e-6,
    backend: 'lr',
  },
  follow: {
    flags: '--follow',
    description: 'stay resident: one step per batch; an empty line or {"end_batch":true} ends a batch',
    group: 'pipeline',
  },
  warmupSteps: {
    flags: '--warmup-steps <n>',
    description: 'linear LR warm-up over the first N steps',
    parse: integer(0),
    default: 0,
    backend: 'warmup_steps',
  },
  optimizer: {
    flags: '--optimizer <name>',
    description: 'the optimiser (sgd: the update is lr * gradient)',
    choices: ['adamw', 'sgd'],
    default: 'adamw',
    backend: 'optimizer',
  },
  weightDecay: {
    flags: '--weight-decay <x>',
    description: 'weight decay',
    parse: number(0),
    default: 0.01,
    backend: 'weight_decay',
  },
  beta1: {
    flags: '--beta1 <x>',
    description: "AdamW's first-moment decay",
    parse: number(0, 1),
    default: 0.9,
    backend: 'beta1',
  },
  beta2: {
    flags: '--beta2 <x>',
    description: "AdamW's second-moment decay",
    parse: number(0, 1),
    default: 0.999,
    backend: 'beta2',
  },
  eps: {
    flags: '--eps <x>',
    description: "AdamW's epsilon",
    parse: number(0),
    default: 1e-8,
    backend: 'eps',
  },
  maxGradNorm: {
    flags: '--max-grad-norm <x>',
    description: 'clip the global gradient norm (0: no clipping)',
    parse: number(0),
    default: 1.0,
    backend: 'max_grad_norm',
  },
  clipLow: {
    flags: '--clip-low <x>',
    description: 'GRPO: lower clip of the ratio (1 - x)',
    parse: number(0, 1),
    default: 0.2,
    backend: 'clip_low',
    group: 'grpo',
  },
  clipHigh: {
    flags: '--clip-high <x>',
    description: 'GRPO: upper clip of the ratio (1 + x)',
    parse: number(0),
    default: 0.28,
    backend: 'clip_high',
    group: 'grpo',
  },
  oldLogprobs: {
    flags: '--old-logprobs <src>',
    description: "GRPO: recompute (current weights) | rollout (records' logprobs)",
    choices: ['recompute', 'rollout'],
    default: 'recompute',
    backend: 'old_logprobs',
    group: 'grpo',
  },
  klCoef: {
    flags: '--kl-coef <x>',
    description: 'GRPO: KL penalty to the reference model (0: off)',
    parse: number(0),
    default: 0,
    backend: 'kl_coef',
    group: 'grpo',
  },
  ref: {
    flags: '--ref <dir>',
    description: 'reference checkpoint for --kl-coef (default: --model)',
    backend: 'ref',
    group: 'grpo',
  },
  entropyCoef: {
    flags: '--entropy-coef <x>',
    description: 'entropy bonus (0: off)',
    parse: number(0),
    default: 0,
    backend: 'entropy_coef',
  },
  microBatchTokens: {
    flags: '--micro-batch-tokens <n>',
    description: 'padded tokens per micro-batch (gradient accumulation)',
    parse: integer(1),
    default: 16384,
    backend: 'micro_batch_tokens',
  },
  miniBatches: {
    flags: '--mini-batches <k>',
    description: 'optimiser updates per batch, on K shuffled mini-batches',
    parse: integer(1),
    default: 1,
    backend: 'mini_batches',
  },
  optimizerState: {
    flags: '--optimizer-state <mode>',
    description: "auto: continue --model's AdamW moments and step count when they come from the same --loss",
    choices: ['auto', 'load', 'reset'],
    default: 'auto',
    backend: 'optimizer_state',
  },
  // not --epochs: sft-train's epochs are passes over the data set
  passesPerBatch: {
    flags: '--passes-per-batch <e>',
    description: 'passes over each batch (each pass makes --mini-batches updates)',
    parse: integer(1),
    default: 1,
    backend: 'epochs',
  },
  rolloutCorrection: {
    flags: '--rollout-correction <mode>',
    description: 'GRPO with recomputed old log-probs: the engine-vs-trainer mismatch correction',
    choices: ['token-tis', 'seq-mask', 'none'],
    default: 'token-tis',
    backend: 'rollout_correction',
    group: 'grpo',
  },
  rolloutCorrectionCap: {
    flags: '--rollout-correction-cap <c>',
    description: 'the IS weight cap C (token-tis) or ratio bound (seq-mask)',
    parse: number(1),
    default: 2,
    backend: 'rollout_correction_cap',
    group: 'grpo',
  },
  sync: {
    flags: '--sync <urls...>',
    description: 'after each step, make these engines load the new checkpoint (weight_version = the step)',
    group: 'pipeline',
  },
  engineKind: {
    flags: '--engine-kind <kind>',
    description: '--sync engines: sglang (also engine-serve) | vllm',
    choices: ['sglang', 'vllm'],
    default: 'sglang',
    group: 'pipeline',
  },
  weightVersion: {
    flags: '--weight-version <n>',
    description: "the policy version of --model (the first batch's step - 1)",
    parse: integer(0),
    default: 0,
    group: 'pipeline',
  },
  maxStaleness: {
    flags: '--max-staleness <n>',
    description: "refuse a trajectory whose policy_version is more than N steps behind the trainer's weights",
    parse: integer(0),
    group: 'pipeline',
  },
  keepCheckpoints: {
    flags: '--keep-checkpoints <k>',
    description:
      'after each step, keep only the last K step checkpoints of --out (those --keep-every names and --model excepted; 0: keep all)',
    parse: integer(0),
    default: 0,
    group: 'pipeline',
  },
  keepEvery: {
    flags: '--keep-every <n>',
    description:
      'with --keep-checkpoints, also keep every checkpoint whose step is a multiple of N (0: none)',
    parse: integer(0),
    default: 0,
    group: 'pipeline',
  },
  maxShardBytes: {
    flags: '--max-shard-bytes <n>',
    description: 'shard the written safetensors (0: one file)',
    parse: integer(0),
    default: 0,
    backend: 'max_shard_bytes',
  },
  policy: {
    flags: '--policy <name>',
    description: 'policy id in the Step record (default: the checkpoint path)',
    backend: 'policy',
  },
  dtype: {
    flags: '--dtype <dtype>',
    description:
      'compute dtype; master weights, gradients and AdamW state stay fp32 (bf16 also on CPU, fp16 on a GPU only)',
    choices: ['fp32', 'bf16', 'fp16'],
    default: 'fp32',
    backend: 'dtype',
  },
  shard: {
    flags: '--shard <mode>',
    description:
      'with --nproc >= 2: none (data parallel) | full (FSDP2, ZeRO-3) | grad-op (FSDP2, ZeRO-2); torch >= 2.4',
    choices: ['none', 'full', 'grad-op'],
    default: 'none',
    backend: 'shard',
  },
  device: {
    flags: '--device <name>',
    description: 'auto | cpu | cuda | cuda:N',
    default: 'auto',
    backend: 'device',
  },
  seed: {
    flags: '--seed <n>',
    description: 'torch seed (and the mini-batch shuffles)',
    parse: integer(0),
    default: 0,
    backend: 'seed',
  },
  loraRank: {
    flags: '--lora-rank <r>',
    description:
      'train a LoRA adapter of rank R (base frozen, AdamW over the adapter only); --out then writes an adapter folder in PEFT format',
    parse: integer(1),
    backend: 'lora_rank',
  },
  loraAlpha: {
    flags: '--lora-alpha <a>',
    description: 'LoRA alpha: the update is scaled by alpha / rank (default: the rank, a scale of 1)',
    parse: positive,
    backend: 'lora_alpha',
  },
  loraDropout: {
    flags: '--lora-dropout <p>',
    description: "dropout on the LoRA branch's input",
    parse: number(0, 0.99),
    default: 0,
    backend: 'lora_dropout',
  },
  loraTargets: {
    flags: '--lora-targets <list>',
    description: 'the layers LoRA wraps: all-linear | a comma list of q,k,v,o,gate,up,down',
    parse: loraTargets,
    default: 'all-linear',
    backend: 'lora_targets',
  },
  loraInit: {
    flags: '--lora-init <dir>',
    description:
      'warm-start LoRA from this adapter folder (PEFT format): its rank, alpha, dropout and targets (a --lora-rank or --lora-alpha given must match), and its AdamW moments when it has them',
    backend: 'lora_init',
  },
  nproc: {
    flags: '--nproc <n>',
    description: 'training processes (torch.distributed): data parallel, or sharded with --shard',
    parse: integer(1),
    default: 1,
  },
  threads: {
    flags: '--threads <n>',
    description:
      'CPU threads per training process (0: the cores shared among the processes); 1 leaves a core to an engine that overlaps',
    parse: integer(0),
    default: 0,
  },
} as const satisfies Record<string, Flag>;

type Flags = typeof TRAIN_FLAGS;
export type TrainFlagName = keyof Flags;

type ValueOf<F> = F extends { choices: readonly (infer C)[] }
  ? C
  : F extends { parse: (value: string) => infer T }
    ? T
    : F extends { flags: `${string}...>` }
      ? string[]
      : F extends { flags: `${string}<${string}>` }
        ? string
        : boolean;
type AlwaysSet<F> = F extends { default: unknown } ? true : F extends { required: true } ? true : false;

/** Every train-step value: those with a default or required always set, the others optional. */
export type TrainOptions = {
  -readonly [K in TrainFlagName as AlwaysSet<Flags[K]> extends true ? K : never]: ValueOf<Flags[K]>;
} & {
  -readonly [K in TrainFlagName as AlwaysSet<Flags[K]> extends true ? never : K]?: ValueOf<Flags[K]>;
};

type BackendKey<K extends TrainFlagName> = Flags[K] extends { backend: infer B extends string } ? B : never;

/** What the Python trainer reads (`cfg.<key>`): every backend value, null for an unset optional one. */
export type BackendConfig = {
  [K in TrainFlagName as BackendKey<K>]: ValueOf<Flags[K]> | null;
};

const entries = Object.entries(TRAIN_FLAGS) as [TrainFlagName, Flag][];

function option(name: TrainFlagName, flag: Flag): Option {
  const o = flag.choices
    ? choice(flag.flags, flag.description, flag.choices, flag.default as string | undefined)
    : new Option(flag.flags, flag.description);
  if (flag.parse) o.argParser(flag.parse);
  if (flag.default !== undefined && !flag.choices) o.default(flag.default);
  if (flag.required) o.makeOptionMandatory();
  // the table's key is the options' property: a misspelt key would silently never be set
  if (o.attributeName() !== name)
    throw new Error(`TRAIN_FLAGS.${name}: ${flag.flags} sets '${o.attributeName()}'`);
  return o;
}

/** Adds the table's flags to `command` (those `include` keeps: sft-train takes only the general ones). */
export function addTrainFlags(
  command: Command,
  include: (name: TrainFlagName, flag: Flag) => boolean = () => true,
): Command {
  for (const [name, flag] of entries) if (include(name, flag)) command.addOption(option(name, flag));
  return command;
}

/** A complete TrainOptions from the table's defaults and `values` (those a flag did not set). */
export function trainOptions(
  values: Pick<TrainOptions, 'loss' | 'model' | 'out'> & Partial<TrainOptions>,
): TrainOptions {
  const defaults: Record<string, unknown> = {};
  for (const [name, flag] of entries) if (flag.default !== undefined) defaults[name] = flag.default;
  return { ...defaults, ...values } as TrainOptions;
}

/** The config the backend is started with: every `backend` value of the table, by its backend key. */
export function backendConfig(options: TrainOptions): BackendConfig {
  const config: Record<string, unknown> = {};
  const values = options as Record<string, unknown>;
  for (const [name, flag] of entries) if (flag.backend) config[flag.backend] = values[name] ?? null;
  return config as BackendConfig;
}

/** The argv of `run.py` for a trainer: `train --config JSON`. */
export function backendTrainArgv(options: TrainOptions): string[] {
  return ['train', '--config', JSON.stringify(backendConfig(options))];
}
