import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** A command started as the leader of a process group of its own, its stderr collected. */
export interface GroupRun {
  child: ChildProcess;
  /** The group's id, which is the leader's pid. */
  group: number;
  /** Its stderr so far. */
  readonly log: string;
  /** Its exit code once it has closed (null when a signal ended it). */
  exit: Promise<number | null>;
}

/**
 * Starts `command ARGS` detached, so that whatever of it is left in its group afterwards is what it
 * left behind, and so that `killGroup` can end all of it (stdin and stdout ignored).
 */
export function spawnGroup(
  command: string,
  args: string[],
  options: { cwd?: string; env: NodeJS.ProcessEnv },
): GroupRun {
  const child = spawn(command, args, {
    cwd: options.cwd,
    env: options.env,
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
  });
  let log = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => {
    log += d;
  });
  const exit = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  return {
    child,
    group: child.pid as number,
    get log() {
      return log;
    },
    exit,
  };
}

/**
 * SIGKILL to every process of `group`, for a test's `finally`: whatever the test failed on, nothing
 * it started outlives it. A group already gone is not an error.
 */
export function killGroup(group: number): void {
  try {
    process.kill(-group, 'SIGKILL');
  } catch {
    // nothing of the group is left
  }
}

/** Live (not zombie) processes of process group `group`, with their command lines. */
export function groupMembers(group: number): { pid: number; cmd: string }[] {
  const found: { pid: number; cmd: string }[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      // after the command name (which may hold spaces): STATE PPID PGRP ...
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(pgrp) !== group || state === 'Z') continue;
      const cmd = readFileSync(`/proc/${name}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
      found.push({ pid: Number(name), cmd });
    } catch {
      // gone while read
    }
  }
  return found;
}
