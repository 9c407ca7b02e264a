import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { rstar } from '../support/helpers.js';

describe('rstar schema: fields explain themselves', () => {
  test('every field of problem, trajectory and step carries a description', async () => {
    for (const name of ['problem', 'trajectory', 'step']) {
      const r = await rstar(['schema', name]);
      assert.equal(r.code, 0, r.stderr);
      const { properties } = JSON.parse(r.stdout) as { properties: Record<string, { description?: string }> };
      const bare = Object.entries(properties)
        .filter(([, p]) => !p.description)
        .map(([k]) => k);
      // step's optional diagnostics (updates, rollout_kl, ...) are documented in docs/backend.md
      const required = name === 'step' ? bare.filter((k) => !STEP_OPTIONAL.has(k)) : bare;
      assert.deepEqual(required, [], `${name}: fields without a description`);
    }
    const trajectory = JSON.parse((await rstar(['schema', 'trajectory'])).stdout);
    assert.match(trajectory.properties.answer_tags.description, /<answer> blocks/);
    assert.match(trajectory.properties.policy_version.description, /weight_version/);
  });
});

const STEP_OPTIONAL = new Set([
  'updates',
  'mini_batches',
  'epochs',
  'logprob_mismatch',
  'rollout_kl',
  'rollout_correction',
  'tis_capped_frac',
  'seq_masked_frac',
  'skipped',
]);
