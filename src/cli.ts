import { exitCodeOf, UsageError } from './errors.js';

/**
 * Every command of the toolchain. Modules load lazily so `rstar roc-filter` does not pay for
 * the tokenizer or the Redis client; a command whose module is not built yet says so (exit 2).
 */
export const COMMANDS: Record<string, string> = {
  'sft-data': 'build non-reasoning SFT records (or the synthetic tool-use curriculum)',
  'sft-train': 'SFT over a data set with a wall-clock/step budget and an LR schedule (one resident trainer)',
  'sft-eval': "the SFT stage's held-out figures (format validity, tool success, accuracy) from trajectories",
  rollout: 'multi-turn agent rollouts over SGLang / vLLM / engine-serve with the KV-cache scheduler',
  'sandbox-serve': 'isolated Python execution service (code-judge compatible API)',
  'sandbox-run': 'run sandbox submissions from NDJSON through a sandbox (embedded if no --sandbox)',
  'roc-filter': 'GRPO-RoC: down-sample 2G rollouts per problem to G (Resample-on-Correct)',
  advantage: 'GRPO group advantages (std-normalised, Dr. GRPO, or RLOO)',
  'train-step': 'one optimiser step (SFT or GRPO) on the PyTorch backend',
  eval: 'benchmarks: avg@n, unbiased pass@k, maj@n, reports and plots',
  verify: 'extract final answers and check them against references',
  'hard-problems': 'the problems not solved by every rollout of the last pass (the last RL stage)',
  'engine-serve': 'embedded inference engine speaking the SGLang HTTP subset',
  'model-init': 'randomly initialised Qwen3-architecture checkpoint (HF layout)',
  'model-merge': 'a LoRA adapter (PEFT format) merged into its base: a full HF checkpoint',
  doctor: 'what the PyTorch backend finds here: Python, torch build, GPUs, bf16, collectives, FSDP, BLAS',
  schema: 'print the JSON Schema of a record',
  view: 'browse runs in the browser: curves, steps, trajectories, evaluations; live, or exported',
};

export interface CommandModule {
  /** Runs the command with its own arguments; resolves when all output is flushed. */
  run(argv: string[]): Promise<void>;
}

function help(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((name) => name.length));
  const lines = Object.entries(COMMANDS).map(([name, summary]) => `  ${name.padEnd(width)}  ${summary}`);
  return [
    'Usage: rstar <command> [options] [FILE]',
    '',
    'Commands read NDJSON from FILE or stdin and write NDJSON to stdout; logs go to stderr.',
    '',
    'Commands:',
    ...lines,
    '',
    'Run `rstar <command> --help` for the options of one command.',
  ].join('\n');
}

async function load(name: string): Promise<CommandModule> {
  try {
    return (await import(`./commands/${name}.js`)) as CommandModule;
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'ERR_MODULE_NOT_FOUND' && String(error).includes(`commands/${name}.js`)) {
      throw new UsageError(`'${name}' is part of the toolchain but is not built yet`);
    }
    throw error;
  }
}

export async function main(argv: string[]): Promise<void> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(`${help()}\n`);
    if (name === undefined) process.exitCode = 2;
    return;
  }
  if (name === '--version' || name === '-V') {
    process.stdout.write('0.1.0\n');
    return;
  }
  try {
    if (!Object.hasOwn(COMMANDS, name)) throw new UsageError(`unknown command '${name}'\n\n${help()}`);
    const command = await load(name);
    await command.run(rest);
  } catch (error) {
    process.stderr.write(`rstar ${name}: ${error instanceof Error ? error.message : String(error)}\n`);
    if (process.env.RSTAR_DEBUG && error instanceof Error) process.stderr.write(`${error.stack}\n`);
    process.exitCode = exitCodeOf(error);
  }
}
