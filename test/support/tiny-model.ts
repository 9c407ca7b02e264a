import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lines, rstar, smallConfig } from './helpers.js';

/** What `rstar model-init` prints about the model it wrote. */
export interface ModelInitInfo {
  parameters: number;
  tokenizer_files: string[];
}

export interface TinyModel {
  /** A fresh temporary folder holding everything below; the caller removes it. */
  dir: string;
  /** `dir/cfg/config.json`: `smallConfig()`, beside its tokenizer files. */
  config: string;
  /** `dir/m0`: the model `model-init` wrote from `config`. */
  model: string;
  init: ModelInitInfo;
}

/**
 * A `model-init`'ed model of `smallConfig()` in a new folder under the system's temp dir, made as a
 * user would make one (the CLI, not the backend's Python directly), so that the tests that train it
 * start from what train-step really loads. `chatTemplate` adds a chat template to the tokenizer
 * files, which model-init must copy.
 */
export async function tinyModel(
  prefix: string,
  options: { seed?: number; chatTemplate?: boolean } = {},
): Promise<TinyModel> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const cfg = join(dir, 'cfg');
  mkdirSync(cfg);
  const config = join(cfg, 'config.json');
  writeFileSync(config, JSON.stringify(smallConfig()));
  writeFileSync(join(cfg, 'tokenizer_config.json'), '{"eos_token": "<|im_end|>"}');
  if (options.chatTemplate) writeFileSync(join(cfg, 'chat_template.jinja'), '{{ messages }}');
  const model = join(dir, 'm0');
  const seed = String(options.seed ?? 3);
  const r = await rstar(['model-init', '--config', config, '--out', model, '--seed', seed]);
  if (r.code !== 0) throw new Error(`model-init failed (exit ${r.code}):\n${r.stderr}`);
  return { dir, config, model, init: lines<ModelInitInfo>(r.stdout)[0] };
}
