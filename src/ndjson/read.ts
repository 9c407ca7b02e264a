import { constants } from 'node:buffer';
import { createReadStream } from 'node:fs';
import type { Readable } from 'node:stream';
import type { z } from 'zod';
import { DataError } from '../errors.js';

/** One line of input with where it came from, so every error can say `FILE:LINE`. */
export interface SourceLine {
  text: string;
  line: number;
  source: string;
}

export interface Located<T> {
  record: T;
  line: number;
  source: string;
}

/** `-` or no file means stdin; errors then say `stdin:LINE`. */
export function openInput(file?: string): { stream: Readable; source: string } {
  if (file === undefined || file === '-') return { stream: process.stdin, source: 'stdin' };
  const stream = createReadStream(file);
  return { stream, source: file };
}

/**
 * The longest line read by default: Node's string limit (in UTF-16 units, and a UTF-8 line decodes
 * to at most as many units as it has bytes), past which decoding fails with no FILE:LINE.
 */
export const MAX_LINE_BYTES = constants.MAX_STRING_LENGTH;

export interface LineOptions {
  /** Longer lines fail with `FILE:LINE: line longer than N bytes` (default `MAX_LINE_BYTES`). */
  maxLineBytes?: number;
}

/**
 * Splits a byte stream into lines without holding more than one partial line in memory, and never
 * more than `maxLineBytes` of it: a line past the limit fails as soon as it is, newline or not.
 * Back-pressure comes for free: the stream is only read as fast as the consumer iterates.
 */
export async function* readLines(
  stream: Readable,
  source: string,
  { maxLineBytes = MAX_LINE_BYTES }: LineOptions = {},
): AsyncGenerator<SourceLine> {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let line = 0;
  const tooLong = (bytes: number) => {
    if (bytes > maxLineBytes)
      throw new DataError(`${source}:${line + 1}: line longer than ${maxLineBytes} bytes`);
  };
  try {
    for await (const chunk of stream as AsyncIterable<Buffer | string>) {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      let start = 0;
      let nl = buf.indexOf(10, start);
      while (nl !== -1) {
        tooLong(pendingBytes + nl - start);
        line += 1;
        let text: string;
        if (pending.length > 0) {
          pending.push(buf.subarray(start, nl));
          text = Buffer.concat(pending).toString('utf8');
          pending = [];
          pendingBytes = 0;
        } else {
          text = buf.toString('utf8', start, nl);
        }
        yield { text, line, source };
        start = nl + 1;
        nl = buf.indexOf(10, start);
      }
      if (start < buf.length) {
        pendingBytes += buf.length - start;
        tooLong(pendingBytes);
        pending.push(buf.subarray(start));
      }
    }
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'ENOENT') throw new DataError(`${source}: no such file`);
    if (code === 'EISDIR') throw new DataError(`${source}: is a directory, not an NDJSON file`);
    if (code === 'EACCES') throw new DataError(`${source}: permission denied`);
    throw error;
  }
  if (pending.length > 0) {
    line += 1;
    yield { text: Buffer.concat(pending).toString('utf8'), line, source };
  }
}

/** `FILE:LINE: field.path: message` for the first problem zod found. */
export function describeIssue(where: string, error: z.ZodError): string {
  const issue = error.issues[0];
  const path = issue.path.length > 0 ? issue.path.map(String).join('.') : '(record)';
  const more = error.issues.length > 1 ? ` (and ${error.issues.length - 1} more)` : '';
  return `${where}: ${path}: ${issue.message}${more}`;
}

export interface ReadOptions extends LineOptions {
  /** Count and report malformed lines instead of failing on the first one. */
  skipInvalid?: boolean;
  /** Called for each skipped line with its error message. */
  onSkip?: (message: string) => void;
}

/** Parses one NDJSON line against a schema, throwing a DataError that names file, line and field. */
export function parseLine<S extends z.ZodType>(schema: S, { text, line, source }: SourceLine): z.output<S> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new DataError(`${source}:${line}: invalid JSON: ${(error as Error).message}`);
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new DataError(describeIssue(`${source}:${line}`, parsed.error));
  return parsed.data;
}

/** Streams validated records; blank lines are allowed and ignored. */
export async function* readRecords<S extends z.ZodType>(
  stream: Readable,
  source: string,
  schema: S,
  options: ReadOptions = {},
): AsyncGenerator<Located<z.output<S>>> {
  for await (const entry of readLines(stream, source, options)) {
    if (entry.text.trim() === '') continue;
    let record: z.output<S>;
    try {
      record = parseLine(schema, entry);
    } catch (error) {
      if (options.skipInvalid && error instanceof DataError) {
        options.onSkip?.(error.message);
        continue;
      }
      throw error;
    }
    yield { record, line: entry.line, source: entry.source };
  }
}

/** Reads a whole (small) NDJSON file into memory, e.g. a problem set. */
export async function readAll<S extends z.ZodType>(
  file: string | undefined,
  schema: S,
  options: ReadOptions = {},
): Promise<Located<z.output<S>>[]> {
  const { stream, source } = openInput(file);
  const out: Located<z.output<S>>[] = [];
  for await (const entry of readRecords(stream, source, schema, options)) out.push(entry);
  return out;
}
