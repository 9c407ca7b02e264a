// The overview's curves, as vega-lite specs rendered to SVG by vega (both served from this
// install, never a CDN). Each chart plots one or more series per run; runs overlay by colour.

/** The overview's charts: a title and the per-step fields it plots (label -> field). */
export const CHARTS = [
  {
    id: 'reward',
    title: 'Training reward (mean per step) and held-out avg@n',
    series: { 'train reward': 'train_reward' },
    heldout: true,
  },
  { id: 'length', title: 'Response length (tokens per trajectory)', series: { tokens: 'response_tokens' } },
  {
    id: 'tools',
    title: 'Tool calls and tool errors per trajectory',
    series: { 'tool calls': 'tool_calls_per_traj', 'tool errors': 'tool_errors_per_traj' },
  },
  {
    id: 'format',
    title: 'Format violations and truncations (share of trajectories)',
    series: { 'format violations': 'format_violation_share', truncated: 'truncated_share' },
  },
  { id: 'entropy', title: 'Entropy', series: { entropy: 'entropy' } },
  {
    id: 'kl',
    title: 'KL (approx) and rollout KL',
    series: { 'approx KL': 'approx_kl', 'rollout KL': 'rollout_kl' },
  },
  { id: 'clip', title: 'Clip fraction', series: { 'clip fraction': 'pg_clipfrac' } },
  { id: 'grad', title: 'Gradient norm', series: { 'grad norm': 'grad_norm' } },
  { id: 'tis', title: 'TIS capped share', series: { 'TIS capped': 'tis_capped_frac' } },
  {
    id: 'sequences',
    title: 'Trained sequences (kept by RoC)',
    series: { sequences: 'sequences', 'mixed groups': 'mixed_groups' },
  },
];

function lineSpec(values, rules, title, heldout) {
  const layers = [
    {
      data: { values },
      mark: { type: 'line', point: { size: 18 }, strokeWidth: 1.5 },
      encoding: {
        x: { field: 'step', type: 'quantitative', title: 'step' },
        y: { field: 'value', type: 'quantitative', title: null, scale: { zero: false } },
        color: { field: 'series', type: 'nominal', title: null },
        tooltip: [
          { field: 'series', type: 'nominal' },
          { field: 'step', type: 'quantitative' },
          { field: 'value', type: 'quantitative', format: '.4f' },
        ],
      },
    },
  ];
  if (heldout && heldout.length > 0) {
    layers.push({
      data: { values: heldout },
      mark: { type: 'point', shape: 'diamond', size: 80, filled: true },
      encoding: {
        x: { field: 'step', type: 'quantitative' },
        y: { field: 'value', type: 'quantitative' },
        color: { field: 'series', type: 'nominal' },
        tooltip: [
          { field: 'series', type: 'nominal' },
          { field: 'eval', type: 'nominal' },
          { field: 'value', type: 'quantitative', format: '.3f' },
        ],
      },
    });
  }
  if (rules.length > 0) {
    layers.push({
      data: { values: rules },
      mark: { type: 'rule', strokeDash: [4, 3], color: '#999' },
      encoding: { x: { field: 'at', type: 'quantitative' }, tooltip: [{ field: 'label', type: 'nominal' }] },
    });
  }
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: title, fontSize: 12, anchor: 'start' },
    width: 'container',
    height: 160,
    layer: layers,
    config: { legend: { orient: 'bottom', labelLimit: 260 }, view: { stroke: null } },
  };
}

/** The stacked step time: generation, waiting for the policy, training. */
function timeSpec(values, title) {
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: title, fontSize: 12, anchor: 'start' },
    width: 'container',
    height: 160,
    data: { values },
    mark: { type: 'bar' },
    encoding: {
      x: { field: 'step', type: 'ordinal', title: 'step', axis: { labelOverlap: true } },
      y: { field: 'value', type: 'quantitative', title: 'seconds', stack: 'zero' },
      color: { field: 'series', type: 'nominal', title: null },
      tooltip: [
        { field: 'series', type: 'nominal' },
        { field: 'step', type: 'quantitative' },
        { field: 'value', type: 'quantitative', format: '.1f' },
      ],
    },
    config: { legend: { orient: 'bottom' }, view: { stroke: null } },
  };
}

/** Renders a spec into `el` as SVG; resolves to the number of data values plotted. */
export async function render(el, spec, count) {
  const compiled = window.vegaLite.compile(spec).spec;
  const view = new window.vega.View(window.vega.parse(compiled), {
    renderer: 'svg',
    container: el,
    hover: true,
  });
  await view.runAsync();
  el.dataset.points = String(count);
  return view;
}

/** [{run, overview}] -> chart specs with their data counts. */
export function overviewSpecs(sets) {
  const label = (run, series) => (sets.length > 1 ? `${run}: ${series}` : series);
  const rulesOf = (set) =>
    set.overview.stages
      .filter((s) => s.first > 1)
      .map((s) => ({ at: s.first - 0.5, label: `${set.run}: stage ${s.stage} starts at step ${s.first}` }));
  const rules = sets.flatMap(rulesOf);
  const out = [];
  for (const c of CHARTS) {
    const values = [];
    for (const set of sets) {
      for (const [name, field] of Object.entries(c.series)) {
        for (const p of set.overview.steps) {
          let v = p[field];
          if (field === 'train_reward' && (v === undefined || v === null)) v = p.mean_reward;
          if (typeof v === 'number' && Number.isFinite(v))
            values.push({ step: p.step, value: v, series: label(set.run, name) });
        }
      }
    }
    const heldout = c.heldout
      ? sets.flatMap((set) =>
          set.overview.heldout.map((x) => ({ ...x, series: label(set.run, 'held-out avg@n') })),
        )
      : [];
    if (values.length + heldout.length === 0) continue;
    out.push({
      id: c.id,
      spec: lineSpec(values, rules, c.title, heldout),
      count: values.length + heldout.length,
    });
  }
  for (const set of sets) {
    const values = [];
    for (const p of set.overview.steps) {
      for (const [series, field] of [
        ['generation', 'generate_seconds'],
        ['waiting for the policy', 'wait_seconds'],
        ['training', 'train_seconds'],
      ]) {
        if (typeof p[field] === 'number') values.push({ step: p.step, value: p[field], series });
      }
    }
    if (values.length > 0)
      out.push({
        id: `time-${set.index}`,
        spec: timeSpec(values, `Step time: ${set.run}`),
        count: values.length,
      });
  }
  return out;
}
