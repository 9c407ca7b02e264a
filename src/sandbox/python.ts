import { execFileSync } from 'node:child_process';

export interface Interpreter {
  /** The real binary behind a pyenv shim, resolved once (each shim start costs ~100 ms). */
  executable: string;
  /** Installation prefixes the interpreter reads from (bound read-only into the sandbox). */
  prefixes: string[];
}

let cached: Interpreter | undefined;

export function resolveInterpreter(command = process.env.RSTAR_SANDBOX_PYTHON ?? 'python3'): Interpreter {
  if (cached) return cached;
  const out = execFileSync(
    command,
    [
      '-c',
      'import sys, json; print(json.dumps([sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix]))',
    ],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const [executable, ...prefixes] = JSON.parse(out) as string[];
  cached = { executable, prefixes: [...new Set(prefixes)] };
  return cached;
}
