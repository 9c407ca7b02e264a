/**
 * `npm run bench:sandbox`: throughput and latency of `rstar sandbox-serve` over loopback.
 *  - trivial `print(i)` calls/s through the streaming endpoint;
 *  - the realistic mix (fixtures/tool-calls-sample.jsonl: sympy/numpy/brute force, ~12% failing)
 *    in calls/s, against two baselines: a fresh interpreter per call (what code-judge does) and
 *    one warm interpreter running the same code in-process with no isolation at all;
 *  - p50/p99 latency of single `POST /run` calls at concurrency 1 and 256;
 *  - server memory (RSS of the Node process and of everything in its cgroup) over a soak.
 * Flags: --trivial N  --mix-rounds N  --baseline N  --latency N  --soak N  --workers N
 * The machine may be shared; figures are wall-clock and therefore pessimistic under load.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { resolveInterpreter } from '../src/sandbox/python.js';
import { type GuardedServer, startGuardedServer } from '../test/support/guard.js';
import { cpuOf, flag, loadMix, type Res, type Sub, streamResults } from './args.js';

async function stream(url: string, subs: Sub[]): Promise<{ seconds: number; results: Res[] }> {
  const body = subs.map((s) => JSON.stringify(s)).join('\n');
  const t0 = performance.now();
  const response = await fetch(`${url}/run/stream`, { method: 'POST', body });
  const text = await response.text();
  const seconds = (performance.now() - t0) / 1000;
  return { seconds, results: streamResults(text, subs.length) };
}

async function latency(
  url: string,
  total: number,
  concurrency: number,
): Promise<{ p50: number; p99: number; rate: number }> {
  const times: number[] = [];
  let next = 0;
  const t0 = performance.now();
  const workers = Array.from({ length: concurrency }, async () => {
    while (next < total) {
      const i = next++;
      const s = performance.now();
      const r = await fetch(`${url}/run`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ type: 'python', solution: `print(${i})` }),
      });
      const res = (await r.json()) as Res;
      if (res.stdout !== `${i}\n`) throw new Error(`bad answer ${JSON.stringify(res)}`);
      times.push(performance.now() - s);
    }
  });
  await Promise.all(workers);
  const rate = total / ((performance.now() - t0) / 1000);
  times.sort((a, b) => a - b);
  const q = (p: number) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
  return { p50: q(0.5), p99: q(0.99), rate };
}

/** A fresh `python -c` per call (the real binary, not the pyenv shim), `cores` at a time. */
async function freshInterpreter(subs: Sub[]): Promise<number> {
  const python = resolveInterpreter().executable;
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: availableParallelism() }, async () => {
      while (next < subs.length) {
        const s = subs[next++];
        await new Promise<void>((resolve) => {
          const child = spawn(python, ['-c', s.solution], { stdio: ['pipe', 'ignore', 'ignore'] });
          child.stdin.on('error', () => {});
          child.stdin.end(s.input ?? '');
          const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
          child.on('exit', () => {
            clearTimeout(timer);
            resolve();
          });
        });
      }
    }),
  );
  return subs.length / ((performance.now() - t0) / 1000);
}

/** One warm interpreter, no isolation: exec() each program in-process with captured stdout. */
async function warmInterpreter(subs: Sub[]): Promise<number> {
  const python = resolveInterpreter().executable;
  const script = `
import sys, io, json, time, contextlib, builtins
import math, itertools, fractions, numpy, sympy
progs = [json.loads(l) for l in sys.stdin]
t0 = time.perf_counter()
for p in progs:
    out = io.StringIO()
    sys.stdin = io.StringIO(p.get("input") or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(p["solution"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except BaseException:
        pass
print(len(progs) / (time.perf_counter() - t0))
`;
  return new Promise((resolve, reject) => {
    const child = spawn(python, ['-c', script], {
      stdio: ['pipe', 'pipe', 'inherit'],
      env: { ...process.env, OPENBLAS_NUM_THREADS: '1' },
    });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
    });
    child.on('exit', (code) =>
      code === 0 ? resolve(Number(out.trim().split('\n').pop())) : reject(new Error(`exit ${code}`)),
    );
    child.stdin.end(subs.map((s) => JSON.stringify(s)).join('\n'));
  });
}

function rssMb(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

/** Busy CPU seconds of the whole machine (all processes and kernel threads), from /proc/stat. */
function machineBusySeconds(): number {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const idle = fields[3] + (fields[4] ?? 0);
  return (fields.slice(0, 8).reduce((a, b) => a + b, 0) - idle) / 100;
}

/**
 * Runs `work` and reports CPU ms per call: everything in the guard, the Node server alone, and
 * the whole machine (which also counts kernel threads, e.g. namespace teardown deferred to
 * workqueues, and anything else running: meaningful on an idle machine only).
 */
async function cpuPerCall<T>(
  server: GuardedServer,
  calls: number,
  work: () => Promise<T>,
): Promise<{ value: T; text: string }> {
  const nodePid = server.pid as number;
  const all0 = server.cpuSeconds();
  const node0 = cpuOf(nodePid);
  const machine0 = machineBusySeconds();
  const value = await work();
  const all = ((server.cpuSeconds() - all0) * 1000) / calls;
  const node = ((cpuOf(nodePid) - node0) * 1000) / calls;
  const machine = ((machineBusySeconds() - machine0) * 1000) / calls;
  const text = Number.isNaN(all)
    ? `node ${node.toFixed(2)} ms CPU/call`
    : `${all.toFixed(2)} ms CPU/call (node ${node.toFixed(2)}, executors ${(all - node).toFixed(2)}; whole machine ${machine.toFixed(2)})`;
  return { value, text };
}

function totalRssMb(server: GuardedServer): number {
  return server.pids().reduce((sum, pid) => sum + rssMb(pid), 0);
}

async function main(): Promise<void> {
  const trivialN = flag('trivial', 4000);
  const mixRounds = flag('mix-rounds', 2);
  // The whole mix by default: a ratio against a slice of it would depend on which kinds the slice holds.
  const baselineN = flag('baseline', Number.POSITIVE_INFINITY);
  const latencyN = flag('latency', 300);
  const soakN = flag('soak', 20_000);
  const workers = flag('workers', 0);
  const mix = loadMix();
  const log = (line: string) => process.stdout.write(`${line}\n`);
  log(
    `machine: ${availableParallelism()} CPUs, load average ${readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}`,
  );
  const server = await startGuardedServer(workers > 0 ? ['--workers', String(workers)] : []);
  const nodePid = server.pid as number;
  try {
    log(`service: ${JSON.stringify(await (await fetch(`${server.url}/health`)).json())}`);
    await stream(
      server.url,
      Array.from({ length: 200 }, (_, i) => ({ type: 'python', solution: `print(${i})` })),
    );

    let mixRate = Number.NaN;
    if (trivialN > 0) {
      const subs = Array.from({ length: trivialN }, (_, i) => ({ type: 'python', solution: `print(${i})` }));
      const { value: trivial, text } = await cpuPerCall(server, trivialN, () => stream(server.url, subs));
      if (trivial.results.some((r, i) => r.stdout !== `${i}\n`)) throw new Error('wrong trivial answer');
      log(
        `trivial print(i): ${(trivialN / trivial.seconds).toFixed(0)} calls/s (${trivialN} calls, stream); ${text}`,
      );
      // The same call routed to the heavy executors (numpy + sympy preloaded) by a comment.
      const heavyN = Math.min(trivialN, 1000);
      const heavySubs = Array.from({ length: heavyN }, (_, i) => ({
        type: 'python',
        solution: `print(${i})  # sympy`,
      }));
      const heavy = await cpuPerCall(server, heavyN, () => stream(server.url, heavySubs));
      log(
        `trivial print(i) on heavy executors: ${(heavyN / heavy.value.seconds).toFixed(0)} calls/s (${heavyN} calls); ${heavy.text}`,
      );
    }

    if (mixRounds > 0) {
      const subs = Array.from({ length: mixRounds }, () => mix).flat();
      const { value: mixed, text } = await cpuPerCall(server, subs.length, () => stream(server.url, subs));
      mixRate = subs.length / mixed.seconds;
      const failed = mixed.results.filter((r) => !r.run_success).length / subs.length;
      log(
        `realistic mix: ${mixRate.toFixed(1)} calls/s (${subs.length} calls, ${(failed * 100).toFixed(1)}% failing); ${text}`,
      );
    }

    if (baselineN > 0) {
      const sample = mix.slice(0, baselineN);
      const fresh = await freshInterpreter(sample);
      log(
        `baseline fresh interpreter per call: ${fresh.toFixed(1)} calls/s (${sample.length} calls, ${availableParallelism()} parallel) -> service is ${(mixRate / fresh).toFixed(1)}x`,
      );
      const warm = await warmInterpreter(mix);
      log(
        `floor one warm interpreter, no isolation: ${warm.toFixed(1)} calls/s (${mix.length} calls, 1 process) -> service is ${((mixRate / warm) * 100).toFixed(0)}%`,
      );
    }

    if (latencyN > 0) {
      const c1 = await latency(server.url, latencyN, 1);
      log(
        `/run latency, concurrency 1: p50 ${c1.p50.toFixed(1)} ms, p99 ${c1.p99.toFixed(1)} ms (${latencyN} calls)`,
      );
      const c256 = await latency(server.url, Math.max(latencyN * 4, 1024), 256);
      log(
        `/run latency, concurrency 256: p50 ${c256.p50.toFixed(1)} ms, p99 ${c256.p99.toFixed(1)} ms, ${c256.rate.toFixed(0)} calls/s`,
      );
    }

    const memory: string[] = [];
    const before = { node: rssMb(nodePid), all: totalRssMb(server) };
    const chunk = 5000;
    const t0 = performance.now();
    for (let done = 0; done < soakN; done += chunk) {
      const n = Math.min(chunk, soakN - done);
      await stream(
        server.url,
        Array.from({ length: n }, (_, i) => ({
          type: 'python',
          solution: `x = [${i}] * 1000\nprint(len(x))`,
        })),
      );
      memory.push(
        `${done + n}: node ${rssMb(nodePid).toFixed(0)} MB, all ${totalRssMb(server).toFixed(0)} MB`,
      );
    }
    const soakRate = soakN / ((performance.now() - t0) / 1000);
    if (soakN > 0) {
      log(
        `soak ${soakN} calls at ${soakRate.toFixed(0)} calls/s; RSS before: node ${before.node.toFixed(0)} MB, all ${before.all.toFixed(0)} MB`,
      );
      for (const line of memory) log(`  after ${line}`);
    }
  } finally {
    await server.stop();
  }
}

main().catch((error) => {
  process.stderr.write(`${error instanceof Error ? error.stack : error}\n`);
  process.exitCode = 1;
});
