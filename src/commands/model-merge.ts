import { resolve } from 'node:path';
import { occupied, writeCheckpoint } from '../backend/write-checkpoint.js';
import { UsageError } from '../errors.js';
import { parse, program } from '../program.js';

const HELP = `
Merges a LoRA adapter folder (PEFT format: adapter_config.json + adapter_model.safetensors, as
train-step --lora-rank writes) into its base checkpoint: W + (lora_alpha / r) * B @ A in every
target layer, computed in fp32 and written in the base's dtype, with the base's config and tokenizer.
A missing file, a rank that does not match the weights, a target module the model lacks or an
adapter trained on another base exits 1 with one line naming the file and field.`;

export async function run(argv: string[]): Promise<void> {
  const cmd = program('model-merge', 'a LoRA adapter merged into its base: a full HF checkpoint')
    .requiredOption('--base <dir>', 'the base checkpoint the adapter was trained on')
    .requiredOption('--adapter <dir>', 'the adapter folder (PEFT format)')
    .requiredOption('--out <dir>', 'checkpoint folder to write (new or empty, unless --force)')
    .option('--force', 'replace a non-empty --out whole')
    .addHelpText('after', HELP);
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{ base: string; adapter: string; out: string; force?: boolean }>();
  const out = resolve(o.out);
  if (out === resolve(o.base) || out === resolve(o.adapter)) {
    throw new UsageError('--out: must not be --base or --adapter');
  }
  if (occupied(out) && !o.force) {
    throw new UsageError(`--out ${o.out}: not empty; give --force to replace it whole`);
  }
  await writeCheckpoint(out, 'merge', ['--base', o.base, '--adapter', o.adapter]);
}
