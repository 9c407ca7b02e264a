import { writeFileSync } from 'node:fs';
import { type Baseline, groupAdvantages } from '../algo/advantage.js';
import { appendField, type GroupStageFlags, type InfraCounts, runGroupStage } from '../algo/group.js';
import { choice, interactive, number, parse, program } from '../program.js';
import { groupStageOptions } from './group-options.js';

/** The stats line: what went in, what came out, and the infrastructure failures left out. */
export interface AdvantageStats extends InfraCounts {
  groups_in: number;
  groups_out: number;
  records_in: number;
  records_out: number;
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('advantage', "GRPO group advantages, as verl's compute_grpo_outcome_advantage")
    .argument('[file]', 'trajectories (NDJSON); stdin when absent or -')
    .addOption(
      choice(
        '--baseline <kind>',
        'mean: GRPO group mean; loo: RLOO leave-one-out mean',
        ['mean', 'loo'],
        'mean',
      ),
    )
    .option('--no-std', 'do not divide by the group std (Dr. GRPO)')
    .option('--epsilon <x>', 'added to the std before dividing', number(0), 1e-6)
    .option('--stats <file>', 'write the JSON stats line to FILE (default: stderr, when there is news)');
  groupStageOptions(cmd);
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<
    {
      baseline: Baseline;
      std: boolean;
      epsilon: number;
      stats?: string;
    } & GroupStageFlags
  >();

  const stats: AdvantageStats = {
    groups_in: 0,
    groups_out: 0,
    records_in: 0,
    records_out: 0,
    infra_errors: 0,
    infra_error_groups: 0,
    infra_only_groups: 0,
  };
  const finished = await runGroupStage({
    command: 'advantage',
    file: cmd.args[0],
    flags: opts,
    task: { kind: 'advantage' },
    fields: () => ({}),
    counts: stats,
    each: async (_, members, out) => {
      stats.groups_out += 1;
      const items = members.map((m) => m.item);
      const advantages = groupAdvantages(
        items.map((i) => i.reward),
        { baseline: opts.baseline, normalizeStd: opts.std, epsilon: opts.epsilon },
      );
      for (const [k, item] of items.entries()) {
        await out.writeRaw(appendField(item.raw, 'advantage', advantages[k]));
        stats.records_out += 1;
        if (out.closed) return;
      }
    },
  });
  if (!finished) return;
  const line = `${JSON.stringify(stats)}\n`;
  if (opts.stats) writeFileSync(opts.stats, line);
  else if (stats.infra_errors > 0 || interactive()) process.stderr.write(`rstar advantage: ${line}`);
}
