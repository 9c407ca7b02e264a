import { resolve } from 'node:path';
import { occupied, writeCheckpoint } from '../backend/write-checkpoint.js';
import { UsageError } from '../errors.js';
import { choice, integer, parse, program } from '../program.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'model-init',
    'randomly initialised Qwen3, Qwen2 or Llama checkpoint (HF layout), from a config.json or tiny',
  )
    .option(
      '--config <file>',
      'a Hugging Face config.json (Qwen3, Qwen2/2.5 or Llama 3.x; its architectures/model_type pick the model); tokenizer files beside it are copied',
    )
    .addOption(
      choice(
        '--arch <name>',
        "without --config: a tiny random model of this architecture with the test fixture's tokenizer; with it: the architecture when config.json names none",
        ['qwen3', 'qwen2', 'llama'],
      ),
    )
    .requiredOption('--out <dir>', 'checkpoint folder to write (new or empty, unless --force)')
    .option('--force', 'replace a non-empty --out whole (its AdamW state and step count go with it)')
    .option('--seed <n>', 'initialisation seed', integer(0), 0)
    .addOption(
      choice(
        '--init <scheme>',
        'normal: N(0, initializer_range); induction: heads above the first layer start as copying heads',
        ['normal', 'induction'],
        'normal',
      ),
    )
    .option(
      '--max-shard-bytes <n>',
      'split model.safetensors into shards of at most N bytes (0: one file)',
      integer(0),
      0,
    );
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{
    config?: string;
    arch?: string;
    out: string;
    force?: boolean;
    seed: number;
    init: string;
    maxShardBytes: number;
  }>();
  if (o.config === undefined && o.arch === undefined) {
    throw new UsageError('give --config FILE (a config.json), --arch qwen3|qwen2|llama, or both');
  }
  const out = resolve(o.out);
  // Writing new weights into an old checkpoint would leave its optimizer.safetensors and
  // trainer_state.json behind, and the next train-step would continue their AdamW moments.
  if (occupied(out) && !o.force) {
    throw new UsageError(
      `--out ${o.out}: not empty (an earlier checkpoint?); give --force to replace it whole`,
    );
  }
  await writeCheckpoint(out, 'init', [
    ...(o.config === undefined ? [] : ['--config', o.config]),
    ...(o.arch === undefined ? [] : ['--arch', o.arch]),
    '--seed',
    String(o.seed),
    '--init',
    o.init,
    ...(o.maxShardBytes > 0 ? ['--max-shard-bytes', String(o.maxShardBytes)] : []),
  ]);
}
