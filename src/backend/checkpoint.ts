import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { DataError } from '../errors.js';

/** The few config.json fields the TypeScript side checks records against. */
export interface CheckpointConfig {
  vocab_size: number;
  eos_token_id: number;
  max_position_embeddings: number;
}

/** Reads DIR/config.json, failing with a clear message when DIR is not a checkpoint folder. */
export function readCheckpointConfig(dir: string): CheckpointConfig {
  const path = join(dir, 'config.json');
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'ENOENT' || code === 'ENOTDIR')
      throw new DataError(`${dir}: not a checkpoint: no config.json`);
    throw new DataError(`${path}: ${(error as Error).message}`);
  }
  let config: Record<string, unknown>;
  try {
    config = JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new DataError(`${path}: invalid JSON: ${(error as Error).message}`);
  }
  const vocab = config.vocab_size;
  if (typeof vocab !== 'number' || !Number.isInteger(vocab) || vocab <= 0) {
    throw new DataError(`${path}: vocab_size: expected a positive integer`);
  }
  const eos = Array.isArray(config.eos_token_id) ? config.eos_token_id[0] : config.eos_token_id;
  return {
    vocab_size: vocab,
    eos_token_id: typeof eos === 'number' ? eos : 0,
    max_position_embeddings:
      typeof config.max_position_embeddings === 'number' ? config.max_position_embeddings : 0,
  };
}
