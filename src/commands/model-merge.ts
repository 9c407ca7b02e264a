import { existsSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { execa } from 'execa';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from '../backend/python.js';
import { DataError, UsageError } from '../errors.js';
import { parse, program } from '../program.js';

const HELP = `
Merges a LoRA adapter folder (PEFT format: adapter_config.json + adapter_model.safetensors, as
train-step --lora-rank writes) into its base checkpoint: W + (lora_alpha / r) * B @ A in every
target layer, computed in fp32 and written in the base's dtype, with the base's config and tokenizer.
A missing file, a rank that does not match the weights, a target module the model lacks or an
adapter trained on another base exits 1 with one line naming the file and field.`;

/** True when DIR exists and holds anything (a file where DIR should be counts too). */
function occupied(dir: string): boolean {
  if (!existsSync(dir)) return false;
  try {
    return readdirSync(dir).length > 0;
  } catch {
    return true;
  }
}

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
  // written beside --out and renamed into place: --out is always one whole checkpoint
  const partial = `${out}.partial-${process.pid}`;
  rmSync(partial, { recursive: true, force: true });
  const python = await findPython();
  const args = [BACKEND_SCRIPT, 'merge', '--base', o.base, '--adapter', o.adapter, '--out', partial];
  const result = await execa(python, args, { env: backendEnv(), reject: false });
  if (result.exitCode !== 0) {
    rmSync(partial, { recursive: true, force: true });
    throw new DataError(backendMessage(String(result.stderr), 'model-merge failed'));
  }
  const old = `${out}.old-${process.pid}`;
  if (existsSync(out)) renameSync(out, old);
  renameSync(partial, out);
  rmSync(old, { recursive: true, force: true });
  const summary = JSON.parse(String(result.stdout)) as Record<string, unknown>;
  process.stdout.write(`${JSON.stringify({ ...summary, checkpoint: out })}\n`);
}
