/**
 * A run folder in the main job's layout (recipes/demo.sh, rl.sh), made of records in the real
 * shapes, for the viewer's tests and its benchmark: `sft/data/*problems.jsonl`, `rl/` with
 * `manifest-stage-K.txt`, `steps.jsonl`, `rollout-steps.jsonl`, `curve.jsonl` and
 * `trajectories/step-K.jsonl`, and `eval-sft/`, `eval-rl/` folders. With `xss`, problem text, model
 * text, tool code, tool output and answers carry HTML and script payloads.
 */
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { mulberry32 } from '../../src/random.js';

export interface RunSpec {
  steps: number;
  /** Problems per step, each sampled `n` times. */
  problems: number;
  n: number;
  keep: number;
  /** First step of each stage after the first. */
  stageStarts?: number[];
  /** Response tokens per trajectory (ids, mask and log-probs of this length). */
  tokens?: number;
  xss?: boolean;
  seed?: number;
}

/** Payloads that must stay inert text (the browser test checks `window.__xss` stays unset). */
export const XSS = {
  problem:
    'Compute 2+1. <script>window.__xss="problem-script"</script><img src=x onerror="window.__xss=\'problem-img\'"> [link](javascript:window.__xss="md") <a href="javascript:window.__xss=1">a</a>',
  model:
    'Let me think <img src=x onerror="window.__xss=\'model-img\'"><script>window.__xss="model"</script> **bold** <b>',
  code: 'print("<script>window.__xss=\'code\'</script>")  # <img src=x onerror=alert(1)>',
  tool: '<img src=x onerror="window.__xss=\'tool-img\'"><script>window.__xss="tool"</script>',
  answer: '<b onmouseover="window.__xss=\'answer\'">3</b>',
  problemId: 'xss-"><svg onload=window.__xss=1>',
};

const FAMILIES = ['count', 'digits', 'stdin', 'primes', 'modpow'];

export function problemId(i: number): string {
  return `${FAMILIES[i % FAMILIES.length]}-${(0x1000_0000 + i * 7919).toString(16)}`;
}

function problems(count: number, xss: boolean): Record<string, unknown>[] {
  return Array.from({ length: count }, (_, i) => {
    const id = xss && i === 0 ? XSS.problemId : problemId(i);
    return {
      v: 1,
      id,
      prompt:
        xss && i === 0
          ? XSS.problem
          : `Problem ${i}: how many integers below ${1000 + i} are divisible by 7?`,
      answer: String(142 + i),
      kind: 'math',
      meta: { family: xss && i === 0 ? 'xss' : FAMILIES[i % FAMILIES.length], split: 'train' },
    };
  });
}

const CALL = (code: string) =>
  `<tool_call>\n${JSON.stringify({ name: 'python_code_with_standard_io', arguments: { code, input: '' } })}\n</tool_call>`;

/** A response text with `calls` tool turns, as rollout decodes one (the chat markers kept). */
function responseText(answer: string, calls: number, errors: number, xss: boolean, tagged: boolean): string {
  let text = xss ? `${XSS.model}\n` : 'I will compute it with a short program.\n';
  for (let c = 0; c < calls; c++) {
    const code = xss
      ? XSS.code
      : `count = 0\nfor n in range(1, 1000):\n    if n % 7 == 0:\n        count += 1\nprint(count)  # the count`;
    const out =
      c < errors
        ? 'Traceback (most recent call last):\nNameError: name x is not defined'
        : xss
          ? XSS.tool
          : answer;
    text += `${CALL(code)}<|im_end|>\n<|im_start|>user\n<tool_response>\n${out}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>`;
    text += c + 1 < calls ? 'Let me check again.\n' : '';
  }
  text += `So the count is ${answer}.</reason>\n`;
  if (tagged) text += `<answer>\\boxed{${xss ? XSS.answer : answer}}</answer>`;
  return `${text}<|im_end|>`;
}

/** The records of one RL step: trajectories, rollout's end_batch line, train-step's Step, the curve point. */
export function stepRecords(spec: RunSpec, step: number, pool: Record<string, unknown>[]) {
  const random = mulberry32((spec.seed ?? 0) * 1000 + step);
  const length = spec.tokens ?? 48;
  const trajectories: string[] = [];
  let sum = 0;
  let mixed = 0;
  const byVersion: Record<string, number> = {};
  for (let q = 0; q < spec.problems; q++) {
    const problem = pool[(step * spec.problems + q) % pool.length];
    const xss = spec.xss === true && problem.id === XSS.problemId;
    const skill = 0.2 + 0.6 * (step / Math.max(1, spec.steps)) + 0.2 * random();
    const rewards: number[] = [];
    for (let s = 0; s < spec.n; s++) {
      const correct = random() < skill;
      const calls = 1 + Math.floor(random() * 2);
      const errors = random() < 0.15 ? 1 : 0;
      const tagged = random() > 0.08;
      const finish = random() < 0.05 ? 'length' : 'stop';
      const reward = correct && tagged && finish === 'stop' ? 1 : 0;
      rewards.push(reward);
      const answer = correct ? String(problem.answer) : String(Number(problem.answer) + 1 + s);
      const mask = Array.from({ length }, (_, i) => (i % 12 >= 9 ? 0 : 1));
      const turns = calls + 1;
      const versions = Array.from({ length: turns }, (_, i) =>
        String(i === turns - 1 && random() < 0.3 ? step : step - 1),
      );
      for (const v of versions) byVersion[v] = (byVersion[v] ?? 0) + 1;
      trajectories.push(
        JSON.stringify({
          v: 1,
          id: `${problem.id}/${s}`,
          problem_id: problem.id,
          sample: s,
          policy: `rl-step-${step - 1}`,
          prompt_ids: Array.from({ length: 80 }, (_, i) => 100 + ((i * 31 + q) % 900)),
          response_ids: Array.from({ length }, (_, i) => 10 + ((i * 17 + s) % 1000)),
          loss_mask: mask,
          logprobs: mask.map((m) => (m === 0 ? 0 : -Math.round(random() * 3000) / 1000)),
          text: responseText(answer, calls, errors, xss, tagged),
          turns,
          tool_calls: calls,
          tool_errors: errors,
          answer_tags: tagged ? 1 : 0,
          finish,
          answer: tagged ? (xss ? XSS.answer : answer) : null,
          reward,
          timing: { queued_ms: 3, generate_ms: 900, tool_ms: 40 },
          step,
          policy_version: String(step - 1),
          turn_versions: versions,
        }),
      );
      sum += reward;
    }
    if (new Set(rewards).size > 1) mixed += 1;
  }
  const mean = sum / (spec.problems * spec.n);
  const rollout = {
    v: 1,
    end_batch: true,
    step,
    stats: {
      problems: spec.problems,
      trajectories: spec.problems * spec.n,
      mean_reward: mean,
      mixed_groups: mixed,
      rounds: 1 + (step % 3 === 0 ? 1 : 0),
      policy_version: step - 1,
      turns_by_version: byVersion,
      wait_seconds: Math.round(random() * 30) / 10,
      seconds: 8 + Math.round(random() * 40) / 10,
    },
  };
  const train = {
    v: 1,
    step,
    policy: `rl-step-${step}`,
    checkpoint: `/runs/demo/rl/step-${step}`,
    loss: -0.01 + random() * 0.02,
    pg_clipfrac: random() * 0.05,
    approx_kl: random() * 0.002,
    entropy: 1.2 - step / (spec.steps * 2) + random() * 0.05,
    grad_norm: 0.5 + random(),
    lr: 3e-4,
    sequences: mixed * spec.keep,
    tokens: mixed * spec.keep * (80 + length),
    seconds: 3 + random() * 2,
    rollout_kl: random() * 0.001,
    rollout_correction: 'token-tis',
    tis_capped_frac: random() * 0.01,
  };
  return { trajectories, rollout, train, curve: { v: 1, step, train_reward: mean } };
}

/** Appends step `step` to the run in `dir` (trajectories first, as the pipeline writes them). */
export function appendStep(dir: string, spec: RunSpec, step: number): void {
  const rl = join(dir, 'rl');
  const r = stepRecords(spec, step, problems(Math.max(spec.problems * 2, 10), spec.xss === true));
  mkdirSync(join(rl, 'trajectories'), { recursive: true });
  writeFileSync(join(rl, 'trajectories', `step-${step}.jsonl`), `${r.trajectories.join('\n')}\n`);
  appendFileSync(join(rl, 'rollout-steps.jsonl'), `${JSON.stringify(r.rollout)}\n`);
  appendFileSync(join(rl, 'steps.jsonl'), `${JSON.stringify(r.train)}\n`);
  appendFileSync(join(rl, 'curve.jsonl'), `${JSON.stringify(r.curve)}\n`);
}

function evalFolder(
  dir: string,
  name: string,
  pool: Record<string, unknown>[],
  skill: number,
  xss: boolean,
): void {
  const out = join(dir, name);
  mkdirSync(out, { recursive: true });
  const random = mulberry32(name.length * 7 + Math.round(skill * 100));
  const n = 4;
  const records: Record<string, unknown>[] = [];
  const lines: string[] = [];
  let correctAll = 0;
  let solved = 0;
  for (const p of pool) {
    let correct = 0;
    for (let s = 0; s < n; s++) {
      const ok = random() < skill;
      correct += ok ? 1 : 0;
      const answer = ok ? String(p.answer) : '0';
      lines.push(
        JSON.stringify({
          v: 1,
          id: `${p.id}/${s}`,
          problem_id: p.id,
          sample: s,
          policy: name,
          prompt_ids: [1, 2, 3],
          response_ids: [4, 5, 6, 7],
          loss_mask: [1, 1, 0, 1],
          logprobs: [-0.1, -0.5, 0, -2],
          text: responseText(answer, 1, 0, xss && p.id === XSS.problemId, true),
          turns: 2,
          tool_calls: 1,
          tool_errors: 0,
          answer_tags: 1,
          finish: 'stop',
          answer,
          reward: ok ? 1 : 0,
        }),
      );
    }
    correctAll += correct;
    if (correct > 0) solved += 1;
    records.push({
      v: 1,
      problem_id: p.id,
      n,
      correct,
      mean_reward: correct / n,
      mean_tokens: 4,
      tool_calls: 1,
      tool_errors: 0,
      'pass@k': { '1': correct / n },
      'maj@n': correct * 2 >= n ? 1 : 0,
    });
  }
  const summary = {
    v: 1,
    summary: true,
    benchmark: 'test-problems',
    n,
    problems: pool.length,
    'avg@n': correctAll / (n * pool.length),
    'pass@k': { '1': correctAll / (n * pool.length), '4': solved / pool.length },
    'maj@n': records.filter((r) => r['maj@n'] === 1).length / pool.length,
    mean_tokens: 4,
    tool_error_rate: 0,
    format_violation_rate: 0,
    policy: name,
  };
  writeFileSync(join(out, 'trajectories-test-problems.jsonl'), `${lines.join('\n')}\n`);
  writeFileSync(
    join(out, 'eval-test-problems.jsonl'),
    [...records, summary].map((r) => `${JSON.stringify(r)}\n`).join(''),
  );
  writeFileSync(
    join(out, 'report.json'),
    `${JSON.stringify({ v: 1, created: '2026-12-05T00:00:00Z', benchmarks: [summary] }, null, 2)}\n`,
  );
}

/** Writes a whole run (all its steps, the SFT and RL evaluations) into `dir`. */
export function writeRun(dir: string, spec: RunSpec, { evals = true } = {}): void {
  const pool = problems(Math.max(spec.problems * 2, 10), spec.xss === true);
  mkdirSync(join(dir, 'sft', 'data'), { recursive: true });
  writeFileSync(
    join(dir, 'sft', 'data', 'train-problems.jsonl'),
    pool.map((p) => `${JSON.stringify(p)}\n`).join(''),
  );
  writeFileSync(
    join(dir, 'sft', 'data', 'test-problems.jsonl'),
    pool
      .slice(0, 6)
      .map((p) => `${JSON.stringify(p)}\n`)
      .join(''),
  );
  writeFileSync(join(dir, 'manifest.txt'), `RSTAR_DEMO_KEEP=${spec.keep}\n`);
  mkdirSync(join(dir, 'rl'), { recursive: true });
  for (const first of [1, ...(spec.stageStarts ?? [])]) {
    writeFileSync(
      join(dir, 'rl', `manifest-stage-${first}.txt`),
      `RSTAR_RL_KEEP=${spec.keep}\nRSTAR_RL_N=${spec.n}\nRSTAR_RL_DOWN_SAMPLE=roc\n`,
    );
  }
  for (let k = 1; k <= spec.steps; k++) appendStep(dir, spec, k);
  if (evals) {
    evalFolder(dir, 'eval-sft', pool.slice(0, 6), 0.4, spec.xss === true);
    evalFolder(dir, 'eval-rl', pool.slice(0, 6), 0.7, spec.xss === true);
    appendFileSync(
      join(dir, 'rl', 'curve.jsonl'),
      `${JSON.stringify({ v: 1, step: 0, 'heldout_avg@n': 0.4, eval: 'sft' })}\n`,
    );
    appendFileSync(
      join(dir, 'rl', 'curve.jsonl'),
      `${JSON.stringify({ v: 1, step: spec.steps, 'heldout_avg@n': 0.7, eval: 'rl' })}\n`,
    );
  }
}
