import type { Command } from 'commander';
import { integer, number } from '../program.js';

/**
 * The flags of the group stages (roc-filter, advantage): both read trajectories grouped by problem
 * and both guard against infrastructure failures the same way, so they declare them once.
 */
export function groupStageOptions(cmd: Command): Command {
  return cmd
    .option('--group-size <n>', 'rollouts per problem: emit each group once complete', integer(1))
    .option(
      '--max-error-share <x>',
      'fail when more than this share of records failed for infrastructure reasons (finish error)',
      number(0, 1),
    )
    .option(
      '--threads <n>',
      'worker threads parsing large inputs (default 0: the main thread only)',
      integer(0),
      0,
    );
}
