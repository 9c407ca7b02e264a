import { writeFileSync } from 'node:fs';
import { type Baseline, groupAdvantages } from '../algo/advantage.js';
import {
  appendField,
  type GroupStageFlags,
  type InfraCounts,
  type Member,
  runGroupStage,
} from '../algo/group.js';
import { type StepGrouping, stepAdvantages, tokenAdvantages } from '../algo/step-groups.js';
import { UsageError } from '../errors.js';
import type { NdjsonWriter } from '../ndjson/index.js';
import { choice, integer, interactive, number, parse, program } from '../program.js';
import { checkOverlong, type OverlongOptions, overlongPenalty } from '../reward/overlong.js';
import { groupStageOptions } from './group-options.js';

/** The stats line: what went in, what came out, and the infrastructure failures left out. */
export interface AdvantageStats extends InfraCounts {
  groups_in: number;
  groups_out: number;
  records_in: number;
  records_out: number;
  /** --overlong-buffer: records whose reward the penalty lowered, and the mean term over all records out. */
  overlong_penalized?: number;
  overlong_penalty_mean?: number;
  /**
   * --step-weight: model turns, step groups, and the turns that share their step group with
   * another sample (the others have step advantage 0).
   */
  step_turns?: number;
  step_groups?: number;
  step_turns_shared?: number;
  /** --branch-credit with-parent: branch groups credited together with their parent's continuation. */
  branch_groups_with_parent?: number;
}

/** A record as this stage keeps it: with --step-weight, its tokens and mask. */
interface Item {
  raw: string;
  reward: number;
  errored: boolean;
  responseLength: number;
  tokens?: { response_ids: number[]; loss_mask: number[] };
  /** A branch of tree rollouts (its group is its siblings). */
  branch: boolean;
  /** A sample that branched: where, and into how many. */
  branched?: { offset: number; of: number };
}

/** A group as scored: its members' shaped rewards, episode advantages and step grouping. */
interface Scored {
  items: Item[];
  rewards: number[];
  advantages: number[];
  grouping?: StepGrouping;
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
    .option('--stats <file>', 'write the JSON stats line to FILE (default: stderr, when there is news)')
    .option(
      '--overlong-buffer <n>',
      "DAPO's soft overlong penalty: the last N tokens of --max-tokens in which it grows (off when absent)",
      integer(1),
    )
    .option('--overlong-penalty <x>', 'the overlong penalty at the budget (DAPO: 1)', number(0), 1)
    .option('--max-tokens <n>', "the rollout's response budget, for --overlong-buffer", integer(1))
    .option(
      '--step-weight <w>',
      'add W x the step-level (GiGPO) advantage on each model turn: per-token `advantages` (0: off)',
      number(0),
      0,
    )
    .option('--gamma <g>', 'discount per later turn of the step returns (--step-weight)', number(0, 1), 0.95)
    .addOption(
      choice(
        '--branch-credit <how>',
        "tree rollouts: siblings, a branch group is credited among its branches; with-parent, the parent's continuation joins it (its tokens after the branch point are credited there)",
        ['siblings', 'with-parent'],
        'siblings',
      ),
    );
  groupStageOptions(cmd);
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<
    {
      baseline: Baseline;
      std: boolean;
      epsilon: number;
      stats?: string;
      overlongBuffer?: number;
      overlongPenalty: number;
      maxTokens?: number;
      stepWeight: number;
      gamma: number;
      branchCredit: 'siblings' | 'with-parent';
    } & GroupStageFlags
  >();
  let overlong: OverlongOptions | undefined;
  if (opts.overlongBuffer !== undefined) {
    if (opts.maxTokens === undefined) {
      throw new UsageError(
        "advantage: --overlong-buffer needs --max-tokens, the rollout's response budget it counts back from",
      );
    }
    overlong = { maxTokens: opts.maxTokens, buffer: opts.overlongBuffer, factor: opts.overlongPenalty };
    try {
      checkOverlong(overlong);
    } catch (error) {
      throw new UsageError(`advantage: ${(error as Error).message}`);
    }
  }
  const steps = opts.stepWeight > 0;
  const withParent = opts.branchCredit === 'with-parent';
  const baseline = { baseline: opts.baseline, normalizeStd: opts.std, epsilon: opts.epsilon };
  let penaltySum = 0;

  const stats: AdvantageStats = {
    groups_in: 0,
    groups_out: 0,
    records_in: 0,
    records_out: 0,
    infra_errors: 0,
    infra_error_groups: 0,
    infra_only_groups: 0,
    ...(overlong ? { overlong_penalized: 0, overlong_penalty_mean: 0 } : {}),
    ...(steps ? { step_turns: 0, step_groups: 0, step_turns_shared: 0 } : {}),
    ...(withParent ? { branch_groups_with_parent: 0 } : {}),
  };
  /** One group's shaped rewards, episode advantages and (with --step-weight) step grouping. */
  const score = (items: Item[]): Scored => {
    // The penalty shapes the training signal only: `reward` stays the verified outcome, which RoC,
    // the step statistics and eval read.
    const rewards = items.map((i) => {
      if (!overlong) return i.reward;
      const term = overlongPenalty(i.responseLength, overlong);
      penaltySum += term;
      if (term < 0) stats.overlong_penalized = (stats.overlong_penalized ?? 0) + 1;
      return i.reward + term;
    });
    const advantages = groupAdvantages(rewards, baseline);
    const grouping = steps
      ? stepAdvantages(
          items.map((i, k) => ({ ...(i.tokens as NonNullable<Item['tokens']>), reward: rewards[k] })),
          { gamma: opts.gamma, normalizeStd: opts.std, epsilon: opts.epsilon },
        )
      : undefined;
    if (grouping) {
      stats.step_groups = (stats.step_groups ?? 0) + grouping.groups;
      for (const sizes of grouping.groupSizes) {
        stats.step_turns = (stats.step_turns ?? 0) + sizes.length;
        stats.step_turns_shared = (stats.step_turns_shared ?? 0) + sizes.filter((n) => n > 1).length;
      }
    }
    return { items, rewards, advantages, grouping };
  };
  const perToken = (item: Item, episode: number, grouping: StepGrouping | undefined, k: number) =>
    grouping
      ? tokenAdvantages(
          (item.tokens as NonNullable<Item['tokens']>).loss_mask,
          episode,
          grouping.advantages[k],
          opts.stepWeight,
        )
      : undefined;
  /** Writes a record with its episode advantage and, when given, its per-token advantages. */
  const write = async (item: Item, advantage: number, tokens: number[] | undefined, out: NdjsonWriter) => {
    let line = appendField(item.raw, 'advantage', advantage);
    if (tokens) line = appendField(line, 'advantages', tokens);
    await out.writeRaw(line);
    stats.records_out += 1;
  };
  const emit = async (s: Scored, out: NdjsonWriter) => {
    stats.groups_out += 1;
    for (const [k, item] of s.items.entries()) {
      await write(item, s.advantages[k], perToken(item, s.advantages[k], s.grouping, k), out);
      if (out.closed) return;
    }
  };

  // --branch-credit with-parent: a problem group waits for the branch groups of its members that
  // branched (and a branch group for its parent's problem group), until a batch end or the end.
  const roots = new Map<string, { members: Member<Item>[]; waiting: Set<string> }>();
  const branches = new Map<string, Member<Item>[]>();
  const rootOf = new Map<string, string>();
  const pointOf = (m: Member<Item>) =>
    m.item.branched === undefined ? undefined : `${m.id}@${m.item.branched.offset}`;
  /**
   * A problem group and the branch groups of its members: a parent's tokens before its branch point
   * take its advantage in the problem group, those after it its advantage among its branches (its
   * continuation is one more sample from the same state); the branches are credited against the
   * parent's continuation and each other.
   */
  const emitTree = async (key: string, out: NdjsonWriter) => {
    const root = roots.get(key) as { members: Member<Item>[] };
    roots.delete(key);
    const s = score(root.members.map((m) => m.item));
    stats.groups_out += 1;
    const after: (() => Promise<void>)[] = [];
    for (const [k, m] of root.members.entries()) {
      const point = pointOf(m);
      const siblings = point === undefined ? undefined : branches.get(point);
      let tokens = perToken(m.item, s.advantages[k], s.grouping, k);
      if (point !== undefined && siblings !== undefined) {
        branches.delete(point);
        rootOf.delete(point);
        const b = score(siblings.map((x) => x.item));
        const joint = groupAdvantages([s.rewards[k], ...b.rewards], baseline);
        const offset = (m.item.branched as { offset: number }).offset;
        const mask = (m.item.tokens as NonNullable<Item['tokens']>).loss_mask;
        const base = tokens ?? mask.map((x) => (x === 1 ? s.advantages[k] : 0));
        const shift = Math.fround(joint[0] - s.advantages[k]);
        tokens = base.map((a, i) => (i >= offset && mask[i] === 1 ? Math.fround(a + shift) : a));
        stats.branch_groups_with_parent = (stats.branch_groups_with_parent ?? 0) + 1;
        after.push(async () => {
          stats.groups_out += 1;
          for (const [j, x] of b.items.entries()) {
            if (out.closed) return;
            await write(x, joint[j + 1], perToken(x, joint[j + 1], b.grouping, j), out);
          }
        });
      }
      await write(m.item, s.advantages[k], tokens, out);
      if (out.closed) return;
    }
    for (const next of after) await next();
  };

  const finished = await runGroupStage<Item>({
    command: 'advantage',
    file: cmd.args[0],
    flags: opts,
    task: { kind: 'advantage', steps, branches: withParent },
    fields: (record) => ({
      responseLength: record.responseLength,
      tokens: record.tokens,
      branch: record.groupSize !== undefined,
      ...(record.branched ? { branched: record.branched } : {}),
    }),
    counts: stats,
    each: async (group, members, out) => {
      if (!withParent) return emit(score(members.map((m) => m.item)), out);
      if (members[0]?.item.branch) {
        branches.set(group.key, members);
        const key = rootOf.get(group.key);
        const root = key === undefined ? undefined : roots.get(key);
        if (key === undefined || root === undefined) return;
        root.waiting.delete(group.key);
        if (root.waiting.size === 0) await emitTree(key, out);
        return;
      }
      const waiting = new Set<string>();
      for (const m of members) {
        const point = pointOf(m);
        if (point === undefined) continue;
        rootOf.set(point, group.key);
        if (!branches.has(point)) waiting.add(point);
      }
      roots.set(group.key, { members, waiting });
      if (waiting.size === 0) await emitTree(group.key, out);
    },
    flush: async (out) => {
      // A branch group roc-filter dropped never comes: its parent is credited in its problem group.
      for (const key of [...roots.keys()]) {
        await emitTree(key, out);
        if (out.closed) return;
      }
      // Branches whose parent roc-filter dropped: credited among themselves.
      for (const [point, members] of branches) {
        branches.delete(point);
        await emit(score(members.map((m) => m.item)), out);
        if (out.closed) return;
      }
      rootOf.clear();
    },
  });
  if (!finished) return;
  if (overlong) stats.overlong_penalty_mean = stats.records_out > 0 ? penaltySum / stats.records_out : 0;
  const line = `${JSON.stringify(stats)}\n`;
  if (opts.stats) writeFileSync(opts.stats, line);
  else if (stats.infra_errors > 0 || interactive()) process.stderr.write(`rstar advantage: ${line}`);
}
