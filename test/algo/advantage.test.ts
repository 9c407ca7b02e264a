import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, it } from 'node:test';
import { groupAdvantages, groupStats } from '../../src/algo/advantage.js';
import { lines, ndjson, rstar, trajectory } from '../support/helpers.js';

const close = (got: number[], want: number[], tol = 1e-6) => {
  assert.equal(got.length, want.length);
  for (const [i, g] of got.entries()) assert.ok(Math.abs(g - want[i]) <= tol, `[${i}] ${g} vs ${want[i]}`);
};

describe('groupAdvantages (verl compute_grpo_outcome_advantage)', () => {
  it('normalises by the unbiased std plus 1e-6', () => {
    // mean 0.5, unbiased std sqrt(1/3) = 0.57735: (1 - 0.5) / (0.57735 + 1e-6) = 0.866024...
    const a = 0.5 / (Math.sqrt(1 / 3) + 1e-6);
    close(groupAdvantages([1, 0, 0, 1]), [a, -a, -a, a]);
    // 1 of 4 correct: mean 0.25, std 0.5.
    close(groupAdvantages([1, 0, 0, 0]), [
      0.75 / 0.500001,
      -0.25 / 0.500001,
      -0.25 / 0.500001,
      -0.25 / 0.500001,
    ]);
    // Values are float32 like verl's tensors.
    for (const x of groupAdvantages([1, 0, 0, 1])) assert.equal(Math.fround(x), x);
  });

  it('gives a group of one mean 0 and std 1, and an equal group zeros', () => {
    assert.deepEqual(groupStats([1]), { mean: 0, std: 1 });
    close(groupAdvantages([1]), [1 / 1.000001]);
    assert.deepEqual(groupAdvantages([1, 1, 1]), [0, 0, 0]);
    assert.deepEqual(groupAdvantages([0, 0]), [0, 0]);
  });

  it('--no-std subtracts the mean only (Dr. GRPO)', () => {
    close(groupAdvantages([1, 0, 0, 0], { normalizeStd: false }), [0.75, -0.25, -0.25, -0.25]);
    close(groupAdvantages([3], { normalizeStd: false }), [3]);
  });

  it('--baseline loo is RLOO: r * n/(n-1) - mean * n/(n-1), a lone sample unchanged', () => {
    // [1, 0, 0, 0]: 1 - mean of the others (0) = 1; 0 - 1/3 = -1/3.
    close(groupAdvantages([1, 0, 0, 0], { baseline: 'loo' }), [1, -1 / 3, -1 / 3, -1 / 3]);
    close(groupAdvantages([0.5], { baseline: 'loo' }), [0.5]);
  });

  it('matches PyTorch bit for bit (verl formula in torch, float32)', () => {
    let s = 17;
    const random = () => {
      s = (s * 48271) % 2147483647;
      return s / 2147483647;
    };
    const groups: number[][] = [];
    for (let g = 0; g < 60; g++) {
      const n = 1 + Math.floor(random() * 33);
      const values = g % 3 === 0 ? [0, 1, 0.5, -1] : [0, 1];
      groups.push(Array.from({ length: n }, () => values[Math.floor(random() * values.length)]));
    }
    const script = `
import json, sys, torch
out = []
for rewards in json.load(sys.stdin):
    s = torch.tensor(rewards, dtype=torch.float32)
    if len(rewards) == 1:
        mean, std = torch.tensor(0.0), torch.tensor(1.0)
    else:
        mean, std = torch.mean(s), torch.std(s)
    n = len(rewards)
    grpo = [((s[i] - mean) / (std + 1e-6)).item() for i in range(n)]
    drgrpo = [(s[i] - mean).item() for i in range(n)]
    loo = [(s[i] * n / (n - 1) - mean * n / (n - 1)).item() if n > 1 else s[i].item() for i in range(n)]
    out.append([grpo, drgrpo, loo])
print(json.dumps(out))
`;
    const run = spawnSync('/usr/bin/python3', ['-c', script], {
      input: JSON.stringify(groups),
      encoding: 'utf8',
    });
    assert.equal(run.status, 0, run.stderr);
    const torch = JSON.parse(run.stdout) as number[][][];
    groups.forEach((rewards, i) => {
      assert.deepEqual(groupAdvantages(rewards), torch[i][0], `grpo ${rewards}`);
      assert.deepEqual(groupAdvantages(rewards, { normalizeStd: false }), torch[i][1], `dr grpo ${rewards}`);
      assert.deepEqual(groupAdvantages(rewards, { baseline: 'loo' }), torch[i][2], `rloo ${rewards}`);
    });
  });
});

const traj = (problem: string, sample: number, reward: number, extra = {}) =>
  trajectory(problem, sample, reward, extra);

type Rec = Record<string, unknown>;

describe('rstar advantage', () => {
  const batch = [
    traj('a', 1, 0),
    traj('b', 0, 1),
    traj('a', 0, 1),
    traj('b', 1, 1),
    traj('a', 2, 0),
    traj('a', 3, 1),
  ];

  it('adds advantage per group for interleaved input, keeping everything else', async () => {
    const { code, stdout, stderr } = await rstar(['advantage'], ndjson(batch));
    assert.equal(code, 0, stderr);
    const out = lines<Rec>(stdout);
    assert.deepEqual(
      out.map((r) => r.id),
      ['a/0', 'a/1', 'a/2', 'a/3', 'b/0', 'b/1'],
    );
    const a = 0.5 / (Math.sqrt(1 / 3) + 1e-6);
    close(
      out.map((r) => r.advantage as number),
      [a, -a, -a, a, 0, 0],
    );
    assert.deepEqual({ ...out[0], advantage: undefined }, { ...batch[2], advantage: undefined });
  });

  it('supports --no-std, --baseline loo and --epsilon', async () => {
    const adv = async (args: string[]) =>
      lines<Rec>((await rstar(['advantage', ...args], ndjson(batch))).stdout).map(
        (r) => r.advantage as number,
      );
    close(await adv(['--no-std']), [0.5, -0.5, -0.5, 0.5, 0, 0]);
    close(await adv(['--baseline', 'loo']), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0]);
    close(
      await adv(['--epsilon', '1']),
      [0.5 / (Math.sqrt(1 / 3) + 1), -0.5 / 1.57735, -0.5 / 1.57735, 0.5 / 1.57735, 0, 0],
      1e-5,
    );
  });

  it('replaces an advantage the input already had', async () => {
    const { stdout } = await rstar(['advantage'], ndjson([traj('s', 0, 1, { advantage: 5 })]));
    const [one] = lines<Rec>(stdout);
    close([one.advantage as number], [1 / 1.000001]);
  });

  it('streams complete groups with --group-size and rejects a group left short', async () => {
    const ok = await rstar(
      ['advantage', '--group-size', '2'],
      ndjson(batch.filter((r) => r.problem_id === 'b')),
    );
    assert.equal(ok.code, 0, ok.stderr);
    const bad = await rstar(['advantage', '--group-size', '4'], ndjson(batch));
    assert.equal(bad.code, 1);
    assert.match(
      bad.stderr,
      /stdin:2: problem_id: group 'b' has 2 records at end of input, --group-size says 4/,
    );
  });

  it('exits 1 naming line and field on bad input, 2 on bad usage', async () => {
    const cases: [string, RegExp][] = [
      [`${JSON.stringify(batch[0])}\nnot json\n`, /^rstar advantage: stdin:2: invalid JSON/m],
      [ndjson([batch[0], { ...batch[1], reward: '1' }]), /^rstar advantage: stdin:2: reward: /m],
      [ndjson([{ ...batch[0], problem_id: undefined }]), /^rstar advantage: stdin:1: problem_id: /m],
      [
        ndjson([batch[0], { ...batch[1], logprobs: [0] }]),
        /^rstar advantage: stdin:2: logprobs: length 1 differs/m,
      ],
      [ndjson([batch[0], batch[0]]), /^rstar advantage: stdin:2: sample: duplicate sample 1 of problem 'a'/m],
    ];
    for (const [input, message] of cases) {
      const { code, stderr } = await rstar(['advantage'], input);
      assert.equal(code, 1, stderr);
      assert.match(stderr, message);
    }
    for (const args of [
      ['--baseline', 'max'],
      ['--epsilon', 'x'],
      ['--group-size', '0'],
    ]) {
      assert.equal((await rstar(['advantage', ...args])).code, 2, args.join(' '));
    }
  });
});
