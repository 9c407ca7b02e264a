import { startServer } from '../process/serve.js';
import { BACKEND_SCRIPT, backendEnv, findPython } from './python.js';

export interface EngineOptions {
  /** Checkpoint folder (HF layout). */
  model: string;
  /** 0 or absent: a free port chosen by the OS. */
  port?: number;
  /** KV budget in tokens (`--max-total-tokens`). */
  maxTotalTokens?: number;
  /** Most requests decoded together (default 256). */
  maxRunningRequests?: number;
  /** The label of the weights served at start (SGLang's weight_version; default "0"). */
  weightVersion?: string;
  /** CPU threads for the model's ops (0 or absent: torch's default). */
  threads?: number;
  /** No prefix cache: every request prefills its whole input (`--disable-radix-cache`). */
  disableRadixCache?: boolean;
  /** How decode reads the running requests' K/V: as dense rows kept up to date (`rows`, the default) or
   * gathered from the pool's slots every step (`pool`). */
  decodeKv?: 'rows' | 'pool';
}

export interface Engine {
  /** `http://127.0.0.1:PORT`, ready to serve. */
  url: string;
  /** Stops the server and waits for the process to exit. */
  close(): Promise<void>;
}

/** The command line of `engine-serve`'s Python server, shared by the CLI command and startEngine. */
export function engineArgs(options: EngineOptions & { host?: string }): string[] {
  const args = [BACKEND_SCRIPT, 'serve', '--model', options.model, '--port', String(options.port ?? 0)];
  if (options.host) args.push('--host', options.host);
  if (options.maxTotalTokens !== undefined) args.push('--max-total-tokens', String(options.maxTotalTokens));
  if (options.maxRunningRequests !== undefined) {
    args.push('--max-running-requests', String(options.maxRunningRequests));
  }
  if (options.weightVersion !== undefined) args.push('--weight-version', options.weightVersion);
  if (options.threads) args.push('--threads', String(options.threads));
  if (options.disableRadixCache) args.push('--disable-radix-cache');
  if (options.decodeKv) args.push('--decode-kv', options.decodeKv);
  return args;
}

/**
 * The Python server's environment: the backend's, plus this process's pid, which run.py turns into
 * PR_SET_PDEATHSIG so the server dies with this process even when it is SIGKILLed (an OOM kill).
 */
export function engineEnv(threads?: number): NodeJS.ProcessEnv {
  return { ...backendEnv(threads), RSTAR_PARENT_PID: String(process.pid) };
}

/**
 * Starts `engine-serve`'s Python server as a child process on 127.0.0.1 and resolves once it
 * listens; rejects with the server's own error (e.g. not a checkpoint) if it exits first.
 */
export async function startEngine(options: EngineOptions): Promise<Engine> {
  const server = await startServer({
    name: 'engine-serve',
    command: await findPython(),
    args: engineArgs(options),
    env: engineEnv(options.threads),
    killAfterMs: 5000,
  });
  return {
    url: server.url,
    close: async () => {
      await server.stop();
    },
  };
}
