import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Per-worker cgroups that bound what one call (and the warm interpreter it forks from) may use:
 * memory and process count. cgroup v1 (separate memory and pids hierarchies) and v2 (one
 * unified hierarchy) are both supported; when neither is writable the service runs with
 * rlimits only and says so at startup.
 */
export interface WorkerCgroup {
  /** Directories whose `cgroup.procs` a process writes its pid into to join. */
  procsFiles: string[];
  /** Pids currently in the group (for killing leftovers of a dead executor). */
  pids(): number[];
  remove(): void;
}

export interface CgroupManager {
  kind: 'v1' | 'v2' | 'none';
  reason: string;
  create(name: string, memoryBytes: number, maxPids: number): WorkerCgroup | undefined;
  close(): void;
}

const ROOT = '/sys/fs/cgroup';

function ownPath(controller: string): string | undefined {
  try {
    for (const line of readFileSync('/proc/self/cgroup', 'utf8').split('\n')) {
      const [, controllers, path] = line.split(':');
      if (controllers === undefined) continue;
      if (controller === '' ? controllers === '' : controllers.split(',').includes(controller)) return path;
    }
  } catch {}
  return undefined;
}

function tryMkdir(path: string): boolean {
  try {
    mkdirSync(path, { recursive: true });
    return true;
  } catch {
    return false;
  }
}

function safeRmdir(path: string): void {
  try {
    rmdirSync(path);
  } catch {}
}

function readPids(file: string): number[] {
  try {
    return readFileSync(file, 'utf8')
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map(Number);
  } catch {
    return [];
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes the cgroups a previous `sandbox-serve` left behind when it was SIGKILLed (its
 * executors die with it, but a dead process cannot rmdir its groups).
 */
function sweepStale(parent: string): void {
  let entries: string[];
  try {
    entries = readdirSync(parent);
  } catch {
    return;
  }
  for (const name of entries) {
    const match = /^rstar-sandbox-(\d+)$/.exec(name);
    if (!match || alive(Number(match[1]))) continue;
    const dir = join(parent, name);
    try {
      for (const child of readdirSync(dir, { withFileTypes: true })) {
        if (!child.isDirectory()) continue;
        for (const pid of readPids(join(dir, child.name, 'cgroup.procs'))) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {}
        }
        safeRmdir(join(dir, child.name));
      }
    } catch {}
    safeRmdir(dir);
  }
}

export function cgroupManager(tag: string): CgroupManager {
  const memRoot = join(ROOT, 'memory');
  const pidsRoot = join(ROOT, 'pids');
  if (existsSync(join(memRoot, 'cgroup.procs')) && existsSync(join(pidsRoot, 'cgroup.procs'))) {
    sweepStale(join(memRoot, ownPath('memory') ?? '/'));
    sweepStale(join(pidsRoot, ownPath('pids') ?? '/'));
    const memBase = join(memRoot, ownPath('memory') ?? '/', tag);
    const pidsBase = join(pidsRoot, ownPath('pids') ?? '/', tag);
    if (tryMkdir(memBase) && tryMkdir(pidsBase)) {
      const made: string[] = [];
      return {
        kind: 'v1',
        reason: 'cgroup v1 memory+pids',
        create(name, memoryBytes, maxPids) {
          const mem = join(memBase, name);
          const pids = join(pidsBase, name);
          try {
            mkdirSync(mem, { recursive: true });
            mkdirSync(pids, { recursive: true });
            writeFileSync(join(mem, 'memory.limit_in_bytes'), String(memoryBytes));
            try {
              writeFileSync(join(mem, 'memory.memsw.limit_in_bytes'), String(memoryBytes));
            } catch {}
            writeFileSync(join(pids, 'pids.max'), String(maxPids));
          } catch {
            safeRmdir(mem);
            safeRmdir(pids);
            return undefined;
          }
          made.push(mem, pids);
          return {
            procsFiles: [join(mem, 'cgroup.procs'), join(pids, 'cgroup.procs')],
            pids: () => [
              ...new Set([...readPids(join(mem, 'cgroup.procs')), ...readPids(join(pids, 'cgroup.procs'))]),
            ],
            remove() {
              safeRmdir(mem);
              safeRmdir(pids);
            },
          };
        },
        close() {
          for (const dir of made) safeRmdir(dir);
          safeRmdir(memBase);
          safeRmdir(pidsBase);
        },
      };
    }
  }
  const unified = existsSync(join(ROOT, 'cgroup.controllers')) ? ROOT : undefined;
  if (unified) {
    sweepStale(join(unified, ownPath('') ?? '/'));
    const base = join(unified, ownPath('') ?? '/', tag);
    try {
      mkdirSync(base, { recursive: true });
      writeFileSync(join(base, 'cgroup.subtree_control'), '+memory +pids');
      const made: string[] = [];
      return {
        kind: 'v2',
        reason: 'cgroup v2 memory+pids',
        create(name, memoryBytes, maxPids) {
          const dir = join(base, name);
          try {
            mkdirSync(dir, { recursive: true });
            writeFileSync(join(dir, 'memory.max'), String(memoryBytes));
            try {
              writeFileSync(join(dir, 'memory.swap.max'), '0');
            } catch {}
            writeFileSync(join(dir, 'pids.max'), String(maxPids));
          } catch {
            safeRmdir(dir);
            return undefined;
          }
          made.push(dir);
          return {
            procsFiles: [join(dir, 'cgroup.procs')],
            pids: () => readPids(join(dir, 'cgroup.procs')),
            remove: () => safeRmdir(dir),
          };
        },
        close() {
          for (const dir of made) safeRmdir(dir);
          safeRmdir(base);
        },
      };
    } catch (error) {
      safeRmdir(base);
      return none(`cgroup v2 not writable (${(error as Error).message})`);
    }
  }
  return none('no writable cgroup v1 memory+pids or v2 hierarchy');
}

function none(reason: string): CgroupManager {
  return { kind: 'none', reason, create: () => undefined, close() {} };
}
