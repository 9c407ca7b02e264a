import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { cleanEnv, lines, ROOT } from '../support/helpers.js';

/** Runs the recipe in its quick CI mode: the whole loop (data, init, resident SFT, eval) on tiny sizes. */
function recipe(out: string, env: Record<string, string> = {}): Promise<{ code: number; log: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', [`${ROOT}recipes/sft.sh`, out], {
      cwd: ROOT,
      env: cleanEnv({ RSTAR_SFT_QUICK: '1', ...env }),
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let log = '';
    child.stdout.setEncoding('utf8').on('data', (d) => {
      log += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d) => {
      log += d;
    });
    // Never leave the engine or sandbox behind if the recipe hangs.
    const timer = setTimeout(() => process.kill(-(child.pid as number), 'SIGTERM'), 300_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? 1, log });
    });
  });
}

describe('recipes/sft.sh', () => {
  it('runs end to end in quick CI mode: metrics per step, held-out eval greedy and sampled, or none', async () => {
    const out = mkdtempSync(join(tmpdir(), 'rstar-sft-recipe-'));
    try {
      const { code, log } = await recipe(out);
      assert.equal(code, 0, log.slice(-3000));
      const metrics = lines<Record<string, number>>(readFileSync(join(out, 'metrics.jsonl'), 'utf8'));
      assert.equal(metrics.length, 3);
      metrics.forEach((m, i) => {
        assert.equal(m.step, i + 1);
        assert.ok(Number.isFinite(m.loss) && m.loss > 0);
        assert.ok(m.tokens_per_s > 0);
        assert.ok(m.elapsed > 0);
      });
      const evals = lines<Record<string, unknown>>(readFileSync(join(out, 'eval.jsonl'), 'utf8'));
      assert.deepEqual(
        evals.map((e) => e.name),
        ['greedy', 'sampled'],
      );
      for (const e of evals) {
        assert.equal(e.trajectories, 4);
        for (const key of ['format_valid', 'tool_success', 'accuracy']) {
          const v = e[key] as number;
          assert.ok(v >= 0 && v <= 1, `${key} ${v}`);
        }
      }
      const config = JSON.parse(readFileSync(join(out, 'ckpt', 'config.json'), 'utf8'));
      assert.equal(config.vocab_size, 4096);

      // RSTAR_SFT_EVAL=0 (the main job's setting: it evaluates the checkpoint itself) trains the same
      // way and leaves no evaluation behind, not even the earlier run's; the evaluation is no
      // setting of what OUT holds, so the same folder is reused (its data: no sft-data run)
      const skipped = await recipe(out, { RSTAR_SFT_EVAL: '0' });
      assert.equal(skipped.code, 0, skipped.log.slice(-3000));
      assert.equal(lines(readFileSync(join(out, 'metrics.jsonl'), 'utf8')).length, 3);
      assert.ok(existsSync(join(out, 'ckpt', 'config.json')));
      assert.equal(existsSync(join(out, 'eval.jsonl')), false);
      assert.doesNotMatch(skipped.log, /rollout greedy|rollout sampled|sft-data --synthetic/);
      assert.match(skipped.log, /no evaluation: RSTAR_SFT_EVAL=0/);

      // another training set size would reuse OUT/data made with 48: refused before anything runs
      const other = await recipe(out, { RSTAR_SFT_TRAIN: '40' });
      assert.equal(other.code, 1, other.log);
      assert.match(other.log, /RSTAR_SFT_TRAIN: '48' there; '40' now/);
      assert.doesNotMatch(other.log, /sft-data|model-init/);

      // the default curriculum's family weights are a setting of OUT's data: recorded, and a run
      // that asks for uniform families is refused (its data would be another draw)
      assert.match(
        readFileSync(join(out, 'manifest.txt'), 'utf8'),
        /^RSTAR_SFT_FAMILY_WEIGHTS=inspect=2,search=2,recover=2$/m,
      );
      const uniform = await recipe(out, { RSTAR_SFT_FAMILY_WEIGHTS: 'uniform' });
      assert.equal(uniform.code, 1, uniform.log);
      assert.match(
        uniform.log,
        /RSTAR_SFT_FAMILY_WEIGHTS: 'inspect=2,search=2,recover=2' there; not a setting now/,
      );
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
