/**
 * Start a server as a child process and wait until it says it listens: the one way every command,
 * test and benchmark starts `sandbox-serve`, `engine-serve`'s Python server, Redis or a fake engine.
 *
 * Readiness is a line on the child's output (`listening on http://HOST:PORT` for the rstar servers,
 * which bind port 0 and print the port the OS gave them), read from a pipe as it arrives: no port
 * is guessed and nothing is polled. A child that dies or hangs before that line fails with the tail
 * of its output, which is where its own error is.
 */
import { execa } from 'execa';

/** The line the rstar servers print once they accept connections; group 1 is the URL. */
export const LISTENING = /listening on (http:\/\/\S+)/;

const TAIL_CHARS = 20_000;
const ERROR_TAIL_CHARS = 4000;

export interface ServerCommand {
  /** Named in errors: `sandbox-serve exited (1) before it was ready`. */
  name: string;
  command: string;
  args: readonly string[];
  /** The child's whole environment (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** The output line that says the server is ready; its first group, if any, is the URL (default LISTENING). */
  ready?: RegExp;
  /** The stream that carries the ready line (default stderr). */
  readyOn?: 'stderr' | 'stdout';
  /**
   * Pass the child's output through to this process (a CLI wrapper): the watched stream as it is
   * read, the other one inherited. Otherwise the other stream is discarded.
   */
  echo?: boolean;
  /** Stop the child and fail when it is not ready after this long; 0: wait while it runs (default 300 s). */
  readyTimeoutMs?: number;
  /** How long stop() waits after its signal before SIGKILL (default 10 s). */
  killAfterMs?: number;
}

export interface Exit {
  code: number | null;
  signal: string | null;
}

export interface ChildServer {
  pid: number | undefined;
  /** The URL (the ready line's first group, else the whole match) once the server is ready. */
  ready: Promise<string>;
  /** Settles when the child has exited (spawn failures included). */
  exited: Promise<Exit>;
  /** The last 20,000 characters of the watched stream. */
  output(): string;
  /**
   * Sends `signal` (default SIGTERM), then SIGKILL if the child is still there after `killAfterMs`;
   * resolves once it has exited. Later calls return the first call's promise.
   */
  stop(signal?: NodeJS.Signals): Promise<Exit>;
}

/**
 * Spawns the server and returns at once; `ready` settles when it is ready, exits, or times out
 * (then the child is stopped). The child is also killed if this process exits first (execa cleanup).
 */
export function spawnServer(spec: ServerCommand): ChildServer {
  const watched = spec.readyOn ?? 'stderr';
  const other = spec.echo ? 'inherit' : 'ignore';
  const child = execa(spec.command, [...spec.args], {
    env: spec.env ?? process.env,
    extendEnv: false,
    stdin: 'ignore',
    stdout: watched === 'stdout' ? 'pipe' : other,
    stderr: watched === 'stderr' ? 'pipe' : other,
    buffer: false,
    reject: false,
    cleanup: true,
    forceKillAfterDelay: false,
  });
  const stream = watched === 'stdout' ? child.stdout : child.stderr;
  const pattern = spec.ready ?? LISTENING;
  const echo = spec.echo ? (watched === 'stdout' ? process.stdout : process.stderr) : undefined;

  let tail = '';
  let line = '';
  let onLine: ((text: string) => void) | undefined;
  // Draining the pipe for the child's whole life keeps a chatty server from blocking on it.
  stream?.setEncoding('utf8');
  stream?.on('data', (text: string) => {
    echo?.write(text);
    tail = (tail + text).slice(-TAIL_CHARS);
    if (!onLine) return;
    // Whole lines only: a URL split across two reads must not resolve half-read.
    const lines = (line + text).split('\n');
    line = lines.pop() ?? '';
    for (const complete of lines) onLine?.(complete);
  });
  const streamDone = new Promise<void>((resolve) => {
    if (!stream) return resolve();
    stream
      .once('end', resolve)
      .once('close', resolve)
      .once('error', () => resolve());
  });

  const exited = new Promise<Exit>((resolve) => {
    child.once('exit', (code, signal) => resolve({ code, signal }));
    // A spawn failure (ENOENT) never emits 'exit'; execa's promise settles for it too.
    child.then((result) => resolve({ code: result.exitCode ?? null, signal: result.signal ?? null }));
  });
  let stopping: Promise<Exit> | undefined;
  const stop = (signal: NodeJS.Signals = 'SIGTERM'): Promise<Exit> => {
    stopping ??= (async () => {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      const force = setTimeout(() => child.kill('SIGKILL'), spec.killAfterMs ?? 10_000);
      child.kill(signal);
      const exit = await exited;
      clearTimeout(force);
      return exit;
    })();
    return stopping;
  };

  const failure = (what: string) =>
    new Error(`${spec.name} ${what}${tail.trim() ? `:\n${tail.trim().slice(-ERROR_TAIL_CHARS)}` : ''}`);
  const ready = new Promise<string>((resolve, reject) => {
    const timeoutMs = spec.readyTimeoutMs ?? 300_000;
    const timer =
      timeoutMs > 0
        ? setTimeout(() => {
            onLine = undefined;
            reject(failure(`not ready after ${timeoutMs / 1000} s`));
            void stop();
          }, timeoutMs)
        : undefined;
    onLine = (text) => {
      const match = pattern.exec(text);
      if (!match) return;
      onLine = undefined;
      clearTimeout(timer);
      resolve(match[1] ?? match[0]);
    };
    exited.then(async (exit) => {
      if (!onLine) return;
      onLine = undefined;
      clearTimeout(timer);
      if (exit.code === null && exit.signal === null) {
        // It never ran (ENOENT, EACCES): execa says why.
        return reject(new Error(`${spec.name}: ${(await child).shortMessage}`));
      }
      // The child's last words may still be in the pipe when it exits.
      await Promise.race([streamDone, new Promise((r) => setTimeout(r, 500))]);
      reject(failure(`exited (${exit.signal ?? exit.code}) before it was ready`));
    });
  });
  // Callers that only wait for `exited` (a CLI wrapper) must not see an unhandled rejection.
  ready.catch(() => {});
  return { pid: child.pid, ready, exited, output: () => tail, stop };
}

/** spawnServer, resolved once the server is ready (the URL in `url`); rejects as `ready` does. */
export async function startServer(spec: ServerCommand): Promise<ChildServer & { url: string }> {
  const server = spawnServer(spec);
  return { ...server, url: await server.ready };
}

export { writeReadyFile } from './listening.js';
