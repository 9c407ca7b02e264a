// Catches: the SGLang client dropping or altering temperature, top_p or the per-request seed, seeds not
// derived per trajectory and turn (docs/rollout.md `--seed`), and reruns with one seed that do not repeat.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Trajectory, type Trajectory as TrajectoryRecord } from '../../src/records/trajectory.js';
import { loadTokenizer } from '../../src/rollout/tokenizer.js';
import { requestSeed } from '../../src/rollout/turns.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { ANSWER, CALL, problems, TINY } from '../support/agent-fixtures.js';
import { type FakeStats, startFakeSglang } from '../support/fake-sglang.js';
import { lines, ndjson, rstar } from '../support/helpers.js';

const WRONG = 'So x = 4.</reason>\n<answer>\\boxed{4}</answer>';

describe('sampling parameters and seeded reruns (rollout against a seed-driven SGLang fake)', () => {
  let dir: string;
  let file: string;
  let sandbox: { url: string; close(): Promise<void> };
  let decode: (ids: number[]) => string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-sampling-'));
    file = join(dir, 'problems.jsonl');
    writeFileSync(file, ndjson(problems(3)));
    const tk = await loadTokenizer(TINY);
    decode = (ids) => tk.decode(ids);
    sandbox = await startSandbox({ workers: 1 });
  });
  after(async () => {
    await sandbox.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** One rollout on a fresh fake whose replies follow each request's sampling_seed. */
  async function rollout(
    seed: number,
  ): Promise<{ trajectories: TrajectoryRecord[]; requests: FakeStats['generated'] }> {
    const engine = await startFakeSglang({
      tokenizer: TINY,
      capacity: 100_000,
      turns: [ANSWER],
      seeded: [{ match: 'Solve 2x = 6', replies: [CALL, ANSWER, WRONG] }],
    });
    try {
      const args = ['rollout', '--problems', file, '--engine', engine.url, '--sandbox', sandbox.url];
      args.push(
        '--tokenizer',
        TINY,
        '--n',
        '3',
        '--temperature',
        '0.7',
        '--top-p',
        '0.9',
        '--seed',
        String(seed),
      );
      const r = await rstar(args);
      assert.equal(r.code, 0, r.stderr);
      const trajectories = lines(r.stdout)
        .map((x) => Trajectory.parse(x))
        .sort((a, b) => a.id.localeCompare(b.id));
      return { trajectories, requests: (await engine.stats()).generated };
    } finally {
      await engine.close();
    }
  }

  /** What a rerun must repeat: requests in a fixed order, the tool's measured time masked (it is wall time). */
  const requestStream = (requests: FakeStats['generated']) =>
    requests
      .map((q) =>
        JSON.stringify([decode(q.input_ids).replace(/execution time: [\d.]+s/g, 'T'), q.sampling_params]),
      )
      .sort();
  const trajectoryStream = (ts: TrajectoryRecord[]) =>
    ts.map((t) => {
      const model = t.response_ids.filter((_, i) => t.loss_mask[i] === 1);
      return JSON.stringify([t.id, t.turns, t.tool_calls, t.finish, t.answer, t.reward, model, t.logprobs]);
    });

  it('temperature, top_p and a seed per trajectory and turn reach the engine; a rerun repeats, another seed differs', async () => {
    const first = await rollout(11);
    assert.equal(first.trajectories.length, 9);
    assert.ok(first.requests.length > 9, 'some trajectories take several turns');
    for (const q of first.requests) {
      const p = q.sampling_params;
      assert.equal(p.temperature, 0.7, JSON.stringify(p));
      assert.equal(p.top_p, 0.9, JSON.stringify(p));
      assert.ok(Number.isInteger(p.sampling_seed), JSON.stringify(p));
      assert.equal(typeof p.max_new_tokens, 'number');
    }
    // Exactly the documented seeds: requestSeed(--seed, trajectory id, turn) for each turn taken.
    const want = first.trajectories.flatMap((t) =>
      Array.from({ length: t.turns }, (_, turn) => requestSeed(11, t.id, turn)),
    );
    const got = first.requests.map((q) => q.sampling_params.sampling_seed as number);
    assert.deepEqual([...got].sort(), [...want].sort());
    assert.equal(new Set(got).size, got.length, 'no two requests share a seed');
    assert.ok(
      first.trajectories.some((t) => t.turns > 1),
      'the seeds differ per turn, not only per trajectory',
    );

    const again = await rollout(11);
    assert.deepEqual(requestStream(again.requests), requestStream(first.requests));
    assert.deepEqual(trajectoryStream(again.trajectories), trajectoryStream(first.trajectories));

    const other = await rollout(12);
    const seeds = new Set(got);
    assert.ok(
      other.requests.every((q) => !seeds.has(q.sampling_params.sampling_seed as number)),
      'another --seed, other request seeds',
    );
    assert.notDeepEqual(trajectoryStream(other.trajectories), trajectoryStream(first.trajectories));
  });
});
