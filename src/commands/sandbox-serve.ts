import type { Server } from 'node:http';
import { InvalidArgumentError } from 'commander';
import { UsageError } from '../errors.js';
import { writeReadyFile } from '../process/serve.js';
import { addDeprecatedAlias, integer, number, parse, program } from '../program.js';
import { DEFAULT_HASH_SEED, type HashSeed } from '../sandbox/executor.js';
import { defaultOptions, LocalPool, type Runner } from '../sandbox/pool.js';
import { createSandboxServer, listen } from '../sandbox/server.js';

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1', '[::1]']);

function hashSeed(value: string): HashSeed {
  if (value === 'random') return value;
  const n = Number(value);
  if (!/^\d+$/.test(value) || n > 4294967295)
    throw new InvalidArgumentError(`${value} is not an integer in [0, 4294967295] or random`);
  return n;
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('sandbox-serve', 'isolated Python execution service (code-judge compatible API)')
    .option('--host <host>', 'bind address (non-loopback requires --sandbox-token)', '127.0.0.1')
    .option('--port <n>', 'port (0 = any free port)', integer(0, 65535), 8088)
    .option('--workers <n>', 'warm executors (default: 2 x CPUs)', integer(1))
    .option('--tool-timeout <s>', "one tool call's wall-clock limit, seconds", number(0.01, 3600), 10)
    .option('--memory <mb>', 'memory per call, MiB', integer(16), 512)
    .option('--output-chars <n>', 'stdout/stderr characters returned per call', integer(0), 1000)
    .option('--queue-timeout <s>', 'queue wait before queue_timeout (/run, /run/batch)', number(0, 86400), 20)
    .option('--max-queue <n>', 'queued short calls before refusing with queue_timeout', integer(1))
    .option(
      '--cpus <n>',
      'cores all calls together may use (cgroup CPU quota; default: no cap)',
      number(0.01, 4096),
    )
    .option(
      '--hash-seed <n>',
      'PYTHONHASHSEED of every executor: a number (set and dict order of strings the same in every call) or random',
      hashSeed,
      DEFAULT_HASH_SEED,
    )
    .option(
      '--session-ttl <s>',
      'seconds a stateful session may stay idle before it is closed',
      number(1, 86400),
      600,
    )
    .option(
      '--max-sessions <n>',
      'stateful sessions held at once (the least recently used idle one goes first)',
      integer(1, 4096),
      1024,
    )
    .option(
      '--session-memory <mb>',
      'MiB all idle sessions together may hold (beyond it the oldest idle ones are closed)',
      integer(64),
      4096,
    )
    .option('--redis <url>', 'share one Redis queue with other sandbox-serve processes')
    .option('--sandbox-token <token>', 'require `Authorization: Bearer TOKEN` (env RSTAR_SANDBOX_TOKEN)')
    .option('--ready-file <file>', 'write the URL to FILE once listening (for scripts)');
  addDeprecatedAlias(cmd, '--token <token>', '--sandbox-token');
  addDeprecatedAlias(cmd, '--timeout <s>', '--tool-timeout');
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{
    host: string;
    port: number;
    workers?: number;
    toolTimeout: number;
    memory: number;
    outputChars: number;
    queueTimeout: number;
    maxQueue?: number;
    cpus?: number;
    hashSeed: HashSeed;
    sessionTtl: number;
    maxSessions: number;
    sessionMemory: number;
    redis?: string;
    sandboxToken?: string;
    readyFile?: string;
  }>();
  const token = o.sandboxToken ?? process.env.RSTAR_SANDBOX_TOKEN;
  if (!LOOPBACK.has(o.host) && !token) {
    throw new UsageError(`binding ${o.host} (not loopback) requires --sandbox-token`);
  }
  const log = (line: string) => process.stderr.write(`${line}\n`);
  const options = defaultOptions({
    ...(o.workers !== undefined ? { workers: o.workers } : {}),
    timeoutS: o.toolTimeout,
    memoryMb: o.memory,
    outputChars: o.outputChars,
    queueTimeoutS: o.queueTimeout,
    ...(o.maxQueue !== undefined ? { maxQueue: o.maxQueue } : {}),
    cpus: o.cpus,
    hashSeed: o.hashSeed,
    sessionTtlS: o.sessionTtl,
    maxSessions: o.maxSessions,
    sessionMemoryMb: o.sessionMemory,
    log,
  });
  // One handler for the whole life, installed before the pool makes its cgroups (a signal before it
  // would kill the process outright and leave them): a signal during start-up (executors spawning,
  // Redis connecting) ends start-up at its next step, and everything made so far is removed.
  let stopping = false;
  let onStop = () => {};
  const stopped = new Promise<void>((resolve) => {
    onStop = resolve;
  });
  const stop = () => {
    stopping = true;
    onStop();
  };
  process.on('SIGTERM', stop).on('SIGINT', stop);
  const pool = new LocalPool(options);
  let runner: Runner = pool;
  let server: Server | undefined;
  try {
    // A Ctrl-C reaches the executors too: one that dies of it while starting is no error then.
    const started = await pool.start().then(
      () => true,
      (error: unknown) => {
        if (stopping) return false;
        throw error;
      },
    );
    if (!started) return;
    if (o.redis && !stopping) {
      const { RedisRunner } = await import('../sandbox/redis.js');
      const redis = new RedisRunner(o.redis, pool, { log });
      runner = redis;
      // A Redis that does not answer must not hold a SIGTERM up.
      await Promise.race([redis.start(), stopped]);
    }
    if (stopping) return;
    server = createSandboxServer({
      host: o.host,
      port: o.port,
      token,
      runner,
      describe: () => ({
        workers: options.workers,
        isolation: pool.isolation.isolate ? 'namespaces' : 'degraded',
        cgroup: pool.cgroupKind,
        redis: Boolean(o.redis),
        // What a client's tool cache needs to judge results: the time limit and whether set order is fixed.
        timeout_s: options.timeoutS,
        hash_seed: options.hashSeed,
        sessions: pool.sessionCount,
        max_sessions: options.maxSessions,
        session_ttl_s: options.sessionTtlS,
      }),
    });
    const address = await listen(server, o.host, o.port);
    log(
      `sandbox-serve: ${options.workers} workers, isolation: ${pool.isolation.reason}; limits: ${pool.cgroupKind}`,
    );
    const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
    const url = `http://${host}:${address.port}`;
    log(`listening on ${url}`);
    if (o.readyFile) writeReadyFile(o.readyFile, url);
    await stopped;
    log('sandbox-serve: shutting down');
  } finally {
    // Runs on a bind failure, a bad --ready-file or a signal alike: no executor, cgroup or
    // Redis consumer outlives the process.
    if (server?.listening) {
      server.close();
      server.closeIdleConnections();
    }
    await runner.close().catch((error: Error) => log(`sandbox-serve: shutdown error: ${error.message}`));
    if (runner !== pool) await pool.close();
    server?.closeAllConnections();
    process.off('SIGTERM', stop).off('SIGINT', stop);
  }
}
