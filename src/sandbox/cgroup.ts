import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Per-worker cgroups that bound what one call (and the warm interpreter it forks from) may use:
 * memory and process count, and CPU where the cpu controller is available: every worker gets an
 * equal weight, so a call that starts dozens of busy processes gets one worker's share of the
 * machine, not dozens of shares; with `cpus` all workers together are capped at that many cores
 * (CFS quota), which keeps the service from taking the CPUs of a trainer or rollout on the same
 * host. cgroup v1 (separate hierarchies) and v2 (one unified hierarchy) are both supported; when
 * neither is writable the service runs with rlimits only and says so at startup.
 */
export interface WorkerCgroup {
  /** Directories whose `cgroup.procs` a process writes its pid into to join. */
  procsFiles: string[];
  /** Pids currently in the group (for killing leftovers of a dead executor). */
  pids(): number[];
  /** Bytes the group's memory counter holds now (what its memory limit is checked against). */
  memoryUsage(): number | undefined;
  remove(): void;
}

export interface CgroupManager {
  kind: 'v1' | 'v2' | 'none';
  reason: string;
  create(name: string, memoryBytes: number, maxPids: number): WorkerCgroup | undefined;
  /** Removes the groups of other `sandbox-serve` processes here that died without removing theirs. */
  sweep(): void;
  close(): void;
}

export interface CgroupOptions {
  /** Cores all workers together may use (a CFS quota); undefined: no cap. */
  cpus?: number;
}

/** `cpus` asked for a cap that this machine's cgroups cannot enforce. */
export class CpuCapUnavailable extends Error {
  override name = 'CpuCapUnavailable';
}

const ROOT = '/sys/fs/cgroup';
const CPU_PERIOD_US = 100_000;
const quotaUs = (cpus: number): number => Math.max(1000, Math.round(cpus * CPU_PERIOD_US));
const cpuLabel = (cpus: number | undefined): string =>
  cpus === undefined ? '+cpu' : `+cpu (cap ${cpus} cores)`;

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

/** The tag of one server's groups: `rstar-sandbox-PID` (sweepStale reads the pid back). */
export const serverTag = (pid: number): string => `rstar-sandbox-${pid}`;

/**
 * The directories a `sandbox-serve` with this pid, started from this process's cgroups, makes
 * (v1 memory, pids, cpu; v2 unified) and that exist now: what a test expects gone after it exits.
 */
export function serverCgroupDirs(pid: number): string[] {
  const candidates = [
    ...['memory', 'pids', 'cpu'].map((c) => join(ROOT, c, ownPath(c) ?? '/', serverTag(pid))),
    join(ROOT, ownPath('') ?? '/', serverTag(pid)),
  ];
  return candidates.filter((dir) => existsSync(dir));
}

function readNumber(path: string): number | undefined {
  try {
    const value = Number(readFileSync(path, 'utf8').trim());
    return Number.isFinite(value) ? value : undefined;
  } catch {
    return undefined;
  }
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

/**
 * The v1 cpu hierarchy's group for this service (workers get the default, equal cpu.shares
 * under it), with the CFS quota when `cpus` is set; undefined when there is no writable cpu
 * hierarchy and no cap was asked for.
 */
function v1CpuBase(tag: string, cpus: number | undefined): string | undefined {
  const cpuRoot = join(ROOT, 'cpu');
  const missing = (why: string) => {
    if (cpus !== undefined) throw new CpuCapUnavailable(`--cpus needs the cgroup cpu controller: ${why}`);
    return undefined;
  };
  if (!existsSync(join(cpuRoot, 'cgroup.procs'))) return missing(`no ${cpuRoot}`);
  const base = join(cpuRoot, ownPath('cpu') ?? '/', tag);
  if (!tryMkdir(base)) return missing(`${base} not writable`);
  if (cpus !== undefined) {
    try {
      writeFileSync(join(base, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      writeFileSync(join(base, 'cpu.cfs_quota_us'), String(quotaUs(cpus)));
    } catch (error) {
      safeRmdir(base);
      return missing((error as Error).message);
    }
  }
  return base;
}

export function cgroupManager(tag: string, options: CgroupOptions = {}): CgroupManager {
  const { cpus } = options;
  const memRoot = join(ROOT, 'memory');
  const pidsRoot = join(ROOT, 'pids');
  if (existsSync(join(memRoot, 'cgroup.procs')) && existsSync(join(pidsRoot, 'cgroup.procs'))) {
    const parents = [join(memRoot, ownPath('memory') ?? '/'), join(pidsRoot, ownPath('pids') ?? '/')];
    if (existsSync(join(ROOT, 'cpu', 'cgroup.procs'))) parents.push(join(ROOT, 'cpu', ownPath('cpu') ?? '/'));
    const sweep = () => {
      for (const parent of parents) sweepStale(parent);
    };
    sweep();
    const memBase = join(memRoot, ownPath('memory') ?? '/', tag);
    const pidsBase = join(pidsRoot, ownPath('pids') ?? '/', tag);
    if (tryMkdir(memBase) && tryMkdir(pidsBase)) {
      let cpuBase: string | undefined;
      try {
        cpuBase = v1CpuBase(tag, cpus);
      } catch (error) {
        safeRmdir(memBase);
        safeRmdir(pidsBase);
        throw error;
      }
      const made: string[] = [];
      return {
        kind: 'v1',
        reason: `cgroup v1 memory+pids${cpuBase ? cpuLabel(cpus) : ''}`,
        sweep,
        create(name, memoryBytes, maxPids) {
          const dirs = [join(memBase, name), join(pidsBase, name), ...(cpuBase ? [join(cpuBase, name)] : [])];
          const [mem, pids] = dirs;
          try {
            for (const dir of dirs) mkdirSync(dir, { recursive: true });
            writeFileSync(join(mem, 'memory.limit_in_bytes'), String(memoryBytes));
            try {
              writeFileSync(join(mem, 'memory.memsw.limit_in_bytes'), String(memoryBytes));
            } catch {}
            writeFileSync(join(pids, 'pids.max'), String(maxPids));
          } catch {
            for (const dir of dirs) safeRmdir(dir);
            return undefined;
          }
          made.push(...dirs);
          const procsFiles = dirs.map((dir) => join(dir, 'cgroup.procs'));
          return {
            procsFiles,
            pids: () => [...new Set(procsFiles.flatMap(readPids))],
            memoryUsage: () => readNumber(join(mem, 'memory.usage_in_bytes')),
            remove() {
              for (const dir of dirs) safeRmdir(dir);
            },
          };
        },
        close() {
          for (const dir of made) safeRmdir(dir);
          safeRmdir(memBase);
          safeRmdir(pidsBase);
          if (cpuBase) safeRmdir(cpuBase);
        },
      };
    }
  }
  const unified = existsSync(join(ROOT, 'cgroup.controllers')) ? ROOT : undefined;
  if (unified) {
    const parent = join(unified, ownPath('') ?? '/');
    sweepStale(parent);
    const base = join(unified, ownPath('') ?? '/', tag);
    try {
      mkdirSync(base, { recursive: true });
      // The cpu controller is optional (the parent may not delegate it) unless a cap was asked for.
      let cpu = true;
      try {
        writeFileSync(join(base, 'cgroup.subtree_control'), '+memory +pids +cpu');
      } catch (error) {
        if (cpus !== undefined)
          throw new CpuCapUnavailable(`--cpus needs the cgroup cpu controller: ${error}`);
        cpu = false;
        writeFileSync(join(base, 'cgroup.subtree_control'), '+memory +pids');
      }
      if (cpus !== undefined) {
        try {
          writeFileSync(join(base, 'cpu.max'), `${quotaUs(cpus)} ${CPU_PERIOD_US}`);
        } catch (error) {
          throw new CpuCapUnavailable(`--cpus needs cpu.max on ${base}: ${(error as Error).message}`);
        }
      }
      const made: string[] = [];
      return {
        kind: 'v2',
        reason: `cgroup v2 memory+pids${cpu ? cpuLabel(cpus) : ''}`,
        sweep: () => sweepStale(parent),
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
            memoryUsage: () => readNumber(join(dir, 'memory.current')),
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
      if (error instanceof CpuCapUnavailable) throw error;
      return none(`cgroup v2 not writable (${(error as Error).message})`);
    }
  }
  if (cpus !== undefined) throw new CpuCapUnavailable('--cpus needs a writable cgroup hierarchy');
  return none('no writable cgroup v1 memory+pids or v2 hierarchy');
}

function none(reason: string): CgroupManager {
  return { kind: 'none', reason, create: () => undefined, sweep() {}, close() {} };
}
