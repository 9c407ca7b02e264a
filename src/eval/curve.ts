import { writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { TopLevelSpec } from 'vega-lite';
import { z } from 'zod';
import { openInput, parseLine, readLines } from '../ndjson/index.js';
import { renderSvg } from './plots.js';

/**
 * One point of an RL run's learning curve (`curve.jsonl`, written by recipes/rl.sh): at `step`, the
 * mean training reward of that step's rollouts and/or the held-out avg@n of the step's checkpoint.
 */
export const CurvePoint = z.looseObject({
  v: z.literal(1),
  step: z.int().nonnegative(),
  stage: z.string().optional(),
  train_reward: z.number().min(0).max(1).optional(),
  'heldout_avg@n': z.number().min(0).max(1).optional(),
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

/** Training reward and held-out avg@n against the RL step, one line each. */
export function curveSpec(points: readonly CurvePoint[], title = 'RL learning curve'): TopLevelSpec {
  // A step's reward is 16 problems' worth: noisy. The trailing 10-step mean shows the trend.
  const rewards = points.filter((p) => p.train_reward !== undefined).sort((a, b) => a.step - b.step);
  const smooth = rewards.map((p, i) => {
    const window = rewards.slice(Math.max(0, i - 9), i + 1);
    const mean = window.reduce((s, q) => s + (q.train_reward ?? 0), 0) / window.length;
    return { step: p.step, series: 'training reward (10-step mean)', value: mean };
  });
  const values = points.flatMap((p) => [
    ...(p.train_reward !== undefined
      ? [{ step: p.step, series: 'training reward (step mean)', value: p.train_reward }]
      : []),
    ...(p['heldout_avg@n'] !== undefined
      ? [{ step: p.step, series: 'held-out avg@n', value: p['heldout_avg@n'] }]
      : []),
  ]);
  values.push(...smooth);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    width: 480,
    height: 280,
    data: { values },
    mark: { type: 'line', point: true },
    encoding: {
      x: { field: 'step', type: 'quantitative', title: 'RL step', axis: { tickMinStep: 1 } },
      y: {
        field: 'value',
        type: 'quantitative',
        title: 'accuracy',
        scale: { domain: [0, 1] },
        axis: { format: '%' },
      },
      color: { field: 'series', type: 'nominal', title: null },
      tooltip: [{ field: 'series' }, { field: 'step' }, { field: 'value', format: '.3f' }],
    },
  };
}

/** Renders FILE (curve.jsonl) to curve.svg beside it; returns the SVG's path. */
export async function plotCurve(file: string): Promise<string> {
  const svg = await renderSvg(curveSpec(await readCurve(file)));
  const out = join(dirname(file), 'curve.svg');
  await writeFile(out, svg);
  return out;
}
