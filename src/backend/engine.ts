import { execa, type ResultPromise } from 'execa';
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
  return args;
}

/**
 * Starts `engine-serve` as a child process on 127.0.0.1 and resolves once it prints its
 * `listening on` line; rejects with the server's own error (e.g. not a checkpoint) if it exits first.
 */
export async function startEngine(options: EngineOptions): Promise<Engine> {
  const python = await findPython();
  const child: ResultPromise = execa(python, engineArgs(options), {
    env: backendEnv(),
    stdin: 'ignore',
    stdout: 'ignore',
    stderr: 'pipe',
    reject: false,
    cleanup: true,
  });
  let log = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stderr?.setEncoding('utf8');
    const onData = (chunk: string) => {
      log += chunk;
      const m = /listening on (http:\/\/\S+)/.exec(log);
      if (m) {
        child.stderr?.off('data', onData);
        child.stderr?.resume(); // keep draining so a chatty server never blocks on a full pipe
        resolve(m[1]);
      }
    };
    child.stderr?.on('data', onData);
    child.then((result) => {
      const text = log.trim() || String(result.stderr ?? '');
      reject(
        new Error(`engine-serve exited (${result.exitCode ?? result.signal}) before listening: ${text}`),
      );
    });
  });
  let closed: Promise<void> | undefined;
  return {
    url,
    close() {
      closed ??= (async () => {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await child;
        clearTimeout(timer);
      })();
      return closed;
    },
  };
}
