import { writeFileSync } from 'node:fs';
import {
  appendField,
  type GroupStageFlags,
  type InfraCounts,
  runGroupStage,
  type StageItem,
} from '../algo/group.js';
import { PENALTY_MODES, type PenaltyMode, type ScoredText } from '../algo/penalty.js';
import {
  groupRandom,
  isPositive,
  type PositiveSelection,
  rewardsAllEqual,
  rewardsAllZero,
  rocSelect,
} from '../algo/roc.js';
import { choice, integer, parse, program } from '../program.js';
import { groupStageOptions } from './group-options.js';

interface Scored extends ScoredText, StageItem {
  /** A failed call followed later by a successful one (tool_status). */
  recovered: boolean;
  /** A branch of tree rollouts: its siblings (`branch.of`). */
  branchOf?: number;
}

/** The summary: the release's `reject_equal_reward/*`, `roc_error_ratio/*` and `roc_answer_format/*` metrics. */
export interface RocStats extends InfraCounts {
  groups_in: number;
  groups_out: number;
  records_in: number;
  records_out: number;
  positives_out: number;
  negatives_out: number;
  /**
   * Correct trajectories with a failed call followed later by a successful one (recovery by order,
   * src/algo/tool-use.ts), among the records that reach RoC, and among those kept: what
   * `--reserve-recovered` moves.
   */
  recovered_in: number;
  recovered_out: number;
  /** Groups whose rewards are all equal (counted whether or not they are rejected). */
  equal_reward: number;
  equal_reward_all_zero: number;
  equal_reward_non_zero: number;
  rejected_equal: number;
  too_small: number;
  kept_whole: number;
  both_short: number;
  sampled: number;
  /** Groups where the release's `assert len(choices) == down_sample_to_n` would fail; kept as selected. */
  size_mismatch: number;
  /** Over the records that reach RoC (after reject-equal), like the release's metrics. */
  tool_responses: number;
  tool_errors: number;
  tool_error_ratio: number;
  tool_error_penalty_mean: number;
  answer_tags: { per_rollout_mean: number; zero: number; one: number; more: number };
  /** The same figures under the release trainer's metric names, for comparing runs with the paper's. */
  release_metrics: Record<string, number>;
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'roc-filter',
    'GRPO-RoC: down-sample each problem group to --keep rollouts (Resample-on-Correct)',
  )
    .argument('[file]', 'trajectories (NDJSON); stdin when absent or -')
    .option('--keep <n>', 'rollouts kept per group (down_sample_to_n)', integer(1), 16)
    .option('--min-pos <n>', 'minimum positive (reward > 0) rollouts kept', integer(0), 2)
    .option('--min-neg <n>', 'minimum negative (reward <= 0) rollouts kept', integer(0), 2)
    .option('--no-reject-equal', 'keep groups whose rewards are all equal')
    .addOption(
      choice(
        '--positives <how>',
        'sorted: lowest penalty first; weighted: sample by penalty',
        ['sorted', 'weighted'],
        'sorted',
      ),
    )
    .option('--seed <n>', 'seed of --positives weighted', integer(0), 0)
    .option(
      '--reserve-recovered <r>',
      'reserve up to R positive slots for recovered positives (a failed call, later a successful one)',
      integer(0),
      0,
    )
    .addOption(
      choice(
        '--penalty <which>',
        'penalties summed into total (rstar = tool-error + format)',
        PENALTY_MODES,
        'rstar',
      ),
    )
    .option('--stats <file>', 'write the JSON summary to FILE instead of stderr');
  groupStageOptions(cmd);
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<
    {
      keep: number;
      minPos: number;
      minNeg: number;
      rejectEqual: boolean;
      positives: PositiveSelection;
      seed: number;
      reserveRecovered: number;
      penalty: PenaltyMode;
      stats?: string;
    } & GroupStageFlags
  >();
  // The release asserts this before sampling (resample_of_correct); rstar runs the same arithmetic anyway,
  // which is the only way its keep-the-whole-group branch (both classes short) can be reached.
  if (opts.minPos + opts.minNeg > opts.keep) {
    process.stderr.write(
      `rstar roc-filter: warning: --min-pos ${opts.minPos} + --min-neg ${opts.minNeg} exceed --keep ${opts.keep} (the release rejects this configuration)\n`,
    );
  }

  if (opts.groupSize !== undefined && opts.groupSize < opts.keep) {
    process.stderr.write(
      `rstar roc-filter: warning: --group-size ${opts.groupSize} is below --keep ${opts.keep}: every group will be dropped\n`,
    );
  }
  const stats = emptyStats();
  let penaltySum = 0;
  let scoredRecords = 0;

  const finished = await runGroupStage<Scored>({
    command: 'roc-filter',
    file: cmd.args[0],
    flags: opts,
    task: { kind: 'roc', penalty: opts.penalty },
    fields: (record) => ({
      ...(record.scored as ScoredText),
      recovered: record.recovered === true,
      ...(record.groupSize !== undefined ? { branchOf: record.groupSize } : {}),
    }),
    counts: stats,
    each: async (group, members, out) => {
      const items = members.map((m) => m.item);
      const rewards = items.map((s) => s.reward);
      if (rewardsAllEqual(rewards)) {
        stats.equal_reward += 1;
        if (rewardsAllZero(rewards)) stats.equal_reward_all_zero += 1;
        else stats.equal_reward_non_zero += 1;
      }
      // A branch group keeps at most --keep of its siblings: fewer siblings than --keep is not a
      // group too small to train on, as a problem's would be.
      const branchOf = items[0]?.branchOf;
      const keep = branchOf !== undefined ? Math.min(opts.keep, branchOf) : opts.keep;
      const decision = rocSelect(
        items.map((s, i) => ({
          sample: members[i].sample,
          reward: s.reward,
          penalty: s.penalty.total,
          recovered: s.recovered,
        })),
        {
          keep,
          minPos: branchOf !== undefined ? Math.min(opts.minPos, keep) : opts.minPos,
          minNeg: branchOf !== undefined ? Math.min(opts.minNeg, keep) : opts.minNeg,
          rejectEqual: opts.rejectEqual,
          positives: opts.positives,
          reserveRecovered: opts.reserveRecovered,
          random: opts.positives === 'weighted' ? groupRandom(opts.seed, group.key) : undefined,
        },
      );
      if (decision.outcome === 'rejected-equal') {
        stats.rejected_equal += 1;
        return;
      }
      // calc_*_penalty_weights run over every record that survived reject_equal_reward.
      for (const s of items) {
        scoredRecords += 1;
        if (s.recovered && isPositive(s.reward)) stats.recovered_in += 1;
        penaltySum += s.penalty.tool_error;
        stats.tool_errors += s.toolErrors;
        stats.tool_responses += s.toolResponses;
        stats.answer_tags.per_rollout_mean += s.answerTags;
        if (s.answerTags === 0) stats.answer_tags.zero += 1;
        else if (s.answerTags === 1) stats.answer_tags.one += 1;
        else stats.answer_tags.more += 1;
      }
      if (decision.outcome === 'too-small') stats.too_small += 1;
      else if (decision.outcome === 'kept-whole') stats.kept_whole += 1;
      else if (decision.outcome === 'both-short') stats.both_short += 1;
      else stats.sampled += 1;
      if (decision.sizeMismatch) {
        stats.size_mismatch += 1;
        process.stderr.write(
          `rstar roc-filter: warning: group '${group.key}' keeps ${decision.kept.length}, not --keep ${opts.keep} (the release would assert here)\n`,
        );
      }
      if (decision.kept.length === 0) return;
      stats.groups_out += 1;
      for (const i of decision.kept) {
        const s = items[i];
        stats.records_out += 1;
        if (isPositive(s.reward)) {
          stats.positives_out += 1;
          if (s.recovered) stats.recovered_out += 1;
        } else stats.negatives_out += 1;
        await out.writeRaw(appendField(s.raw, 'penalty', s.penalty));
        if (out.closed) return;
      }
    },
  });
  if (!finished) return;

  stats.tool_error_ratio = stats.tool_responses > 0 ? stats.tool_errors / stats.tool_responses : 0;
  stats.tool_error_penalty_mean = scoredRecords > 0 ? penaltySum / scoredRecords : 0;
  stats.answer_tags.per_rollout_mean =
    scoredRecords > 0 ? stats.answer_tags.per_rollout_mean / scoredRecords : 0;
  stats.release_metrics = releaseMetrics(stats);
  const summary = `${JSON.stringify(stats)}\n`;
  if (opts.stats) writeFileSync(opts.stats, summary);
  else process.stderr.write(summary);
}

function releaseMetrics(s: RocStats): Record<string, number> {
  return {
    'down_sampling/before_sampling_trace_num': s.records_in,
    'down_sampling/after_sampling_trace_num': s.records_out,
    'reject_equal_reward/solve_non_equal_total': s.groups_in - s.equal_reward,
    'reject_equal_reward/solve_equal_total': s.equal_reward,
    'reject_equal_reward/solve_equal_total_ratio': s.groups_in > 0 ? s.equal_reward / s.groups_in : 0,
    'reject_equal_reward/solve_equal_zeros': s.equal_reward_all_zero,
    'reject_equal_reward/solve_equal_non_all_zeros': s.equal_reward_non_zero,
    'roc_error_ratio/global_err_ratio': s.tool_error_ratio,
    'roc_error_ratio/penalty_weight': s.tool_error_penalty_mean,
    'roc_answer_format/answer_per_rollout_mean': s.answer_tags.per_rollout_mean,
    'roc_answer_format/zero_answer_count': s.answer_tags.zero,
    'roc_answer_format/one_answer_count': s.answer_tags.one,
    'roc_answer_format/gt_one_answer_count': s.answer_tags.more,
  };
}

function emptyStats(): RocStats {
  return {
    groups_in: 0,
    groups_out: 0,
    records_in: 0,
    records_out: 0,
    positives_out: 0,
    negatives_out: 0,
    recovered_in: 0,
    recovered_out: 0,
    equal_reward: 0,
    equal_reward_all_zero: 0,
    equal_reward_non_zero: 0,
    rejected_equal: 0,
    too_small: 0,
    kept_whole: 0,
    both_short: 0,
    sampled: 0,
    size_mismatch: 0,
    infra_errors: 0,
    infra_error_groups: 0,
    infra_only_groups: 0,
    tool_responses: 0,
    tool_errors: 0,
    tool_error_ratio: 0,
    tool_error_penalty_mean: 0,
    answer_tags: { per_rollout_mean: 0, zero: 0, one: 0, more: 0 },
    release_metrics: {},
  };
}
