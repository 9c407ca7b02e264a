// The viewer's page: four views over the runs (overview, steps, trajectories, evaluations) and a
// trajectory page, routed by the URL's #fragment. Data comes from the server's /api routes, or from
// the data/ scripts of an export (opened from disk, where fetch() cannot read files). Everything
// from a run is put in the page as text (dom.js).
import { drawCharts, overviewSpecs } from './charts.js';
import { fill, fmt, h, markdown, table } from './dom.js';
import { highlight } from './highlight.js';

const main = document.getElementById('main');
const PAGE = 200;
const CHUNK = 100;

// ---- data ----------------------------------------------------------------------------------

const scripts = new Map();
const waiting = new Map();
window.rstarData = (key, json) => {
  waiting.get(key)?.(json);
  waiting.delete(key);
};

/** An export's payload: data/<key>.js calls rstarData(key, json). */
function staticData(key) {
  if (!scripts.has(key)) {
    scripts.set(
      key,
      new Promise((resolve, reject) => {
        waiting.set(key, resolve);
        const s = document.createElement('script');
        s.src = `data/${key.replace(/[^A-Za-z0-9]+/g, '_')}.js`;
        s.onerror = () => reject(new Error(`missing ${s.src}`));
        document.head.append(s);
      }),
    );
  }
  return scripts.get(key);
}

async function api(path, query = {}) {
  if (window.RSTAR_STATIC) {
    const t = /^run\/(\d+)\/trajectory\/(\d+)$/.exec(path);
    if (t) return (await staticData(`run/${t[1]}/trajectories/${Math.floor(Number(t[2]) / CHUNK)}`))[t[2]];
    return staticData(path);
  }
  const qs = new URLSearchParams(query).toString();
  const res = await fetch(`api/${path}${qs ? `?${qs}` : ''}`, { credentials: 'same-origin' });
  if (!res.ok) throw new Error(`${path}: ${res.status} ${(await res.json().catch(() => ({}))).error ?? ''}`);
  return res.json();
}

const state = { runs: [], overview: new Map(), rows: new Map(), evals: new Map(), overlay: null };

async function loadRuns() {
  state.runs = await api('runs');
  const status = document.getElementById('status');
  fill(
    status,
    window.RSTAR_STATIC ? 'static export' : 'live',
    ' · ',
    state.runs.map((r) => r.name).join(', '),
    state.runs.some((r) => !r.indexed) ? ' · indexing trajectories…' : '',
  );
  const issues = state.runs.flatMap((r) => r.issues.map((i) => `${r.name}: ${i.where}: ${i.message}`));
  const count = state.runs.reduce((a, r) => a + r.issueCount, 0);
  fill(
    document.getElementById('issues'),
    count > 0
      ? h(
          'details',
          { class: 'issues' },
          h('summary', {}, `${count} unreadable lines (skipped)`),
          h(
            'ul',
            {},
            issues.map((i) => h('li', {}, i)),
          ),
        )
      : null,
  );
}

async function overview(run) {
  if (!state.overview.has(run)) state.overview.set(run, await api(`run/${run}/overview`));
  return state.overview.get(run);
}

/** A run's trajectory rows as objects; live, only the rows added since the last call are fetched. */
async function rows(run) {
  let have = state.rows.get(run);
  if (have && !have.stale) return have.list;
  const query = have && !window.RSTAR_STATIC ? { from: have.list.length, generation: have.generation } : {};
  const got = await api(`run/${run}/rows`, query);
  const objects = got.rows.map((values) => Object.fromEntries(got.columns.map((c, i) => [c, values[i]])));
  if (!have || got.generation !== have.generation || got.from === 0)
    have = { generation: got.generation, list: [] };
  have.list.push(...objects);
  have.stale = false;
  state.rows.set(run, have);
  return have.list;
}

async function evals(run) {
  if (!state.evals.has(run)) state.evals.set(run, await api(`run/${run}/evals`));
  return state.evals.get(run);
}

// ---- routing -------------------------------------------------------------------------------

function route() {
  const [path, qs] = location.hash.replace(/^#\/?/, '').split('?');
  return { page: path || 'overview', q: Object.fromEntries(new URLSearchParams(qs ?? '')) };
}

const link = (page, q) => `#/${page}?${new URLSearchParams(q).toString()}`;

function runPicker(q, page) {
  if (state.runs.length < 2) return null;
  return h(
    'label',
    { class: 'picker' },
    'run ',
    h(
      'select',
      { onchange: (e) => (location.hash = link(page, { ...q, run: e.target.value })) },
      state.runs.map((r) =>
        h('option', { value: r.index, selected: String(r.index) === String(q.run ?? 0) }, r.name),
      ),
    ),
  );
}

let rendering = 0;
async function show() {
  const token = ++rendering;
  const { page, q } = route();
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('on', a.dataset.page === page);
  const run = Number(q.run ?? 0);
  try {
    const view = await {
      overview: showOverview,
      steps: showSteps,
      trajectories: showTrajectories,
      trajectory: showTrajectory,
      group: showGroup,
      evals: showEvals,
    }[page]?.(q, run);
    if (token !== rendering || !view) return;
    main.dataset.page = page;
    fill(main, view);
    await view.ready;
    main.dataset.ready = page;
  } catch (error) {
    if (token === rendering) fill(main, h('p', { class: 'error' }, String(error.message ?? error)));
  }
}

// ---- overview ------------------------------------------------------------------------------

async function showOverview(q) {
  // The runs overlaid: ?runs=0,1 (two at most), default the first two.
  const picked = (
    q.runs ??
    state.runs
      .slice(0, 2)
      .map((r) => r.index)
      .join(',')
  )
    .split(',')
    .filter((x) => x !== '')
    .map(Number)
    .filter((i) => state.runs[i]);
  const sets = [];
  for (const i of picked) sets.push({ index: i, run: state.runs[i].name, overview: await overview(i) });
  const boxes =
    state.runs.length > 1
      ? h(
          'p',
          { class: 'picker' },
          'overlay: ',
          state.runs.map((r) =>
            h(
              'label',
              {},
              h('input', {
                type: 'checkbox',
                checked: picked.includes(r.index),
                onchange: (e) => {
                  const next = e.target.checked
                    ? [...picked, r.index].slice(-2)
                    : picked.filter((x) => x !== r.index);
                  location.hash = link('overview', { runs: next.join(',') });
                },
              }),
              ` ${r.name} `,
            ),
          ),
        )
      : null;
  const specs = overviewSpecs(sets);
  const grid = h('div', { class: 'charts' });
  const cells = specs.map((s) =>
    s.pending
      ? h(
          'div',
          { class: 'chart pending', 'data-chart': s.id },
          h('strong', {}, s.title),
          h('p', {}, 'waiting for the trajectories to be indexed…'),
        )
      : h('div', { class: 'chart', 'data-chart': s.id }),
  );
  grid.append(...cells);
  const summary = sets.map((s) => {
    const st = s.overview.steps;
    const last = st[st.length - 1];
    return h(
      'p',
      {},
      h('strong', {}, s.run),
      `: ${st.length} steps`,
      last ? `, last step ${last.step}` : '',
      s.overview.stages.length > 0
        ? `, stages start at ${s.overview.stages.map((x) => x.first).join(', ')}`
        : '',
      s.overview.heldout.length > 0
        ? `, held-out avg@n ${s.overview.heldout.map((x) => `${x.eval || x.step} ${fmt(x.value)}`).join(' · ')}`
        : '',
    );
  });
  const view = h(
    'section',
    {},
    h('h1', {}, 'Overview'),
    boxes,
    summary,
    specs.length === 0 ? h('p', {}, 'No steps yet.') : grid,
  );
  // ready once the charts in the window are drawn; the others are drawn after (charts.js)
  view.ready = drawCharts(grid, cells, specs);
  return view;
}

// ---- steps ---------------------------------------------------------------------------------

async function showSteps(q, run) {
  const o = await overview(run);
  const versions = (p) =>
    p.turns_by_version
      ? Object.entries(p.turns_by_version)
          .map(([v, n]) => `v${v}: ${n}`)
          .join(', ')
      : '';
  const body = o.steps.map((p) =>
    h(
      'tr',
      { 'data-step': p.step },
      h('td', {}, h('a', { href: link('trajectories', { run, step: p.step }) }, String(p.step))),
      h('td', {}, p.stage === null ? '' : String(p.stage)),
      [p.problems, p.mixed_groups, p.rounds, p.trajectories ?? p.indexed, p.roc_kept, p.roc_dropped].map(
        (x) => h('td', { class: 'num' }, fmt(x)),
      ),
      h('td', { class: 'num' }, fmt(p.train_reward ?? p.mean_reward)),
      h('td', {}, p.policy_version === undefined ? '' : String(p.policy_version)),
      h('td', {}, versions(p)),
      [p.generate_seconds, p.wait_seconds, p.train_seconds].map((x) => h('td', { class: 'num' }, fmt(x, 1))),
      h('td', { class: 'num' }, fmt(p.generated_tokens)),
      // rollout's own counts (its end_batch stats.branches), served as they are: the page adds nothing
      h(
        'td',
        { class: 'num', 'data-branches': '' },
        p.branches
          ? `${p.branches.points} · ${p.branches.samples} · ${p.branches.correct} · ${p.branches.recovered}`
          : '',
      ),
      h('td', {}, p.skipped ?? ''),
    ),
  );
  return h(
    'section',
    {},
    h('h1', {}, 'Steps'),
    runPicker(q, 'steps'),
    table(
      [
        'step',
        'stage',
        'problems',
        'mixed groups',
        'refill rounds',
        'trajectories',
        'RoC kept',
        'RoC dropped',
        'reward',
        'policy version',
        'turns by version',
        'generation s',
        'waiting s',
        'training s',
        'generated tokens',
        'branch points · samples · correct · recovered',
        'skipped',
      ],
      body,
      { class: 'steps' },
    ),
  );
}

// ---- trajectories --------------------------------------------------------------------------

function matches(r, f) {
  if (f.step !== undefined && f.step !== '' && String(r.step) !== f.step) return false;
  if (f.eval && r.eval !== f.eval) return false;
  if (f.problem && !r.problem_id.includes(f.problem)) return false;
  if (f.family && r.family !== f.family) return false;
  if (f.reward === 'correct' && !(r.reward > 0)) return false;
  if (f.reward === 'wrong' && r.reward > 0) return false;
  if (f.finish && r.finish !== f.finish) return false;
  if (f.roc && r.roc !== f.roc) return false;
  if (f.tools !== undefined && f.tools !== '' && String(r.tool_calls) !== f.tools) return false;
  if (f.errors === 'any' && !(r.tool_errors > 0)) return false;
  if (f.errors === 'none' && r.tool_errors > 0) return false;
  if (f.tree === 'root' && r.branch) return false;
  if (f.tree === 'branch' && !r.branch) return false;
  return true;
}

function select(name, values, current, q, run) {
  return h(
    'label',
    {},
    `${name} `,
    h(
      'select',
      {
        name,
        onchange: (e) =>
          (location.hash = link('trajectories', { ...q, run, [name]: e.target.value, page: 0 })),
      },
      h('option', { value: '' }, 'any'),
      values.map((v) => h('option', { value: v, selected: String(v) === current }, String(v))),
    ),
  );
}

async function showTrajectories(q, run) {
  const all = await rows(run);
  const distinct = (key) =>
    [...new Set(all.map((r) => r[key]).filter((x) => x !== null))].sort((a, b) =>
      a < b ? -1 : a > b ? 1 : 0,
    );
  const list = all.filter((r) => matches(r, q));
  const page = Number(q.page ?? 0);
  const shown = list.slice(page * PAGE, (page + 1) * PAGE);
  const problemBox = h('input', {
    name: 'problem',
    value: q.problem ?? '',
    placeholder: 'problem id contains',
  });
  problemBox.addEventListener(
    'change',
    () => (location.hash = link('trajectories', { ...q, run, problem: problemBox.value, page: 0 })),
  );
  const form = h(
    'div',
    { class: 'filters' },
    select('step', distinct('step'), q.step, q, run),
    select('eval', distinct('eval'), q.eval, q, run),
    problemBox,
    select('family', distinct('family'), q.family, q, run),
    select('reward', ['correct', 'wrong'], q.reward, q, run),
    select('finish', distinct('finish'), q.finish, q, run),
    select('roc', ['kept', 'dropped'], q.roc, q, run),
    select('tools', distinct('tool_calls'), q.tools, q, run),
    select('errors', ['any', 'none'], q.errors, q, run),
    select('tree', ['root', 'branch'], q.tree, q, run),
  );
  const body = shown.map((r) =>
    h(
      'tr',
      { 'data-n': r.n },
      h('td', {}, h('a', { href: link('trajectory', { run, n: r.n }) }, r.id)),
      h('td', {}, r.step === null ? r.eval : String(r.step)),
      h(
        'td',
        {},
        r.step === null
          ? ''
          : h('a', { href: groupLink(run, r.step, r) }, r.branch ? 'branch group' : 'group'),
      ),
      h('td', {}, r.family),
      h('td', { class: r.reward > 0 ? 'num good' : 'num bad' }, fmt(r.reward)),
      h('td', {}, r.finish),
      h('td', {}, r.roc ?? ''),
      [r.turns, r.tool_calls, r.tool_errors, r.answer_tags, r.tokens].map((x) =>
        h('td', { class: 'num' }, fmt(x)),
      ),
      h('td', {}, r.answer ?? '—'),
      h('td', {}, r.turn_versions ? r.turn_versions.join(' ') : (r.policy_version ?? '')),
    ),
  );
  const pages = Math.max(1, Math.ceil(list.length / PAGE));
  const nav = h(
    'p',
    { class: 'pager' },
    `${list.length} of ${all.length} trajectories · page ${page + 1} of ${pages} `,
    page > 0 ? h('a', { href: link('trajectories', { ...q, run, page: page - 1 }) }, '← previous') : null,
    ' ',
    page + 1 < pages ? h('a', { href: link('trajectories', { ...q, run, page: page + 1 }) }, 'next →') : null,
  );
  return h(
    'section',
    {},
    h('h1', {}, 'Trajectories'),
    runPicker(q, 'trajectories'),
    form,
    nav,
    table(
      [
        'id',
        'step / eval',
        '',
        'family',
        'reward',
        'finish',
        'RoC',
        'turns',
        'tool calls',
        'tool errors',
        'answer tags',
        'tokens',
        'answer',
        'policy versions',
      ],
      body,
      {
        class: 'trajectories',
      },
    ),
  );
}

// ---- one trajectory ------------------------------------------------------------------------

function tokenView(tv) {
  // Each token shaded by its probability under the behaviour policy: white = certain, red = unlikely.
  const pre = h('pre', { class: 'tokens' });
  tv.text.forEach((text, i) => {
    const masked = tv.mask[i] === 0;
    const lp = tv.logprobs[i] ?? 0;
    const p = Math.exp(lp);
    const span = h('span', { title: masked ? 'tool output' : `log-prob ${lp.toFixed(3)}` }, text);
    span.style.background = masked ? '#eef' : `rgba(220, 40, 40, ${(1 - p).toFixed(3)})`;
    pre.append(span);
  });
  return pre;
}

/** A branch's turns with a mark where its own part starts: the turns before it are its parent's. */
function branchPoint(t, turns) {
  if (!t.branch || t.branch.turn === null) return turns;
  const at = t.segments.findIndex((s) => s.role === 'assistant' && s.turn === t.branch.turn);
  if (at === -1) return turns;
  const mark = h(
    'div',
    { class: 'branch-point' },
    `branch point: the turns above are ${t.branch.parent}'s (trained with it); this branch's own part starts here`,
  );
  return [...turns.slice(0, at), mark, ...turns.slice(at)];
}

async function showTrajectory(q, run) {
  const t = await api(`run/${run}/trajectory/${Number(q.n)}`, q.tokens === '1' ? { tokens: '1' } : {});
  const turns = t.segments.map((s) =>
    s.role === 'assistant'
      ? h(
          'div',
          { class: 'turn assistant' },
          h(
            'div',
            { class: 'who' },
            `model turn ${s.turn + 1}`,
            s.version !== null ? ` · policy version ${s.version}` : '',
          ),
          h('pre', { class: 'text' }, s.text),
          s.calls.map((c) =>
            h(
              'div',
              { class: 'call' },
              h('div', { class: 'who' }, `tool call ${c.name}`, c.parsed ? '' : ' (unparsable)'),
              c.parsed ? highlight(c.code) : h('pre', { class: 'text' }, c.code),
              c.input ? h('pre', { class: 'text' }, `stdin: ${c.input}`) : null,
            ),
          ),
        )
      : h(
          'div',
          { class: 'turn tool' },
          h('div', { class: 'who' }, 'tool response'),
          (s.responses.length > 0 ? s.responses : [s.text]).map((r) => h('pre', { class: 'text' }, r)),
        ),
  );
  const p = t.problem;
  const b = t.branch;
  const facts = [
    ['id', t.id],
    b
      ? [
          'branch',
          h(
            'span',
            { 'data-branch': '' },
            `branch ${b.index} of ${b.of} from `,
            b.parent_n === null
              ? b.parent
              : h('a', { href: link('trajectory', { run, n: b.parent_n }) }, b.parent),
            ` at token ${b.offset}${b.turn === null ? '' : ` (turn ${b.turn})`}`,
          ),
        ]
      : null,
    t.branches.length > 0
      ? [
          'branches',
          h(
            'ul',
            { class: 'branches' },
            t.branches.map((c) =>
              h(
                'li',
                { 'data-n': c.n },
                h('a', { href: link('trajectory', { run, n: c.n }) }, c.id),
                ` at token ${c.offset}: reward ${fmt(c.reward)}, ${c.finish}${c.roc ? `, RoC ${c.roc}` : ''}`,
              ),
            ),
          ),
        ]
      : null,
    ['where', t.where],
    [t.step === null ? 'evaluation' : 'step', t.step === null ? t.eval : String(t.step)],
    ['family', t.family],
    ['reward', fmt(t.reward)],
    ['answer', t.answer ?? '— (none)'],
    ['reference', p ? p.answer : '(problem file not found)'],
    ['finish', t.finish],
    ['turns · tool calls · tool errors', `${t.turns} · ${t.tool_calls} · ${t.tool_errors}`],
    ['answer tags', String(t.answer_tags)],
    [
      'RoC',
      t.roc
        ? `${t.roc} (${t.roc_outcome}); penalty tool ${fmt(t.penalty.tool_error)}, format ${fmt(t.penalty.format)}`
        : '—',
    ],
    ['policy', `${t.policy ?? ''}${t.policy_version !== null ? ` · version ${t.policy_version}` : ''}`],
    ['tokens', String(t.tokens)],
  ].filter((f) => f !== null);
  const tokensLink = window.RSTAR_STATIC
    ? null
    : h(
        'a',
        { href: link('trajectory', { run, n: t.n, tokens: q.tokens === '1' ? '0' : '1' }) },
        q.tokens === '1' ? 'hide token log-probs' : 'shade tokens by log-prob',
      );
  return h(
    'section',
    { class: 'trajectory' },
    h('h1', {}, `Trajectory ${t.id}`),
    h(
      'p',
      {},
      t.step !== null
        ? h(
            'a',
            { href: groupLink(run, t.step, t) },
            b
              ? `the branch group of ${b.parent} at token ${b.offset}, step ${t.step}`
              : `the ${t.problem_id} group of step ${t.step}`,
          )
        : null,
      ' ',
      h(
        'a',
        { href: link('trajectories', t.step !== null ? { run, step: t.step } : { run, eval: t.eval }) },
        'back to the list',
      ),
      ' ',
      tokensLink,
    ),
    table(['', ''], facts, { class: 'facts' }),
    h('h2', {}, 'Problem'),
    h('pre', { class: 'text problem' }, p ? p.prompt : `(no problem file in the run holds ${t.problem_id})`),
    t.token_view ? [h('h2', {}, 'Tokens'), tokenView(t.token_view)] : null,
    q.tokens === '1' && !t.token_view
      ? h('p', {}, 'No tokenizer found for this run (give rstar view --tokenizer DIR).')
      : null,
    h('h2', {}, 'Turns'),
    h('div', { class: 'turns' }, branchPoint(t, turns)),
  );
}

// ---- one problem's samples side by side ----------------------------------------------------

/**
 * A trajectory's RoC group: its problem's samples of the step, or for a branch its siblings from the
 * same branch point (`point`: PARENT@OFFSET, roc-filter's `branchGroupKey`).
 */
function groupLink(run, step, r) {
  return r.branch
    ? link('group', { run, step, problem: r.problem_id, point: `${r.branch.parent}@${r.branch.offset}` })
    : link('group', { run, step, problem: r.problem_id });
}

async function showGroup(q, run) {
  const all = await rows(run);
  const inGroup = q.point
    ? (r) => r.branch !== null && `${r.branch.parent}@${r.branch.offset}` === q.point
    : (r) => r.branch === null && r.problem_id === q.problem;
  const members = all
    .filter((r) => String(r.step) === q.step && r.eval === null && inGroup(r))
    .sort((a, b) => a.sample - b.sample);
  const details = await Promise.all(members.map((r) => api(`run/${run}/trajectory/${r.n}`)));
  const p = details[0]?.problem;
  const cols = members.map((r, i) =>
    h(
      'div',
      { class: `sample ${r.roc ?? ''}`, 'data-n': r.n },
      h(
        'div',
        { class: 'who' },
        h('a', { href: link('trajectory', { run, n: r.n }) }, `sample ${r.sample}`),
        ` · ${r.roc ?? 'RoC unknown'}`,
      ),
      table(
        ['', ''],
        [
          ['reward', fmt(r.reward)],
          ['answer', r.answer ?? '—'],
          ['finish', r.finish],
          ['tool calls / errors', `${r.tool_calls} / ${r.tool_errors}`],
          ['answer tags', String(r.answer_tags)],
          ['penalty tool · format', `${fmt(r.penalty_tool)} · ${fmt(r.penalty_format)}`],
          ['tokens', String(r.tokens)],
        ],
        { class: 'facts' },
      ),
      details[i].segments.map((s) =>
        s.role === 'assistant'
          ? [
              h('pre', { class: 'text small' }, s.text),
              s.calls.map((c) => (c.parsed ? highlight(c.code) : h('pre', { class: 'text small' }, c.code))),
            ]
          : h(
              'pre',
              { class: 'text small tool' },
              (s.responses.length > 0 ? s.responses : [s.text]).join('\n'),
            ),
      ),
    ),
  );
  return h(
    'section',
    {},
    h(
      'h1',
      {},
      q.point
        ? `Branch point ${q.point}, step ${q.step}: ${members.length} branches`
        : `Problem ${q.problem}, step ${q.step}: ${members.length} samples`,
    ),
    h(
      'p',
      {},
      members[0]?.roc_outcome
        ? `RoC: ${members[0].roc_outcome}; kept ${members.filter((r) => r.roc === 'kept').length} of ${members.length} (correct samples with the fewest tool errors and format faults first)`
        : 'RoC: not decided (group incomplete or no stage manifest)',
    ),
    h('p', {}, 'reference answer: ', p ? p.answer : '(problem file not found)'),
    h('pre', { class: 'text problem' }, p ? p.prompt : ''),
    h('div', { class: 'samples' }, cols),
  );
}

// ---- evaluations ---------------------------------------------------------------------------

async function showEvals(q, run) {
  const e = await evals(run);
  const pct = (x) => (typeof x === 'number' ? (100 * x).toFixed(1) : '');
  const blocks = e.evals.map((ev) =>
    h(
      'div',
      { class: 'eval', 'data-eval': ev.name },
      h(
        'h2',
        {},
        ev.name,
        ' ',
        h('a', { href: link('trajectories', { run, eval: ev.name }) }, `${ev.trajectories} trajectories`),
      ),
      table(
        [
          'benchmark',
          'problems',
          'n',
          'avg@n %',
          'pass@k %',
          'maj@n %',
          'tool err %',
          'format viol %',
          'tokens',
          'policy',
        ],
        ev.benchmarks.map((b) => [
          b.benchmark,
          b.problems ?? '',
          b.n,
          pct(b['avg@n']),
          Object.entries(b['pass@k'] ?? {})
            .map(([k, v]) => `@${k} ${pct(v)}`)
            .join(' · '),
          pct(b['maj@n']),
          pct(b.tool_error_rate),
          pct(b.format_violation_rate),
          fmt(b.mean_tokens, 1),
          b.policy,
        ]),
      ),
      Object.entries(ev.families).map(([bench, fams]) => [
        h('h3', {}, `${bench} by family`),
        // The tool-use figures are src/algo/tool-use.ts's, computed by the server (api.ts familiesOf):
        // the page only formats them. Blank: the records predate what the figure needs.
        table(
          [
            'family',
            'problems',
            'trajectories',
            'avg@n %',
            'pass@n %',
            'tool calls / traj',
            'failed calls / traj',
            'unparsable / traj',
            'tool err %',
            'recovery %',
          ],
          fams.map((f) => [
            f.family,
            f.problems,
            f.trajectories,
            pct(f['avg@n']),
            pct(f['pass@n']),
            fmt(f.tool_calls_per_traj),
            fmt(f.failed_calls_per_traj),
            fmt(f.unparsable_calls_per_traj),
            pct(f.tool_error_rate),
            pct(f.recovery_rate),
          ]),
        ),
      ]),
    ),
  );
  return h(
    'section',
    {},
    h('h1', {}, 'Evaluations'),
    runPicker(q, 'evals'),
    e.compare
      ? h(
          'div',
          { class: 'compare' },
          h('h2', {}, `Comparison: ${e.compare.title}`),
          markdown(e.compare.markdown),
        )
      : null,
    blocks.length > 0 ? blocks : h('p', {}, 'No evaluations in this run.'),
  );
}

// ---- live ----------------------------------------------------------------------------------

/** Forgets what the page holds of the runs whose version moved, and shows the page again. */
async function changed(runs) {
  for (const run of runs) {
    state.overview.delete(run);
    state.evals.delete(run);
    const have = state.rows.get(run);
    if (have) have.stale = true;
  }
  await loadRuns();
  const { page } = route();
  // a trajectory or a group does not change once written: no reload under the reader's eyes
  if (page !== 'trajectory' && page !== 'group') await show();
}

// The event stream opens once the first view is drawn: the server pauses its background indexing
// from the page's request until then (server.ts), so the two do not share the cores.
function follow() {
  if (window.RSTAR_STATIC || !window.EventSource) return;
  const events = new EventSource('api/events');
  events.addEventListener('update', (e) => changed([JSON.parse(e.data).run]));
  // An update sent before the stream opened (while the first view rendered) is not lost: on (re)open
  // the page compares the runs' versions with those it showed.
  // A run still being indexed for the first time is left alone: its versions move with every file,
  // and the server sends one update when the indexing ends (drawing the overview again meanwhile
  // would only take the cores from the indexing).
  events.addEventListener('open', async () => {
    const shown = new Map(state.runs.map((r) => [r.index, r.version]));
    const now = await api('runs');
    const moved = now.filter((r) => r.indexed && shown.get(r.index) !== r.version).map((r) => r.index);
    if (moved.length > 0) await changed(moved);
  });
}

// ---- boot ----------------------------------------------------------------------------------

// `rstar view --view-token` prints the page's address with ?token=: the server answered that request
// with a cookie (HttpOnly, this origin only) that authenticates every later one, so the token leaves
// the address bar, the history and whatever copies the address (a bookmark, a screenshot, a paste).
if (new URLSearchParams(location.search).has('token')) {
  const rest = new URLSearchParams(location.search);
  rest.delete('token');
  const qs = rest.toString();
  history.replaceState(history.state, '', `${location.pathname}${qs ? `?${qs}` : ''}${location.hash}`);
}

window.addEventListener('hashchange', show);
loadRuns()
  .then(show)
  .then(follow)
  .catch((error) => fill(main, h('p', { class: 'error' }, String(error.message ?? error))));
