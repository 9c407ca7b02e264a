import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe, it } from 'node:test';
import { lines, ndjson, ROOT, rstar } from '../support/helpers.js';

/**
 * rstar roc-filter against test/support/oracle/roc_oracle.py, a Python model of the release's
 * reject_equal_reward + resample_of_correct over a float32 torch reward tensor, on random groups:
 * random penalties from random tag soup, random rewards (float32 edge cases included), random
 * sizes, interleaved order and random flags.
 */

const PYTHON = '/usr/bin/python3'; // Debian's, with torch
const ORACLE = `${ROOT}test/support/oracle/roc_oracle.py`;

const PIECES = [
  '<tool_response>',
  '</tool_response>',
  '<tool_response>\nTool call success\nstdout: 1\n</tool_response>',
  '<tool_response>\nTool call failure\nreason: NameError\n</tool_response>',
  'error',
  'ERROR',
  'Err',
  'or',
  '\n',
  ' ',
  '<answer>',
  '</answer>',
  '<answer>42</answer>',
  '<|im_start|>assistant',
  '<|im_end|>',
  '<|im_start|>assistant\n<reason>x</reason><|im_end|>',
  '<|im_start|>user',
  'İ',
  'π',
];
const PLAIN_REWARDS = [0, 1];
const ODD_REWARDS = [0, 1, 0.5, -1, 1e-46, 1 + 1e-7, 1 + 1e-4, 1e-9, 2];

type Random = () => number;
function rng(seed: number): Random {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pick = <T>(r: Random, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
const int = (r: Random, lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));

interface Params {
  keep: number;
  min_pos: number;
  min_neg: number;
  reject_equal: boolean;
  penalty: string;
}

function randomCase(r: Random, index: number) {
  const keep = r() < 0.5 ? 16 : int(r, 1, 12);
  const params: Params = {
    keep,
    min_pos: r() < 0.6 ? 2 : int(r, 0, 4),
    min_neg: r() < 0.6 ? 2 : int(r, 0, 4),
    reject_equal: r() < 0.75,
    penalty: r() < 0.7 ? 'rstar' : pick(r, ['tool-error', 'format', 'none']),
  };
  const odd = r() < 0.3;
  const records: Record<string, unknown>[] = [];
  const groups = int(r, 6, 14);
  for (let g = 0; g < groups; g++) {
    const problem = `c${index}-p${g}`;
    const size = r() < 0.6 ? 2 * keep : int(r, 1, 2 * keep + 3);
    const bias = r();
    const constant = r() < 0.15 ? pick(r, odd ? ODD_REWARDS : PLAIN_REWARDS) : undefined;
    for (let s = 0; s < size; s++) {
      const text = Array.from({ length: int(r, 0, 14) }, () => pick(r, PIECES)).join('');
      const reward = constant ?? (odd ? pick(r, ODD_REWARDS) : r() < bias ? 1 : 0);
      records.push({
        v: 1,
        id: `${problem}/${s}`,
        problem_id: problem,
        sample: s,
        policy: 'oracle',
        prompt_ids: [1],
        response_ids: [2],
        loss_mask: [1],
        logprobs: [-1],
        text,
        turns: 1,
        tool_calls: 0,
        tool_errors: 0,
        answer_tags: 0,
        finish: 'stop',
        answer: null,
        reward,
      });
    }
  }
  // Interleave groups in a random order.
  for (let i = records.length - 1; i > 0; i--) {
    const j = int(r, 0, i);
    [records[i], records[j]] = [records[j], records[i]];
  }
  return { params, records };
}

function runOracle(cases: unknown[]): Promise<{ results: OracleResult[] }> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, [ORACLE], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (d) => {
      out += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d) => {
      err += d;
    });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(err))));
    child.stdin.end(JSON.stringify({ cases }));
  });
}

interface OracleResult {
  kept: string[];
  penalty: Record<string, unknown>;
  stats: Record<string, unknown>;
}

const EXACT_STATS = [
  'equal_reward',
  'equal_reward_all_zero',
  'equal_reward_non_zero',
  'rejected_equal',
  'too_small',
  'kept_whole',
  'both_short',
  'sampled',
  'size_mismatch',
  'tool_responses',
  'tool_errors',
  'tool_error_ratio',
  'answer_tags',
  'records_out',
  'groups_out',
  'positives_out',
];

describe('roc-filter against the Python model of the release', () => {
  it('agrees on a few hundred random groups', { timeout: 240_000 }, async () => {
    const seed = Number(process.env.RSTAR_ORACLE_SEED ?? 20250828);
    const r = rng(seed);
    const cases = Array.from({ length: 28 }, (_, i) => randomCase(r, i));
    const oracle = runOracle(cases);
    const ours: { stdout: string; stderr: string; code: number }[] = [];
    for (let i = 0; i < cases.length; i += 2) {
      const batch = cases.slice(i, i + 2).map(({ params, records }) => {
        const args = [
          'roc-filter',
          '--keep',
          String(params.keep),
          '--min-pos',
          String(params.min_pos),
          '--min-neg',
          String(params.min_neg),
          '--penalty',
          params.penalty,
          ...(params.reject_equal ? [] : ['--no-reject-equal']),
        ];
        return rstar(args, ndjson(records));
      });
      ours.push(...(await Promise.all(batch)));
    }
    const { results } = await oracle;
    let groups = 0;
    const seen: Record<string, number> = {};
    for (const [i, c] of cases.entries()) {
      const where = `case ${i} (seed ${seed}, ${JSON.stringify(c.params)})`;
      const got = ours[i];
      assert.equal(got.code, 0, `${where}: ${got.stderr}`);
      const want = results[i];
      const out = lines<Record<string, unknown>>(got.stdout);
      assert.deepEqual(out.map((x) => x.id as string).sort(), want.kept, where);
      for (const x of out) assert.deepEqual(x.penalty, want.penalty[x.id as string], `${where}: ${x.id}`);
      const stats = JSON.parse(got.stderr.trim().split('\n').at(-1) ?? '{}');
      for (const key of EXACT_STATS) assert.deepEqual(stats[key], want.stats[key], `${where}: ${key}`);
      const mean = want.stats.tool_error_penalty_mean as number;
      assert.ok(Math.abs(stats.tool_error_penalty_mean - mean) < 1e-12, `${where}: penalty mean`);
      groups += new Set(c.records.map((x) => x.problem_id)).size;
      for (const key of [
        'rejected_equal',
        'too_small',
        'kept_whole',
        'both_short',
        'sampled',
        'size_mismatch',
      ]) {
        seen[key] = (seen[key] ?? 0) + (want.stats[key] as number);
      }
    }
    // Every branch of the release's selection was exercised.
    for (const [key, count] of Object.entries(seen)) assert.ok(count > 0, `no group took the ${key} branch`);
    assert.ok(groups >= 200, `only ${groups} groups`);
  });
});
