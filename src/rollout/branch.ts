/**
 * Tree rollouts (`rollout --branch K`): when a sample's tool call fails, K more continuations are
 * sampled from the state just after that call's response. They share the prefix token for token
 * (the engine's prefix cache makes it nearly free), and in session mode a fork of the sandbox
 * session. Each sample branches at most once (at its first turn with a failed or unparsable call),
 * branches never branch again, and a budget bounds the branch samples of a step (of a run without
 * --steps). The siblings form a group of their own downstream (`branchGroupKey`), trained on the
 * tokens after the branch point only: a recovery that ends correct is credited against the
 * continuations from the same state that do not.
 */
import type { Branch, Trajectory } from '../records/trajectory.js';
import type { AgentSnapshot } from './agent.js';
import type { ProtocolContext } from './protocol.js';

/** The branch samples a step (or a run) may still spend, and what it spent; shared by its rounds. */
export interface BranchBudget {
  left: number;
  /** Branch points taken. */
  points: number;
  /** Branch samples started. */
  samples: number;
}

export const branchBudget = (samples: number): BranchBudget => ({ left: samples, points: 0, samples: 0 });

/** `--branch-budget`'s default: half as many branch samples as samples (`n` × problems). */
export const defaultBranchBudget = (n: number, problems: number): number => Math.floor((n * problems) / 2);

export interface BranchOptions {
  /** Continuations per branch point. */
  k: number;
  budget: BranchBudget;
}

/**
 * The continuations a new branch point gets: K, or what is left of the budget; none when fewer
 * than 2 would be left, since a group of one has no baseline to be credited against.
 */
export function claimBranches(options: BranchOptions): number {
  const k = Math.min(options.k, options.budget.left);
  if (k < 2) return 0;
  options.budget.left -= k;
  options.budget.points += 1;
  options.budget.samples += k;
  return k;
}

/** Gives back what `claimBranches` took when the branches could not start (a failed fork). */
export function releaseBranches(options: BranchOptions, k: number): void {
  options.budget.left += k;
  options.budget.points -= 1;
  options.budget.samples -= k;
}

/** Where a branch starts, as its job carries it. */
export interface BranchStart {
  parent: string;
  at: AgentSnapshot;
  index: number;
  of: number;
  /** The engine weight_version of each of the prefix's turns (the record's `turn_versions`). */
  versions: (string | undefined)[];
}

/**
 * A finished branch as its record says it: the shared prefix masked out of training (loss_mask and
 * logprobs 0: it is trained with its parent) and `branch` naming the parent and the branch point.
 * The prefix's text is located by decoding it: it ends with the tool turn's template tokens, so
 * the whole response's text starts with it.
 */
export function branchRecord(record: Trajectory, start: BranchStart, protocol: ProtocolContext): Trajectory {
  const offset = start.at.response_ids.length;
  const prefixText = offset > 0 ? protocol.tokenizer.decode(start.at.response_ids) : '';
  if (!record.text.startsWith(prefixText)) {
    throw new Error(`branch ${record.id}: the response's text does not start with its prefix's text`);
  }
  const branch: Branch = {
    parent: start.parent,
    offset,
    text_offset: prefixText.length,
    turn: start.at.turns,
    calls: start.at.tool_calls,
    index: start.index,
    of: start.of,
  };
  const loss_mask = record.loss_mask.map((m, i) => (i < offset ? 0 : m));
  const logprobs = record.logprobs.map((lp, i) => (i < offset ? 0 : lp));
  return { ...record, sample: start.index, loss_mask, logprobs, branch };
}
