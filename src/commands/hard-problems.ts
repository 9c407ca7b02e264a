import { NdjsonWriter, openInput, readAll, readRecords } from '../ndjson/index.js';
import { integer, parse, program } from '../program.js';
import { Problem } from '../records/problem.js';
import { Trajectory } from '../records/trajectory.js';

/**
 * rStar2-Agent's last RL stage trains on the hard problems only: those the policy does not yet
 * always solve. Reads the trajectories of the last pass (in the order they were written) and prints
 * the problems minus those whose latest group was all correct; a problem never sampled stays in
 * (its difficulty is unknown), and infrastructure failures (finish "error") are not evidence.
 */
export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'hard-problems',
    'the problems the policy did not solve in every rollout of its last pass',
  )
    .argument('<trajectories...>', 'trajectory files of the last pass (NDJSON), oldest first')
    .requiredOption('--problems <file>', 'the problem set to filter (NDJSON Problem records)')
    .option(
      '--min-samples <n>',
      'a group needs this many scored rollouts to prove a problem easy',
      integer(1),
      2,
    );
  if (!parse(cmd, argv)) return;
  const { problems, minSamples } = cmd.opts<{ problems: string; minSamples: number }>();
  // Per problem: its latest step's rewards (a later step replaces an earlier one).
  const latest = new Map<string, { step: number; rewards: number[] }>();
  let order = 0;
  for (const file of cmd.args) {
    const { stream, source } = openInput(file);
    order += 1;
    for await (const { record } of readRecords(stream, source, Trajectory)) {
      if (record.finish === 'error') continue;
      const step = record.step ?? order * 1e6; // files without step stamps: later files win
      const seen = latest.get(record.problem_id);
      if (seen === undefined || step > seen.step)
        latest.set(record.problem_id, { step, rewards: [record.reward] });
      else if (step === seen.step) seen.rewards.push(record.reward);
    }
  }
  const solved = (id: string) => {
    const g = latest.get(id);
    return g !== undefined && g.rewards.length >= minSamples && g.rewards.every((r) => r >= 1);
  };
  const out = new NdjsonWriter();
  let kept = 0;
  let total = 0;
  for (const { record } of await readAll(problems, Problem)) {
    total += 1;
    if (solved(record.id)) continue;
    kept += 1;
    await out.write(record);
  }
  await out.end();
  process.stderr.write(
    `rstar hard-problems: ${kept} of ${total} problems kept (${total - kept} always solved)\n`,
  );
}
