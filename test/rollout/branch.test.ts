// Catches: tree rollouts (`rollout --branch K`) that branch from the wrong token offset (the engine
// asked to continue anything but the parent's prompt + response up to the failed call's response),
// a branch whose shared prefix is trained again (loss_mask or logprobs not 0 there), a branch
// without its parent and branch point in the record, a branch that branches again, a budget that
// is overspent (or a lone branch with no sibling to be credited against), branches that share a
// sandbox session with each other or their parent instead of a fork each (the variable set before
// the failure must be seen, another branch's must not), forked sessions left open, step stats that
// count branches as samples of their problem, eval taking a branch for a sample, and roc-filter /
// advantage grouping a branch with its problem instead of with its siblings (hand counts).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Trajectory } from '../../src/records/trajectory.js';
import { branchBudget } from '../../src/rollout/branch.js';
import { loadProtocol, type ProtocolContext, rollout, SglangClient } from '../../src/rollout/index.js';
import { rolloutSteps } from '../../src/rollout/steps.js';
import { SandboxClient } from '../../src/sandbox/client.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { ANSWER, collect, problems, TINY, toolCall } from '../support/agent-fixtures.js';
import { type FakeServer, startFakeSglang } from '../support/fake-sglang.js';
import { lines, ndjson, rstar, trajectory } from '../support/helpers.js';

const FAIL = toolCall('raise ValueError("boom")');

/** The real client, counting the forks it asks for. */
class ForkCounting extends SandboxClient {
  forks = 0;
  override async forkSession(id: string): Promise<string> {
    this.forks += 1;
    return super.forkSession(id);
  }
}

/** The response positions of the second model turn's first token: where a branch after turn 1 starts. */
function secondTurnStart(mask: readonly number[]): number {
  const firstZero = mask.indexOf(0);
  return mask.indexOf(1, firstZero);
}

describe('tree rollouts: rollout --branch', () => {
  let sandbox: { url: string; close(): Promise<void> };
  let stateless: ProtocolContext;
  let session: ProtocolContext;
  let dir: string;
  const servers: FakeServer[] = [];
  const fake = async (turns: string[], o: Partial<Parameters<typeof startFakeSglang>[0]> = {}) => {
    const s = await startFakeSglang({ tokenizer: TINY, capacity: 100_000, turns, ...o });
    servers.push(s);
    return s;
  };
  const openSessions = async () =>
    ((await (await fetch(`${sandbox.url}/health`)).json()) as { sessions: number }).sessions;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-branch-'));
    [sandbox, stateless, session] = await Promise.all([
      startSandbox({ workers: 2 }),
      loadProtocol(TINY),
      loadProtocol(TINY, { toolState: 'session' }),
    ]);
  });
  after(async () => {
    await Promise.all(servers.map((s) => s.close()));
    await sandbox.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('branches K continuations from the token offset just after the failed call’s response', async () => {
    const engine = await fake([FAIL, ANSWER]);
    const budget = branchBudget(100);
    const out = await collect(
      rollout(problems(2), {
        engines: [new SglangClient(engine.url)],
        sandbox: sandbox.url,
        protocol: stateless,
        n: 2,
        seed: 1,
        branch: { k: 3, budget },
      }),
    );
    const records = out.map((t) => Trajectory.parse(t));
    const roots = records.filter((t) => t.branch === undefined);
    const branches = records.filter((t) => t.branch !== undefined);
    assert.equal(roots.length, 4);
    assert.equal(branches.length, 12, 'each root failed its first call: 3 branches each');
    assert.deepEqual(budget, { left: 88, points: 4, samples: 12 });
    const requests = (await engine.stats()).generated;
    for (const b of branches) {
      const branch = b.branch!;
      const parent = roots.find((r) => r.id === branch.parent);
      assert.ok(parent, `${b.id}: its parent ${branch.parent} is in the run`);
      assert.equal(b.problem_id, parent.problem_id);
      assert.match(b.id, new RegExp(`^${parent.id}/b[0-2]$`));
      assert.equal(b.sample, branch.index);
      assert.equal(branch.of, 3);
      const offset = secondTurnStart(parent.loss_mask);
      assert.equal(branch.offset, offset, 'the branch point is right after the tool response');
      assert.equal(branch.turn, 1);
      assert.equal(branch.calls, 1);
      assert.deepEqual(b.response_ids.slice(0, offset), parent.response_ids.slice(0, offset));
      assert.ok(
        b.loss_mask.slice(0, offset).every((m) => m === 0),
        'the shared prefix is trained with its parent only',
      );
      assert.ok(b.logprobs.slice(0, offset).every((lp) => lp === 0));
      assert.ok(b.loss_mask.slice(offset).includes(1), 'the branch trains on what it generated');
      assert.equal(b.text.slice(0, branch.text_offset), parent.text.slice(0, branch.text_offset));
      assert.ok(b.text.slice(branch.text_offset).startsWith('So x = 3.'), b.text.slice(branch.text_offset));
      assert.deepEqual(b.tool_status, ['failed']);
      assert.equal(b.reward, 1);
      assert.deepEqual(parent.branched, { offset, of: 3 }, 'the parent says where it branched');
      // The engine was asked to continue exactly the parent's prompt + prefix.
      const context = [...parent.prompt_ids, ...parent.response_ids.slice(0, offset)];
      assert.ok(
        requests.some(
          (r) => r.input_ids.length === context.length && r.input_ids.every((id, i) => id === context[i]),
        ),
        `${b.id}: no request continued the prefix`,
      );
    }
    // K + 1 requests continue each root's prefix: the root's own second turn and its 3 branches
    // (two roots whose tool responses are identical share the prefix: 2 x 4).
    const prefixOf = (t: Trajectory) =>
      JSON.stringify([...t.prompt_ids, ...t.response_ids.slice(0, secondTurnStart(t.loss_mask))]);
    for (const root of roots) {
      const context = prefixOf(root);
      const same = requests.filter((r) => JSON.stringify(r.input_ids) === context);
      assert.equal(same.length, 4 * roots.filter((o) => prefixOf(o) === context).length);
    }
    const seeds = new Set(requests.map((r) => r.sampling_params.sampling_seed));
    assert.equal(seeds.size, requests.length, 'every request (branches included) has a seed of its own');
  });

  it('never spends more than the budget, and never starts a lone branch', async () => {
    const engine = await fake([FAIL, FAIL, ANSWER]);
    const budget = branchBudget(4);
    const out = await collect(
      rollout(problems(1), {
        engines: [new SglangClient(engine.url)],
        sandbox: sandbox.url,
        protocol: stateless,
        n: 2,
        branch: { k: 3, budget },
      }),
    );
    const branches = out.filter((t) => t.branch !== undefined);
    assert.equal(branches.length, 3, 'one point of 3; the second root would get 1 and gets none');
    assert.deepEqual(budget, { left: 1, points: 1, samples: 3 });
    // Each root failed twice: it branched once, at its first failure, and branches never branch.
    assert.ok(branches.every((b) => b.branch?.turn === 1));
    assert.equal(out.length, 5);
  });

  it('in session mode each branch runs in a fork: it sees the state before the failure, not its siblings’', async () => {
    const engine = await fake([
      toolCall('x = 41\nraise ValueError("boom")'),
      toolCall('print(x, "seen" in globals())\nseen = 1'),
      ANSWER,
    ]);
    const client = new ForkCounting(sandbox.url, { rejectServiceFailures: true });
    const out = await collect(
      rollout(problems(1), {
        engines: [new SglangClient(engine.url)],
        sandbox: client,
        protocol: session,
        n: 1,
        branch: { k: 3, budget: branchBudget(10) },
      }),
    );
    await client.close();
    assert.equal(out.length, 4);
    assert.equal(client.forks, 3);
    for (const t of out) {
      // x from before the failure; `seen` set by nobody else's cell in this session
      assert.match(t.text, /stdout: 41 False\n/, t.text);
      assert.deepEqual(t.tool_status, ['failed', 'ok']);
      assert.equal(t.tool_state, 'session');
    }
    assert.equal(await openSessions(), 0, 'the forks are closed with their branches');
  });

  it('counts branches apart in the step stats, and their own tokens only', async () => {
    const engine = await fake([FAIL, toolCall('print(6 // 2)'), ANSWER]);
    const out = await collect(
      rolloutSteps(
        problems(2),
        { engines: [new SglangClient(engine.url)], sandbox: sandbox.url, protocol: stateless, n: 2 },
        { batch: 2, steps: 1, branch: { k: 2, budget: 3 } },
      ),
    );
    const end = out.at(-1) as { stats: Record<string, unknown> };
    const records = out.slice(0, -1) as Trajectory[];
    assert.equal(records.length, 6, '4 roots, one branch point of 2 (the budget of 3 allows no second)');
    assert.equal(end.stats.trajectories, 6);
    assert.equal(end.stats.mixed_groups, 0, 'branches decide nothing about their problem’s group');
    assert.deepEqual(end.stats.branches, {
      points: 1,
      samples: 2,
      correct: 2,
      recovered: 2,
      errors: 0,
      tokens: sum(records.filter((t) => t.branch).map(own)),
    });
    assert.equal(end.stats.generated_tokens, sum(records.map(own)));
    assert.equal((end.stats.tool_use as Record<string, number>).trajectories, 4);
  });

  it('eval refuses a branch as a sample of its problem', async () => {
    const file = join(dir, 'with-branch.ndjson');
    const branch = {
      ...trajectory('p', 0, 1, { id: 'p/0/b0', loss_mask: [0, 1] }),
      branch: { parent: 'p/0', offset: 1, text_offset: 0, turn: 0, calls: 0, index: 0, of: 2 },
    };
    writeFileSync(file, ndjson([trajectory('p', 0, 1), branch]));
    const r = await rstar(['eval', '--from-trajectories', file]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /with-branch\.ndjson:2: branch: 'p\/0\/b0' is a branch of 'p\/0'/);
  });
});

const own = (t: Trajectory) => t.loss_mask.reduce<number>((n, m) => n + m, 0);
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

const PREFIX = 'A<tool_response>error</tool_response>';

/** A small tree by hand: problem p's two samples, and three branches of p/0 after its failed call. */
function tree() {
  // p/0: turn (2 tokens), tool response (2), turn (2); failed then wrong.
  const p0 = trajectory('p', 0, 0, {
    response_ids: [5, 6, 7, 8, 9, 10],
    loss_mask: [1, 1, 0, 0, 1, 1],
    logprobs: [-1, -1, 0, 0, -1, -1],
    text: 'A<tool_response>error</tool_response>B<answer>4</answer>',
    turns: 2,
    tool_calls: 1,
    tool_errors: 1,
    tool_status: ['failed'],
  });
  const p1 = trajectory('p', 1, 1, { text: 'C<answer>3</answer>' });
  const branch = (index: number, reward: number, tail: number[], text: string) =>
    trajectory('p', index, reward, {
      id: `p/0/b${index}`,
      response_ids: [5, 6, 7, 8, ...tail],
      loss_mask: [0, 0, 0, 0, ...tail.map(() => 1)],
      logprobs: [0, 0, 0, 0, ...tail.map(() => -1)],
      text: `${PREFIX}${text}`,
      turns: 2,
      tool_calls: 1,
      tool_errors: 1,
      tool_status: ['failed'],
      branch: { parent: 'p/0', offset: 4, text_offset: PREFIX.length, turn: 1, calls: 1, index, of: 3 },
    });
  return [
    p0,
    branch(0, 1, [11, 12], 'D<answer>3</answer>'),
    p1,
    branch(1, 0, [13], 'E<answer>5</answer>'),
    branch(2, 1, [11, 12], 'D<answer>3</answer>'),
  ];
}

describe('a tree downstream: roc-filter and advantage', () => {
  it('advantage credits branches against their siblings, on their own tokens (hand counts)', async () => {
    const r = await rstar(['advantage', '--step-weight', '1', '--gamma', '1'], ndjson(tree()));
    assert.equal(r.code, 0, r.stderr);
    const out = new Map(
      lines<{ id: string; advantage: number; advantages: number[] }>(r.stdout).map((t) => [t.id, t]),
    );
    // problem group [0, 1]: mean 0.5, std 0.7071 -> -/+0.7071
    assert.ok(Math.abs(out.get('p/0')!.advantage + Math.SQRT1_2) < 1e-5);
    assert.ok(Math.abs(out.get('p/1')!.advantage - Math.SQRT1_2) < 1e-5);
    // branch group [1, 0, 1]: mean 2/3, std sqrt(1/3) -> 0.57735, -1.1547, 0.57735
    const s = Math.sqrt(1 / 3);
    assert.ok(Math.abs(out.get('p/0/b0')!.advantage - 1 / 3 / s) < 1e-5);
    assert.ok(Math.abs(out.get('p/0/b1')!.advantage + 2 / 3 / s) < 1e-5);
    // Step groups within the branch group: the three branches' one model turn starts from the same
    // prefix (one step group of 3, returns = rewards): the step advantage equals the episode's, so
    // weight 1 doubles it on the trained tokens; the prefix stays 0.
    const b1 = out.get('p/0/b1')!;
    assert.deepEqual(b1.advantages.slice(0, 4), [0, 0, 0, 0]);
    assert.ok(Math.abs(b1.advantages[4] - 2 * b1.advantage) < 1e-5);
  });

  it('--branch-credit with-parent credits the parent’s continuation in its branch group (hand counts)', async () => {
    const [p0, ...rest] = tree();
    const parent = { ...p0, branched: { offset: 4, of: 3 } };
    const stats = join(mkdtempSync(join(tmpdir(), 'rstar-branch-adv-')), 'stats.json');
    const r = await rstar(
      ['advantage', '--branch-credit', 'with-parent', '--stats', stats],
      ndjson([rest[0], parent, ...rest.slice(1)]),
    );
    assert.equal(r.code, 0, r.stderr);
    const out = lines<{ id: string; advantage: number; advantages?: number[] }>(r.stdout);
    const by = new Map(out.map((t) => [t.id, t]));
    const near = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-5, `${a} vs ${b}`);
    // problem group [0, 1]: -/+0.7071; the branch point's group [parent 0, 1, 0, 1]: mean 0.5,
    // std sqrt(1/3): -/+0.8660
    const p = by.get('p/0')!;
    near(p.advantage, -Math.SQRT1_2);
    const a = p.advantages!;
    assert.equal(a.length, 6);
    near(a[0], -Math.SQRT1_2);
    near(a[1], -Math.SQRT1_2);
    assert.deepEqual([a[2], a[3]], [0, 0]);
    near(a[4], -0.5 / Math.sqrt(1 / 3));
    near(a[5], -0.5 / Math.sqrt(1 / 3));
    near(by.get('p/0/b0')!.advantage, 0.5 / Math.sqrt(1 / 3));
    near(by.get('p/0/b1')!.advantage, -0.5 / Math.sqrt(1 / 3));
    near(by.get('p/1')!.advantage, Math.SQRT1_2);
    assert.equal(out.length, 5, 'every record once');
    assert.equal(JSON.parse(readFileSync(stats, 'utf8')).branch_groups_with_parent, 1);
    // A branch group roc-filter dropped: the parent is credited in its problem group alone, and a
    // branch group whose parent was dropped among its siblings.
    const alone = await rstar(['advantage', '--branch-credit', 'with-parent'], ndjson([parent, rest[1]]));
    assert.equal(alone.code, 0, alone.stderr);
    const [onlyParent, onlyP1] = lines<{ id: string; advantages?: number[] }>(alone.stdout);
    assert.equal(onlyParent.id, 'p/0');
    assert.equal(onlyP1.id, 'p/1');
    assert.equal(onlyParent.advantages, undefined, 'no branch group: the scalar advantage');
    const orphans = await rstar(
      ['advantage', '--branch-credit', 'with-parent'],
      ndjson([rest[0], rest[2], rest[3]]),
    );
    assert.equal(orphans.code, 0, orphans.stderr);
    near(lines<{ advantage: number }>(orphans.stdout)[0].advantage, 1 / 3 / Math.sqrt(1 / 3));
  });

  it('roc-filter keeps a branch group of its own, scored from the branch point', async () => {
    const stats = join(mkdtempSync(join(tmpdir(), 'rstar-branch-roc-')), 'stats.json');
    const r = await rstar(
      ['roc-filter', '--keep', '2', '--min-pos', '1', '--min-neg', '1', '--stats', stats],
      ndjson(tree()),
    );
    assert.equal(r.code, 0, r.stderr);
    const kept = lines<{ id: string; penalty: { tool_error: number } }>(r.stdout);
    const ids = kept.map((t) => t.id).sort();
    // the problem group is kept whole (2 = --keep); the branch group keeps 1 positive + 1 negative
    assert.deepEqual(
      ids.filter((id) => !id.includes('/b')),
      ['p/0', 'p/1'],
    );
    const branches = kept.filter((t) => t.id.includes('/b'));
    assert.equal(branches.length, 2);
    assert.ok(branches.some((t) => t.id === 'p/0/b1'));
    // The failed call lies before the branch point: a branch's own part made no call (penalty 0.5,
    // the release's "no tool response"), not the 1.0 of its prefix's error.
    for (const t of branches) assert.equal(t.penalty.tool_error, 0.5);
  });

  it('streams a branch group once its siblings are in (group size from the record)', async () => {
    const recs = tree();
    // --group-size 2: the problem group and the branch group (min(3, 2) after a --keep 2 upstream)
    const r = await rstar(['advantage', '--group-size', '2'], ndjson([recs[0], recs[1], recs[2], recs[3]]));
    assert.equal(r.code, 0, r.stderr);
    assert.equal(lines(r.stdout).length, 4);
    const bad = await rstar(['advantage', '--group-size', '2'], ndjson(recs));
    assert.notEqual(bad.code, 0);
    assert.match(
      bad.stderr,
      /stdin:5: branch: branch group 'p\/0@4' already had its 2 records \(min of branch.of 3/,
    );
  });
});
