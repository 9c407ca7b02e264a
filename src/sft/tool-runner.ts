import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import type { SubmissionResult } from '../records/sandbox.js';
import { encodeFiles, SandboxClient } from '../sandbox/client.js';
import { startSandbox } from '../sandbox/embedded.js';
import { DEFAULT_HASH_SEED, firstChars, type RawResult } from '../sandbox/executor.js';
import { resolveInterpreter } from '../sandbox/python.js';
import { toResult } from '../sandbox/result.js';

const WARM = fileURLToPath(new URL('../../../src/sandbox/warm.py', import.meta.url));

/** One call of `python_code_with_standard_io`. */
export interface CodeCall {
  code: string;
  input: string;
  /** Files of the call's working directory, name -> UTF-8 text (sandbox runners only). */
  files?: Record<string, string>;
}

/** Runs the curriculum's code so demonstrations carry real outputs (rollout formats the text). */
export interface ToolRunner {
  /** Each call in a fresh interpreter (`--tool-state stateless`). */
  run(calls: CodeCall[]): Promise<SubmissionResult[]>;
  /**
   * The calls, in order, as the cells of one new session, closed afterwards (`--tool-state
   * session`): a finished cell's effects (variables, imports, files; an exception keeps what ran
   * before it) are there for the next, a cell killed at its limit leaves the session as it was
   * (`session_rolled_back: true`).
   */
  runCells(calls: CodeCall[], files?: Record<string, string>): Promise<SubmissionResult[]>;
  close(): Promise<void>;
}

/**
 * A running `sandbox-serve` at `url`. A call the service itself failed (after the client's
 * retries) and a refused token are errors, never a tool failure baked into a demonstration.
 */
export function sandboxRunner(url: string, options: { token?: string } = {}): ToolRunner {
  const client = new SandboxClient(url, { token: options.token, rejectServiceFailures: true });
  return {
    run: (calls) =>
      client.runBatch(
        calls.map((c) => {
          const files = encodeFiles(c.files);
          return { type: 'python', solution: c.code, input: c.input, ...(files ? { files } : {}) };
        }),
      ),
    async runCells(calls, files) {
      const encoded = encodeFiles(files);
      const session_id = await client.createSession(encoded ? { files: encoded } : {});
      try {
        const results: SubmissionResult[] = [];
        for (const c of calls)
          results.push(await client.run({ type: 'python', solution: c.code, input: c.input, session_id }));
        return results;
      } finally {
        await client.closeSession(session_id);
      }
    },
    close: () => client.close(),
  };
}

/** An embedded `sandbox-serve` child process, closed with the runner. */
export async function embeddedRunner(options: { timeoutS?: number } = {}): Promise<ToolRunner> {
  const sandbox = await startSandbox(options);
  const runner = sandboxRunner(sandbox.url);
  return {
    run: runner.run,
    runCells: runner.runCells,
    async close() {
      await runner.close();
      await sandbox.close();
    },
  };
}

/**
 * Trusted code (the curriculum's own programs, never a model's) run in one warm Python
 * (src/sandbox/warm.py) with the sandbox's cell semantics (src/sandbox/cell.py, the same file the
 * sandbox's executor runs) and its result rules (`toResult`), so each call's result is the one
 * sandbox-serve gives the same program, cost aside. No fork per call and no isolation: on VMs where
 * a fork costs ~20 ms of CPU the embedded sandbox spends a minute on the curriculum.
 */
export function warmRunner(
  options: { python?: string; timeout?: number; outputChars?: number } = {},
): ToolRunner {
  const python = options.python ?? resolveInterpreter().executable;
  const timeout = options.timeout ?? 10;
  const outputChars = options.outputChars ?? 1000;
  const keep = outputChars * 4 + 4; // bytes enough for outputChars characters (as the executor keeps)
  // The sandbox's string-hash seed, so a demonstration prints a set of strings in the order RL's
  // calls will: -I would ignore PYTHONHASHSEED, so its parts that matter are given one by one
  // (-s: no user site, -P: no script folder on sys.path, no other PYTHON* variable passed on).
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('PYTHON')));
  const child = spawn(python, ['-s', '-P', WARM], {
    env: { ...env, PYTHONHASHSEED: String(DEFAULT_HASH_SEED) },
    stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'],
  });
  // Answers come back one line per request, in request order.
  const pending: { resolve: (line: string) => void; reject: (e: Error) => void }[] = [];
  let log = '';
  let ended: Error | undefined;
  const fail = (error: Error) => {
    ended ??= error;
    for (const p of pending.splice(0)) p.reject(ended);
  };
  child.stderr?.setEncoding('utf8').on('data', (d: string) => {
    log = (log + d).slice(-2000);
  });
  child.on('error', (error) =>
    fail(new Error(`warm runner: cannot run Python '${python}': ${error.message}`)),
  );
  child.on('close', (code, signal) =>
    fail(new Error(`warm runner exited (${signal ?? code})${log ? `: ${log.trim()}` : ''}`)),
  );
  const requests = child.stdio[3] as Writable;
  requests.on('error', () => {}); // a dead runner is reported by 'close'
  const answers = createInterface({ input: child.stdio[4] as Readable });
  answers.on('line', (line) => pending.shift()?.resolve(line));

  function request(body: Record<string, unknown>): Promise<string> {
    if (ended) return Promise.reject(ended);
    const line = new Promise<string>((resolve, reject) => pending.push({ resolve, reject }));
    requests.write(`${JSON.stringify(body)}\n`);
    return line;
  }

  /** A call's answer as the sandbox's result: `toResult` over the raw exit, cost and outputs. */
  function result(call: CodeCall, answer: string | WarmAnswer): SubmissionResult {
    const a = typeof answer === 'string' ? (JSON.parse(answer) as WarmAnswer) : answer;
    if (a.error !== undefined) throw new Error(`warm runner: ${a.error}`);
    const raw: RawResult = {
      exit: a.exit,
      cost: a.cost,
      timed_out: a.timed_out,
      output_exceeded: false,
      stdout: firstChars(Buffer.from(a.stdout, 'base64'), outputChars),
      stderr: firstChars(Buffer.from(a.stderr, 'base64'), outputChars),
    };
    const r = toResult({ type: 'python', solution: call.code, input: call.input }, raw, outputChars);
    // As the sandbox answers a session's cell: `session_rolled_back` only on a killed one.
    return a.rolled_back === true ? { ...r, session_rolled_back: true } : r;
  }

  const one = (call: CodeCall, session?: string): Promise<SubmissionResult> => {
    const files = session ? undefined : encodeFiles(call.files);
    return request({
      code: call.code,
      input: call.input,
      timeout,
      keep,
      ...(session ? { session } : {}),
      ...(files ? { files } : {}),
    }).then((line) => result(call, line));
  };

  async function runCells(calls: CodeCall[], files?: Record<string, string>): Promise<SubmissionResult[]> {
    const encoded = encodeFiles(files);
    // The whole session in the runner's own process first (no fork); a forked one where only that is exact.
    const cells = calls.map((c) => ({ code: c.code, input: c.input, timeout, keep }));
    const batch = JSON.parse(
      await request({ op: 'cells', cells, ...(encoded ? { files: encoded } : {}) }),
    ) as {
      cells?: WarmAnswer[];
      fallback?: boolean;
      error?: string;
    };
    if (batch.error !== undefined) throw new Error(`warm runner: ${batch.error}`);
    if (batch.cells) return batch.cells.map((a, i) => result(calls[i] as CodeCall, a));
    const opened = await request({ op: 'open', ...(encoded ? { files: encoded } : {}) });
    const { session } = JSON.parse(opened) as { session: string };
    try {
      const results: SubmissionResult[] = [];
      for (const c of calls) results.push(await one(c, session));
      return results;
    } finally {
      if (!ended) await request({ op: 'close', session });
    }
  }

  return {
    run: (calls) => Promise.all(calls.map((c) => one(c))),
    runCells,
    async close() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const closed = new Promise((resolve) => child.once('close', resolve));
      requests.end();
      await closed;
    },
  };
}

/** One answer of the warm runner (warm.py `answer`), outputs base64. */
interface WarmAnswer {
  exit: number;
  cost: number;
  timed_out: boolean;
  stdout: string;
  stderr: string;
  rolled_back?: boolean;
  error?: string;
}

/**
 * Several runners as one: a batch of calls is split over them in order, a session goes to the one
 * with the fewest sessions in flight. The warm runner is one process, so sft-data runs one per core.
 */
export function pooledRunner(runners: ToolRunner[]): ToolRunner {
  if (runners.length === 1) return runners[0] as ToolRunner;
  const busy = runners.map(() => 0);
  return {
    async run(calls) {
      const size = Math.ceil(calls.length / runners.length);
      const parts = runners.map((r, k) => r.run(calls.slice(k * size, (k + 1) * size)));
      return (await Promise.all(parts)).flat();
    },
    async runCells(calls, files) {
      const k = busy.indexOf(Math.min(...busy));
      busy[k] += 1;
      try {
        return await (runners[k] as ToolRunner).runCells(calls, files);
      } finally {
        busy[k] -= 1;
      }
    },
    async close() {
      await Promise.all(runners.map((r) => r.close()));
    },
  };
}
