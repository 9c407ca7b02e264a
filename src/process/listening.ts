/**
 * What a server command does once it listens: `listen` and `--ready-file`. Apart from
 * process/serve.ts (execa) and sandbox/server.ts (the sandbox's schemas and pool), so a command that
 * only serves (`rstar view`) loads neither: execa alone was ~0.25 s of `rstar view`'s start.
 */
import { renameSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export function listen(server: Server, host: string, port: number): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server.address() as AddressInfo));
  });
}

/**
 * `--ready-file FILE`: the URL and a newline, written once the server listens, renamed into place
 * so a script waiting for FILE never reads half of it.
 */
export function writeReadyFile(file: string, url: string): void {
  const partial = `${file}.${process.pid}.partial`;
  try {
    writeFileSync(partial, `${url}\n`);
    renameSync(partial, file);
  } catch (error) {
    throw new Error(`--ready-file ${file}: ${(error as NodeJS.ErrnoException).code ?? String(error)}`);
  }
}
