import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { cleanEnv, lines, ROOT } from '../support/helpers.js';

/** The smallest main job the recipe allows: 3-step SFT, 3 + 2 + 2 RL steps of 2 problems x 4 rollouts. */
const TINY: Record<string, string> = {
  RSTAR_DEMO_STAGES: '3 2 2',
  RSTAR_DEMO_TOKENS: '32 32 32',
  RSTAR_DEMO_PROBLEMS: '2',
  RSTAR_DEMO_KEEP: '2',
  RSTAR_DEMO_DYNAMIC: '1',
  RSTAR_DEMO_EVAL_N: '1',
  RSTAR_DEMO_CURVE_N: '1',
  RSTAR_DEMO_CURVE_EVERY: '2',
  RSTAR_DEMO_KEEP_CHECKPOINTS: '1',
};

/** Runs bash with `args`; the environment is `cleanEnv`'s plus `env` (a value '' unsets it). */
function run(args: string[], env: Record<string, string>): Promise<{ code: number; log: string }> {
  const full = cleanEnv(
    Object.fromEntries(Object.entries(env).map(([k, v]) => [k, v === '' ? undefined : v])),
  );
  return new Promise((resolve, reject) => {
    const child = spawn('bash', args, {
      cwd: ROOT,
      env: full,
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
    // never leave an engine or a sandbox behind if the recipe hangs
    const timer = setTimeout(() => process.kill(-(child.pid as number), 'SIGTERM'), 600_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? 1, log });
    });
  });
}

const recipe = (script: string, args: string[], env: Record<string, string>) =>
  run([`${ROOT}recipes/${script}`, ...args], env);

const stepFolders = (rl: string): number[] =>
  readdirSync(rl)
    .filter((n) => /^step-\d+$/.test(n))
    .map((n) => Number(n.slice(5)))
    .sort((a, b) => a - b);

describe('recipes/smoke.sh and demo.sh: a run folder is reused only by a run of the same settings', () => {
  let out: string;
  let first: { code: number; log: string };
  before(async () => {
    out = mkdtempSync(join(tmpdir(), 'rstar-demo-recipe-'));
    first = await recipe('smoke.sh', [out], TINY);
  });
  after(() => rmSync(out, { recursive: true, force: true }));

  it('runs the whole pipeline, says what it checked, keeps the last checkpoint and the evaluated ones', () => {
    assert.equal(first.code, 0, first.log.slice(-4000));
    assert.match(first.log, /smoke: the pipeline ran end to end: 7 RL steps checkpointed and served/);
    assert.match(readFileSync(join(out, 'manifest.txt'), 'utf8'), /^RSTAR_DEMO_STAGES=3 2 2$/m);
    assert.match(readFileSync(join(out, 'sft', 'manifest.txt'), 'utf8'), /^RSTAR_SFT_QUICK=1$/m);
    assert.ok(existsSync(join(out, 'compare.md')));
    const rl = join(out, 'rl');
    // step advantages and a reserved recovered positive are the main job's defaults: recorded, and
    // reaching every stage's advantage and roc-filter
    const manifest = readFileSync(join(out, 'manifest.txt'), 'utf8');
    assert.match(manifest, /^RSTAR_DEMO_STEP_WEIGHT=1$/m);
    assert.match(manifest, /^RSTAR_DEMO_RESERVE_RECOVERED=1$/m);
    for (const stage of [1, 4, 6]) {
      const own = readFileSync(join(rl, `manifest-stage-${stage}.txt`), 'utf8');
      assert.match(own, /^RSTAR_RL_STEP_WEIGHT=1$/m);
      assert.match(own, /^RSTAR_RL_RESERVE_RECOVERED=1$/m);
    }
    assert.deepEqual(
      lines<{ step: number }>(readFileSync(join(rl, 'steps.jsonl'), 'utf8')).map((s) => s.step),
      [1, 2, 3, 4, 5, 6, 7],
    );
    // --keep-checkpoints 1 --keep-every 2 (the curve's steps): step-5, where stage 3 started, stays
    // as train-step's --model; 1 and 3 are gone, after the curve evaluated step 3 as stage 1's end
    assert.deepEqual(stepFolders(rl), [2, 4, 5, 6, 7]);
    for (const name of ['sft', 'step2', 'stage1', 'step4', 'stage2', 'rl']) {
      assert.ok(existsSync(join(out, `eval-${name}`, 'report.json')), `eval-${name}`);
    }
  });

  it('resumes among pruned checkpoints: the finished stages return, stage 3 continues from its newest', async () => {
    assert.equal(first.code, 0);
    // as if killed before step 7's checkpoint
    rmSync(join(out, 'rl', 'step-7'), { recursive: true });
    rmSync(join(out, 'eval-rl'), { recursive: true });
    const again = await recipe('smoke.sh', [out], TINY);
    assert.equal(again.code, 0, again.log.slice(-4000));
    assert.match(again.log, /rl: every step up to 3 is done \(.*step-6\)/);
    assert.match(again.log, /rl: resuming after step 6/);
    assert.doesNotMatch(again.log, /SFT stage/);
    // step-5 was the first process's --model, not this one's: pruned now
    assert.deepEqual(stepFolders(join(out, 'rl')), [2, 4, 6, 7]);
    assert.ok(existsSync(join(out, 'eval-rl', 'report.json')));
  });

  it('refuses a rerun with other settings before anything runs, naming each setting', async () => {
    assert.equal(first.code, 0);
    const before = readdirSync(join(out, 'rl')).sort();
    const other = await recipe('demo.sh', [out], {
      ...TINY,
      RSTAR_SFT_QUICK: '1',
      RSTAR_DEMO_STAGES: '4 2 1',
    });
    assert.equal(other.code, 1, other.log);
    assert.match(other.log, /RSTAR_DEMO_STAGES: '3 2 2' there; '4 2 1' now/);
    assert.match(other.log, /RSTAR_FRESH=1 to delete/);
    assert.doesNotMatch(other.log, /SFT stage|engine-serve|RL stage/);
    assert.deepEqual(readdirSync(join(out, 'rl')).sort(), before);

    // the README's trap: the main job on the smoke run's folder would take its 3-step SFT checkpoint
    const full = await recipe('demo.sh', [out], { ...TINY, RSTAR_SFT_QUICK: '' });
    assert.equal(full.code, 1, full.log);
    assert.match(full.log, /RSTAR_SFT_QUICK: '1' there; '0' now/);
    assert.match(full.log, /RSTAR_SFT_TRAIN: '48' there; '5000' now/);
    assert.match(full.log, /demo: .*sft: made with other SFT settings/);

    // RSTAR_CHECK_ONLY=1 compares and never deletes, not even with RSTAR_FRESH=1
    const checked = await recipe('demo.sh', [out], {
      ...TINY,
      RSTAR_SFT_QUICK: '1',
      RSTAR_DEMO_SEED: '1',
      RSTAR_FRESH: '1',
      RSTAR_CHECK_ONLY: '1',
    });
    assert.equal(checked.code, 1, checked.log);
    assert.match(checked.log, /RSTAR_DEMO_SEED: '0' there; '1' now/);
    const same = await recipe('demo.sh', [out], { ...TINY, RSTAR_SFT_QUICK: '1', RSTAR_CHECK_ONLY: '1' });
    assert.equal(same.code, 0, same.log);
    assert.match(same.log, /demo: .*: settings match/);
    // a setting added later is recorded only away from its default: the run above (made without
    // RSTAR_DEMO_POSITIVES) matches its default spelled out, and is refused weighted positives
    const positives = (value: string) =>
      recipe('demo.sh', [out], {
        ...TINY,
        RSTAR_SFT_QUICK: '1',
        RSTAR_DEMO_POSITIVES: value,
        RSTAR_CHECK_ONLY: '1',
      });
    const spelled = await positives('sorted');
    assert.equal(spelled.code, 0, spelled.log);
    const weighted = await positives('weighted');
    assert.equal(weighted.code, 1, weighted.log);
    assert.match(weighted.log, /RSTAR_DEMO_POSITIVES: not recorded there; 'weighted' now/);
    const typo = await positives('best');
    assert.equal(typo.code, 1, typo.log);
    assert.match(typo.log, /RSTAR_DEMO_POSITIVES: expected sorted or weighted, got 'best'/);
    assert.deepEqual(readdirSync(join(out, 'rl')).sort(), before);
  });

  it('RSTAR_DEMO_LORA_RANK: every RL stage trains one adapter on the SFT checkpoint, each evaluated merged', async () => {
    assert.equal(first.code, 0);
    const lora = join(out, 'lora');
    // one-step-off (the main job's default) with one checkpoint kept: step 1's adapter folder is
    // pruned while requests for it still wait on the engine, which serves it from what it read
    const env = {
      ...TINY,
      RSTAR_SFT_QUICK: '1',
      RSTAR_DEMO_SFT: join(out, 'sft'),
      RSTAR_DEMO_LR: '1e-2',
    };
    const wrongKnob = await recipe('demo.sh', [lora], {
      ...env,
      RSTAR_RL_LORA_RANK: '4',
      RSTAR_CHECK_ONLY: '1',
    });
    assert.equal(wrongKnob.code, 1, wrongKnob.log);
    assert.match(wrongKnob.log, /the main job's LoRA settings are RSTAR_DEMO_LORA_RANK/);
    const run = await recipe('demo.sh', [lora], {
      ...env,
      RSTAR_DEMO_LORA_RANK: '4',
      RSTAR_DEMO_LORA_ALPHA: '8',
    });
    assert.equal(run.code, 0, run.log.slice(-4000));
    assert.match(
      readFileSync(join(lora, 'manifest.txt'), 'utf8'),
      /^RSTAR_DEMO_LORA_RANK=4\nRSTAR_DEMO_LORA_ALPHA=8$/m,
    );
    const rl = join(lora, 'rl');
    assert.deepEqual(
      lines<{ step: number; adapter?: boolean }>(readFileSync(join(rl, 'steps.jsonl'), 'utf8')).map((s) => [
        s.step,
        s.adapter,
      ]),
      [1, 2, 3, 4, 5, 6, 7].map((k) => [k, true]),
    );
    for (const k of stepFolders(rl)) {
      const config = JSON.parse(readFileSync(join(rl, `step-${k}`, 'adapter_config.json'), 'utf8'));
      assert.equal(
        config.base_model_name_or_path,
        join(out, 'sft', 'ckpt'),
        `step-${k} trains on the SFT checkpoint`,
      );
      assert.deepEqual([config.r, config.lora_alpha], [4, 8]);
      assert.ok(!existsSync(join(rl, `step-${k}`, 'model.safetensors')), `step-${k} is an adapter folder`);
    }
    // stage 2 went on from stage 1's last adapter, stage 3 from stage 2's
    assert.match(readFileSync(join(rl, 'manifest-stage-4.txt'), 'utf8'), /^RSTAR_RL_MODEL=.*\/rl\/step-3$/m);
    assert.match(readFileSync(join(rl, 'manifest-stage-6.txt'), 'utf8'), /^RSTAR_RL_MODEL=.*\/rl\/step-5$/m);
    for (const name of ['sft', 'step2', 'stage1', 'step4', 'stage2', 'rl']) {
      assert.ok(existsSync(join(lora, `eval-${name}`, 'report.json')), `eval-${name}`);
    }
    assert.deepEqual(
      readdirSync(lora).filter((n) => n.endsWith('.merged')),
      [],
      'the merged copies are gone once evaluated',
    );
    assert.ok(existsSync(join(lora, 'compare.md')));
  });

  it('recipes/heldout.sh: finished runs on a larger held-out set, a shared SFT checkpoint once, a LoRA step merged', async () => {
    assert.equal(first.code, 0);
    const lora = join(out, 'lora');
    const env = {
      RSTAR_HELDOUT_PROBLEMS: '3',
      RSTAR_HELDOUT_N: '1',
      RSTAR_HELDOUT_ENGINES: '1',
    };
    const notRun = await recipe('heldout.sh', [join(out, 'rl')], env);
    assert.equal(notRun.code, 1, notRun.log);
    assert.match(notRun.log, /rl\/manifest.txt: missing \(not a main-job run folder\)/);
    const res = await recipe('heldout.sh', [out, lora], env);
    assert.equal(res.code, 0, res.log.slice(-4000));
    const own = new Set(
      lines<{ prompt: string }>(readFileSync(join(out, 'sft', 'data', 'test-problems.jsonl'), 'utf8')).map(
        (p) => p.prompt,
      ),
    );
    const set = readFileSync(join(out, 'eval-ms-problems.jsonl'), 'utf8');
    const problems = lines<{ prompt: string; meta: { family: string; split: string } }>(set);
    assert.equal(problems.length, 3);
    for (const p of problems) {
      assert.ok(['inspect', 'search', 'recover'].includes(p.meta.family), p.meta.family);
      assert.equal(p.meta.split, 'test');
      assert.ok(!own.has(p.prompt), 'none of the run’s own held-out problems');
    }
    for (const run of [out, lora]) {
      assert.equal(readFileSync(join(run, 'eval-ms-problems.jsonl'), 'utf8'), set);
      for (const side of ['sft', 'rl']) {
        const report = JSON.parse(readFileSync(join(run, `eval-ms-${side}`, 'report.json'), 'utf8'));
        assert.equal(report.benchmarks[0].problems, 3, `${run} eval-ms-${side}`);
      }
    }
    // one SFT checkpoint, one evaluation; the LoRA run's step evaluated merged, the copy removed
    assert.equal(res.log.match(/== eval \S*\/sft\/ckpt /g)?.length, 1, res.log);
    assert.match(res.log, /== eval \S*\/merged on 3 held-out problems/);
    const seeds = spawnSync('node', [`${ROOT}dist/bench/seeds.js`, out, '--vs', lora, '--set', 'ms'], {
      encoding: 'utf8',
    });
    assert.equal(seeds.status, 0, seeds.stderr);
    assert.match(seeds.stdout, /\| \*\*mean B − A\*\* \|/);
    // finished evaluations are kept
    const again = await recipe('heldout.sh', [out], env);
    assert.equal(again.code, 0, again.log);
    assert.doesNotMatch(again.log, /== eval/);
    assert.match(again.log, /eval-ms-rl: done/);
  });

  it('RSTAR_FRESH=1 deletes a folder made with other settings and records the new ones; an unrecorded one is refused', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-manifest-'));
    try {
      // what a recipe runs at its top: recipes/lib.sh's check, on OUT = dir/run
      const check = (env: Record<string, string>, setting: string) =>
        run(
          [
            '-c',
            `source recipes/lib.sh; e=0; occupied "$1" && e=1; check_manifest "$1/manifest.txt" $e "$1" ${setting}`,
            'check',
            join(dir, 'run'),
          ],
          env,
        );
      assert.equal((await check({}, 'A=1')).code, 0);
      writeFileSync(join(dir, 'run', 'ckpt'), 'old');
      rmSync(join(dir, 'run', 'manifest.txt'));
      const unrecorded = await check({}, 'A=1');
      assert.equal(unrecorded.code, 1);
      assert.match(unrecorded.log, /no manifest\.txt: made by an earlier version of the recipe/);
      const fresh = await check({ RSTAR_FRESH: '1' }, 'A=2');
      assert.equal(fresh.code, 0, fresh.log);
      assert.equal(existsSync(join(dir, 'run', 'ckpt')), false);
      assert.equal(readFileSync(join(dir, 'run', 'manifest.txt'), 'utf8'), 'A=2\n');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('recipes/lib.sh sft_data: the data folder an SFT run was made from', () => {
  const dataOf = (sft: string) =>
    spawnSync('bash', ['-c', 'source recipes/lib.sh && sft_data "$1"', 'sft_data', sft], {
      cwd: ROOT,
      encoding: 'utf8',
      env: cleanEnv({}),
    });

  it('its own data/, or the folder RSTAR_SFT_DATA named; a folder without held-out problems is an error', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-sft-data-'));
    try {
      const own = join(dir, 'own');
      const shared = join(dir, 'shared');
      for (const d of [join(own, 'data'), shared, join(dir, 'reuses')]) mkdirSync(d, { recursive: true });
      writeFileSync(join(own, 'data', 'test-problems.jsonl'), '');
      writeFileSync(join(shared, 'test-problems.jsonl'), '');
      writeFileSync(join(own, 'manifest.txt'), 'RSTAR_SFT_SEED=0\nRSTAR_SFT_DATA=\n');
      writeFileSync(join(dir, 'reuses', 'manifest.txt'), `RSTAR_SFT_DATA=${shared}\n`);
      assert.equal(dataOf(own).stdout, join(own, 'data'));
      assert.equal(dataOf(join(dir, 'reuses')).stdout, shared);
      const none = dataOf(join(dir, 'nothing'));
      assert.equal(none.status, 1);
      assert.match(none.stderr, /nothing: its data folder .*nothing\/data has no test-problems.jsonl/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
