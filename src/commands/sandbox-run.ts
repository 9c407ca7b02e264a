import { openInput, readRecords } from '../ndjson/index.js';
import { NdjsonWriter } from '../ndjson/write.js';
import { addDeprecatedAlias, integer, number, parse, program } from '../program.js';
import { Submission, type SubmissionResult } from '../records/sandbox.js';
import { SandboxClient } from '../sandbox/client.js';
import { startSandbox } from '../sandbox/embedded.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'sandbox-run',
    'run sandbox submissions from NDJSON through a sandbox (embedded if no --sandbox)',
  )
    .argument('[file]', 'submissions NDJSON (default: stdin)')
    .option('--sandbox <url>', 'sandbox-serve (or code-judge) URL; without it an embedded service runs')
    .option('--sandbox-token <token>', 'bearer token of --sandbox (env RSTAR_SANDBOX_TOKEN)')
    .option('--workers <n>', 'embedded service: warm executors', integer(1))
    .option(
      '--tool-timeout <s>',
      "embedded service: one tool call's wall-clock limit, seconds",
      number(0.01, 3600),
    )
    .option('--memory <mb>', 'embedded service: memory per call, MiB', integer(16))
    .option('--concurrency <n>', 'submissions in flight', integer(1), 1024);
  addDeprecatedAlias(cmd, '--token <token>', '--sandbox-token');
  addDeprecatedAlias(cmd, '--timeout <s>', '--tool-timeout');
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{
    sandbox?: string;
    sandboxToken?: string;
    workers?: number;
    toolTimeout?: number;
    memory?: number;
    concurrency: number;
  }>();
  const embedded = o.sandbox
    ? undefined
    : await startSandbox({ workers: o.workers, timeoutS: o.toolTimeout, memoryMb: o.memory });
  const client = new SandboxClient(o.sandbox ?? (embedded as { url: string }).url, {
    token: o.sandboxToken ?? process.env.RSTAR_SANDBOX_TOKEN,
  });
  const writer = new NdjsonWriter();
  try {
    const { stream, source } = openInput(cmd.args[0]);
    // Results go out in input order while up to `concurrency` calls run.
    const window: Promise<SubmissionResult>[] = [];
    for await (const { record } of readRecords(stream, source, Submission)) {
      const pending = client.run(record);
      // Awaited in order below; this only keeps a failure from surfacing twice.
      pending.catch(() => {});
      window.push(pending);
      if (window.length >= o.concurrency)
        await writer.write(await (window.shift() as Promise<SubmissionResult>));
    }
    for (const pending of window) await writer.write(await pending);
    await writer.end();
  } finally {
    await client.close();
    await embedded?.close();
  }
}
