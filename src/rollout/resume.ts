import { closeSync, existsSync, ftruncateSync, openSync, readFileSync } from 'node:fs';
import { DataError } from '../errors.js';
import { writeFileAtomic } from '../ndjson/index.js';

/**
 * Ids of the trajectories an earlier run already wrote to `file`. A last line cut short by a
 * kill is removed from the file (it is regenerated), so appending continues on a line boundary.
 * Trajectories that ended with `finish: "error"` (an infrastructure failure) are removed too, so
 * the resumed run generates them again instead of keeping the failure.
 */
export function finishedIds(file: string): Set<string> {
  const ids = new Set<string>();
  if (!existsSync(file)) return ids;
  const text = readFileSync(file, 'utf8');
  const end = text.lastIndexOf('\n') + 1;
  if (end < text.length) {
    const fd = openSync(file, 'r+');
    try {
      ftruncateSync(fd, Buffer.byteLength(text.slice(0, end)));
    } finally {
      closeSync(fd);
    }
  }
  const kept: string[] = [];
  let dropped = 0;
  for (const [i, line] of text.slice(0, end).split('\n').entries()) {
    if (line.trim() === '') continue;
    let record: { id?: unknown; finish?: unknown };
    try {
      record = JSON.parse(line) as typeof record;
    } catch (error) {
      throw new DataError(`${file}:${i + 1}: invalid JSON: ${(error as Error).message}`);
    }
    if (typeof record.id !== 'string') throw new DataError(`${file}:${i + 1}: id: expected a string`);
    if (record.finish === 'error') {
      dropped += 1;
      continue;
    }
    kept.push(line);
    ids.add(record.id);
  }
  if (dropped > 0) writeFileAtomic(file, kept.map((l) => `${l}\n`).join(''));
  return ids;
}

/**
 * Rewrites the per-step statistics file (`rollout --steps --step-stats FILE`) of a run resuming at
 * `firstStep`, without the lines of steps from `firstStep` on: those steps are about to run again
 * and append their lines anew, so each step keeps exactly one. The earlier lines stay, byte for
 * byte; a last line cut short by a kill goes. The file is replaced whole (temp file and rename),
 * so a crash here loses nothing. Returns how many lines were dropped.
 */
export function dropStepsFrom(file: string, firstStep: number): number {
  if (!existsSync(file)) return 0;
  const text = readFileSync(file, 'utf8');
  const lines = text.split('\n');
  // After the last newline: '' in a whole file, else a line being written when the run stopped.
  let dropped = lines.pop() === '' ? 0 : 1;
  const kept: string[] = [];
  for (const [i, line] of lines.entries()) {
    if (line.trim() === '') continue;
    let step: unknown;
    try {
      step = (JSON.parse(line) as { step?: unknown }).step;
    } catch (error) {
      throw new DataError(`${file}:${i + 1}: invalid JSON: ${(error as Error).message}`);
    }
    if (typeof step !== 'number' || !Number.isInteger(step))
      throw new DataError(`${file}:${i + 1}: step: expected an integer`);
    if (step >= firstStep) dropped += 1;
    else kept.push(`${line}\n`);
  }
  if (dropped > 0) writeFileAtomic(file, kept.join(''));
  return dropped;
}
