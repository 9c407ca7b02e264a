import { mkdirSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../errors.js';
import { type NdjsonWriter, openOutput } from '../ndjson/index.js';
import { addDeprecatedAlias, choice, integer, number, parse, program } from '../program.js';
import { Rng } from '../random.js';
import { toolStateOption } from '../rollout/options.js';
import { loadProtocol } from '../rollout/protocol.js';
import type { ToolState } from '../rollout/tool-state.js';
import { SandboxClient } from '../sandbox/client.js';
import { ConversationRenderer } from '../sft/conversation.js';
import { agenticDemonstrations } from '../sft/curriculum/agentic.js';
import {
  CURRICULA,
  demonstrations,
  parseFamilyWeights,
  problemOf,
  split,
  type Task,
} from '../sft/curriculum/index.js';
import type { SftRecord } from '../sft/record.js';
import { emptyStats, readSources } from '../sft/sources/index.js';
import {
  embeddedRunner,
  pooledRunner,
  sandboxRunner,
  type ToolRunner,
  warmRunner,
} from '../sft/tool-runner.js';

const TINY = fileURLToPath(new URL('../../../fixtures/tiny', import.meta.url));

interface Options {
  synthetic?: string;
  familyWeights?: string;
  train: number;
  test: number;
  seed: number;
  errorRate: number;
  slipLoss?: boolean;
  out?: string;
  testOut?: string;
  tokenizer: string;
  chatTemplate: string;
  tools?: string;
  maxSeqTokens: number;
  skipInvalid?: boolean;
  keepMath?: boolean;
  sandbox?: string;
  sandboxToken?: string;
  python?: string;
  toolState: ToolState;
}

function log(message: string): void {
  process.stderr.write(`sft-data: ${message}\n`);
}

async function writeAll(writer: NdjsonWriter, records: unknown[]): Promise<void> {
  for (const r of records) await writer.write(r);
  await writer.end();
}

async function toolRunner(opts: Options): Promise<ToolRunner> {
  if (opts.sandbox === 'embedded') return embeddedRunner();
  if (opts.sandbox !== undefined) {
    const token = opts.sandboxToken ?? process.env.RSTAR_SANDBOX_TOKEN;
    // A refused token fails here, naming the URL, before any demonstration is built.
    await new SandboxClient(opts.sandbox, { token }).checkAuth();
    return sandboxRunner(opts.sandbox, { token });
  }
  // One warm Python per core: the programs are trusted and a process runs one call at a time.
  const cores = Math.max(1, Math.min(4, availableParallelism()));
  return pooledRunner(Array.from({ length: cores }, () => warmRunner({ python: opts.python })));
}

/**
 * The agentic families' demonstrations, in the same runner as the others (their files go with each
 * call, or once to the session), stateless or as sessions (`--tool-state`).
 */
function multiStep(
  tasks: Task[],
  name: string,
  opts: Options,
  renderer: ConversationRenderer,
  runner: ToolRunner,
): Promise<SftRecord[]> {
  return agenticDemonstrations(tasks, runner, renderer, {
    name,
    // session: a task's calls run as one session's cells, the second reusing the first's variables
    mode: opts.toolState,
    record: (t) => {
      const p = problemOf(t, name, 'train');
      return { id: p.id, source: p.source as string };
    },
  });
}

async function synthetic(name: string, opts: Options, renderer: ConversationRenderer): Promise<void> {
  let weights: Record<string, number> | undefined;
  if (opts.familyWeights !== undefined) {
    try {
      weights = parseFamilyWeights(opts.familyWeights, name);
    } catch (e) {
      throw new UsageError(`--family-weights: ${(e as Error).message}`);
    }
  }
  const tasks = split(name, { train: opts.train, test: opts.test, seed: opts.seed, weights });
  const runner = await toolRunner(opts);
  // Multi-step tasks (the agentic families, agentic.ts) carry files.
  const single = tasks.train.filter((t) => t.steps === undefined);
  const multi = tasks.train.filter((t) => t.steps !== undefined);
  let built: Awaited<ReturnType<typeof demonstrations>>;
  let steps: SftRecord[] = [];
  try {
    if (multi.length > 0) steps = await multiStep(multi, name, opts, renderer, runner);
    built = await demonstrations(single, runner, renderer, {
      errorRate: opts.errorRate,
      slipLoss: opts.slipLoss === true,
      seed: opts.seed,
      name,
      toolState: opts.toolState,
    });
  } finally {
    await runner.close();
  }
  // Back in the order of the tasks.
  const one = built.records[Symbol.iterator]();
  const two = steps[Symbol.iterator]();
  const all = tasks.train.map(
    (t) => (t.steps === undefined ? one.next().value : two.next().value) as SftRecord,
  );
  built = { ...built, records: all };
  const records = built.records.filter(
    (r) => r.prompt_ids.length + r.response_ids.length <= opts.maxSeqTokens,
  );
  const trainProblems = tasks.train.map((t) => problemOf(t, name, 'train'));
  const testProblems = tasks.test.map((t) => problemOf(t, name, 'test'));
  if (opts.out !== undefined) {
    mkdirSync(opts.out, { recursive: true });
    await writeAll(openOutput(join(opts.out, 'sft.jsonl')), records);
    await writeAll(openOutput(join(opts.out, 'train-problems.jsonl')), trainProblems);
    await writeAll(openOutput(join(opts.out, 'test-problems.jsonl')), testProblems);
  } else {
    await writeAll(openOutput(), records);
  }
  if (opts.testOut !== undefined) await writeAll(openOutput(opts.testOut), testProblems);
  const lengths = records.map((r) => r.prompt_ids.length + r.response_ids.length);
  const trained = records.reduce((s, r) => s + r.loss_mask.reduce<number>((a, x) => a + x, 0), 0);
  log(
    `${name}: ${records.length} demonstrations (${built.failedFirst} with a failed first call fixed, ` +
      (opts.toolState === 'session' ? `${built.reused} reusing a variable of their first call, ` : '') +
      `${built.records.length - records.length} over --max-seq-tokens), ${testProblems.length} held-out problems; ` +
      `tokens/example mean ${Math.round(lengths.reduce((s, x) => s + x, 0) / Math.max(1, lengths.length))}, ` +
      `max ${Math.max(0, ...lengths)}, trained tokens ${trained}`,
  );
}

export async function run(argv: string[]): Promise<void> {
  const cmd = program('sft-data', 'build non-reasoning SFT records (or the synthetic tool-use curriculum)')
    .argument(
      '[files...]',
      'sources: OpenAI messages, ShareGPT/Hermes conversations, or instruction pairs (NDJSON)',
    )
    .addOption(choice('--synthetic <name>', 'build the tool-use curriculum instead', CURRICULA))
    .option(
      '--family-weights <spec>',
      "synthetic: draw the training demonstrations' families in these proportions, e.g. inspect=2,search=2 (others weigh 1; the held-out problems stay the uniform draw)",
    )
    .option('--train <n>', 'synthetic: training demonstrations', integer(0), 1000)
    .option('--test <n>', 'synthetic: held-out problems', integer(0), 200)
    .option('--seed <n>', 'shuffle / generation seed', integer(), 0)
    .option(
      '--error-rate <r>',
      'synthetic: fraction of demonstrations whose first call fails',
      number(0, 1),
      0.15,
    )
    .option('--slip-loss', 'synthetic: train on the failing first call too (default: loss only on the fix)')
    .option('--out <dir>', 'synthetic: write sft.jsonl, train-problems.jsonl, test-problems.jsonl there')
    .option('--test-out <file>', 'synthetic: write the held-out Problems there')
    .option('--tokenizer <dir>', 'tokenizer folder (or qwen3)', TINY)
    .option('--chat-template <spec>', 'rstar2, model (the tokenizer’s own), or a Jinja file', 'rstar2')
    .option('--tools <file>', 'tool schemas JSON (default: python_code_with_standard_io)')
    .option('--max-seq-tokens <n>', 'drop examples longer than this (prompt + response)', integer(1), 4096)
    .option('--skip-invalid', 'count and skip malformed lines instead of failing')
    .option('--keep-math', 'keep math-reasoning examples (dropped by default)')
    .option(
      '--sandbox <url>',
      "synthetic: run the programs in this sandbox-serve, or 'embedded' for one of its own (default: one warm local Python with the sandbox's cell semantics: the programs are the curriculum's own)",
    )
    .option('--sandbox-token <token>', 'synthetic: bearer token of --sandbox (env RSTAR_SANDBOX_TOKEN)')
    .option(
      '--python <path>',
      "synthetic: the warm runner's Python (default: python3, as the sandbox resolves it)",
    )
    .addOption(toolStateOption());
  addDeprecatedAlias(cmd, '--max-tokens <n>', '--max-seq-tokens');
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<Options>();
  const files = cmd.args;
  const ctx = await loadProtocol(opts.tokenizer, {
    chatTemplate: opts.chatTemplate,
    toolsFile: opts.tools,
    toolState: opts.toolState,
  });
  const renderer = new ConversationRenderer(ctx);

  if (opts.synthetic !== undefined) {
    if (files.length > 0) throw new UsageError('--synthetic takes no source files');
    await synthetic(opts.synthetic, opts, renderer);
    return;
  }
  if (opts.out !== undefined) throw new UsageError('--out is for --synthetic; sources go to stdout');
  if (opts.familyWeights !== undefined) throw new UsageError('--family-weights is for --synthetic');
  const stats = emptyStats();
  const records: SftRecord[] = await readSources(
    files,
    {
      renderer,
      tools: [...ctx.tools],
      maxTokens: opts.maxSeqTokens,
      skipInvalid: opts.skipInvalid === true,
      keepMath: opts.keepMath === true,
      onSkip: (message) => log(`skipped ${message}`),
    },
    stats,
  );
  new Rng(opts.seed).shuffle(records);
  await writeAll(openOutput(), records);
  log(JSON.stringify(stats));
}
