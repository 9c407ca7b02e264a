import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
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

/** Which of a run's step checkpoints outlive a new one (train-step --keep-checkpoints, --keep-every). */
export interface KeepPolicy {
  /** The last `last` checkpoints (the newest included) stay; 0 keeps every one. */
  last: number;
  /** Also every checkpoint whose step is a multiple of this (0: none), e.g. the steps a recipe evaluates. */
  every: number;
  /** Folders never removed: the checkpoint the trainer started from (it still reads its tokenizer). */
  protect: readonly string[];
}

/**
 * The complete step checkpoints of an `--out` template (`{step}` in its last path component), by
 * step. A folder without trainer_state.json is a save in progress or another run's: never counted.
 * A LoRA run's step folders are adapter folders (PEFT's files plus trainer_state.json): they count,
 * and are kept or removed, the same way.
 */
export function stepCheckpoints(template: string): Map<number, string> {
  const found = new Map<number, string>();
  const name = basename(template);
  if (!name.includes('{step}') || dirname(template).includes('{step}')) return found;
  const [before, after] = name.split('{step}', 2) as [string, string];
  const dir = dirname(template);
  let entries: string[];
  try {
    entries = readdirSync(dir);
  } catch {
    return found;
  }
  for (const entry of entries) {
    if (!entry.startsWith(before) || !entry.endsWith(after)) continue;
    const digits = entry.slice(before.length, entry.length - after.length);
    if (!/^\d+$/.test(digits)) continue;
    const path = join(dir, entry);
    if (existsSync(join(path, 'trainer_state.json'))) found.set(Number(digits), path);
  }
  return found;
}

/**
 * Removes the checkpoints of `template` older than `step` that the policy does not keep; returns
 * their paths. Never touches `step` itself, a newer one, or a protected folder, so a resume (from the
 * newest) and an evaluation of a kept step still find theirs.
 */
export function pruneCheckpoints(template: string, step: number, policy: KeepPolicy): string[] {
  if (policy.last <= 0) return [];
  const all = stepCheckpoints(template);
  const steps = [...all.keys()].filter((k) => k <= step).sort((a, b) => b - a);
  const recent = new Set(steps.slice(0, policy.last));
  const protect = new Set(policy.protect.map((p) => resolve(p)));
  const removed: string[] = [];
  for (const k of steps) {
    const path = all.get(k) as string;
    if (k === step || recent.has(k) || (policy.every > 0 && k % policy.every === 0)) continue;
    if (protect.has(resolve(path))) continue;
    rmSync(path, { recursive: true, force: true });
    removed.push(path);
  }
  return removed;
}
