/**
 * `node dist/bench/batch-path.bench.js`: the HTTP side of the sandbox alone. A child process runs
 * `createSandboxServer` over a stub runner that answers every submission on the next turn of the
 * event loop (no executor, no fork), and the client measures, side by side:
 *  - `/run/long-batch`, 16 calls a batch, 8 batches in flight, in calls/s;
 *  - `/run/stream`, all calls in one request;
 * with the server's CPU per call (from /proc/PID/stat), which is what the path costs next to the
 * executors on a real server. Flags: --calls N  --runs N  --batch N  --inflight N  --sub-ids
 * (every submission carries a sub_id, as rstar's client sends)  --no-stream (batches only)
 * --cpu-prof DIR (profile the server).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import type { Submission, SubmissionResult } from '../src/records/sandbox.js';
import { Metrics } from '../src/sandbox/metrics.js';
import type { Runner } from '../src/sandbox/pool.js';
import { subId } from '../src/sandbox/result.js';
import { createSandboxServer, listen } from '../src/sandbox/server.js';
import { cpuOf, flag, option, streamResults } from './args.js';

/** Answers like an executor that printed the program's argument, one event-loop turn later. */
class StubRunner implements Runner {
  readonly metrics = new Metrics();
  submit(submission: Submission): Promise<SubmissionResult> {
    return new Promise((resolve) =>
      setImmediate(() => {
        const result = {
          sub_id: subId(submission),
          success: true,
          run_success: true,
          cost: 0.0012,
          reason: '',
          stdout: `${submission.solution.slice(6, -1)}\n`,
          stderr: '',
        };
        this.metrics.record('', 0.001);
        resolve(result);
      }),
    );
  }
  createSession(): Promise<never> {
    return Promise.reject(new Error('the stub runs no sessions'));
  }
  forkSession(): Promise<never> {
    return this.createSession();
  }
  async closeSession(): Promise<boolean> {
    return false;
  }
  async close(): Promise<void> {}
}

async function serve(): Promise<void> {
  const server = createSandboxServer({ host: '127.0.0.1', port: 0, runner: new StubRunner() });
  const address = await listen(server, '127.0.0.1', 0);
  process.stdout.write(`${address.port}\n`);
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
}

const dispatcher = new Agent({ connections: 64, keepAliveTimeout: 60_000 });

async function post(url: string, body: string): Promise<string> {
  const response = await request(url, {
    method: 'POST',
    body,
    dispatcher,
    headersTimeout: 0,
    bodyTimeout: 0,
  });
  const text = await response.body.text();
  if (response.statusCode !== 200) throw new Error(`${response.statusCode} ${text.slice(0, 300)}`);
  return text;
}

async function main(): Promise<void> {
  if (process.argv.includes('--serve')) return serve();
  const calls = flag('calls', 32_000);
  const runs = flag('runs', 3);
  const size = flag('batch', 16);
  const inflight = flag('inflight', 8);
  const subIds = process.argv.includes('--sub-ids');
  const noStream = process.argv.includes('--no-stream');
  const prof = option('cpu-prof');
  const self = fileURLToPath(import.meta.url);
  const child: ChildProcess = spawn(
    process.execPath,
    [...(prof ? ['--cpu-prof', '--cpu-prof-dir', prof] : []), self, '--serve'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const port = await new Promise<string>((resolve) =>
    child.stdout?.once('data', (d) => resolve(String(d).trim())),
  );
  const url = `http://127.0.0.1:${port}`;
  const pid = child.pid as number;
  const subs = Array.from({ length: calls }, (_, i) => ({
    type: 'python',
    solution: `print(${i})`,
    ...(subIds ? { sub_id: `bench-${i}` } : {}),
  }));
  const bodies: string[] = [];
  for (let i = 0; i < subs.length; i += size)
    bodies.push(JSON.stringify({ type: 'batch', submissions: subs.slice(i, i + size) }));
  const streamBody = subs.map((s) => JSON.stringify(s)).join('\n');
  const log = (line: string) => process.stdout.write(`${line}\n`);
  log(`${calls} calls${subIds ? ' with sub_ids' : ''}; batch ${size} x ${inflight} in flight; ${runs} runs`);
  const check = (stdout: (string | null)[]) => {
    if (stdout.length !== calls || stdout.some((s, i) => s !== `${i}\n`)) throw new Error('wrong answers');
  };
  try {
    for (let run = 0; run <= runs; run += 1) {
      // Run 0 warms up (JIT, connections) and is not reported.
      let c0 = cpuOf(pid);
      let t0 = performance.now();
      const results: { stdout: string | null }[][] = new Array(bodies.length);
      let next = 0;
      await Promise.all(
        Array.from({ length: inflight }, async () => {
          while (next < bodies.length) {
            const i = next++;
            results[i] = (
              JSON.parse(await post(`${url}/run/long-batch`, bodies[i])) as { results: [] }
            ).results;
          }
        }),
      );
      const batchS = (performance.now() - t0) / 1000;
      const batchCpu = cpuOf(pid) - c0;
      check(results.flat().map((r) => r.stdout));
      const batchText = `batch ${(calls / batchS).toFixed(0)} calls/s, server ${((batchCpu * 1e6) / calls).toFixed(1)} µs CPU/call`;
      if (noStream) {
        if (run > 0) log(`run ${run}: ${batchText}`);
        continue;
      }
      c0 = cpuOf(pid);
      t0 = performance.now();
      const text = await post(`${url}/run/stream`, streamBody);
      const streamS = (performance.now() - t0) / 1000;
      const streamCpu = cpuOf(pid) - c0;
      check(streamResults(text, calls).map((r) => r.stdout));
      if (run === 0) continue;
      log(
        `run ${run}: ${batchText}; stream ${(calls / streamS).toFixed(0)} calls/s, server ${((streamCpu * 1e6) / calls).toFixed(1)} µs CPU/call`,
      );
    }
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await dispatcher.close();
  }
}

main().catch((error) => {
  process.stderr.write(`${error instanceof Error ? error.stack : error}\n`);
  process.exitCode = 1;
});
