import { z } from 'zod';
import { version } from './common.js';

/** Output of `train-step`: one optimiser step. */
export const Step = z.looseObject({
  v: version.describe('record schema version (1)'),
  step: z
    .int()
    .nonnegative()
    .describe(
      "the optimiser step's number (continues from the checkpoint's trainer_state.json, or end_batch's step)",
    ),
  policy: z.string().describe('policy id: --policy with {step} filled in, default the checkpoint path'),
  checkpoint: z.string().describe('absolute path of the checkpoint this step wrote'),
  loss: z.number().describe("mean loss over the step's loss tokens"),
  pg_clipfrac: z.number().describe('GRPO: share of tokens whose ratio was clipped'),
  approx_kl: z.number().describe('GRPO: approximate KL between the policy before and after the update'),
  entropy: z.number().describe('mean token entropy of the policy on the batch'),
  grad_norm: z.number().describe('gradient norm before clipping'),
  lr: z.number().describe('learning rate used for this step'),
  sequences: z.int().nonnegative().describe('records trained on'),
  tokens: z.int().nonnegative().describe('prompt + response tokens trained on'),
  seconds: z.number().nonnegative().describe('wall-clock seconds of the step'),
  updates: z
    .int()
    .nonnegative()
    .optional()
    .describe(
      'optimiser updates this step made (--mini-batches x --passes-per-batch; 0 for an empty numbered step)',
    ),
  mini_batches: z
    .int()
    .nonnegative()
    .optional()
    .describe('mini-batches the batch was split into (--mini-batches)'),
  epochs: z.int().nonnegative().optional().describe('passes over the batch (--passes-per-batch)'),
  logprob_mismatch: z
    .number()
    .optional()
    .describe('mean |rollout - trainer| log-prob over the sampled tokens (records with logprobs)'),
  rollout_kl: z
    .number()
    .optional()
    .describe('k3 estimate of KL(pi_rollout || pi_trainer) on the sampled tokens'),
  rollout_correction: z
    .enum(['token-tis', 'seq-mask', 'none'])
    .optional()
    .describe('how the rollout/trainer mismatch was corrected (--rollout-correction)'),
  tis_capped_frac: z.number().optional().describe('token-tis: share of tokens whose IS weight hit the cap'),
  seq_masked_frac: z.number().optional().describe('seq-mask: share of sequences masked out'),
  skipped: z.string().optional().describe('why a numbered step trained nothing'),
  adapter: z
    .literal(true)
    .optional()
    .describe(
      'LoRA (--lora-rank/--lora-init): the checkpoint is an adapter folder in PEFT format (adapter_config.json, adapter_model.safetensors) over the base named by its base_model_name_or_path, not a full checkpoint',
    ),
});
export type Step = z.output<typeof Step>;

/**
 * The line that closes one step's batch in the RL pipeline (`rollout --steps`): roc-filter and
 * advantage pass it on after the step's groups; train-step trains on what came before it, names the
 * checkpoint after `step` and may take `lr` for the step (a driver owning the schedule).
 */
export const EndBatch = z.looseObject({
  v: version.optional(),
  end_batch: z.literal(true).describe("closes one step's batch"),
  step: z.int().nonnegative().optional().describe('the step this batch trains (names its checkpoint)'),
  lr: z.number().positive().optional().describe("this step's learning rate, when a driver owns the schedule"),
  stats: z
    .looseObject({
      problems: z.int().nonnegative(),
      trajectories: z.int().nonnegative(),
      mean_reward: z.number(),
      mixed_groups: z.int().nonnegative(),
      rounds: z.int().nonnegative(),
      policy_version: z.int().nonnegative(),
      /** Generated turns by the weight_version they finished under (trajectories' turn_versions). */
      turns_by_version: z.record(z.string(), z.int().nonnegative()).optional(),
      /** With `--tool-cache group`: calls answered from a shared result, those re-run by the audit, how many differed, and every call through the cache. */
      tool_cache: z
        .object({
          hits: z.int().nonnegative(),
          audited: z.int().nonnegative(),
          mismatches: z.int().nonnegative(),
          /** Every call that went through the cache (absent from steps written before it was counted). */
          calls: z.int().nonnegative().optional(),
        })
        .optional(),
      /** The step's tool use (src/algo/tool-use.ts, docs/eval.md "Agentic tool use"), over the scored trajectories. */
      tool_use: z.record(z.string(), z.number().nullable()).optional(),
      /** The same per problem family (meta.family, or a curriculum id's prefix). */
      tool_use_by_family: z.record(z.string(), z.record(z.string(), z.number().nullable())).optional(),
      tool_use_multi_step: z.record(z.string(), z.number().nullable()).optional(),
      /** With `--tool-state session` (its cells are shared by their whole history, in `tool_cache`). */
      tool_state: z.literal('session').optional(),
      /** With `--tool-state session`: lost sessions rebuilt by replaying their finished cells, over the step. */
      session_replays: z.int().nonnegative().optional(),
      /** Tokens the model generated this step (loss_mask 1), a branch's own part only: the budget arms are compared at. */
      generated_tokens: z.int().nonnegative().optional(),
      /**
       * With `--branch`: branch points taken, branch samples, those correct, those correct after a
       * failed call and a later successful one (recovered), infrastructure failures, and their tokens.
       */
      branches: z
        .object({
          points: z.int().nonnegative(),
          samples: z.int().nonnegative(),
          correct: z.int().nonnegative(),
          recovered: z.int().nonnegative(),
          errors: z.int().nonnegative(),
          tokens: z.int().nonnegative(),
        })
        .optional(),
      wait_seconds: z.number().nonnegative(),
      seconds: z.number().nonnegative(),
    })
    .optional()
    .describe(
      "rollout's statistics of the step: problems, trajectories, mean_reward, mixed_groups, refill rounds, policy_version, turns_by_version, tool_cache counts (or tool_state session and its session_replays), tool_use (src/algo/tool-use.ts: trajectories, tool_calls_per_traj, failed_calls_per_traj, unparsable_calls_per_traj, multi_call_share, tool_error_rate, unparsable_call_rate, recovery_rate, positive_tool_error_rate, positive_error_share, accuracy; docs/eval.md) and tool_use_by_family, tool_use_multi_step (the multi-step problems together, meta.steps >= 2; root samples only), generated_tokens, branches (--branch: points, samples, correct, recovered, errors, tokens), seconds waiting for the policy and in all",
    ),
});
export type EndBatch = z.output<typeof EndBatch>;
