import { fileURLToPath } from 'node:url';
import { startServer } from '../process/serve.js';

/** bin/rstar.js, from dist/src/sandbox/embedded.js. */
const BIN = fileURLToPath(new URL('../../../bin/rstar.js', import.meta.url));

export interface EmbeddedSandbox {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts `rstar sandbox-serve` on a free loopback port as a child process and resolves once it
 * listens. A separate process keeps hostile code and the executor pool away from the caller's
 * event loop; `close()` sends SIGTERM and waits (SIGKILL after 15 s).
 */
export async function startSandbox(
  options: { workers?: number; timeoutS?: number; memoryMb?: number } = {},
): Promise<EmbeddedSandbox> {
  const args = [BIN, 'sandbox-serve', '--host', '127.0.0.1', '--port', '0'];
  if (options.workers !== undefined) args.push('--workers', String(options.workers));
  if (options.timeoutS !== undefined) args.push('--tool-timeout', String(options.timeoutS));
  if (options.memoryMb !== undefined) args.push('--memory', String(options.memoryMb));
  const server = await startServer({
    name: 'sandbox-serve',
    command: process.execPath,
    args,
    killAfterMs: 15_000,
  });
  return {
    url: server.url,
    close: async () => {
      await server.stop();
    },
  };
}
