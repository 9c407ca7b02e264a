// Catches: a trajectory row that disagrees with its full record (the fast summary cutting the wrong
// bytes); a live refresh that re-reads old bytes or hands over half a line; a rewritten file that
// leaves rows pointing at moved bytes; a malformed line that crashes the index instead of being
// reported FILE:LINE; RoC verdicts other than roc-filter's; an index cache that hands back rows of a
// file that changed since, loses a verdict or an unreadable line, or keeps verdicts decided under
// other stage settings.
import assert from 'node:assert/strict';
import {
  appendFileSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { rocSelect } from '../../src/algo/roc.js';
import { trajectoryPayload } from '../../src/view/api.js';
import { CACHE_MAX_AGE_MS, cacheFile, pruneCaches } from '../../src/view/cache.js';
import { summarize } from '../../src/view/row.js';
import { RunIndex } from '../../src/view/run-index.js';
import { FileTail } from '../../src/view/tail.js';
import { appendStep, type RunSpec, writeRun } from '../support/view-run.js';

const dir = mkdtempSync(join(tmpdir(), 'rstar-view-index-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const SPEC: RunSpec = { steps: 3, problems: 4, n: 8, keep: 4 };

test('a row summary equals the fields of the whole record', () => {
  writeRun(join(dir, 'rows'), SPEC, { evals: false });
  const lines = readFileSync(join(dir, 'rows', 'rl', 'trajectories', 'step-2.jsonl'), 'utf8')
    .trim()
    .split('\n');
  for (const line of lines) {
    const full = JSON.parse(line);
    const row = summarize(Buffer.from(line));
    assert.equal(row.id, full.id);
    assert.equal(row.reward, full.reward);
    assert.equal(row.step, 2);
    assert.equal(row.tokens, full.response_ids.length);
    assert.equal(row.model_tokens, full.loss_mask.filter((m: number) => m === 1).length);
    assert.deepEqual(row.turn_versions, full.turn_versions);
    assert.equal(row.answer, full.answer);
  }
  assert.throws(
    () => summarize(Buffer.from('{"id": "a", "problem_id": 3}')),
    /problem_id: expected a string/,
  );
});

test('a tail hands over whole lines once, numbered, and starts over when the file shrank', async () => {
  const path = join(dir, 'tail.jsonl');
  writeFileSync(path, '{"a":1}\n{"a":2}\n{"a":');
  const tail = new FileTail(path);
  const seen: string[] = [];
  const read = () => tail.read((l) => seen.push(`${l.line}:${l.bytes.toString()}`));
  assert.deepEqual(await read(), { reset: false, lines: 2 });
  appendFileSync(path, '3}\n{"a":4}\n');
  assert.deepEqual(await read(), { reset: false, lines: 2 });
  assert.deepEqual(seen, ['1:{"a":1}', '2:{"a":2}', '3:{"a":3}', '4:{"a":4}']);
  writeFileSync(path, '{"b":1}\n');
  assert.deepEqual(await read(), { reset: true, lines: 1 });
  assert.equal(seen.at(-1), '1:{"b":1}');
});

test('the index follows a live run, reports a bad line FILE:LINE and decides RoC as roc-filter', async () => {
  const run = join(dir, 'live');
  writeRun(run, SPEC);
  const ix = new RunIndex('live', run);
  await ix.refresh();
  const training = () => ix.rows.filter((r) => r.eval === null);
  assert.equal(training().length, SPEC.steps * SPEC.problems * SPEC.n);
  assert.equal(ix.evals.size, 2);
  // RoC: every complete group decided, as rocSelect decides it from rewards and penalties
  const groups = new Map<string, typeof ix.rows>();
  for (const r of training())
    groups.set(`${r.step}/${r.problem_id}`, [...(groups.get(`${r.step}/${r.problem_id}`) ?? []), r]);
  let sampled = 0;
  for (const rows of groups.values()) {
    const d = rocSelect(
      rows.map((r) => ({ sample: r.sample, reward: r.reward, penalty: r.penalty.total })),
      { keep: SPEC.keep, minPos: 2, minNeg: 2, rejectEqual: true, positives: 'sorted' },
    );
    assert.deepEqual(
      rows.map((r) => r.roc),
      rows.map((_, i) => (d.kept.includes(i) ? 'kept' : 'dropped')),
    );
    if (d.outcome === 'sampled') sampled += 1;
  }
  assert.ok(sampled > 0, 'some groups down-sampled');
  // live: a new step and a malformed line; only the new bytes are read
  const before = ix.rows.length;
  appendStep(run, SPEC, 4);
  appendFileSync(join(run, 'rl', 'trajectories', 'step-4.jsonl'), 'not json\n');
  assert.equal(await ix.refresh(), true);
  assert.equal(ix.rows.length, before + SPEC.problems * SPEC.n);
  assert.equal(
    ix.rows.slice(before).every((r) => r.step === 4),
    true,
  );
  assert.equal(ix.issues.length, 1);
  assert.match(ix.issues[0].where, /^live\/rl\/trajectories\/step-4\.jsonl:33$/);
  assert.equal(await ix.refresh(), false, 'nothing new: nothing changed');
  // a rewritten (shorter) step file: rows rebuilt, handles still point at the right lines
  const step1 = join(run, 'rl', 'trajectories', 'step-1.jsonl');
  const kept = readFileSync(step1, 'utf8').split('\n').slice(0, 8).join('\n');
  writeFileSync(step1, `${kept}\n`);
  await ix.refresh();
  assert.equal(ix.generation, 1);
  assert.equal(training().filter((r) => r.step === 1).length, 8);
  const last = ix.rows[ix.rows.length - 1];
  const t = await trajectoryPayload(ix, last.n);
  assert.equal(t?.id, last.id);
  assert.ok((t?.segments.length ?? 0) >= 3);
});

test('a reopened run takes unchanged files from the index cache; changed ones are read again', async () => {
  const run = join(dir, 'cached');
  writeRun(run, SPEC);
  const step = (k: number) => join(run, 'rl', 'trajectories', `step-${k}.jsonl`);
  appendFileSync(step(2), 'not json\n');
  const fresh = async () => {
    const ix = new RunIndex('cached', run);
    await ix.refresh();
    return ix;
  };
  const cache = cacheFile(join(dir, 'caches'), run);
  const first = new RunIndex('cached', run, { cacheFile: cache });
  await first.refresh();
  assert.equal(first.cachedRows, 0);
  assert.ok(existsSync(cache));
  // the run folder is not written to
  assert.deepEqual(readdirSync(run).sort(), ['eval-rl', 'eval-sft', 'manifest.txt', 'rl', 'sft']);

  // what the cache holds is taken first (rstar view: right after listening): here everything
  const again = new RunIndex('cached', run, { cacheFile: cache });
  await again.refresh({ rows: 'cached' });
  assert.equal(again.cachedRows, first.rows.length);
  assert.deepEqual(again.rows, first.rows);
  assert.deepEqual(again.issues, first.issues);
  assert.equal(again.issueCount, first.issueCount);
  assert.ok(again.rows.some((r) => r.roc === 'kept'));
  assert.equal(again.indexed, true, 'every file came from the cache');
  assert.equal(await again.refresh(), false, 'nothing to read');
  const last = again.rows[again.rows.length - 1];
  assert.equal((await trajectoryPayload(again, last.n))?.id, last.id);

  // step 1 rewritten (shorter), step 4 added: both read, the rest still cached, rows as a fresh index's
  const kept = readFileSync(step(1), 'utf8').split('\n').slice(0, 8).join('\n');
  writeFileSync(step(1), `${kept}\n`);
  appendStep(run, SPEC, 4);
  const partly = new RunIndex('cached', run, { cacheFile: cache });
  await partly.refresh({ rows: 'cached' });
  assert.equal(partly.rows.length, 0, 'the cache is taken in order, up to the first changed file');
  await partly.refresh();
  const expected = await fresh();
  assert.equal(partly.cachedRows, expected.rows.filter((r) => r.step !== 1 && r.step !== 4).length);
  assert.deepEqual(partly.rows, expected.rows);
  assert.deepEqual(partly.issues, expected.issues);

  // other RoC settings in a stage manifest: the verdicts are decided again, not taken from the cache
  writeFileSync(
    join(run, 'rl', 'manifest-stage-1.txt'),
    `RSTAR_RL_KEEP=2\nRSTAR_RL_N=${SPEC.n}\nRSTAR_RL_DOWN_SAMPLE=roc\n`,
  );
  const resettled = new RunIndex('cached', run, { cacheFile: cache });
  await resettled.refresh();
  assert.ok(resettled.cachedRows > 0);
  const decided = await fresh();
  assert.deepEqual(
    resettled.rows.map((r) => r.roc),
    decided.rows.map((r) => r.roc),
  );
  assert.notDeepEqual(
    decided.rows.map((r) => r.roc),
    expected.rows.map((r) => r.roc),
  );
});

test("a cache is another run folder's only under its own path; caches unused for 30 days are pruned", async () => {
  const run = join(dir, 'pruned');
  writeRun(run, SPEC, { evals: false });
  const caches = join(dir, 'pruned-caches');
  const cache = cacheFile(caches, run);
  await new RunIndex('pruned', run, { cacheFile: cache }).refresh();
  // the same file given for another folder (a hash clash) is not taken
  const other = join(dir, 'other');
  writeRun(other, SPEC, { evals: false });
  const wrong = new RunIndex('other', other, { cacheFile: cache });
  await wrong.refresh();
  assert.equal(wrong.cachedRows, 0);
  const old = join(caches, 'gone-0123456789abcdef.json');
  writeFileSync(old, '{}');
  const past = new Date(Date.now() - CACHE_MAX_AGE_MS - 60_000);
  utimesSync(old, past, past);
  assert.equal(await pruneCaches(caches), 1);
  assert.equal(existsSync(old), false);
  assert.equal(existsSync(cache), true);
});
