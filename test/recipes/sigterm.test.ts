// Catches: a recipe that, sent SIGTERM on its own pid (a supervisor's `kill PID`, not Ctrl-C's
// signal to the whole process group), waits for its foreground step to end (bash runs a trap only
// once the foreground child has exited) or leaves that step, a nested recipe or their Python
// processes running after it exits; and tests that run recipes and commands in the caller's
// environment (a user's exported RSTAR_* settings).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { cleanEnv, ROOT, rstar } from '../support/helpers.js';
import { groupMembers, killGroup, spawnGroup } from '../support/process-group.js';

test('SIGTERM to a recipe’s own pid during a nested step stops it at once, and everything under it', {
  timeout: 240_000,
}, async () => {
  const out = mkdtempSync(join(tmpdir(), 'rstar-sigterm-'));
  // demo.sh runs sft.sh, which runs `rstar sft-train` and its Python trainer: three levels under it.
  const run = spawnGroup('bash', ['recipes/demo.sh', out], {
    cwd: ROOT,
    env: cleanEnv({ RSTAR_SFT_QUICK: '1', RSTAR_SFT_SECONDS: '120', RSTAR_SFT_MAX_STEPS: '1000' }),
  });
  const { group } = run;
  try {
    const end = Date.now() + 180_000;
    // The trainer's Python processes are up: the step the SIGTERM must not wait for.
    while (!groupMembers(group).some((p) => /run\.py train/.test(p.cmd))) {
      assert.ok(Date.now() < end && run.child.exitCode === null, `sft-train never started:\n${run.log}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.match(run.log, /== sft-train/);
    const running = groupMembers(group).map((p) => p.cmd);
    process.kill(group, 'SIGTERM'); // the recipe's pid alone
    const sent = performance.now();
    const code = await run.exit;
    const seconds = (performance.now() - sent) / 1000;
    assert.equal(code, 130, run.log);
    assert.ok(
      seconds < 2.5,
      `exited ${seconds.toFixed(1)} s after SIGTERM (running: ${running.join(' | ')})`,
    );
    const lines = run.log.split('\n').filter((l) => /interrupted/.test(l));
    assert.deepEqual(lines.length, 1, run.log);
    assert.match(lines[0], /^\[\d\d:\d\d:\d\d\] interrupted; rerun to resume \(no RL step finished yet\)$/);
    assert.deepEqual(groupMembers(group), [], 'nothing of the recipe left running');
  } finally {
    killGroup(group);
    rmSync(out, { recursive: true, force: true });
  }
});

test('SIGTERM to a recipe’s own pid stops a pipeline it runs in a function, members included', async () => {
  // rl.sh's shape: the pipeline's members are children of a subshell, which a SIGTERM kills alone.
  const dir = mkdtempSync(join(tmpdir(), 'rstar-sigterm-pipe-'));
  const script = join(dir, 'recipe.sh');
  writeFileSync(
    script,
    `set -euo pipefail
cd ${JSON.stringify(ROOT)}
source recipes/lib.sh
hint() { echo "resume"; }
trap_interrupts hint
trained() { sleep 61 | sleep 62 | cat; }
echo started >${JSON.stringify(join(dir, 'started'))}
if ! child trained; then die "the pipeline failed"; fi
`,
  );
  const run = spawnGroup('bash', [script], { env: cleanEnv() });
  const { group } = run;
  try {
    const end = Date.now() + 30_000;
    while (!groupMembers(group).some((p) => p.cmd === 'sleep 62')) {
      assert.ok(Date.now() < end, `the pipeline never started:\n${run.log}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    process.kill(group, 'SIGTERM');
    const sent = performance.now();
    assert.equal(await run.exit, 130, run.log);
    assert.ok(performance.now() - sent < 2000);
    assert.match(run.log, /^\[\d\d:\d\d:\d\d\] interrupted; rerun to resume\n$/);
    assert.deepEqual(groupMembers(group), [], 'no member of the pipeline left running');
  } finally {
    killGroup(group);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('recipes and commands run in the environment the test sets, not the caller’s RSTAR_* settings', async () => {
  // What a user may have exported from an earlier run (README: RSTAR_FRESH=1 starts afresh).
  const leaked = {
    RSTAR_FRESH: '1',
    RSTAR_CHECK_ONLY: '1',
    RSTAR_DEMO_SEED: '13',
    RSTAR_DEBUG: '1',
    RSTAR_RECIPE_TOP: '1',
    EVAL_CI_N: '7',
  };
  const saved = Object.fromEntries(Object.keys(leaked).map((k) => [k, process.env[k]]));
  Object.assign(process.env, leaked);
  const dir = mkdtempSync(join(tmpdir(), 'rstar-env-'));
  try {
    const env = cleanEnv({ RSTAR_TEST_OWN: 'x' });
    assert.deepEqual(
      Object.keys(env).filter((k) => /^(RSTAR_|EVAL_CI_)/.test(k)),
      ['RSTAR_TEST_OWN'],
    );
    // A recipe's settings check: a folder made with other settings is refused, not deleted (the
    // caller's RSTAR_FRESH=1 would delete it).
    writeFileSync(join(dir, 'manifest.txt'), 'RSTAR_DEMO_SEED=0\n');
    writeFileSync(join(dir, 'ckpt'), 'old');
    const r = await new Promise<{ code: number | null; log: string }>((resolve) => {
      const c = spawn(
        'bash',
        [
          '-c',
          'source recipes/lib.sh; check_manifest "$1/manifest.txt" 1 "$1" RSTAR_DEMO_SEED=1',
          'check',
          dir,
        ],
        { cwd: ROOT, env: cleanEnv(), stdio: ['ignore', 'ignore', 'pipe'] },
      );
      let log = '';
      c.stderr.setEncoding('utf8').on('data', (d: string) => {
        log += d;
      });
      c.once('close', (code) => resolve({ code, log }));
    });
    assert.equal(r.code, 1, r.log);
    assert.match(r.log, /RSTAR_DEMO_SEED: '0' there; '1' now/);
    assert.equal(readFileSync(join(dir, 'ckpt'), 'utf8'), 'old');
    // A command: no stack trace (RSTAR_DEBUG) on a usage error.
    const cli = await rstar(['no-such-command']);
    assert.equal(cli.code, 2);
    assert.doesNotMatch(cli.stderr, /\n\s+at /);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    rmSync(dir, { recursive: true, force: true });
  }
});
