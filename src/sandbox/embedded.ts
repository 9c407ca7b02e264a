import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** bin/rstar.js, from dist/src/sandbox/embedded.js. */
const BIN = fileURLToPath(new URL('../../../bin/rstar.js', import.meta.url));

export interface EmbeddedSandbox {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts `rstar sandbox-serve` on a free loopback port as a child process and resolves once it
 * prints `listening on http://HOST:PORT`. A separate process keeps hostile code and the
 * executor pool away from the caller's event loop; `close()` sends SIGTERM and waits.
 */
export async function startSandbox(
  options: { workers?: number; timeoutS?: number; memoryMb?: number } = {},
): Promise<{ url: string; close(): Promise<void> }> {
  const args = [BIN, 'sandbox-serve', '--host', '127.0.0.1', '--port', '0'];
  if (options.workers !== undefined) args.push('--workers', String(options.workers));
  if (options.timeoutS !== undefined) args.push('--timeout', String(options.timeoutS));
  if (options.memoryMb !== undefined) args.push('--memory', String(options.memoryMb));
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const url = await waitForListening(child);
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      const force = setTimeout(() => child.kill('SIGKILL'), 15_000);
      child.once('exit', () => {
        clearTimeout(force);
        resolve();
      });
      child.kill('SIGTERM');
    });
    return closing;
  };
  // A parent that exits without closing must not leave the service behind.
  const onExit = () => child.kill('SIGTERM');
  process.once('exit', onExit);
  child.once('exit', () => process.off('exit', onExit));
  return { url, close };
}

function waitForListening(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let log = '';
    const onData = (chunk: Buffer) => {
      log += chunk.toString('utf8');
      const match = /listening on (http:\/\/\S+)/.exec(log);
      if (match) {
        cleanup();
        // Keep draining stderr so the child never blocks on a full pipe.
        child.stderr?.on('data', () => {});
        resolve(match[1]);
      }
    };
    const onExit = (code: number | null, signal: string | null) => {
      cleanup();
      reject(new Error(`sandbox-serve exited (${signal ?? code}) before listening:\n${log.slice(-2000)}`));
    };
    const cleanup = () => {
      child.stderr?.off('data', onData);
      child.off('exit', onExit);
    };
    child.stderr?.on('data', onData);
    child.once('exit', onExit);
  });
}
