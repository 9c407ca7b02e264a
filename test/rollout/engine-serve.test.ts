import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startEngine } from '../../src/backend/engine.js';
import { Trajectory } from '../../src/records/trajectory.js';
import { loadProtocol, promptIds } from '../../src/rollout/index.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { lines, ndjson, ROOT, rstar } from '../support/helpers.js';

const TINY = `${ROOT}fixtures/tiny`;

describe('rstar rollout end to end with engine-serve and the tiny model', () => {
  let dir: string;
  const closers: (() => Promise<void>)[] = [];
  let engines: string[];
  let sandbox: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-rollout-engine-'));
    const init = await rstar(['model-init', '--config', `${TINY}/config.json`, '--out', join(dir, 'model')]);
    assert.equal(init.code, 0, init.stderr);
    const started = await Promise.all([
      startEngine({ model: join(dir, 'model'), maxTotalTokens: 4096 }),
      startEngine({ model: join(dir, 'model'), maxTotalTokens: 2048 }),
      startSandbox({ workers: 1 }),
    ]);
    for (const s of started) closers.push(() => s.close());
    engines = [started[0].url, started[1].url];
    sandbox = started[2].url;
  });
  after(async () => {
    await Promise.all(closers.map((c) => c()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('samples token-in/token-out trajectories from two real engines', async () => {
    const problems = [
      { id: 'a', prompt: 'What is 1 + 1?', answer: '2' },
      { id: 'b', prompt: 'What is 2 + 3?', answer: '5' },
    ];
    const file = join(dir, 'problems.jsonl');
    writeFileSync(file, ndjson(problems));
    const args = ['rollout', '--problems', file, '--engine', engines[0], '--engine', engines[1]];
    args.push('--sandbox', sandbox, '--tokenizer', TINY, '--n', '2', '--max-tokens', '40', '--seed', '3');
    const r = await rstar(args);
    assert.equal(r.code, 0, r.stderr);
    const out = lines(r.stdout).map((x) => Trajectory.parse(x));
    assert.deepEqual(out.map((t) => t.id).sort(), ['a/0', 'a/1', 'b/0', 'b/1']);
    const ctx = await loadProtocol(TINY);
    for (const t of out) {
      const p = problems.find((x) => x.id === t.problem_id)!;
      assert.deepEqual(t.prompt_ids, promptIds(p.prompt, ctx));
      assert.equal(t.policy, join(dir, 'model'));
      assert.ok(t.response_ids.length > 0 && t.response_ids.length <= 40);
      assert.ok(t.response_ids.every((id) => id < 4096));
      for (const [i, m] of t.loss_mask.entries()) {
        if (m === 1)
          assert.ok(t.logprobs[i] < 0 && Number.isFinite(t.logprobs[i]), `logprob ${t.logprobs[i]}`);
        else assert.equal(t.logprobs[i], 0);
      }
      assert.equal(t.text, ctx.tokenizer.decode(t.response_ids));
      assert.ok(['stop', 'length', 'max_turns', 'tool_overflow'].includes(t.finish));
      if (t.finish === 'length') assert.equal(t.response_ids.length, 40);
    }
  });
});
