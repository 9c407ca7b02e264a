import { writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { openInput, parseLine, readLines } from '../ndjson/index.js';

/**
 * One point of an RL run's learning curve (`curve.jsonl`, written by recipes/rl.sh and demo.sh): at
 * `step`, the mean training reward of that step's rollouts and/or the held-out avg@n of the step's
 * checkpoint. This module owns the file; plots.ts draws it.
 */
export const CurvePoint = z.looseObject({
  v: z.literal(1),
  step: z.int().nonnegative().describe('the RL step (0: the checkpoint RL starts from)'),
  stage: z.string().optional(),
  train_reward: z.number().min(0).max(1).optional().describe("mean reward of the step's rollouts"),
  'heldout_avg@n': z.number().min(0).max(1).optional().describe("held-out avg@n of the step's checkpoint"),
  train_multi_call_share: z
    .number()
    .min(0)
    .max(1)
    .optional()
    .describe("share of the step's rollouts with 2+ tool calls (end_batch stats.tool_use)"),
  train_positive_tool_error_rate: z
    .number()
    .min(0)
    .max(1)
    .optional()
    .describe("failed tool calls / tool calls in the step's correct rollouts (the paper's RoC figure)"),
  eval: z
    .string()
    .optional()
    .describe(
      'the evaluation behind heldout_avg@n (demo.sh: sft, stepK, stageN, rl); stageN ends RL stage N',
    ),
});
export type CurvePoint = z.output<typeof CurvePoint>;

export async function readCurve(file: string): Promise<CurvePoint[]> {
  const out: CurvePoint[] = [];
  const { stream, source } = openInput(file);
  for await (const entry of readLines(stream, source)) {
    if (entry.text.trim() !== '') out.push(parseLine(CurvePoint, entry));
  }
  return out;
}

/** Renders FILE (curve.jsonl) to curve.svg beside it; returns the SVG's path. */
export async function plotCurve(file: string): Promise<string> {
  // loaded here: vega is heavy, and readers of the schema (rstar view) draw nothing
  const { curveSpec, renderSvg } = await import('./plots.js');
  const svg = await renderSvg(curveSpec(await readCurve(file)));
  const out = join(dirname(file), 'curve.svg');
  await writeFile(out, svg);
  return out;
}
