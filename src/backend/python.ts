import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';

/** src/backend/ in the repository: the Python package is run from its source, tsc compiles only .ts. */
export const BACKEND_DIR = fileURLToPath(new URL('../../../src/backend/', import.meta.url));
/** The Python entry point: `run.py init|train|serve ...`, also usable as a torchrun script. */
export const BACKEND_SCRIPT = `${BACKEND_DIR}run.py`;

/** No interpreter with PyTorch: exit 1 with instructions. */
export class PythonNotFoundError extends Error {
  readonly exitCode: number = 1;
  override name = 'PythonNotFoundError';
}

const INSTALL =
  'install PyTorch: on Debian/Ubuntu `apt-get install -y python3-torch libopenblas0-pthread`, ' +
  'elsewhere `pip install torch` (CUDA/ROCm builds from pytorch.org); or point RSTAR_PYTHON at an interpreter that has it';

// find_spec locates torch without importing it (an import costs seconds on a loaded machine).
const PROBE = 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("torch") else 1)';

async function hasTorch(python: string): Promise<boolean> {
  const result = await execa(python, ['-c', PROBE], { reject: false, timeout: 60_000 });
  return result.exitCode === 0;
}

let found: Promise<string> | undefined;

/**
 * The interpreter that runs the backend: `RSTAR_PYTHON` if set (it must import torch), else
 * /usr/bin/python3 when it has torch (Debian's python3-torch), else `python3` on PATH.
 * Resolved once per process.
 */
export function findPython(): Promise<string> {
  found ??= (async () => {
    const explicit = process.env.RSTAR_PYTHON;
    if (explicit) {
      if (await hasTorch(explicit)) return explicit;
      throw new PythonNotFoundError(`RSTAR_PYTHON=${explicit} cannot import torch; ${INSTALL}`);
    }
    for (const candidate of ['/usr/bin/python3', 'python3']) {
      if (await hasTorch(candidate)) return candidate;
    }
    throw new PythonNotFoundError(`no Python interpreter with PyTorch found; ${INSTALL}`);
  })();
  found.catch(() => {
    found = undefined;
  });
  return found;
}

/**
 * The OpenBLAS kernel family for this CPU, from /proc/cpuinfo's flags. OpenBLAS picks its kernels
 * from the CPU model number, and a model it does not know (a newer Xeon, or a hypervisor's generic
 * "Intel Xeon Processor") falls back to Prescott's SSE3 kernels: on this project's VMs (AVX-512,
 * AMX) Debian's OpenBLAS 0.3.21 did that, and matmuls ran 5x slower (30 vs 152 GFLOP/s, a tiny-model
 * SFT step 2x slower). Naming the family by the instructions the CPU has avoids that; an
 * `OPENBLAS_CORETYPE` already set wins, and non-OpenBLAS builds (MKL, CUDA, ROCm) ignore it.
 */
export function openblasCoreType(cpuinfo: string): string | undefined {
  const flags = new Set(/^flags\s*:(.*)$/m.exec(cpuinfo)?.[1]?.trim().split(/\s+/) ?? []);
  if (['avx512f', 'avx512bw', 'avx512dq', 'avx512vl', 'avx512cd'].every((f) => flags.has(f)))
    return 'SkylakeX';
  if (['avx2', 'fma'].every((f) => flags.has(f))) return 'Haswell';
  return undefined;
}

let coreType: string | undefined | null = null;

function detectedCoreType(): string | undefined {
  if (coreType === null) {
    try {
      coreType = openblasCoreType(readFileSync('/proc/cpuinfo', 'utf8'));
    } catch {
      coreType = undefined; // not Linux, or /proc unavailable: leave OpenBLAS to its own detection
    }
  }
  return coreType;
}

/** Environment for backend processes: unbuffered, so log lines and records arrive when written. */
export function backendEnv(threads = 0): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONUNBUFFERED: '1', PYTHONDONTWRITEBYTECODE: '1' };
  // OpenMP and OpenBLAS size their pools from OMP_NUM_THREADS when torch loads (set_num_threads
  // later does not shrink OpenBLAS's), so a thread count goes in the environment too.
  if (threads > 0) env.OMP_NUM_THREADS = String(threads);
  const core = env.OPENBLAS_CORETYPE ? undefined : detectedCoreType();
  if (core) env.OPENBLAS_CORETYPE = core;
  return env;
}

/** The backend's own error text without its `rstar <command>: ` prefix (the CLI adds that again). */
export function backendMessage(stderr: string, fallback: string): string {
  const lines = stderr
    .trim()
    .split('\n')
    .filter((l) => l.trim() !== '');
  const last = lines.findLast((l) => l.startsWith('rstar ')) ?? lines.at(-1);
  return last ? last.replace(/^rstar [a-z-]+: /, '') : fallback;
}
