import { execa } from 'execa';
import { BACKEND_SCRIPT, backendEnv, backendMessage, findPython } from '../backend/python.js';
import { DataError } from '../errors.js';
import { choice, integer, parse, program } from '../program.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program('model-init', 'randomly initialised Qwen3-architecture checkpoint (HF layout)')
    .requiredOption(
      '--config <file>',
      'config.json with Qwen3 field names (tokenizer files beside it are copied)',
    )
    .requiredOption('--out <dir>', 'checkpoint folder to write')
    .option('--seed <n>', 'initialisation seed', integer(0), 0)
    .addOption(
      choice(
        '--init <scheme>',
        'normal: N(0, initializer_range); induction: heads above the first layer start as copying heads',
        ['normal', 'induction'],
        'normal',
      ),
    )
    .option(
      '--max-shard-bytes <n>',
      'split model.safetensors into shards of at most N bytes (0: one file)',
      integer(0),
      0,
    );
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{ config: string; out: string; seed: number; init: string; maxShardBytes: number }>();
  const python = await findPython();
  const args = [
    BACKEND_SCRIPT,
    'init',
    '--config',
    o.config,
    '--out',
    o.out,
    '--seed',
    String(o.seed),
    '--init',
    o.init,
  ];
  if (o.maxShardBytes > 0) args.push('--max-shard-bytes', String(o.maxShardBytes));
  const result = await execa(python, args, { env: backendEnv(), reject: false, stdout: 'inherit' });
  if (result.exitCode !== 0) throw new DataError(backendMessage(String(result.stderr), 'model-init failed'));
}
