import { Option } from 'commander';
import { type Baseline, groupAdvantages } from '../algo/advantage.js';
import { appendField, readTrajectoryGroups } from '../algo/group.js';
import { openOutput } from '../ndjson/index.js';
import { integer, number, parse, program } from '../program.js';

interface Item {
  /** The input line (without any `advantage` it already had), to which the new one is appended. */
  raw: string;
  reward: number;
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('advantage', "GRPO group advantages, as verl's compute_grpo_outcome_advantage")
    .argument('[file]', 'trajectories (NDJSON); stdin when absent or -')
    .addOption(
      new Option('--baseline <kind>', 'mean: GRPO group mean; loo: RLOO leave-one-out mean')
        .choices(['mean', 'loo'])
        .default('mean'),
    )
    .option('--no-std', 'do not divide by the group std (Dr. GRPO)')
    .option('--epsilon <x>', 'added to the std before dividing', number(0), 1e-6)
    .option('--group-size <n>', 'rollouts per problem: emit each group once complete', integer(1))
    .option(
      '--threads <n>',
      'worker threads parsing large inputs (default 0: the main thread only)',
      integer(0),
      0,
    );
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<{
    baseline: Baseline;
    std: boolean;
    epsilon: number;
    groupSize?: number;
    threads: number;
  }>();

  const input = readTrajectoryGroups<Item>(
    cmd.args[0],
    { size: opts.groupSize, threads: opts.threads, task: { kind: 'advantage' } },
    (record, raw) => ({ raw: record.without ?? raw, reward: record.reward }),
  );
  const out = openOutput();
  for await (const group of input.groups) {
    const items = group.members.map((m) => m.item);
    const advantages = groupAdvantages(
      items.map((i) => i.reward),
      { baseline: opts.baseline, normalizeStd: opts.std, epsilon: opts.epsilon },
    );
    for (const [k, item] of items.entries()) {
      await out.writeRaw(appendField(item.raw, 'advantage', advantages[k]));
      if (out.closed) return;
    }
  }
  await out.end();
}
