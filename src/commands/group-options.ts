import { type Command, Option } from 'commander';
import { deprecatedAlias, integer, number } from '../program.js';

/**
 * The flags of the group stages (roc-filter, advantage): both read trajectories grouped by problem
 * and both guard against infrastructure failures the same way, so they declare them once.
 */
export function groupStageOptions(cmd: Command): Command {
  // not --threads: elsewhere that is a model's compute threads, and its 0 means all cores
  const parseThreads = new Option(
    '--parse-threads <n>',
    'worker threads parsing large inputs (0: the main thread only)',
  )
    .argParser(integer(0))
    .default(0);
  return cmd
    .option('--group-size <n>', 'rollouts per problem: emit each group once complete', integer(1))
    .option(
      '--max-error-share <x>',
      'fail when more than this share of records failed for infrastructure reasons (finish error)',
      number(0, 1),
    )
    .addOption(parseThreads)
    .addOption(deprecatedAlias('--threads <n>', parseThreads));
}
