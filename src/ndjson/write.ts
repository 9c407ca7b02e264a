import { once } from 'node:events';
import { closeSync, createWriteStream, fsyncSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import type { Writable } from 'node:stream';

/**
 * Writes one JSON object per line and waits for `drain` when the consumer is slower than we are,
 * so a pipeline holds constant memory. A closed downstream (`| head`) ends the process quietly.
 */
export class NdjsonWriter {
  #out: Writable;
  #closed = false;

  constructor(out: Writable = process.stdout) {
    this.#out = out;
    if (out === process.stdout) {
      out.on('error', (error: NodeJS.ErrnoException) => {
        if (error.code === 'EPIPE') {
          this.#closed = true;
          process.exit(process.exitCode ?? 0);
        }
        throw error;
      });
    }
  }

  /** True once the reader went away; producers may stop early. */
  get closed(): boolean {
    return this.#closed;
  }

  async write(value: unknown): Promise<void> {
    if (this.#closed) return;
    if (!this.#out.write(`${JSON.stringify(value)}\n`)) await once(this.#out, 'drain');
  }

  /** Writes a pre-serialised line (no trailing newline) untouched, for pass-through paths. */
  async writeRaw(line: string): Promise<void> {
    if (this.#closed) return;
    if (!this.#out.write(`${line}\n`)) await once(this.#out, 'drain');
  }

  async end(): Promise<void> {
    if (this.#out === process.stdout || this.#out === process.stderr) {
      // Never end the process' own stdio; wait until what we wrote is handed to the OS.
      if (this.#out.writableNeedDrain) await once(this.#out, 'drain');
      return;
    }
    const finished = once(this.#out, 'finish');
    this.#out.end();
    await finished;
  }
}

/** A writer to stdout, or to FILE (appending when `append`, so a resumed run keeps what it wrote). */
export function openOutput(file?: string, { append = false } = {}): NdjsonWriter {
  if (file === undefined || file === '-') return new NdjsonWriter(process.stdout);
  return new NdjsonWriter(createWriteStream(file, { flags: append ? 'a' : 'w' }));
}

/**
 * Writes a whole file atomically (temp file, fsync, rename), so a crash or a bad input never
 * leaves a half-written report or checkpoint index where a good one was.
 */
export function writeFileAtomic(path: string, data: string | Uint8Array): void {
  const tmp = `${path}.tmp-${process.pid}`;
  try {
    const fd = openSync(tmp, 'w');
    try {
      const bytes = typeof data === 'string' ? Buffer.from(data) : data;
      let off = 0;
      while (off < bytes.length) {
        off += writeSync(fd, bytes, off, bytes.length - off);
      }
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (error) {
    rmSync(tmp, { force: true });
    throw error;
  }
}
