import * as vega from 'vega';
import type { TopLevelSpec } from 'vega-lite';
import * as vl from 'vega-lite';
import { isCorrect, type Sample } from './metrics.js';

/** Renders a Vega-Lite spec to a standalone SVG string, headless (no DOM, no canvas). */
export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

export interface CurvePoint {
  benchmark: string;
  k: number;
  pass: number;
}

/** pass@k against k (log2 axis), one line per benchmark: how much sampling more buys. */
export function passAtKSpec(points: CurvePoint[], title = 'pass@k'): TopLevelSpec {
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
