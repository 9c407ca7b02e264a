import { NdjsonWriter, readAll } from '../ndjson/index.js';
import { parse, program } from '../program.js';
import { Trajectory } from '../records/trajectory.js';
import { summarize } from '../sft/eval-summary.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'sft-eval',
    'what the SFT stage is judged on (format validity, tool success, accuracy), from rollout trajectories of held-out problems: one summary line',
  )
    .argument('[file]', 'NDJSON trajectories from `rstar rollout` (default: stdin)')
    .requiredOption('--name <name>', 'the summary\'s "name" (e.g. greedy, sampled)');
  if (!parse(cmd, argv)) return;
  const { name } = cmd.opts<{ name: string }>();
  const records = await readAll(cmd.args[0], Trajectory);
  const writer = new NdjsonWriter();
  await writer.write(
    summarize(
      name,
      records.map((r) => r.record),
    ),
  );
  await writer.end();
}
