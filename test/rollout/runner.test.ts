/** The rollout runner's parts on their own: options, admission, engine health, outcomes, records. */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { Command } from 'commander';
import type { Problem } from '../../src/records/problem.js';
import { expandJobs, type Turn } from '../../src/rollout/admission.js';
import type { AgentResult } from '../../src/rollout/agent.js';
import { EngineHealth } from '../../src/rollout/engine-health.js';
import { type EngineClient, EngineError } from '../../src/rollout/engines.js';
import {
  EVAL_SAMPLES,
  POLICIES,
  progressLine,
  ROLLOUT_DEFAULTS,
  runnerOptions,
  sharedRolloutOptions,
} from '../../src/rollout/options.js';
import { ErrorBudget, Outcomes } from '../../src/rollout/outcomes.js';
import { scoreTrajectory, trajectoryRecord } from '../../src/rollout/record.js';
import { dropStepsFrom } from '../../src/rollout/resume.js';
import { AsyncScheduler, Scheduler } from '../../src/rollout/scheduler.js';

const problem = (id: string, answer = '42'): Problem => ({
  v: 1,
  id,
  prompt: `What is ${id}?`,
  answer,
  kind: 'math',
});

function parsed(samples: number, argv: string[] = []) {
  const cmd = new Command().exitOverride().configureOutput({ outputError: () => {} });
  for (const o of [...sharedRolloutOptions(samples), ...runnerOptions()]) cmd.addOption(o);
  cmd.parse(argv, { from: 'user' });
  return cmd.opts();
}

describe('rollout options', () => {
  it('declare the defaults the library applies', () => {
    const o = parsed(ROLLOUT_DEFAULTS.n);
    assert.deepEqual(o.engine, []);
    for (const key of [
      'engineKind',
      'chatTemplate',
      'n',
      'maxTurns',
      'maxTokens',
      'temperature',
      'topP',
      'maxInvalidCalls',
      'maxErrorShare',
      'schedule',
      'compat',
      'toolCache',
      'maxParallelCalls',
      'toolResponseMaxChars',
      'concurrency',
      'scrapeMs',
    ] as const) {
      assert.equal(o[key], ROLLOUT_DEFAULTS[key], key);
    }
    assert.equal(o.engineTimeout, ROLLOUT_DEFAULTS.timeoutSeconds);
    assert.equal(parsed(EVAL_SAMPLES).n, 16);
  });

  it('validate enum flags by their choices and numbers by their range', () => {
    assert.equal(parsed(1, ['--schedule', 'static']).schedule, 'static');
    assert.deepEqual(parsed(1, ['--engine', 'a', '--engine', 'b']).engine, ['a', 'b']);
    assert.throws(() => parsed(1, ['--schedule', 'magic']), /magic is not one of kv, least-requests/);
    assert.throws(() => parsed(1, ['--engine-kind', 'tgi']), /tgi is not one of sglang, vllm/);
    assert.throws(() => parsed(1, ['--compat', 'loose']), /loose is not one of strict, rstar/);
    assert.throws(() => parsed(1, ['--top-p', '1.5']), /1.5 is not a number in \[0, 1\]/);
    assert.throws(() => parsed(1, ['--n', '0']), /0 is not an integer >= 1/);
    assert.deepEqual([...POLICIES], ['kv', 'least-requests', 'round-robin', 'static']);
  });

  it('draw one progress line: done, tokens/s, tool calls/s, turns in flight per engine', () => {
    const line = progressLine({
      done: 3,
      total: 8,
      tokens: 5000,
      toolCalls: 5,
      elapsedMs: 2000,
      engines: [
        { url: 'a', alive: true, inflight: 4, free: 10, dispatched: 9 },
        { url: 'b', alive: false, inflight: 0, free: 0, dispatched: 2 },
      ],
    });
    assert.equal(line, '\r3/8 trajectories  2500 tok/s  2.5 calls/s  e0:4 e1:down\x1b[K');
  });
});

describe('rollout runner parts', () => {
  it('expands n samples per problem in submission order, skipping resumed ids', () => {
    const jobs = expandJobs([problem('a'), problem('b')], 2, new Set(['a/1']));
    assert.deepEqual(
      jobs.map((j) => [j.id, j.group, j.sample]),
      [
        ['a/0', 0, 0],
        ['b/0', 1, 0],
        ['b/1', 1, 1],
      ],
    );
  });

  it('hands out finished trajectories before the failure, and ends on failure or stop', async () => {
    const out = new Outcomes<number>();
    assert.equal(out.ended, false);
    const waiting = out.next();
    out.push(1);
    assert.equal(await waiting, 1);
    out.push(2);
    out.fail(new Error('boom'));
    out.fail(new Error('second'));
    assert.equal(out.ended, true);
    assert.equal(await out.next(), 2);
    await assert.rejects(out.next(), /boom/);
    const stopped = new Outcomes<number>();
    stopped.stop();
    assert.equal(stopped.ended, true);
  });

  it('fails once more than maxErrorShare of the trajectories ended with an error', () => {
    const budget = new ErrorBudget(10, 0.1);
    const failed = { finish: 'error', error: { kind: 'engine', message: 'e0 down' } } as never;
    budget.count({ finish: 'stop' } as never);
    budget.count(failed);
    assert.throws(
      () => budget.count(failed),
      /2 of 10 trajectories failed .* more than --max-error-share 0\.1 \(first: e0 down\)/,
    );
  });

  it('sets a failing engine aside, never the last one alive, and probes it back', async () => {
    let answers = false;
    const engine = (url: string) =>
      ({
        url,
        capacity: async () => {
          if (!answers) throw new Error('down');
          return { total: 100, used: 0 };
        },
        abortInflight: () => 0,
      }) as unknown as EngineClient;
    const core = new Scheduler<Turn>([100, 100], { clock: () => 0 });
    let scrapes = 0;
    const health = new EngineHealth(
      [engine('a'), engine('b')],
      core,
      new AsyncScheduler(core),
      0,
      () => {
        scrapes++;
      },
      () => {},
    );
    health.start();
    health.setAside(0);
    health.setAside(1); // the last one alive stays
    assert.deepEqual(
      core.stats().map((s) => s.alive),
      [false, true],
    );
    answers = true;
    await new Promise((resolve) => setTimeout(resolve, 700));
    health.stop();
    assert.ok(scrapes >= 1);
    assert.deepEqual(
      core.stats().map((s) => s.alive),
      [true, true],
    );
  });

  it('sets an engine that stops answering its probe aside at once, aborts its turns, says why, takes it back', async () => {
    const down = new Set<string>();
    let notFound = false;
    const aborted: string[] = [];
    const engine = (url: string) =>
      ({
        url,
        capacity: async () => {
          if (down.has(url)) throw new EngineError(`${url}: GET /metrics timed out after 5 s`);
          if (notFound) throw new EngineError(`${url}: GET /metrics: HTTP 404: not found`, false);
          return { total: 100, used: 0 };
        },
        abortInflight: (reason: string) => {
          aborted.push(`${url} ${reason}`);
          return 2;
        },
      }) as unknown as EngineClient;
    const core = new Scheduler<Turn>([100, 100], { clock: () => 0 });
    const log: string[] = [];
    const health = new EngineHealth(
      [engine('a'), engine('b')],
      core,
      new AsyncScheduler(core),
      20,
      () => {},
      (line) => log.push(line),
    );
    const alive = () => core.stats().map((x) => x.alive);
    const settle = () => new Promise((resolve) => setTimeout(resolve, 150));
    health.start();
    try {
      down.add('a');
      await settle();
      assert.deepEqual(alive(), [false, true]);
      // Probed on and on, but set aside, aborted and reported once.
      assert.deepEqual(aborted, [
        'a engine set aside: it stopped answering (GET /metrics timed out after 5 s)',
      ]);
      assert.deepEqual(log, [
        'rollout: engine a stopped answering (GET /metrics timed out after 5 s): set aside, 2 turn(s) in flight go to the other engines; it rejoins when it answers again',
      ]);
      // The last engine alive is only reported: its turns have nowhere else to go.
      down.add('b');
      await settle();
      assert.deepEqual(alive(), [false, true]);
      assert.equal(aborted.length, 1);
      assert.match(
        log[1],
        /^rollout: engine b stopped answering \(GET \/metrics timed out after 5 s\); it is the only engine left/,
      );
      down.clear();
      await settle();
      assert.deepEqual(alive(), [true, true]);
      assert.deepEqual(log.slice(2).sort(), [
        'rollout: engine a answers again: back in the rotation',
        'rollout: engine b answers again: back in the rotation',
      ]);
      // A 4xx is an answer: the engine is up, it only does not say its capacity.
      notFound = true;
      await settle();
      assert.deepEqual(alive(), [true, true]);
      assert.equal(log.length, 4);
    } finally {
      health.stop();
    }
  });

  it('drops the step-stats lines of the steps a resumed run redoes, atomically, keeping the rest', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-steps-'));
    try {
      const file = join(dir, 'rollout-steps.jsonl');
      const line = (k: number) => `{"v":1,"end_batch":true,"step":${k},"stats":{"mean_reward":0.${k}}}\n`;
      assert.equal(dropStepsFrom(file, 3), 0, 'no file: nothing to do');
      assert.equal(existsSync(file), false);
      // Steps 1-3 written, then a kill while step 4's line was being appended.
      writeFileSync(file, `${line(1)}${line(2)}${line(3)}{"v":1,"end_b`);
      assert.equal(dropStepsFrom(file, 3), 2);
      assert.equal(readFileSync(file, 'utf8'), `${line(1)}${line(2)}`);
      assert.deepEqual(readdirSync(dir), ['rollout-steps.jsonl'], 'no temp file left');
      assert.equal(dropStepsFrom(file, 3), 0);
      assert.equal(readFileSync(file, 'utf8'), `${line(1)}${line(2)}`);
      writeFileSync(file, `${line(1)}not json\n`);
      assert.throws(() => dropStepsFrom(file, 2), /rollout-steps\.jsonl:2: invalid JSON/);
      writeFileSync(file, `${line(1)}{"v":1}\n`);
      assert.throws(() => dropStepsFrom(file, 2), /rollout-steps\.jsonl:2: step: expected an integer/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('scores by the record contract and assembles the Trajectory record', () => {
    const r: AgentResult = {
      prompt_ids: [1],
      response_ids: [2, 3],
      loss_mask: [1, 1],
      logprobs: [-0.5, -0.25],
      text: 'so \\boxed{42}',
      turns: 1,
      tool_calls: 0,
      tool_errors: 0,
      answer_tags: 0,
      finish: 'stop',
      timing: { generate_ms: 10, tool_ms: 2.4 },
    };
    const p = problem('a');
    assert.deepEqual(scoreTrajectory(p, r, {}), { answer: '42', reward: 1 });
    // A truncated trajectory keeps its answer but not its reward, unless rewardTruncated.
    assert.deepEqual(scoreTrajectory(p, { ...r, finish: 'length' }, {}), { answer: '42', reward: 0 });
    assert.equal(scoreTrajectory(p, { ...r, finish: 'length' }, { rewardTruncated: true }).reward, 1);
    const [job] = expandJobs([p], 1);
    const t = trajectoryRecord(
      job,
      'ckpt',
      r,
      { answer: '42', reward: 1 },
      { queuedMs: 1.6, generateMs: 8.2 },
    );
    assert.equal(t.id, 'a/0');
    assert.equal(t.policy, 'ckpt');
    assert.deepEqual(t.timing, { queued_ms: 2, generate_ms: 8, tool_ms: 2 });
    assert.equal('error' in t, false);
  });
});
