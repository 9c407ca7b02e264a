import { spawn } from 'node:child_process';
import type { SubmissionResult } from '../records/sandbox.js';
import { SandboxClient } from '../sandbox/client.js';
import { startSandbox } from '../sandbox/embedded.js';

/** One call of `python_code_with_standard_io`. */
export interface CodeCall {
  code: string;
  input: string;
}

/** Runs the curriculum's code so demonstrations carry real outputs (rollout formats the text). */
export interface ToolRunner {
  run(calls: CodeCall[]): Promise<SubmissionResult[]>;
  close(): Promise<void>;
}

/**
 * A running `sandbox-serve` at `url`. A call the service itself failed (after the client's
 * retries) and a refused token are errors, never a tool failure baked into a demonstration.
 */
export function sandboxRunner(url: string, options: { token?: string } = {}): ToolRunner {
  const client = new SandboxClient(url, { token: options.token, rejectServiceFailures: true });
  return {
    run: (calls) => client.runBatch(calls.map((c) => ({ type: 'python', solution: c.code, input: c.input }))),
    close: () => client.close(),
  };
}

/** An embedded `sandbox-serve` child process, closed with the runner. */
export async function embeddedRunner(): Promise<ToolRunner> {
  const sandbox = await startSandbox();
  const runner = sandboxRunner(sandbox.url);
  return {
    run: runner.run,
    async close() {
      await runner.close();
      await sandbox.close();
    },
  };
}

/**
 * Without isolation, for machines with no sandbox: executes calls with a local Python, `concurrency` at a time, each with a wall-clock limit. The
 * result has the sandbox's result fields, so the text comes from the same formatter rollout uses.
 */
export function pythonRunner(options: { python?: string; timeoutMs?: number; concurrency?: number } = {}) {
  const python = options.python ?? process.env.RSTAR_PYTHON ?? 'python3';
  const timeoutMs = options.timeoutMs ?? 10_000;
  const concurrency = options.concurrency ?? 2;

  function one(call: CodeCall): Promise<SubmissionResult> {
    return new Promise((resolve, reject) => {
      const started = performance.now();
      const child = spawn(python, ['-I', '-c', call.code], { stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        child.kill('SIGKILL');
      }, timeoutMs);
      child.stdout.setEncoding('utf8').on('data', (d) => {
        stdout += d;
      });
      child.stderr.setEncoding('utf8').on('data', (d) => {
        stderr += d;
      });
      child.stdin.on('error', () => {});
      child.stdin.end(call.input);
      child.on('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
      child.on('close', (code) => {
        clearTimeout(timer);
        const ok = code === 0 && !timedOut;
        resolve({
          success: ok,
          run_success: ok,
          cost: (performance.now() - started) / 1000,
          reason: timedOut ? 'worker_timeout' : ok ? '' : 'runtime_error',
          stdout,
          stderr,
        });
      });
    });
  }

  const runner: ToolRunner = {
    async run(calls) {
      const out: SubmissionResult[] = new Array(calls.length);
      let next = 0;
      const worker = async () => {
        while (next < calls.length) {
          const i = next++;
          out[i] = await one(calls[i]);
        }
      };
      await Promise.all(Array.from({ length: Math.min(concurrency, calls.length) }, worker));
      return out;
    },
    async close() {},
  };
  return runner;
}
