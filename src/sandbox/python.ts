import { execFileSync } from 'node:child_process';

export interface Interpreter {
  /** The real binary behind a pyenv shim, resolved once (each shim start costs ~100 ms). */
  executable: string;
  /** Installation prefixes the interpreter reads from (bound read-only into the sandbox). */
  prefixes: string[];
  /**
   * `sys.path` of an isolated (`-I`) interpreter after `site` ran: the standard library,
   * site-packages and the directories its `.pth` files add. Executors start with `-S -I` (no
   * `site`: its `.pth` imports would load ~80 modules into every forked call) and get this list.
   */
  path: string[];
}

let cached: Interpreter | undefined;

export function resolveInterpreter(command = process.env.RSTAR_SANDBOX_PYTHON ?? 'python3'): Interpreter {
  if (cached) return cached;
  const probe =
    'import sys, json; print(json.dumps([sys.executable, [sys.prefix, sys.base_prefix, sys.exec_prefix], sys.path]))';
  let out: string;
  try {
    out = execFileSync(command, ['-I', '-c', probe], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  } catch (error) {
    throw new Error(`cannot run Python '${command}' (set RSTAR_SANDBOX_PYTHON): ${(error as Error).message}`);
  }
  const [executable, prefixes, path] = JSON.parse(out.trim().split('\n').pop() ?? '') as [
    string,
    string[],
    string[],
  ];
  cached = {
    executable,
    prefixes: [...new Set(prefixes)],
    path: path.filter((entry) => entry.startsWith('/')),
  };
  return cached;
}
