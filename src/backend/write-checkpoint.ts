import { existsSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { execa } from 'execa';
import { DataError } from '../errors.js';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from './python.js';

/** True when DIR exists and holds anything (a file where DIR should be counts too). */
export function occupied(dir: string): boolean {
  if (!existsSync(dir)) return false;
  try {
    return readdirSync(dir).length > 0;
  } catch {
    return true;
  }
}

/**
 * Runs the backend's `command` (`run.py COMMAND ARGS --out FOLDER`) to write a checkpoint for the
 * absolute path `out`. The backend writes a folder beside it, renamed into place once complete, so
 * `out` is always one whole checkpoint, the old or the new. Prints the backend's JSON summary with
 * `checkpoint: out` on stdout; a backend failure is a DataError with its message.
 */
export async function writeCheckpoint(out: string, command: string, args: readonly string[]): Promise<void> {
  const partial = `${out}.partial-${process.pid}`;
  rmSync(partial, { recursive: true, force: true });
  const python = await findPython();
  const result = await execa(python, [BACKEND_SCRIPT, command, ...args, '--out', partial], {
    env: backendEnv(),
    reject: false,
  });
  if (result.exitCode !== 0) {
    rmSync(partial, { recursive: true, force: true });
    throw new DataError(backendMessage(String(result.stderr), `model-${command} failed`));
  }
  const old = `${out}.old-${process.pid}`;
  if (existsSync(out)) renameSync(out, old);
  renameSync(partial, out);
  rmSync(old, { recursive: true, force: true });
  const summary = JSON.parse(String(result.stdout)) as Record<string, unknown>;
  process.stdout.write(`${JSON.stringify({ ...summary, checkpoint: out })}\n`);
}
