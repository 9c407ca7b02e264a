import { open, stat } from 'node:fs/promises';

/** One complete line of a tailed file: its bytes (no newline), 1-based number and byte range. */
export interface TailLine {
  bytes: Buffer;
  line: number;
  offset: number;
}

const CHUNK = 4 << 20;

/**
 * Follows one NDJSON file as it grows: each `read()` parses only the bytes appended since the last
 * one, so a live run costs what it adds, not what it holds. A line is handed over once its newline
 * has arrived (a writer mid-line is waited for). A file that shrank was rewritten (a resumed run
 * drops its last steps): `read()` then reports `reset` and starts over from byte 0.
 */
export class FileTail {
  #offset = 0;
  #line = 0;
  #size = -1;
  #mtimeMs = -1;
  constructor(readonly path: string) {}

  /** Bytes parsed so far. */
  get offset(): number {
    return this.#offset;
  }

  /** Lines handed over so far. */
  get line(): number {
    return this.#line;
  }

  /** The file's size and mtime when it was last read (-1 before): what the bytes parsed came from. */
  get seen(): { size: number; mtimeMs: number } {
    return { size: this.#size, mtimeMs: this.#mtimeMs };
  }

  /**
   * Continues where an earlier tail of the same file stopped (the viewer's index cache): the bytes
   * before `offset` count as read, and a file still of `size` bytes is not read again.
   */
  resume(offset: number, line: number, size: number, mtimeMs: number): void {
    this.#offset = offset;
    this.#line = line;
    this.#size = size;
    this.#mtimeMs = mtimeMs;
  }

  async read(each: (line: TailLine) => void): Promise<{ reset: boolean; lines: number }> {
    const info = await stat(this.path).catch(() => undefined);
    if (!info?.isFile()) return { reset: false, lines: 0 };
    let reset = false;
    if (info.size < this.#offset) {
      reset = true;
      this.#offset = 0;
      this.#line = 0;
    }
    if (info.size === this.#size && !reset) return { reset, lines: 0 };
    this.#size = info.size;
    this.#mtimeMs = info.mtimeMs;
    let lines = 0;
    const fh = await open(this.path, 'r');
    try {
      let carry = Buffer.alloc(0);
      let position = this.#offset;
      while (position < info.size) {
        const want = Math.min(CHUNK, info.size - position);
        const chunk = Buffer.allocUnsafe(want);
        const { bytesRead } = await fh.read(chunk, 0, want, position);
        if (bytesRead === 0) break;
        position += bytesRead;
        const buf = carry.length > 0 ? Buffer.concat([carry, chunk.subarray(0, bytesRead)]) : chunk;
        const end = carry.length + bytesRead;
        let start = 0;
        let nl = buf.indexOf(10, start);
        while (nl !== -1 && nl < end) {
          this.#line += 1;
          lines += 1;
          each({ bytes: buf.subarray(start, nl), line: this.#line, offset: this.#offset });
          this.#offset += nl + 1 - start;
          start = nl + 1;
          nl = buf.indexOf(10, start);
        }
        // A line longer than the chunk waits for the next chunk; a final line without its newline
        // waits for the writer.
        carry = Buffer.from(buf.subarray(start, end));
      }
    } finally {
      await fh.close();
    }
    return { reset, lines };
  }
}

/** Reads `length` bytes at `offset`: one line the index located. */
export async function readRange(path: string, offset: number, length: number): Promise<Buffer> {
  const fh = await open(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(length);
    const { bytesRead } = await fh.read(buf, 0, length, offset);
    return buf.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}
