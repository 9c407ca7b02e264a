import { closeSync, existsSync, ftruncateSync, openSync, readFileSync } from 'node:fs';
import { DataError } from '../errors.js';

/**
 * Ids of the trajectories an earlier run already wrote to `file`. A last line cut short by a
 * kill is removed from the file (it is regenerated), so appending continues on a line boundary.
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
  for (const [i, line] of text.slice(0, end).split('\n').entries()) {
    if (line.trim() === '') continue;
    let id: unknown;
    try {
      id = (JSON.parse(line) as { id?: unknown }).id;
    } catch (error) {
      throw new DataError(`${file}:${i + 1}: invalid JSON: ${(error as Error).message}`);
    }
    if (typeof id !== 'string') throw new DataError(`${file}:${i + 1}: id: expected a string`);
    ids.add(id);
  }
  return ids;
}
