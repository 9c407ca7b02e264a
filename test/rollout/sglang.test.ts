import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Trajectory } from '../../src/records/trajectory.js';
import {
  loadProtocol,
  type ProtocolContext,
  promptIds,
  rollout,
  SglangClient,
  toolTurnIds,
} from '../../src/rollout/index.js';
import { startSandbox } from '../../src/sandbox/embedded.js';
import { ANSWER, CALL, collect, problems, TINY, toolCall } from '../support/agent-fixtures.js';
import { type FakeServer, fakeLogprob, startFakeSglang } from '../support/fake-sglang.js';
import { BIN, lines, ndjson, ROOT, rstar } from '../support/helpers.js';

describe('rstar rollout against a scripted SGLang server and the real sandbox', () => {
  let dir: string;
  let sandbox: { url: string; close(): Promise<void> };
  let ctx: ProtocolContext;
  const servers: FakeServer[] = [];
  const fake = async (o: Partial<Parameters<typeof startFakeSglang>[0]> = {}) => {
    const s = await startFakeSglang({ tokenizer: TINY, capacity: 100_000, turns: [CALL, ANSWER], ...o });
    servers.push(s);
    return s;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rstar-rollout-'));
    [sandbox, ctx] = await Promise.all([startSandbox({ workers: 2 }), loadProtocol(TINY)]);
  });
  after(async () => {
    await Promise.all(servers.map((s) => s.close()));
    await sandbox.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('produces token-level trajectories: prompt ids, masked tool turns, logprobs, reward', async () => {
    const engine = await fake({ modelPath: '/ckpt/step-7' });
    const file = join(dir, 'problems.jsonl');
    writeFileSync(file, ndjson(problems(2)));
    const r = await rstar([
      'rollout',
      '--problems',
      file,
      '--engine',
      engine.url,
      '--sandbox',
      sandbox.url,
      '--tokenizer',
      TINY,
      '--n',
      '2',
    ]);
    assert.equal(r.code, 0, r.stderr);
    const out = lines(r.stdout).map((x) => Trajectory.parse(x));
    assert.deepEqual(out.map((t) => t.id).sort(), ['p0/0', 'p0/1', 'p1/0', 'p1/1']);
    for (const t of out) {
      assert.deepEqual(t.prompt_ids, promptIds(problems(2)[Number(t.problem_id[1])].prompt, ctx));
      assert.equal(t.policy, '/ckpt/step-7');
      assert.equal(t.finish, 'stop');
      assert.equal(t.turns, 2);
      assert.equal(t.tool_calls, 1);
      assert.equal(t.tool_errors, 0);
      assert.equal(t.answer_tags, 1);
      assert.equal(t.answer, '3');
      assert.equal(t.reward, 1);
      const a0 = [...ctx.tokenizer.encode(CALL), ctx.eosId!];
      const a1 = [...ctx.tokenizer.encode(ANSWER), ctx.eosId!];
      const toolLen = t.response_ids.length - a0.length - a1.length;
      const toolIds = t.response_ids.slice(a0.length, a0.length + toolLen);
      assert.match(
        ctx.tokenizer.decode(toolIds),
        /^<\|im_start\|>user\n<tool_response>\nTool call success\nstdout: 3\n\nexecution time: \d+\.\d\ds\n<\/tool_response><\|im_end\|>\n<\|im_start\|>assistant\n<reason>$/,
      );
      const text = ctx.tokenizer.decode(toolIds).split('<tool_response>\n')[1].split('\n</tool_response>')[0];
      assert.deepEqual(toolIds, toolTurnIds([text], ctx), 'tool ids are the rendered tool turn');
      assert.deepEqual(t.response_ids, [...a0, ...toolIds, ...a1]);
      assert.deepEqual(t.loss_mask, [...a0.map(() => 1), ...toolIds.map(() => 0), ...a1.map(() => 1)]);
      assert.deepEqual(t.logprobs, [
        ...a0.map((id, i) => fakeLogprob(id, i)),
        ...toolIds.map(() => 0),
        ...a1.map((id, i) => fakeLogprob(id, i)),
      ]);
      assert.ok(t.timing && t.timing.tool_ms > 0);
    }
  });

  it("--tool-cache group: a problem's identical calls run once, code that may vary every time", async () => {
    const ran = async () => {
      const text = await (await fetch(`${sandbox.url}/metrics`)).text();
      return [...text.matchAll(/^rstar_sandbox_calls_total\{[^}]*\} (\d+)$/gm)].reduce(
        (a, m) => a + Number(m[1]),
        0,
      );
    };
    const engine = await fake({
      byPrompt: [
        { match: 'variant 1', turns: [toolCall('import random\nprint(random.randint(3, 3))'), ANSWER] },
      ],
    });
    const run = async (toolCache: 'off' | 'group') => {
      const before = await ran();
      const out = await collect(
        rollout(problems(3), {
          engines: [new SglangClient(engine.url)],
          sandbox: sandbox.url,
          protocol: ctx,
          n: 4,
          toolCache,
        }),
      );
      return { out, calls: (await ran()) - before };
    };
    const off = await run('off');
    const group = await run('group');
    assert.equal(off.calls, 12);
    // p0 and p2 share one run each; p1's program draws random numbers, so all four of its run.
    assert.equal(group.calls, 1 + 4 + 1);
    // The same trajectories but for each run's measured time; a shared result shows its run's.
    const texts = (r: typeof off) =>
      r.out.map((t) => [t.id, t.text.replace(/execution time: [\d.]+s/, 'T'), t.reward]).sort();
    assert.deepEqual(texts(group), texts(off));
    const p0 = new Set(group.out.filter((t) => t.problem_id === 'p0').map((t) => t.text));
    assert.equal(p0.size, 1);
  });

  it('answers a malformed tool call and stops cleanly at the token budget', async () => {
    const bad =
      '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"\n</tool_call>';
    const engine = await fake({ turns: [bad, CALL, ANSWER] });
    const [t] = await collect(
      rollout(problems(1), { engines: [new SglangClient(engine.url)], sandbox: sandbox.url, protocol: ctx }),
    );
    assert.equal(t.tool_calls, 2);
    assert.equal(t.tool_errors, 1);
    assert.equal(t.turns, 3);
    assert.match(
      t.text,
      /<tool_response>\nFailed to decode tool call: Expecting ',' delimiter: line 3 column 1 \(char \d+\)\n<\/tool_response>/,
    );

    // A budget that ends inside the second assistant turn: cut there, finish = length.
    const a0 = ctx.tokenizer.encode(bad).length + 1;
    const budget = a0 + 60;
    const [u] = await collect(
      rollout(problems(1), {
        engines: [new SglangClient(engine.url)],
        sandbox: sandbox.url,
        protocol: ctx,
        maxTokens: budget,
      }),
    );
    assert.ok(['length', 'tool_overflow'].includes(u.finish), u.finish);
    assert.ok(u.response_ids.length <= budget);
    assert.equal(u.loss_mask.length, u.response_ids.length);
    assert.equal(u.logprobs.length, u.response_ids.length);
    assert.equal(u.loss_mask.at(-1), 1, 'never ends on a tool turn');
    assert.equal(u.reward, 0);
  });

  it('gives two engines load in proportion to their KV budgets', async () => {
    const small = await fake({ capacity: 2200, baseMs: 120 });
    const large = await fake({ capacity: 6600, baseMs: 120 });
    const out = await collect(
      // 48 trajectories (96 turns): enough that a start-up transient (a slow first scrape on a
      // loaded machine) cannot decide the split on its own.
      rollout(problems(48), {
        engines: [new SglangClient(small.url), new SglangClient(large.url)],
        sandbox: sandbox.url,
        protocol: ctx,
        maxTokens: 600,
        scrapeMs: 100,
      }),
    );
    assert.equal(out.length, 48);
    const [s, l] = await Promise.all([small.stats(), large.stats()]);
    assert.equal(s.requests + l.requests, 96);
    const ratio = l.requests / s.requests;
    assert.ok(ratio > 2 && ratio < 4.5, `large/small = ${l.requests}/${s.requests}`);
    assert.ok(s.maxUsed <= 2200 && l.maxUsed <= 6600, 'no engine was asked for more KV than it has');
  });

  it('survives an engine killed mid-run: every trajectory exactly once, none lost', async () => {
    const a = await fake({ baseMs: 400 });
    const b = await fake({ baseMs: 400 });
    setTimeout(() => void a.kill(), 600);
    const out = await collect(
      rollout(problems(10), {
        engines: [
          new SglangClient(a.url, { probeTimeoutMs: 500 }),
          new SglangClient(b.url, { probeTimeoutMs: 500 }),
        ],
        sandbox: sandbox.url,
        protocol: ctx,
        n: 2,
        scrapeMs: 200,
      }),
    );
    assert.equal((await a.exited).signal, 'SIGKILL');
    const ids = out.map((t) => t.id).sort();
    assert.equal(new Set(ids).size, 20);
    assert.equal(ids.length, 20);
    for (const t of out) {
      assert.equal(t.finish, 'stop');
      assert.equal(t.turns, 2);
      assert.equal(t.reward, 1);
    }
  });

  it('--prior: earlier trajectories set the start order over the whole batch', async () => {
    // p2 runs long: its first turn says much more before calling the tool.
    const long = `${'Let me think about this carefully. '.repeat(12)}${CALL}`;
    const engine = await fake({ byPrompt: [{ match: 'variant 2', turns: [long, ANSWER] }] });
    const file = join(dir, 'prior-problems.jsonl');
    writeFileSync(file, ndjson(problems(4)));
    const args = ['rollout', '--problems', file, '--engine', engine.url, '--sandbox', sandbox.url];
    args.push('--tokenizer', TINY, '--n', '2', '--concurrency', '1');
    // One trajectory under way at a time, so the output order is the start order.
    const earlier = await rstar(args);
    assert.equal(earlier.code, 0, earlier.stderr);
    const probed = lines<{ id: string }>(earlier.stdout).map((t) => t.id);
    assert.deepEqual(probed.slice(0, 4), ['p0/0', 'p1/0', 'p2/0', 'p3/0'], 'without a prior: one probe each');
    const prior = join(dir, 'prior.jsonl');
    writeFileSync(prior, earlier.stdout);
    const r = await rstar([...args, '--prior', prior]);
    assert.equal(r.code, 0, r.stderr);
    const ids = lines<{ id: string }>(r.stdout).map((t) => t.id);
    assert.deepEqual(ids.slice(0, 2), ['p2/0', 'p2/1'], 'the problem that ran longest starts first');
    assert.equal(new Set(ids).size, 8);
    // A bad prior file is named with its line.
    writeFileSync(prior, `${earlier.stdout.split('\n')[0]}\n{"v": 1}\n`);
    const bad = await rstar([...args, '--prior', prior]);
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr, /prior\.jsonl:2/);
  });

  it('resumes a killed run without redoing or duplicating finished trajectories', async () => {
    const engine = await fake({ baseMs: 150 });
    const file = join(dir, 'resume-problems.jsonl');
    const out = join(dir, 'resume-out.jsonl');
    writeFileSync(file, ndjson(problems(6)));
    const args = ['rollout', '--problems', file, '--engine', engine.url, '--sandbox', sandbox.url];
    args.push('--tokenizer', TINY, '--n', '2', '--out', out, '--concurrency', '2');
    const child = spawn(process.execPath, [BIN, ...args], { cwd: ROOT, stdio: 'ignore' });
    const exited = new Promise((r) => child.once('exit', r));
    for (let i = 0; i < 400; i++) {
      await new Promise((r) => setTimeout(r, 50));
      const text = readFileSync(out, { encoding: 'utf8', flag: 'a+' });
      if (text.split('\n').length > 4) break;
    }
    child.kill('SIGKILL');
    await exited;
    const first = lines(readFileSync(out, 'utf8').split('\n').slice(0, -1).join('\n'));
    assert.ok(first.length >= 3 && first.length < 12, `killed after ${first.length}`);
    const before = (await engine.stats()).requests;

    const r = await rstar(args);
    assert.equal(r.code, 0, r.stderr);
    const all = lines<{ id: string }>(readFileSync(out, 'utf8'));
    assert.equal(all.length, 12);
    assert.equal(new Set(all.map((t) => t.id)).size, 12);
    assert.deepEqual(
      all.slice(0, first.length).map((t) => t.id),
      first.map((t) => t.id),
    );
    const redone = (await engine.stats()).requests - before;
    assert.ok(redone <= 2 * (12 - first.length), `resume sent ${redone} requests`);
  });

  it('reloads weights on every engine and labels trajectories with the checkpoint', async () => {
    const a = await fake();
    const b = await fake();
    const file = join(dir, 'reload-problems.jsonl');
    writeFileSync(file, ndjson(problems(1)));
    const r = await rstar([
      'rollout',
      '--reload',
      '/ckpt/step-9',
      '--problems',
      file,
      '--engine',
      a.url,
      '--engine',
      b.url,
      '--sandbox',
      sandbox.url,
      '--tokenizer',
      TINY,
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual((await a.stats()).reloads, ['/ckpt/step-9']);
    assert.deepEqual((await b.stats()).reloads, ['/ckpt/step-9']);
    assert.equal(lines<{ policy: string }>(r.stdout)[0].policy, '/ckpt/step-9');
  });

  it('keeps the token-level protocol with the real Qwen3 tokenizer', async () => {
    const q = await loadProtocol('qwen3');
    const engine = await fake({ tokenizer: 'qwen3' });
    const [t] = await collect(
      rollout([{ v: 1, id: 'q', prompt: 'Solve 2x = 6 — “x”?', answer: '3', kind: 'math' }], {
        engines: [new SglangClient(engine.url)],
        sandbox: sandbox.url,
        protocol: q,
      }),
    );
    assert.deepEqual(
      t.prompt_ids,
      q.tokenizer.encode(
        q.template.render([{ role: 'user', content: 'Solve 2x = 6 — “x”?' }], {
          tools: [...q.tools],
          addGenerationPrompt: true,
        }),
      ),
    );
    const a0 = [...q.tokenizer.encode(CALL), q.eosId!];
    assert.deepEqual(t.response_ids.slice(0, a0.length), a0);
    assert.ok(
      q.tokenizer
        .decode(t.response_ids.slice(a0.length))
        .startsWith('<|im_start|>user\n<tool_response>\nTool call success\nstdout: 3\n'),
    );
    assert.equal(t.reward, 1);
  });

  it('rejects bad usage with exit 2', async () => {
    const r = await rstar(['rollout', '--problems', 'x.jsonl', '--engine', 'http://127.0.0.1:1']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--tokenizer/);
    const s = await rstar(['rollout', '--schedule', 'magic']);
    assert.equal(s.code, 2);
    assert.match(s.stderr, /is not one of kv, least-requests, round-robin, static/);
    const loop = ['rollout', '--problems', 'x.jsonl', '--tokenizer', 'tok', '--engine', 'http://127.0.0.1:1'];
    const alone = await rstar([...loop, '--oversample']);
    assert.equal(alone.code, 2);
    assert.match(alone.stderr, /--oversample.*belong to the RL loop/);
    const undynamic = await rstar([...loop, '--steps', '2', '--batch', '4', '--oversample']);
    assert.equal(undynamic.code, 2);
    assert.match(
      undynamic.stderr,
      /--oversample samples ahead of dynamic sampling: give --dynamic-sampling X > 1/,
    );
    const refill = await rstar([...loop, '--steps', '2', '--batch', '4', '--refill', 'eager']);
    assert.equal(refill.code, 2);
    assert.match(refill.stderr, /--refill: .* is not one of rounds, streaming/);
  });
});
