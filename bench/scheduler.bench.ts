/**
 * Discrete-time simulation of agentic rollout on E engines, driving the real Scheduler
 * (src/rollout/scheduler.ts) with a simulated clock. Prints makespan, engine idle fraction and KV
 * overflow (preemption) events per policy at 4, 16 and 64 engines and writes
 * docs/scheduler-makespan.svg. Usage: npm run bench:scheduler [-- --quick] [-- --seeds N] [-- --workload long-tailed|short-tailed|paper]
 * [-- --json FILE]
 *
 * Model (all parameters below, documented in docs/rollout.md):
 * - Engine: KV capacity C tokens; decoding shares an aggregate throughput R tokens/s among its
 *   running sequences, each capped at r tokens/s (memory-bound decode: a lone sequence cannot use
 *   the whole engine). Admission as SGLang does it: a waiting request starts when its context
 *   plus a small new-token reserve fits; when growing sequences exceed C the most recently
 *   admitted one is retracted (a KV overflow event: its KV is dropped and recomputed later).
 *   Prefill costs uncached tokens / P seconds; a turn on the engine that served the trajectory's
 *   previous turn only prefills the tool tokens (prefix cache).
 * - Workload: problems with a difficulty factor d ~ LogNormal(0, sigma_d); n samples each; a
 *   prompt of ~LogNormal(ln 400, 0.3) tokens; 0-5 tool calls (uniform); each assistant turn
 *   ~LogNormal(ln(L·d), sigma_L) tokens, the trajectory cut at the 8192-token budget; tool
 *   responses ~LogNormal(ln 120, 0.6) tokens; tool latency ~LogNormal(ln 1 s, 1.0), at most 30 s.
 *   `paper` sets what rStar2-Agent's paper and release state (32 samples, at most 4 calls, 0.3 s
 *   mean tool latency cut at 4 s, truncated tool responses); see `PAPER` and docs/rollout.md.
 */
import { writeFileSync } from 'node:fs';
import { mulberry32 } from '../src/random.js';
import { type Order, type Policy, Scheduler, type TurnRequest } from '../src/rollout/scheduler.js';

interface EngineModel {
  capacity: number;
  aggregate: number;
  perSeq: number;
  prefill: number;
}

interface WorkloadModel {
  name: string;
  problemsPerEngine: number;
  n: number;
  sigmaDifficulty: number;
  turnMedian: number;
  sigmaTurn: number;
  budget: number;
  /** Tool calls per trajectory at most. */
  maxCalls: number;
  /** Tool latency ~ LogNormal(ln toolMedian, toolSigma) seconds, at most toolCap. */
  toolMedian: number;
  toolSigma: number;
  toolCap: number;
  /** Tool response tokens at most (the response is truncated), before the wrapper tokens. */
  toolTokensCap: number;
}

const ENGINE: EngineModel = { capacity: 180_000, aggregate: 2_400, perSeq: 120, prefill: 10_000 };
const LONG_TAIL: WorkloadModel = {
  name: 'long-tailed',
  problemsPerEngine: 16,
  n: 16,
  sigmaDifficulty: 1.0,
  turnMedian: 500,
  sigmaTurn: 0.9,
  budget: 8192,
  maxCalls: 5,
  toolMedian: 1,
  toolSigma: 1,
  toolCap: 30,
  toolTokensCap: Number.POSITIVE_INFINITY,
};
const SHORT_TAIL: WorkloadModel = {
  ...LONG_TAIL,
  name: 'short-tailed',
  sigmaDifficulty: 0.1,
  sigmaTurn: 0.3,
};
/**
 * The long-tailed workload with every parameter the rStar2-Agent paper or its release states
 * (docs/rollout.md, "Paper workload"): 32 samples per problem (release `rollout.n=32`, the
 * paper's 2G oversampling), at most 4 tool calls (`max_assistant_turns: 5`), tool latency with a
 * 0.3 s mean (the paper's measured average per call; median 0.3/e^{σ²/2}) cut at 4 s (code-judge
 * `MAX_EXECUTION_TIME=4` in the release), tool responses cut to 256 characters (the release's
 * truncation: about 90 tokens, plus the wrapper). Trajectories per engine stay 256 (8 problems ×
 * 32), response lengths as the long-tailed workload (the paper gives no distribution).
 */
const PAPER: WorkloadModel = {
  ...LONG_TAIL,
  name: 'paper',
  problemsPerEngine: 8,
  n: 32,
  maxCalls: 4,
  toolMedian: 0.3 / Math.exp(0.5),
  toolSigma: 1,
  toolCap: 4,
  toolTokensCap: 110,
};
const ADMIT_RESERVE = 256;
const DT = 0.05;
const SCRAPE_S = 0.5;

/** Mulberry32: a seeded PRNG so every policy sees the same workload. */
const rng = mulberry32;

function logNormal(rand: () => number, median: number, sigma: number): number {
  const u = Math.max(rand(), 1e-12);
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rand());
  return median * Math.exp(sigma * z);
}

interface Turn {
  gen: number;
  toolTokens: number;
  toolLatency: number;
}

interface Traj {
  key: string;
  group: number;
  prompt: number;
  turns: Turn[];
  /** The problem's difficulty factor (for the earlier-epoch prior). */
  difficulty: number;
}

/** One sample of a problem of difficulty d: its prompt and turns (draws from `rand`). */
function sample(w: WorkloadModel, d: number, rand: () => number, key: string, group: number): Traj {
  const prompt = Math.round(logNormal(rand, 400, 0.3));
  // Harder problems draw more tool calls: 0-5, shifted up by difficulty.
  const calls = Math.min(w.maxCalls, Math.floor(rand() * 4 + Math.max(0, Math.log2(d) + 1)));
  const turns: Turn[] = [];
  let used = 0;
  for (let k = 0; k <= calls && used < w.budget; k++) {
    const gen = Math.max(
      1,
      Math.min(Math.round(logNormal(rand, w.turnMedian * d, w.sigmaTurn)), w.budget - used),
    );
    used += gen;
    const toolTokens = Math.min(Math.round(logNormal(rand, 120, 0.6)), w.toolTokensCap);
    const last = k === calls || used + toolTokens >= w.budget;
    turns.push({
      gen,
      toolTokens: last ? 0 : toolTokens,
      toolLatency: Math.min(logNormal(rand, w.toolMedian, w.toolSigma), w.toolCap),
    });
    if (last) break;
    used += toolTokens;
  }
  return { key, group, prompt, turns, difficulty: d };
}

function makeWorkload(w: WorkloadModel, engines: number, seed: number): Traj[] {
  const rand = rng(seed);
  const out: Traj[] = [];
  for (let p = 0; p < w.problemsPerEngine * engines; p++) {
    const d = logNormal(rand, 1, w.sigmaDifficulty);
    for (let s = 0; s < w.n; s++) out.push(sample(w, d, rand, `${p}/${s}`, p));
  }
  return out;
}

/**
 * An earlier epoch of the same batch: the same problems (difficulties), n fresh samples each
 * from an independent stream. Its mean chain per problem is what a runner could know from the
 * previous time it rolled the problem out (with the same policy: drift is not modelled).
 */
function earlierEpoch(w: WorkloadModel, trajs: Traj[], seed: number): Map<number, number> {
  const rand = rng(seed + 7919);
  const seen = new Set<number>();
  const out = new Map<number, number>();
  for (const t of trajs) {
    if (seen.has(t.group)) continue;
    seen.add(t.group);
    let sum = 0;
    for (let s = 0; s < w.n; s++) sum += chainTime(sample(w, t.difficulty, rand, '', t.group));
    out.set(t.group, sum / w.n);
  }
  return out;
}

interface Req extends TurnRequest {
  traj: Traj;
  turn: number;
}

interface Running {
  req: Req;
  assignment: ReturnType<Scheduler<Req>['poll']>[number];
  ctx: number;
  generated: number;
  target: number;
  prefillLeft: number;
  admittedAt: number;
}

interface SimEngine {
  waiting: Running[];
  running: Running[];
  used: number;
  /** trajectory key → context length cached here */
  cached: Map<string, number>;
  generated: number;
}

export interface SimResult {
  policy: Policy;
  engines: number;
  workload: string;
  makespan: number;
  /** max over t of t + (work left after t) / E: see `lowerBounds`. */
  lowerBound: number;
  /** max(total work / E, longest critical path): the bound, weaker. */
  workBound: number;
  idle: number;
  /** Engine time spent recomputing prefixes (after a move or a KV overflow), as a fraction. */
  recompute: number;
  overflows: number;
  tokens: number;
}

/** Scheduler settings a benchmark row varies. */
export interface Variant {
  order?: Order;
  probes?: number;
  /**
   * Rank problems by the true mean length of their trajectories' chains (the `prior` option):
   * the best any per-problem prediction can do, as a ceiling for `kv`'s own estimate.
   */
  oracle?: boolean;
  /** Rank problems by their mean chain in an earlier epoch (`earlierEpoch`): a prior a runner could have. */
  epoch?: boolean;
}

export function simulate(
  policy: Policy,
  engines: number,
  w: WorkloadModel,
  seed = 1,
  v: Variant = {},
): SimResult {
  const trajs = makeWorkload(w, engines, seed);
  let now = 0;
  let prior: ((g: number) => number) | undefined;
  if (v.oracle) {
    const sum = new Map<number, number>();
    for (const t of trajs) sum.set(t.group, (sum.get(t.group) ?? 0) + chainTime(t));
    prior = (g) => sum.get(g) ?? 0;
  } else if (v.epoch) {
    const before = earlierEpoch(w, trajs, seed);
    prior = (g) => before.get(g) ?? 0;
  }
  const sched = new Scheduler<Req>(
    Array.from({ length: engines }, () => ENGINE.capacity),
    { policy, clock: () => now * 1000, order: v.order, probes: v.probes, prior },
  );
  const sim: SimEngine[] = Array.from({ length: engines }, () => ({
    waiting: [],
    running: [],
    used: 0,
    cached: new Map(),
    generated: 0,
  }));
  const responseLen = new Map<string, number>();
  const tools: { at: number; req: Req }[] = [];
  let remaining = trajs.length;
  let overflows = 0;
  let totalTokens = 0;

  const submitTurn = (traj: Traj, turn: number): void => {
    const resp = responseLen.get(traj.key) ?? 0;
    sched.submit({
      key: traj.key,
      group: traj.group,
      contextLen: traj.prompt + resp,
      maxNewTokens: w.budget - resp,
      traj,
      turn,
    });
  };
  for (const t of trajs) {
    submitTurn(t, 0);
    for (const turn of t.turns) totalTokens += turn.gen;
  }

  let nextScrape = 0;
  let prefillTime = 0;
  let mandatoryPrefill = 0;
  for (const t of trajs)
    mandatoryPrefill += (t.prompt + t.turns.reduce((a, x) => a + x.toolTokens, 0)) / ENGINE.prefill;
  while (remaining > 0) {
    if (now >= nextScrape) {
      for (const [e, g] of sim.entries()) sched.observe(e, { total: ENGINE.capacity, used: g.used });
      nextScrape = now + SCRAPE_S;
    }
    for (let i = tools.length - 1; i >= 0; i--) {
      if (tools[i].at <= now) {
        const { req } = tools[i];
        tools.splice(i, 1);
        submitTurn(req.traj, req.turn + 1);
      }
    }
    for (const a of sched.poll()) {
      const g = sim[a.engine];
      const cached = g.cached.get(a.request.key) ?? 0;
      const uncached = a.request.contextLen - Math.min(cached, a.request.contextLen);
      g.waiting.push({
        req: a.request,
        assignment: a,
        ctx: a.request.contextLen,
        generated: 0,
        target: a.request.traj.turns[a.request.turn].gen,
        prefillLeft: uncached / ENGINE.prefill,
        admittedAt: 0,
      });
    }
    for (const g of sim) {
      // Admission: FIFO while context + a small reserve fits (an idle engine takes anything).
      while (g.waiting.length > 0) {
        const r = g.waiting[0];
        const need = r.ctx + r.generated + ADMIT_RESERVE;
        if (g.running.length > 0 && g.used + need > ENGINE.capacity) break;
        g.waiting.shift();
        g.used += r.ctx + r.generated;
        r.admittedAt = now;
        g.running.push(r);
      }
      // Prefill is compute-bound: it takes engine time from decoding (no overlap modelled).
      let budget = DT;
      for (const r of g.running) {
        if (r.prefillLeft <= 0 || budget <= 0) continue;
        const use = Math.min(r.prefillLeft, budget);
        r.prefillLeft -= use;
        budget -= use;
        prefillTime += use;
      }
      const decoding = g.running.filter((r) => r.prefillLeft <= 0);
      const rate = decoding.length === 0 ? 0 : Math.min(ENGINE.perSeq, ENGINE.aggregate / decoding.length);
      for (const r of decoding) {
        const step = Math.min(rate * budget, r.target - r.generated);
        r.generated += step;
        g.used += step;
        g.generated += step;
      }
      // KV overflow: retract the newest sequences until the rest fit; they recompute later.
      while (g.used > ENGINE.capacity && g.running.length > 1) {
        const victim = g.running.reduce((a, b) => (b.admittedAt > a.admittedAt ? b : a));
        g.running.splice(g.running.indexOf(victim), 1);
        g.used -= victim.ctx + victim.generated;
        victim.prefillLeft = (victim.ctx + victim.generated) / ENGINE.prefill;
        g.waiting.unshift(victim);
        overflows++;
      }
    }
    now += DT;
    for (const g of sim) {
      for (let i = g.running.length - 1; i >= 0; i--) {
        const r = g.running[i];
        if (r.generated < r.target - 1e-9) continue;
        g.running.splice(i, 1);
        g.used -= r.ctx + r.generated;
        const { traj, turn } = r.req;
        const gen = traj.turns[turn].gen;
        const resp = (responseLen.get(traj.key) ?? 0) + gen;
        sched.release(r.assignment);
        const t = traj.turns[turn];
        if (turn + 1 < traj.turns.length) {
          responseLen.set(traj.key, resp + t.toolTokens);
          g.cached.set(traj.key, traj.prompt + resp);
          tools.push({ at: now + t.toolLatency, req: r.req });
        } else {
          g.cached.delete(traj.key);
          sched.forget(traj.key);
          remaining--;
        }
      }
    }
  }
  const generated = sim.reduce((s, g) => s + g.generated, 0);
  const lb = lowerBounds(trajs, engines);
  return {
    policy,
    engines,
    workload: w.name,
    makespan: now,
    lowerBound: lb.tail,
    workBound: Math.max(lb.work, lb.critical),
    idle: 1 - (generated / ENGINE.aggregate + prefillTime) / (engines * now),
    recompute: (prefillTime - mandatoryPrefill) / (engines * now),
    overflows,
    tokens: totalTokens,
  };
}

/** One step of a trajectory's critical path: how long it takes at best, and the engine time it uses. */
interface Segment {
  duration: number;
  work: number;
}

/**
 * A trajectory's chain laid out as fast as it can possibly run: prefill of the prompt at P,
 * each turn decoded alone at r tokens/s, each tool call at its latency, the tool tokens
 * prefilled at P. Engine work: prefill seconds, and decode tokens / R.
 */
function chain(t: Traj): Segment[] {
  const out: Segment[] = [{ duration: t.prompt / ENGINE.prefill, work: t.prompt / ENGINE.prefill }];
  for (const [k, turn] of t.turns.entries()) {
    out.push({ duration: turn.gen / ENGINE.perSeq, work: turn.gen / ENGINE.aggregate });
    if (k + 1 < t.turns.length) {
      out.push({ duration: turn.toolLatency, work: 0 });
      out.push({ duration: turn.toolTokens / ENGINE.prefill, work: turn.toolTokens / ENGINE.prefill });
    }
  }
  return out;
}

/** A trajectory's chain at best (no queueing, alone on an engine). */
function chainTime(t: Traj): number {
  return chain(t).reduce((a, x) => a + x.duration, 0);
}

/**
 * Lower bound on the makespan of any schedule, clairvoyant ones included. No trajectory can be
 * further along its chain at time t than position t, so at least W(t) = Σ (engine work after
 * position t of each chain) is left at time t, and E engines need W(t)/E more: T ≥ t + W(t)/E
 * for every t. t = 0 gives total work / total capacity; t = the longest chain gives the longest
 * critical path; in between it charges the tail, where too few trajectories are left to use the
 * engines. The maximum over t of this piecewise-linear function is at a chain breakpoint; a
 * 0.25 s grid is used (any t gives a valid bound).
 */
export function lowerBounds(
  trajs: Traj[],
  engines: number,
): { work: number; critical: number; tail: number } {
  const chains = trajs.map(chain);
  let work = 0;
  let critical = 0;
  for (const c of chains) {
    work += c.reduce((a, x) => a + x.work, 0);
    critical = Math.max(
      critical,
      c.reduce((a, x) => a + x.duration, 0),
    );
  }
  const step = 0.25;
  const steps = Math.ceil(critical / step);
  // left[k] = Σ over chains of the engine work remaining after position k·step.
  const left = new Float64Array(steps + 1);
  for (const c of chains) {
    let at = 0;
    let rest = c.reduce((a, x) => a + x.work, 0);
    let k = 0;
    for (const seg of c) {
      const end = at + seg.duration;
      const rate = seg.duration > 0 ? seg.work / seg.duration : 0;
      for (; k <= steps && k * step <= end; k++) left[k] += rest - rate * (k * step - at);
      at = end;
      rest -= seg.work;
    }
  }
  let tail = 0;
  for (let k = 0; k <= steps; k++) tail = Math.max(tail, k * step + left[k] / engines);
  return { work: work / engines, critical, tail: Math.max(tail, critical) };
}

function svg(all: Row[], workload: string, seeds: number): string {
  const rows = all.filter((r) => r.workload === workload);
  const sizes = [...new Set(rows.map((r) => r.engines))];
  const policies: Policy[] = ['kv', 'least-requests', 'round-robin', 'static'];
  const colors: Record<Policy, string> = {
    kv: '#1b9e77',
    'least-requests': '#7570b3',
    'round-robin': '#e6ab02',
    static: '#d95f02',
  };
  const W = 640;
  const H = 340;
  const left = 60;
  const bottom = 280;
  const top = 40;
  const maxRatio = Math.max(...rows.map((r) => r.ratio), 1.2);
  const y = (v: number) => bottom - ((bottom - top) * v) / (maxRatio * 1.05);
  const groupW = (W - left - 20) / sizes.length;
  const barW = groupW / (policies.length + 1.5);
  let body = '';
  for (const [gi, size] of sizes.entries()) {
    const x0 = left + gi * groupW + barW * 0.75;
    for (const [pi, p] of policies.entries()) {
      const r = rows.find((x) => x.engines === size && x.label === p);
      if (!r) continue;
      const ratio = r.ratio;
      const x = x0 + pi * barW;
      body += `<rect x="${x.toFixed(1)}" y="${y(ratio).toFixed(1)}" width="${(barW - 2).toFixed(1)}" height="${(bottom - y(ratio)).toFixed(1)}" fill="${colors[p]}"><title>${p}, ${size} engines: ${r.makespan.toFixed(0)} s (${ratio.toFixed(2)}× lower bound)</title></rect>`;
      body += `<text x="${(x + barW / 2 - 1).toFixed(1)}" y="${(y(ratio) - 4).toFixed(1)}" font-size="10" text-anchor="middle">${ratio.toFixed(2)}</text>`;
    }
    body += `<text x="${(x0 + (policies.length * barW) / 2).toFixed(1)}" y="${bottom + 18}" font-size="12" text-anchor="middle">${size} engines</text>`;
  }
  let axis = `<line x1="${left}" y1="${bottom}" x2="${W - 10}" y2="${bottom}" stroke="#333"/>`;
  axis += `<line x1="${left}" y1="${top - 10}" x2="${left}" y2="${bottom}" stroke="#333"/>`;
  for (let v = 0; v <= maxRatio * 1.05; v += 0.5) {
    axis += `<text x="${left - 6}" y="${(y(v) + 4).toFixed(1)}" font-size="10" text-anchor="end">${v.toFixed(1)}</text>`;
    axis += `<line x1="${left}" y1="${y(v).toFixed(1)}" x2="${W - 10}" y2="${y(v).toFixed(1)}" stroke="#ddd"/>`;
  }
  axis += `<line x1="${left}" y1="${y(1).toFixed(1)}" x2="${W - 10}" y2="${y(1).toFixed(1)}" stroke="#333" stroke-dasharray="4 3"/>`;
  axis += `<text x="${left + 4}" y="${(y(1) - 4).toFixed(1)}" font-size="10">lower bound</text>`;
  const legend = policies
    .map(
      (p, i) =>
        `<rect x="${left + i * 140}" y="${H - 26}" width="12" height="12" fill="${colors[p]}"/><text x="${left + i * 140 + 16}" y="${H - 16}" font-size="12">${p}</text>`,
    )
    .join('');
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="${W / 2}" y="20" font-size="14" text-anchor="middle">Makespan ÷ lower bound, ${workload} workload (simulated, ${seeds} seeds; lower is better)</text>
<text x="14" y="${(top + bottom) / 2}" font-size="11" transform="rotate(-90 14 ${(top + bottom) / 2})" text-anchor="middle">makespan ÷ lower bound</text>
${axis}${body}${legend}
</svg>
`;
}

/** Mean of each figure over seeds; `×LB` is the mean of the per-seed ratios. */
interface Row {
  label: string;
  policy: Policy;
  engines: number;
  workload: string;
  seeds: number;
  makespan: number;
  lowerBound: number;
  workBound: number;
  ratio: number;
  workRatio: number;
  idle: number;
  recompute: number;
  overflows: number;
  perSeed: number[];
  /** Makespan ÷ lower bound of each seed. */
  perSeedRatio: number[];
}

function row(label: string, runs: SimResult[]): Row {
  const mean = (f: (r: SimResult) => number) => runs.reduce((a, r) => a + f(r), 0) / runs.length;
  return {
    label,
    policy: runs[0].policy,
    engines: runs[0].engines,
    workload: runs[0].workload,
    seeds: runs.length,
    makespan: mean((r) => r.makespan),
    lowerBound: mean((r) => r.lowerBound),
    workBound: mean((r) => r.workBound),
    ratio: mean((r) => r.makespan / r.lowerBound),
    workRatio: mean((r) => r.makespan / r.workBound),
    idle: mean((r) => r.idle),
    recompute: mean((r) => r.recompute),
    overflows: mean((r) => r.overflows),
    perSeed: runs.map((r) => Math.round(r.makespan)),
    perSeedRatio: runs.map((r) => Math.round((1000 * r.makespan) / r.lowerBound) / 1000),
  };
}

function main(): void {
  const args = process.argv.slice(2);
  const quick = args.includes('--quick');
  const jsonAt = args.indexOf('--json');
  const seedsAt = args.indexOf('--seeds');
  const seeds = seedsAt >= 0 ? Number(args[seedsAt + 1]) : quick ? 1 : 5;
  const sizes = quick ? [4, 16] : [4, 16, 64];
  // `kv (fifo)`: starting trajectories in submission order; `kv (1 probe)`: one probing round
  // (the scheduler before `probes`); `kv (oracle)`: problems ranked by their true mean chain.
  const variants: { label: string; policy: Policy; v: Variant; only?: string[] }[] = [
    { label: 'kv', policy: 'kv', v: {} },
    { label: 'kv (1 probe)', policy: 'kv', v: { probes: 1 } },
    { label: 'kv (fifo)', policy: 'kv', v: { order: 'fifo' } },
    { label: 'kv (oracle)', policy: 'kv', v: { oracle: true }, only: ['long-tailed', 'paper'] },
    { label: 'kv (epoch)', policy: 'kv', v: { epoch: true }, only: ['long-tailed', 'paper'] },
    { label: 'least-requests', policy: 'least-requests', v: {} },
    { label: 'round-robin', policy: 'round-robin', v: {} },
    { label: 'static', policy: 'static', v: {} },
  ];
  const rows: Row[] = [];
  const named = args.flatMap((a, i) => (a === '--workload' ? [args[i + 1]] : []));
  for (const w of [LONG_TAIL, SHORT_TAIL, PAPER].filter(
    (x) => named.length === 0 || named.includes(x.name),
  )) {
    for (const size of sizes) {
      for (const v of variants) {
        if (v.only && !v.only.includes(w.name)) continue;
        const t0 = performance.now();
        const runs = Array.from({ length: seeds }, (_, k) => simulate(v.policy, size, w, k + 1, v.v));
        const r = row(v.label, runs);
        rows.push(r);
        console.log(
          `${w.name.padEnd(12)} ${String(size).padStart(3)} engines  ${v.label.padEnd(14)} makespan ${r.makespan.toFixed(0).padStart(5)} s` +
            `  ${r.ratio.toFixed(3)}× LB ${r.lowerBound.toFixed(0)} s (${r.workRatio.toFixed(3)}× work bound)` +
            `  idle ${(100 * r.idle).toFixed(1)}%  recompute ${(100 * r.recompute).toFixed(1)}%` +
            `  overflows ${r.overflows.toFixed(0)}  seeds [${r.perSeed.join(' ')}] (× LB ${r.perSeedRatio.join(' ')})  [${((performance.now() - t0) / 1000).toFixed(1)} s]`,
        );
      }
      const at = (label: string) =>
        rows.find((r) => r.workload === w.name && r.engines === size && r.label === label) as Row;
      const kv = at('kv');
      const st = at('static');
      console.log(
        `  → kv is ${(st.makespan / kv.makespan).toFixed(3)}× faster than static (mean makespans);` +
          ` static itself is ${st.ratio.toFixed(3)}× LB, so no policy can beat it by more`,
      );
    }
  }
  if (!quick)
    writeFileSync(
      new URL('../../docs/scheduler-makespan.svg', import.meta.url),
      svg(rows, LONG_TAIL.name, seeds),
    );
  if (jsonAt >= 0)
    writeFileSync(args[jsonAt + 1], `${JSON.stringify({ engine: ENGINE, seeds, rows }, null, 2)}\n`);
}

main();
