// Catches: branch rows (tree rollouts, `rollout --branch K`) counted in their problem's RoC group
// (its verdict then decided on the wrong members) or left without a verdict of their own; a branch
// group decided with the stage's keep instead of min(keep, K) (a group of fewer siblings than
// --keep all dropped as too small); a branch scored on its whole text (its parent's failed call
// counted against every sibling) instead of its own part, as roc-filter scores it; a trajectory's
// detail that does not name its parent, or a parent that does not list its branches; the step's
// branch statistics and generated tokens not served; an index cache of the format before branches
// taken (its rows have no `branch`, its branch penalties and verdicts were decided on the wrong
// group), or a cache that loses the branch field.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { scoreText } from '../../src/algo/penalty.js';
import { rocSelect } from '../../src/algo/roc.js';
import { overviewPayload, rowsPayload, trajectoryPayload } from '../../src/view/api.js';
import { cacheFile } from '../../src/view/cache.js';
import { summarize } from '../../src/view/row.js';
import { CACHE_FORMAT, type IndexedRow, RunIndex } from '../../src/view/run-index.js';
import { browserMissing, launch, startView, watchedPage } from '../support/browser.js';
import { type RunSpec, writeRun } from '../support/view-run.js';

const dir = mkdtempSync(join(tmpdir(), 'rstar-view-branches-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const SPEC: RunSpec = { steps: 2, problems: 4, n: 8, keep: 4 };

const call = (code: string, out: string) =>
  `<tool_call>\n${JSON.stringify({ name: 'python_code_with_standard_io', arguments: { code, input: '' } })}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n${out}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`;
const FAILED = 'Traceback (most recent call last):\nNameError: name x is not defined';
/** The parent's part up to the branch point: a failed call and its response. */
const PREFIX = `Let me count.\n${call('print(x)', FAILED)}`;
const PREFIX_TOKENS = 20;
const ANSWER = (a: string) => `<answer>\\boxed{${a}}</answer><|im_end|>`;
/** What a branch generated after the branch point: `calls` tool calls (the first `failed` fail), an answer. */
function own(answer: string, calls = 0, failed = 0): string {
  let text = 'I fix the name.';
  for (let c = 0; c < calls; c++) text += call(`print(${c})`, c < failed ? FAILED : answer);
  return `${text}So it is ${answer}.${ANSWER(answer)}`;
}

type Line = Record<string, unknown> & { id: string; problem_id: string };

function branch(parent: Line, index: number, of: number, own: string, reward: number): Line {
  const ownTokens = 12;
  const mask = [...Array(PREFIX_TOKENS).fill(0), ...Array(ownTokens).fill(1)];
  return {
    ...parent,
    id: `${parent.id}/b${index}`,
    sample: index,
    response_ids: mask.map((_, i) => 10 + i),
    loss_mask: mask,
    logprobs: mask.map((m) => (m === 0 ? 0 : -0.5)),
    text: PREFIX + own,
    turns: 2 + (own.match(/<tool_call>/g)?.length ?? 0),
    tool_calls: 1 + (own.match(/<tool_call>/g)?.length ?? 0),
    tool_errors: 1 + (own.match(/Traceback/g)?.length ?? 0),
    answer_tags: 1,
    finish: 'stop',
    reward,
    branch: {
      parent: parent.id,
      offset: PREFIX_TOKENS,
      text_offset: PREFIX.length,
      turn: 1,
      calls: 1,
      index,
      of,
    },
  };
}

/**
 * Two copies of one run: `plain` and `tree`, whose step 1 also holds two branch points, each
 * group's branches right after their parent (so a branch counted in its problem's group would
 * complete that group in place of a root sample). Point A: 6 branches (keep = min(4, 6) = 4, down-
 * sampled); point B: 3 branches (fewer than --keep: kept whole, not too small).
 */
function makeRuns(): { plain: string; tree: string; parents: [Line, Line] } {
  const plain = join(dir, 'plain');
  writeRun(plain, SPEC, { evals: false });
  const step1 = join(plain, 'rl', 'trajectories', 'step-1.jsonl');
  const lines = readFileSync(step1, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Line);
  // each parent's first call failed (what it branched from)
  const a = lines[0];
  const b = lines[SPEC.n];
  for (const p of [a, b]) {
    p.text = PREFIX + own(String(p.answer ?? '0'), 1, 0);
    p.tool_calls = 2;
    p.tool_errors = 1;
  }
  writeFileSync(step1, lines.map((l) => `${JSON.stringify(l)}\n`).join(''));
  const ref = (p: Line) => String((p.reward as number) > 0 ? p.answer : '142');
  // 3 positives, 3 negatives: RoC keeps the 2 positives with the lowest penalty. Their tool-error
  // ratios over their own calls are 0, 1/5, 1/4; over the whole text (the parent's failed call
  // added) 1/2, 2/6, 2/5: the order, and the two kept, differ
  const pointA = [
    branch(a, 0, 6, own(ref(a), 1, 0), 1),
    branch(a, 1, 6, own(ref(a), 5, 1), 1),
    branch(a, 2, 6, own(ref(a), 4, 1), 1),
    branch(a, 3, 6, own('7', 1, 0), 0),
    branch(a, 4, 6, own('8'), 0),
    branch(a, 5, 6, own('9', 2, 1), 0),
  ];
  const pointB = [
    branch(b, 0, 3, own(ref(b), 1, 0), 1),
    branch(b, 1, 3, own('7'), 0),
    branch(b, 2, 3, own('8', 2, 1), 0),
  ];
  const tree = join(dir, 'tree');
  cpSync(plain, tree, { recursive: true });
  const withBranches = [a, ...pointA, ...lines.slice(1, SPEC.n), b, ...pointB, ...lines.slice(SPEC.n + 1)];
  writeFileSync(
    join(tree, 'rl', 'trajectories', 'step-1.jsonl'),
    withBranches.map((l) => `${JSON.stringify(l)}\n`).join(''),
  );
  // rollout's step statistics with branches (its end_batch line)
  const stats = join(tree, 'rl', 'rollout-steps.jsonl');
  const [first, ...rest] = readFileSync(stats, 'utf8').trim().split('\n');
  const line = JSON.parse(first);
  line.stats.generated_tokens = 12_345;
  line.stats.branches = { points: 2, samples: 9, correct: 4, recovered: 2, errors: 0, tokens: 108 };
  writeFileSync(stats, [JSON.stringify(line), ...rest].map((l) => `${l}\n`).join(''));
  return { plain, tree, parents: [a, b] };
}

const runs = makeRuns();

async function indexOf(root: string, cache?: string): Promise<RunIndex> {
  const ix = new RunIndex('run', root, cache ? { cacheFile: cache } : {});
  await ix.refresh();
  return ix;
}

const verdicts = (rows: IndexedRow[]) => rows.map((r) => `${r.id}:${r.roc}:${r.roc_outcome}`);

test("a branch row carries its branch point and its own part's penalty", () => {
  const lines = readFileSync(join(runs.tree, 'rl', 'trajectories', 'step-1.jsonl'), 'utf8')
    .trim()
    .split('\n');
  const full = JSON.parse(lines[2]);
  const row = summarize(Buffer.from(lines[2]));
  assert.deepEqual(row.branch, { parent: runs.parents[0].id, offset: PREFIX_TOKENS, index: 1, of: 6 });
  const own = scoreText(full.text.slice(full.branch.text_offset)).penalty;
  assert.deepEqual(row.penalty, own);
  assert.notDeepEqual(own, scoreText(full.text).penalty, 'the parent failed call would count otherwise');
  assert.equal(row.model_tokens, 12, 'its own tokens only');
  assert.equal(summarize(Buffer.from(lines[0])).branch, null);
  assert.throws(
    () => summarize(Buffer.from(JSON.stringify({ ...full, branch: { ...full.branch, of: 'x' } }))),
    /branch\.of: expected an integer/,
  );
});

test('a branch group is decided on its own, with keep min(--keep, K); root groups as without branches', async () => {
  const plain = await indexOf(runs.plain);
  const tree = await indexOf(runs.tree);
  const roots = tree.rows.filter((r) => r.branch === null);
  assert.deepEqual(verdicts(roots), verdicts(plain.rows), 'root verdicts unchanged by the branches');
  assert.ok(plain.rows.some((r) => r.step === 1 && r.roc === 'kept'));

  const [a, b] = runs.parents;
  const pointA = tree.rows.filter((r) => r.branch?.parent === a.id);
  assert.equal(pointA.length, 6);
  const decide = (penalty: (r: IndexedRow) => number) =>
    rocSelect(
      pointA.map((r) => ({ sample: r.sample, reward: r.reward, penalty: penalty(r) })),
      { keep: 4, minPos: 2, minNeg: 2, rejectEqual: true, positives: 'sorted' },
    );
  const own = decide((r) => r.penalty.total);
  assert.equal(own.outcome, 'sampled');
  assert.deepEqual(
    pointA.map((r) => r.roc),
    pointA.map((_, i) => (own.kept.includes(i) ? 'kept' : 'dropped')),
  );
  assert.ok(pointA.every((r) => r.roc_outcome === 'sampled'));
  // the test can tell: scored on the whole text, RoC would keep other positives
  const lines = readFileSync(join(runs.tree, 'rl', 'trajectories', 'step-1.jsonl'), 'utf8')
    .trim()
    .split('\n');
  const whole = decide((r) => scoreText(JSON.parse(lines[r.line - 1]).text).penalty.total);
  assert.notDeepEqual(whole.kept, own.kept);

  // 3 siblings, --keep 4: roc-filter keeps min(4, 3) = 3, the whole group
  const pointB = tree.rows.filter((r) => r.branch?.parent === b.id);
  assert.deepEqual(
    pointB.map((r) => `${r.roc}:${r.roc_outcome}`),
    ['kept:kept-whole', 'kept:kept-whole', 'kept:kept-whole'],
  );
});

test('the detail names the parent, the parent lists its branches; rows and step stats carry the tree', async () => {
  const ix = await indexOf(runs.tree);
  const [a] = runs.parents;
  const parent = ix.rows.find((r) => r.id === a.id && r.step === 1);
  assert.ok(parent);
  const child = ix.rows.find((r) => r.id === `${a.id}/b3`);
  assert.ok(child);
  const detail = await trajectoryPayload(ix, child.n);
  assert.deepEqual(detail?.branch, {
    parent: a.id,
    parent_n: parent.n,
    offset: PREFIX_TOKENS,
    text_offset: PREFIX.length,
    turn: 1,
    calls: 1,
    index: 3,
    of: 6,
  });
  assert.deepEqual(detail?.branches, []);
  const up = await trajectoryPayload(ix, parent.n);
  assert.equal(up?.branch, null);
  assert.deepEqual(
    up?.branches.map((c) => `${c.id}:${c.index}:${c.reward}`),
    [0, 1, 2, 3, 4, 5].map((i) => `${a.id}/b${i}:${i}:${i < 3 ? 1 : 0}`),
  );
  assert.equal(up?.branches[0].n, ix.rows.find((r) => r.id === `${a.id}/b0`)?.n);

  const table = rowsPayload(ix);
  const at = table.columns.indexOf('branch');
  assert.deepEqual(table.rows[child.n][at], child.branch);
  assert.equal(table.rows[parent.n][at], null);

  const step1 = overviewPayload(ix).steps.find((p) => p.step === 1);
  assert.deepEqual(step1?.branches, {
    points: 2,
    samples: 9,
    correct: 4,
    recovered: 2,
    errors: 0,
    tokens: 108,
  });
  assert.equal(step1?.generated_tokens, 12_345);
  // the trajectory means are the problem's samples', as rollout's own (a branch is no sample)
  const roots = ix.rows.filter((r) => r.step === 1 && r.branch === null);
  assert.equal(step1?.indexed, SPEC.problems * SPEC.n);
  assert.equal(step1?.indexed_branches, 9);
  assert.equal(step1?.traj_reward, roots.reduce((s, r) => s + r.reward, 0) / roots.length);
  assert.equal(
    step1?.roc_kept,
    ix.rows.filter((r) => r.step === 1 && r.roc === 'kept').length,
    'RoC counts cover the branches',
  );
  assert.equal(overviewPayload(ix).steps.find((p) => p.step === 2)?.branches, null);
});

test('the index cache keeps the tree; a cache of the format before branches is rebuilt', async () => {
  const cache = cacheFile(join(dir, 'caches'), runs.tree);
  const first = await indexOf(runs.tree, cache);
  const again = new RunIndex('run', runs.tree, { cacheFile: cache });
  await again.refresh({ rows: 'cached' });
  assert.equal(again.cachedRows, first.rows.length);
  assert.deepEqual(again.rows, first.rows);
  assert.ok(again.rows.some((r) => r.branch !== null && r.roc === 'kept'));

  // the cache as the format before branches wrote it: no branch column, every row of step 1 in
  // its problem's group, penalties over the whole text
  const saved = JSON.parse(readFileSync(cache, 'utf8'));
  saved.format = 1;
  for (const f of saved.files) {
    delete f.columns.branch;
    f.columns.roc = f.columns.roc.map(() => 'dropped');
  }
  assert.ok(CACHE_FORMAT > 1);
  writeFileSync(cache, JSON.stringify(saved));
  const reopened = await indexOf(runs.tree, cache);
  assert.equal(reopened.cachedRows, 0, 'an old-format cache is not read');
  assert.deepEqual(reopened.rows, first.rows);
  // and written again in the current format
  assert.equal(JSON.parse(readFileSync(cache, 'utf8')).format, CACHE_FORMAT);
});

test('the page shows a branch point, links the parent and lists its branches', {
  skip: browserMissing(),
}, async () => {
  const ix = await indexOf(runs.tree);
  const [a] = runs.parents;
  const child = ix.rows.find((r) => r.id === `${a.id}/b3`);
  assert.ok(child);
  const view = await startView([runs.tree, '--no-index-cache']);
  const browser = await launch();
  try {
    const { page, errors, outside } = await watchedPage(browser);
    const ready = (name: string) => page.waitForSelector(`main[data-ready="${name}"]`, { timeout: 30_000 });
    await page.goto(`${view.url}#/trajectory?run=0&n=${child.n}`);
    await ready('trajectory');
    assert.equal(
      await page.textContent('[data-branch]'),
      `branch 3 of 6 from ${a.id} at token ${PREFIX_TOKENS} (turn 1)`,
    );
    // its RoC group: the siblings from its branch point, not its problem's samples
    await page.click('a:text("the branch group of")');
    await ready('group');
    assert.equal(await page.locator('.sample').count(), 6);
    await page.goBack();
    await ready('trajectory');
    // the turns before the branch point (its parent's first) are marked as the parent's
    const before = await page.$$eval('.turns > *', (els) => {
      const at = els.findIndex((e) => e.classList.contains('branch-point'));
      return at === -1 ? -1 : els.slice(0, at).filter((e) => e.classList.contains('assistant')).length;
    });
    assert.equal(before, 1, 'one model turn before the branch point (its turn 1)');
    await page.click('[data-branch] a');
    await page.waitForSelector('ul.branches li');
    assert.match((await page.textContent('h1')) ?? '', new RegExp(`Trajectory ${a.id}$`));
    assert.equal(await page.locator('ul.branches li').count(), 6);
    await page.goto(`${view.url}#/steps`);
    await ready('steps');
    assert.equal(await page.textContent('tr[data-step="1"] td[data-branches]'), '2 · 9 · 4 · 2');
    assert.deepEqual(errors, []);
    assert.deepEqual(outside, []);
  } finally {
    await browser.close();
    await view.stop();
  }
});
