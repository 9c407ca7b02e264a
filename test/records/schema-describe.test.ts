import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { RECORDS } from '../../src/records/index.js';
import { rstar } from '../support/helpers.js';

describe('rstar schema: fields explain themselves', () => {
  test('every top-level field of every record but doctor (a probe report) carries a description', async () => {
    for (const name of Object.keys(RECORDS).filter((n) => n !== 'doctor')) {
      const r = await rstar(['schema', name]);
      assert.equal(r.code, 0, r.stderr);
      const { properties } = JSON.parse(r.stdout) as { properties: Record<string, { description?: string }> };
      const bare = Object.entries(properties)
        .filter(([, p]) => !p.description)
        .map(([k]) => k);
      assert.deepEqual(bare, [], `${name}: fields without a description`);
    }
    const trajectory = JSON.parse((await rstar(['schema', 'trajectory'])).stdout);
    assert.match(trajectory.properties.answer_tags.description, /<answer> blocks/);
    assert.match(trajectory.properties.policy_version.description, /weight_version/);
  });
});
