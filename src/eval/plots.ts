import * as vega from 'vega';
import type { TopLevelSpec } from 'vega-lite';
import * as vl from 'vega-lite';
import type { CurvePoint } from './curve.js';
import { isCorrect, type Sample } from './metrics.js';

/**
 * Every figure of `rstar eval` is a Vega-Lite spec built here and rendered by renderSvg; the modules
 * that own the data (run.ts's reports, curve.ts's curve.jsonl) only hand it over.
 */

/** Renders a Vega-Lite spec to a standalone SVG string, headless (no DOM, no canvas). */
export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

export interface PassAtKPoint {
  benchmark: string;
  k: number;
  pass: number;
}

/** pass@k against k (log2 axis), one line per benchmark: how much sampling more buys. */
export function passAtKSpec(points: PassAtKPoint[], title = 'pass@k'): TopLevelSpec {
  const ks = [...new Set(points.map((p) => p.k))].sort((a, b) => a - b);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    width: 420,
    height: 280,
    data: { values: points },
    mark: { type: 'line', point: true },
    encoding: {
      x: {
        field: 'k',
        type: 'quantitative',
        title: 'k (samples)',
        scale: { type: 'log', base: 2, domain: ks.length > 1 ? [ks[0], ks[ks.length - 1]] : undefined },
        axis: { values: ks, format: 'd' },
      },
      y: {
        field: 'pass',
        type: 'quantitative',
        title: 'pass@k',
        scale: { domain: [0, 1] },
        axis: { format: '%' },
      },
      color: { field: 'benchmark', type: 'nominal', title: 'benchmark' },
      tooltip: [{ field: 'benchmark' }, { field: 'k' }, { field: 'pass', format: '.3f' }],
    },
  };
}

/** Response-length histogram, bars split into correct and incorrect trajectories. */
export function lengthSpec(benchmark: string, samples: readonly Sample[]): TopLevelSpec {
  const values = samples.map((s) => ({ tokens: s.tokens, outcome: isCorrect(s) ? 'correct' : 'incorrect' }));
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: `${benchmark}: response length (tokens, tool output included)`,
    width: 420,
    height: 240,
    data: { values },
    mark: 'bar',
    encoding: {
      x: { field: 'tokens', type: 'quantitative', bin: { maxbins: 30 }, title: 'response tokens' },
      y: { aggregate: 'count', type: 'quantitative', title: 'trajectories', axis: { tickMinStep: 1 } },
      color: {
        field: 'outcome',
        type: 'nominal',
        scale: { domain: ['correct', 'incorrect'], range: ['#4c9f70', '#d1495b'] },
        title: null,
      },
    },
  };
}

/** The end of each RL stage: demo.sh's `stageN` evaluations, at the stage's last step. */
function stageEnds(points: readonly CurvePoint[]): { step: number; label: string }[] {
  return points.flatMap((p) => {
    const stage = /^stage(\d+)$/.exec(p.eval ?? '');
    return stage ? [{ step: p.step, label: `stage ${stage[1]} ends` }] : [];
  });
}

/** Training reward and held-out avg@n against the RL step, one line each; stage ends dashed. */
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
    // tool use of the step's rollouts (issue 32), where rollout recorded it
    ...(p.train_multi_call_share !== undefined
      ? [{ step: p.step, series: 'rollouts with 2+ tool calls', value: p.train_multi_call_share }]
      : []),
    ...(p.train_positive_tool_error_rate !== undefined
      ? [
          {
            step: p.step,
            series: 'tool-error ratio in correct rollouts',
            value: p.train_positive_tool_error_rate,
          },
        ]
      : []),
  ]);
  values.push(...smooth);
  const ends = stageEnds(points);
  const x = { field: 'step', type: 'quantitative', title: 'RL step', axis: { tickMinStep: 1 } } as const;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    width: 480,
    height: 280,
    layer: [
      {
        data: { values },
        mark: { type: 'line', point: true },
        encoding: {
          x,
          y: {
            field: 'value',
            type: 'quantitative',
            title: 'accuracy',
            scale: { domain: [0, 1] },
            axis: { format: '%' },
          },
          // below the plot, one entry a row and no label limit: the long series names stay whole
          color: {
            field: 'series',
            type: 'nominal',
            title: null,
            legend: { orient: 'bottom', direction: 'vertical', labelLimit: 0 },
          },
          tooltip: [{ field: 'series' }, { field: 'step' }, { field: 'value', format: '.3f' }],
        },
      },
      ...(ends.length > 0
        ? [
            {
              data: { values: ends },
              mark: { type: 'rule' as const, strokeDash: [4, 4], color: '#888' },
              encoding: { x },
            },
            {
              data: { values: ends },
              mark: {
                type: 'text' as const,
                align: 'right' as const,
                baseline: 'bottom' as const,
                angle: 270,
                dx: -4,
                y: 0,
                color: '#666',
              },
              encoding: { x, text: { field: 'label' } },
            },
          ]
        : []),
    ],
  };
}
