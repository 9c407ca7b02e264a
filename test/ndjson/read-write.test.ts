import assert from 'node:assert/strict';
import { constants } from 'node:buffer';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { describe, it } from 'node:test';
import { z } from 'zod';
import { DataError } from '../../src/errors.js';
import { MAX_LINE_BYTES, readLines, readRecords, writeFileAtomic } from '../../src/ndjson/index.js';
import { Trajectory } from '../../src/records/index.js';
import { rstar } from '../support/helpers.js';

const chunks = (...parts: string[]) => Readable.from(parts.map((p) => Buffer.from(p)));

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe('ndjson reader', () => {
  it('splits lines across chunk boundaries and numbers them', async () => {
    const got = await collect(readLines(chunks('{"a":', '1}\n{"a"', ':2}\n\n{"a":3}'), 'x.jsonl'));
    assert.deepEqual(
      got.map((l) => [l.line, l.text]),
      [
        [1, '{"a":1}'],
        [2, '{"a":2}'],
        [3, ''],
        [4, '{"a":3}'],
      ],
    );
  });

  it('keeps multi-byte characters split across chunks intact', async () => {
    const bytes = Buffer.from('{"t":"π≈3"}\n');
    const parts = Readable.from([bytes.subarray(0, 7), bytes.subarray(7)]);
    const [line] = await collect(readLines(parts, 'x'));
    assert.equal(JSON.parse(line.text).t, 'π≈3');
  });

  it('fails a line over the limit with FILE:LINE, newline or not, before holding all of it', async () => {
    // Exactly at the limit passes; one byte more fails, split across chunks or not.
    const ok = await collect(readLines(chunks('12345678\n', '1234', '5678\n'), 'x', { maxLineBytes: 8 }));
    assert.deepEqual(
      ok.map((l) => l.text),
      ['12345678', '12345678'],
    );
    await assert.rejects(
      collect(readLines(chunks('ok\n', '12345', '6789\n'), 'big.jsonl', { maxLineBytes: 8 })),
      (e: Error) => e instanceof DataError && e.message === 'big.jsonl:2: line longer than 8 bytes',
    );
    await assert.rejects(
      collect(readLines(chunks('ok\n123456789\n'), 'big.jsonl', { maxLineBytes: 8 })),
      /^DataError: big\.jsonl:2: line longer than 8 bytes$/,
    );
    // A line that does not end (1 MiB in 1 KiB chunks without a newline) fails once past the
    // limit: the reader does not wait for the newline, so it never holds more than the limit.
    let sent = 0;
    const endless = Readable.from(
      (function* () {
        while (sent < 1024 * 1024) {
          sent += 1024;
          yield Buffer.alloc(1024, 0x61);
        }
      })(),
    );
    await assert.rejects(
      collect(readRecords(endless, 'stdin', z.object({}), { maxLineBytes: 64 * 1024 })),
      /^DataError: stdin:1: line longer than 65536 bytes$/,
    );
    assert.ok(sent <= 80 * 1024, `read ${sent} bytes`);
    // The default is Node's string limit, past which decoding would fail with no FILE:LINE.
    assert.equal(MAX_LINE_BYTES, constants.MAX_STRING_LENGTH);
  });

  it('names file, line and field for a schema violation', async () => {
    const schema = z.object({ a: z.array(z.int()) });
    const records = readRecords(chunks('{"a":[1]}\n{"a":[1,"x"]}\n'), 'in.jsonl', schema);
    await assert.rejects(collect(records), (e: Error) => {
      assert.ok(e instanceof DataError);
      assert.match(e.message, /^in\.jsonl:2: a\.1: /);
      return true;
    });
  });

  it('names the line of broken JSON', async () => {
    const records = readRecords(chunks('{}\n{"a":\n'), 'stdin', z.object({}));
    await assert.rejects(collect(records), /^DataError: stdin:2: invalid JSON/);
  });

  it('counts and skips invalid lines when asked', async () => {
    const skipped: string[] = [];
    const got = await collect(
      readRecords(chunks('{"a":1}\nnope\n{"a":2}\n'), 's', z.object({ a: z.int() }), {
        skipInvalid: true,
        onSkip: (m) => skipped.push(m),
      }),
    );
    assert.deepEqual(
      got.map((g) => g.record.a),
      [1, 2],
    );
    assert.equal(skipped.length, 1);
    assert.match(skipped[0], /^s:2: invalid JSON/);
  });
});

describe('records', () => {
  const base = {
    v: 1,
    id: 'p/0',
    problem_id: 'p',
    sample: 0,
    policy: 'init',
    prompt_ids: [1, 2],
    response_ids: [3, 4, 5],
    loss_mask: [1, 0, 1],
    logprobs: [-0.1, 0, -0.2],
    text: 'x',
    turns: 1,
    tool_calls: 0,
    tool_errors: 0,
    answer_tags: 1,
    finish: 'stop',
    answer: '3',
    reward: 1,
  };

  it('accepts a trajectory and keeps unknown fields', () => {
    const t = Trajectory.parse({ ...base, extra: 'kept' });
    assert.equal((t as Record<string, unknown>).extra, 'kept');
  });

  it('rejects a loss mask whose length differs from the response', () => {
    const r = Trajectory.safeParse({ ...base, loss_mask: [1, 0] });
    assert.equal(r.success, false);
    assert.deepEqual(r.error?.issues[0].path, ['loss_mask']);
  });

  it('rejects a wrong finish reason', () => {
    assert.equal(Trajectory.safeParse({ ...base, finish: 'done' }).success, false);
  });
});

describe('writeFileAtomic', () => {
  it('replaces the file whole', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-'));
    const file = join(dir, 'a.json');
    writeFileSync(file, 'old');
    writeFileAtomic(file, 'new');
    assert.equal(readFileSync(file, 'utf8'), 'new');
  });
});

describe('rstar CLI', () => {
  it('lists every command of the toolchain in --help', async () => {
    const { code, stdout } = await rstar(['--help']);
    assert.equal(code, 0);
    for (const name of [
      'sft-data',
      'rollout',
      'sandbox-serve',
      'roc-filter',
      'advantage',
      'train-step',
      'eval',
      'verify',
      'engine-serve',
      'model-init',
    ]) {
      assert.match(stdout, new RegExp(`^  ${name} `, 'm'));
    }
  });

  it('exits 2 on an unknown command', async () => {
    const { code, stderr } = await rstar(['frobnicate']);
    assert.equal(code, 2);
    assert.match(stderr, /unknown command 'frobnicate'/);
  });

  it('prints the JSON Schema of a record', async () => {
    const { code, stdout } = await rstar(['schema', 'trajectory']);
    assert.equal(code, 0);
    const schema = JSON.parse(stdout);
    assert.ok(schema.required.includes('response_ids'));
  });
});
