/**
 * `npm run bench:batch`: the batch API side by side with code-judge on one machine.
 *  - trivial `print(i)` calls/s through `POST /run/long-batch`, 16 calls a batch, 8 batches in flight;
 *  - the realistic mix (fixtures/tool-calls-sample.jsonl) the same way;
 *  - single `POST /run` latency p50/p99 at concurrency 1;
 *  - ours only: trivial calls/s through `/run/stream` (one request), the rate the batch path is
 *    measured against, and Node's CPU per call on both paths.
 * Ours is started here (`sandbox-serve --workers N` in a guard cgroup); code-judge runs where
 * `--codejudge URL` says (bench/codejudge-setup.sh sets it up with 2 workers). Each measurement
 * runs `--runs` times, the targets taking turns, and the table gives every run and the range.
 * CPU per call (ours: everything in the guard cgroup; code-judge: its API, workers, the
 * interpreters they reaped and its redis-server, from the pid files in --codejudge-dir) depends
 * far less on what else runs on a shared machine than calls/s do.
 * Flags: --codejudge URL  --codejudge-dir DIR  --ours URL (use a running server instead)
 *        --workers N  --trivial N  --mix-rounds N  --latency N  --runs N  --batch N  --inflight N
 * The machine may be shared; figures are wall-clock and therefore pessimistic under load.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { Agent, request } from 'undici';
import { type GuardedServer, startGuardedServer } from '../test/support/guard.js';
import { cpuOf, flag, loadMix, option, type Res, type Sub, streamResults } from './args.js';

const dispatcher = new Agent({ connections: 64, keepAliveTimeout: 60_000, pipelining: 1 });

async function post(url: string, body: string): Promise<string> {
  const response = await request(url, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json' },
    dispatcher,
    headersTimeout: 0,
    bodyTimeout: 0,
  });
  const text = await response.body.text();
  if (response.statusCode !== 200) throw new Error(`${url}: ${response.statusCode} ${text.slice(0, 300)}`);
  return text;
}

/** `subs` through `/run/long-batch`, `size` a batch, `inflight` batches at a time; calls/s and results. */
async function batches(
  url: string,
  subs: Sub[],
  size: number,
  inflight: number,
): Promise<{ rate: number; results: Res[] }> {
  const bodies: string[] = [];
  for (let i = 0; i < subs.length; i += size)
    bodies.push(JSON.stringify({ type: 'batch', submissions: subs.slice(i, i + size) }));
  const results: Res[][] = new Array(bodies.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inflight }, async () => {
      while (next < bodies.length) {
        const i = next++;
        const answer = JSON.parse(await post(`${url}/run/long-batch`, bodies[i])) as { results: Res[] };
        results[i] = answer.results;
      }
    }),
  );
  const rate = subs.length / ((performance.now() - t0) / 1000);
  const flat = results.flat();
  if (flat.length !== subs.length) throw new Error(`${url}: ${flat.length} results for ${subs.length} calls`);
  return { rate, results: flat };
}

async function stream(url: string, subs: Sub[]): Promise<{ rate: number; results: Res[] }> {
  const body = subs.map((s) => JSON.stringify(s)).join('\n');
  const t0 = performance.now();
  const text = await post(`${url}/run/stream`, body);
  const rate = subs.length / ((performance.now() - t0) / 1000);
  return { rate, results: streamResults(text, subs.length) };
}

async function latency(url: string, total: number): Promise<{ p50: number; p99: number }> {
  const times: number[] = [];
  for (let i = 0; i < total; i += 1) {
    const s = performance.now();
    const res = JSON.parse(
      await post(`${url}/run`, JSON.stringify({ type: 'python', solution: `print(${i})` })),
    ) as Res;
    if (res.stdout !== `${i}\n`) throw new Error(`bad answer ${JSON.stringify(res)}`);
    times.push(performance.now() - s);
  }
  times.sort((a, b) => a - b);
  const q = (p: number) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
  return { p50: q(0.5), p99: q(0.99) };
}

/**
 * CPU seconds of every process in these process groups (each one's own time plus that of the
 * children it reaped: code-judge's workers reap the interpreter of every call), plus `pids`.
 */
function groupCpu(pgids: number[], pids: number[]): number {
  let total = 0;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const fields = readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1].split(' ');
      if (!pgids.includes(Number(fields[2])) && !pids.includes(Number(entry))) continue;
      total += fields.slice(11, 15).reduce((sum, f) => sum + Number(f), 0) / 100;
    } catch {}
  }
  return total;
}

/** code-judge's processes from the pid files bench/codejudge-setup.sh leaves in its directory. */
function codejudgeCpu(dir: string | undefined): () => number {
  if (!dir) return () => Number.NaN;
  const read = (name: string) => Number(readFileSync(`${dir}/${name}`, 'utf8').trim());
  const groups = [read('api.pid'), read('workers.pid')];
  const redis = read('redis.pid');
  return () => groupCpu(groups, [redis]);
}

const trivial = (n: number): Sub[] =>
  Array.from({ length: n }, (_, i) => ({ type: 'python', solution: `print(${i})` }));

function checkTrivial(name: string, results: Res[]): void {
  const bad = results.findIndex((r, i) => r.stdout !== `${i}\n`);
  if (bad >= 0) throw new Error(`${name}: wrong trivial answer ${bad}: ${JSON.stringify(results[bad])}`);
}

/** Figures of one measure over the runs: every run, then the range. */
class Row {
  readonly values: number[] = [];
  constructor(
    readonly name: string,
    readonly digits: number,
  ) {}
  add(value: number): void {
    this.values.push(value);
  }
  get min(): number {
    return Math.min(...this.values);
  }
  get max(): number {
    return Math.max(...this.values);
  }
  range(): string {
    if (this.values.length === 0) return '-';
    return this.min === this.max
      ? this.min.toFixed(this.digits)
      : `${this.min.toFixed(this.digits)}-${this.max.toFixed(this.digits)}`;
  }
  text(): string {
    return `| ${this.name} | ${this.values.map((v) => v.toFixed(this.digits)).join(' / ')} | ${this.range()} |`;
  }
}

async function main(): Promise<void> {
  const codejudge = option('codejudge');
  const cjCpu = codejudgeCpu(option('codejudge-dir'));
  const oursUrl = option('ours');
  const workers = flag('workers', 2);
  const trivialN = flag('trivial', 3200);
  const mixRounds = flag('mix-rounds', 1);
  const latencyN = flag('latency', 200);
  const runs = flag('runs', 3);
  const size = flag('batch', 16);
  const inflight = flag('inflight', 8);
  const mix = loadMix();
  const mixSubs = Array.from({ length: mixRounds }, () => mix).flat();
  const log = (line: string) => process.stdout.write(`${line}\n`);
  log(
    `machine: ${availableParallelism()} CPUs, load average ${readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}`,
  );
  log(
    `/run/long-batch: ${size} calls a batch, ${inflight} batches in flight; trivial ${trivialN} calls, mix ${mixSubs.length} calls; ${runs} runs`,
  );

  const server: GuardedServer | undefined = oursUrl
    ? undefined
    : await startGuardedServer(['--workers', String(workers)]);
  const ours = oursUrl ?? (server as GuardedServer).url;
  const pid = server?.pid;
  const rows = {
    oursStream: new Row('ours: trivial, `/run/stream` (calls/s)', 0),
    oursTrivial: new Row('ours: trivial, `/run/long-batch` (calls/s)', 0),
    ratio: new Row('ours: batch / stream, trivial (%)', 0),
    cjTrivial: new Row('code-judge: trivial, `/run/long-batch` (calls/s)', 1),
    trivialX: new Row('trivial: ours / code-judge (x)', 1),
    oursMix: new Row('ours: mix, `/run/long-batch` (calls/s)', 1),
    cjMix: new Row('code-judge: mix, `/run/long-batch` (calls/s)', 1),
    mixX: new Row('mix: ours / code-judge (x)', 1),
    oursP50: new Row('ours: `/run` p50, concurrency 1 (ms)', 1),
    oursP99: new Row('ours: `/run` p99, concurrency 1 (ms)', 1),
    cjP50: new Row('code-judge: `/run` p50, concurrency 1 (ms)', 1),
    cjP99: new Row('code-judge: `/run` p99, concurrency 1 (ms)', 1),
    nodeStream: new Row('ours: Node CPU per trivial call, stream (ms)', 3),
    nodeBatch: new Row('ours: Node CPU per trivial call, batch (ms)', 3),
    cpuStream: new Row('ours: all CPU per trivial call, stream (ms)', 2),
    cpuTrivial: new Row('ours: all CPU per trivial call, batch (ms)', 2),
    cjCpuTrivial: new Row('code-judge: all CPU per trivial call, batch (ms)', 1),
    cpuMix: new Row('ours: all CPU per mix call, batch (ms)', 1),
    cjCpuMix: new Row('code-judge: all CPU per mix call, batch (ms)', 1),
    cpuMixX: new Row('mix, CPU per call: code-judge / ours (x)', 1),
  };
  const oursCpu = () => server?.cpuSeconds() ?? Number.NaN;
  /** Runs `work`, adding CPU ms per call to `row` as `cpu` counts it (NaN: not added). */
  const withCpu = async <T>(
    cpu: () => number,
    row: Row,
    calls: number,
    work: () => Promise<T>,
  ): Promise<T> => {
    const c0 = cpu();
    const value = await work();
    const used = cpu() - c0;
    if (!Number.isNaN(used)) row.add((used * 1000) / calls);
    return value;
  };
  const nodeCpu = () => cpuOf(pid);
  try {
    log(`ours: ${ours} ${JSON.stringify(JSON.parse(await (await fetch(`${ours}/health`)).text()))}`);
    if (codejudge) log(`code-judge: ${codejudge} (${await (await fetch(`${codejudge}/ping`)).text()})`);
    // Warm up both: connections, executors, the heavy executors' first sympy call.
    const warm = [...trivial(64), ...mix.slice(0, 32)];
    await batches(ours, warm, size, inflight);
    if (codejudge) await batches(codejudge, warm, size, inflight);

    for (let run = 1; run <= runs; run += 1) {
      const subs = trivial(trivialN);
      const s = await withCpu(oursCpu, rows.cpuStream, trivialN, () =>
        withCpu(nodeCpu, rows.nodeStream, trivialN, () => stream(ours, subs)),
      );
      checkTrivial('ours stream', s.results);
      rows.oursStream.add(s.rate);
      const b = await withCpu(oursCpu, rows.cpuTrivial, trivialN, () =>
        withCpu(nodeCpu, rows.nodeBatch, trivialN, () => batches(ours, subs, size, inflight)),
      );
      checkTrivial('ours batch', b.results);
      rows.oursTrivial.add(b.rate);
      rows.ratio.add((b.rate / s.rate) * 100);
      if (codejudge) {
        const c = await withCpu(cjCpu, rows.cjCpuTrivial, trivialN, () =>
          batches(codejudge, subs, size, inflight),
        );
        checkTrivial('code-judge batch', c.results);
        rows.cjTrivial.add(c.rate);
        rows.trivialX.add(b.rate / c.rate);
      }
      if (mixSubs.length > 0) {
        const m = await withCpu(oursCpu, rows.cpuMix, mixSubs.length, () =>
          batches(ours, mixSubs, size, inflight),
        );
        rows.oursMix.add(m.rate);
        const failing = m.results.filter((r) => !r.run_success).length;
        let line = `run ${run}: mix ours ${m.rate.toFixed(1)} calls/s (${failing} failing)`;
        if (codejudge) {
          const c = await withCpu(cjCpu, rows.cjCpuMix, mixSubs.length, () =>
            batches(codejudge, mixSubs, size, inflight),
          );
          const mine = rows.cpuMix.values.at(-1);
          const theirs = rows.cjCpuMix.values.at(-1);
          if (mine !== undefined && theirs !== undefined) rows.cpuMixX.add(theirs / mine);
          rows.cjMix.add(c.rate);
          rows.mixX.add(m.rate / c.rate);
          line += `, code-judge ${c.rate.toFixed(1)} calls/s (${c.results.filter((r) => !r.run_success).length} failing)`;
        }
        log(line);
      }
      if (latencyN > 0) {
        const l = await latency(ours, latencyN);
        rows.oursP50.add(l.p50);
        rows.oursP99.add(l.p99);
        if (codejudge) {
          const c = await latency(codejudge, latencyN);
          rows.cjP50.add(c.p50);
          rows.cjP99.add(c.p99);
        }
      }
      log(
        `run ${run}: trivial stream ${s.rate.toFixed(0)}, batch ${b.rate.toFixed(0)} calls/s${codejudge ? `, code-judge ${rows.cjTrivial.values.at(-1)?.toFixed(1)}` : ''}`,
      );
    }
  } finally {
    await server?.stop();
    await dispatcher.close();
  }
  log('');
  log('| measure | runs | range |');
  log('|---|---|---|');
  for (const row of Object.values(rows)) if (row.values.length > 0) log(row.text());
}

main().catch((error) => {
  process.stderr.write(`${error instanceof Error ? error.stack : error}\n`);
  process.exitCode = 1;
});
