import { engineArgs, engineEnv } from '../backend/engine.js';
import { findPython } from '../backend/python.js';
import { spawnServer, writeReadyFile } from '../process/serve.js';
import { choice, integer, parse, program } from '../program.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program('engine-serve', 'embedded inference engine speaking the SGLang HTTP subset')
    .requiredOption('--model <dir>', 'checkpoint folder (HF layout)')
    .option('--port <n>', 'port (0: any free port)', integer(0, 65535), 30000)
    .option('--host <addr>', 'bind address', '127.0.0.1')
    .option(
      '--max-total-tokens <n>',
      'KV cache budget in tokens; a request that does not fit waits',
      integer(1),
      65536,
    )
    .option('--max-running-requests <n>', 'most requests decoded together', integer(1), 256)
    .option(
      '--weight-version <label>',
      'the label of the weights served at start (SGLang weight_version)',
      '0',
    )
    .addOption(
      choice(
        '--dtype <dtype>',
        'weights and KV cache dtype; logits are fp32 either way (auto: the checkpoint torch_dtype on a GPU, fp32 on CPU)',
        ['auto', 'bf16', 'fp16', 'fp32'] as const,
        'auto',
      ),
    )
    .option('--device <name>', 'auto (the first GPU, else the CPU), cpu, cuda or cuda:N', 'auto')
    .option(
      '--threads <n>',
      "CPU threads for the model's ops (0: torch's default, one per core); 1 leaves the other cores to a trainer that overlaps",
      integer(0),
      0,
    )
    .option(
      '--disable-radix-cache',
      "prefill every request's whole input: no prefix cache (SGLang's flag of the same name)",
    )
    .addOption(
      choice(
        '--decode-kv <layout>',
        "how decode reads the running requests' K/V: rows (dense rows kept up to date, at most the KV cache's bytes again) or pool (gathered from the cache's slots every step)",
        ['rows', 'pool'] as const,
        'rows',
      ),
    )
    .option('--ready-file <file>', 'write the URL to FILE once listening (for scripts)');
  if (!parse(cmd, argv)) return;
  const o = cmd.opts<{
    model: string;
    port: number;
    host: string;
    maxTotalTokens: number;
    maxRunningRequests: number;
    weightVersion: string;
    dtype: string;
    device: string;
    threads: number;
    disableRadixCache?: boolean;
    decodeKv: 'rows' | 'pool';
    readyFile?: string;
  }>();
  const python = await findPython();
  // The server prints `listening on http://HOST:PORT` and its own errors on stderr, passed through
  // as they come (no double report); the wrapper only watches for that line.
  const server = spawnServer({
    name: 'engine-serve',
    command: python,
    args: [...engineArgs(o), '--dtype', o.dtype, '--device', o.device],
    env: engineEnv(o.threads),
    echo: true,
    readyTimeoutMs: 0,
  });
  // A terminal's Ctrl-C reaches the server directly too; it stops on the first signal it gets.
  let forwarded = false;
  const forward = (signal: NodeJS.Signals) => () => {
    forwarded = true;
    void server.stop(signal);
  };
  const onInt = forward('SIGINT');
  const onTerm = forward('SIGTERM');
  process.on('SIGINT', onInt).on('SIGTERM', onTerm);
  let failure: unknown;
  const readyFile = o.readyFile;
  if (readyFile) {
    server.ready.then(
      (url) => {
        try {
          writeReadyFile(readyFile, url);
        } catch (error) {
          failure = error;
          void server.stop();
        }
      },
      () => {},
    );
  }
  const exit = await server.exited;
  process.off('SIGINT', onInt).off('SIGTERM', onTerm);
  if (failure) throw failure;
  if (exit.signal && !forwarded) throw new Error(`the server was killed (${exit.signal})`);
  if (exit.code !== 0 && exit.code !== null) process.exitCode = exit.code;
}
