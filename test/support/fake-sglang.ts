/**
 * A scripted server speaking SGLang's native protocol (the subset rollout uses), run as its own
 * process so tests can kill it mid-run. The reply to a request is the script's text for that turn
 * (the number of `<|im_start|>assistant` in the decoded input), tokenized with the given tokenizer,
 * ending with `<|im_end|>` and cut at max_new_tokens. KV capacity is enforced like an engine does:
 * a request waits until its input + max_new_tokens fit, then takes `msPerToken` per output token.
 *
 *   node dist/test/support/fake-sglang.js '<json FakeOptions>'   → prints `listening on http://…`
 */
import { createServer, type ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';
import { type Exit, startServer } from '../../src/process/serve.js';
import { loadTokenizer } from '../../src/rollout/tokenizer.js';
import { cleanEnv } from './env.js';
import { readJsonBody } from './http-body.js';

export interface FakeOptions {
  tokenizer: string;
  /** KV tokens (max_total_num_tokens). */
  capacity: number;
  /** Texts per assistant turn; `byPrompt` entries win when `match` occurs in the prompt. */
  turns: string[];
  byPrompt?: { match: string; turns: string[] }[];
  /**
   * Replies that vary by request: the k-th request with the same prompt, where it contains `match`,
   * gets `replies[k % replies.length]` (single-turn scripts, e.g. right and wrong answers for GRPO groups);
   * with `turn`, only at that assistant turn (0 the first), so samples diverge there and the script goes on.
   */
  cycle?: { match: string; replies: string[]; turn?: number }[];
  /**
   * Replies drawn by the request's `sampling_seed`, as a sampling engine would: where the prompt contains
   * `match`, a request gets `replies[sampling_seed % replies.length]` (a random one without a seed), so
   * a rerun with the same seeds repeats every turn and another seed does not.
   */
  seeded?: { match: string; replies: string[] }[];
  /** The weight_version served at start (SGLang's; default "0"). */
  weightVersion?: string;
  msPerToken?: number;
  baseMs?: number;
  modelPath?: string;
  /**
   * LoRA replies' weight_version: `server` (SGLang's: the server's label, which
   * /update_weight_version sets) or `adapter` (engine-serve's: the step of the adapter that served
   * the request, the base's label for a request naming none). Default `server`.
   */
  loraVersion?: 'server' | 'adapter';
  /** A faulty engine: serves the base whatever `lora_path` says (verl #5220). */
  dropLora?: boolean;
  /** A faulty engine: a request naming adapter N is served by the one loaded before it (stale weights). */
  staleLora?: boolean;
}

export interface FakeStats {
  requests: number;
  completed: number;
  maxUsed: number;
  reloads: string[];
  /** Every /generate request as received, in arrival order: its input ids and whole `sampling_params`. */
  generated: { input_ids: number[]; sampling_params: Record<string, unknown>; lora_path?: string }[];
  /** /load_lora_adapter and /unload_lora_adapter calls in order (`path` only on a load). */
  adapters: { op: 'load' | 'unload'; name: string; path?: string }[];
}

/** Deterministic, distinct per position and token, so tests can check alignment. */
export const fakeLogprob = (id: number, i: number): number => -((id % 89) + 1) / 100 - i / 1e6;

async function serve(o: FakeOptions): Promise<void> {
  const tk = await loadTokenizer(o.tokenizer);
  const eos = tk.tokenToId('<|im_end|>')!;
  let used = 0;
  let running = 0;
  const waiting: { need: number; go: () => void }[] = [];
  const stats: FakeStats = {
    requests: 0,
    completed: 0,
    maxUsed: 0,
    reloads: [],
    generated: [],
    adapters: [],
  };
  let model = o.modelPath ?? 'fake-model';
  let version = o.weightVersion ?? '0';
  const baseVersion = version;
  // loaded adapters, oldest first: name, folder, and the server label set after its load
  const loras: { name: string; path: string; version: string }[] = [];
  const cycled = new Map<string, number>();

  const admit = (): void => {
    while (waiting.length > 0 && (used + waiting[0].need <= o.capacity || running === 0)) {
      const w = waiting.shift()!;
      used += w.need;
      running++;
      stats.maxUsed = Math.max(stats.maxUsed, used);
      w.go();
    }
  };

  const json = (res: ServerResponse, status: number, value: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
  };

  const server = createServer(async (req, res) => {
    try {
      if (req.method === 'GET' && req.url === '/get_server_info') {
        return json(res, 200, { max_total_num_tokens: o.capacity, model_path: model });
      }
      if (req.method === 'GET' && req.url === '/get_model_info') return json(res, 200, { model_path: model });
      if (req.method === 'GET' && req.url === '/get_weight_version')
        return json(res, 200, { weight_version: version });
      if (req.method === 'GET' && req.url === '/stats') return json(res, 200, stats);
      if (req.method === 'GET' && req.url === '/metrics') {
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
        return res.end(
          `# TYPE sglang:num_used_tokens gauge\nsglang:num_used_tokens{model_name="${model}"} ${used}\n` +
            `sglang:num_running_reqs{model_name="${model}"} ${running}\nsglang:num_queue_reqs ${waiting.length}\n`,
        );
      }
      if (req.method === 'POST' && req.url === '/update_weights_from_disk') {
        const b = (await readJsonBody(req)) as { model_path?: string; weight_version?: string };
        model = String(b.model_path);
        if (b.weight_version !== undefined) version = b.weight_version;
        stats.reloads.push(model);
        await new Promise((r) => setTimeout(r, 50));
        return json(res, 200, { success: true, message: 'ok' });
      }
      if (req.method === 'POST' && req.url === '/load_lora_adapter') {
        const b = (await readJsonBody(req)) as { lora_name?: unknown; lora_path?: unknown };
        if (typeof b.lora_name !== 'string' || typeof b.lora_path !== 'string')
          return json(res, 400, { success: false, error_message: 'lora_name and lora_path are required' });
        if (loras.some((l) => l.name === b.lora_name))
          return json(res, 400, {
            success: false,
            error_message: `an adapter named ${b.lora_name} is already loaded`,
          });
        loras.push({ name: b.lora_name, path: b.lora_path, version });
        stats.adapters.push({ op: 'load', name: b.lora_name, path: b.lora_path });
        return json(res, 200, {
          success: true,
          error_message: '',
          loaded_adapters: Object.fromEntries(loras.map((l) => [l.name, l.path])),
        });
      }
      if (req.method === 'POST' && req.url === '/unload_lora_adapter') {
        const b = (await readJsonBody(req)) as { lora_name?: unknown };
        const i = loras.findIndex((l) => l.name === b.lora_name);
        if (i < 0)
          return json(res, 400, {
            success: false,
            error_message: `no adapter named ${b.lora_name} is loaded`,
          });
        loras.splice(i, 1);
        stats.adapters.push({ op: 'unload', name: String(b.lora_name) });
        return json(res, 200, {
          success: true,
          error_message: '',
          loaded_adapters: Object.fromEntries(loras.map((l) => [l.name, l.path])),
        });
      }
      if (req.method === 'POST' && req.url === '/update_weight_version') {
        const b = (await readJsonBody(req)) as { new_version?: unknown };
        if (typeof b.new_version !== 'string')
          return json(res, 400, { success: false, message: 'new_version: expected a string' });
        version = b.new_version;
        // the adapter loaded last is the one this label names
        if (loras.length > 0) loras[loras.length - 1].version = version;
        return json(res, 200, { success: true, message: `weight version updated to ${version}` });
      }
      if (req.method === 'POST' && req.url === '/generate') {
        const b = (await readJsonBody(req)) as {
          input_ids: number[];
          sampling_params: { max_new_tokens: number; sampling_seed?: number };
          return_logprob?: boolean;
          lora_path?: string | null;
        };
        stats.requests++;
        stats.generated.push({
          input_ids: b.input_ids,
          sampling_params: b.sampling_params,
          ...(typeof b.lora_path === 'string' ? { lora_path: b.lora_path } : {}),
        });
        // the version of what serves this request
        let served = version;
        if (typeof b.lora_path === 'string' && !o.dropLora) {
          const i = loras.findIndex((l) => l.name === b.lora_path);
          if (i < 0)
            return json(res, 400, {
              error: { message: `LoRA adapter ${b.lora_path} is not loaded`, code: 400 },
            });
          const lora = loras[o.staleLora ? Math.max(0, i - 1) : i];
          if (o.loraVersion === 'adapter') served = lora.version;
        } else if (o.loraVersion === 'adapter') served = baseVersion;
        const maxNew = b.sampling_params.max_new_tokens;
        const text = tk.decode(b.input_ids);
        const turn = text.split('<|im_start|>assistant').length - 2;
        const script = o.byPrompt?.find((p) => text.includes(p.match))?.turns ?? o.turns;
        const cycle = o.cycle?.find(
          (c) => text.includes(c.match) && (c.turn === undefined || c.turn === turn),
        );
        let reply = script[Math.min(turn, script.length - 1)];
        if (cycle) {
          const k = cycled.get(text) ?? 0; // counted per prompt: each group alternates on its own
          cycled.set(text, k + 1);
          reply = cycle.replies[k % cycle.replies.length];
        }
        const seeded = o.seeded?.find((c) => text.includes(c.match));
        if (seeded) {
          const seed = b.sampling_params.sampling_seed ?? Math.floor(Math.random() * 2 ** 31);
          reply = seeded.replies[seed % seeded.replies.length];
        }
        let ids = [...tk.encode(reply), eos];
        const finish =
          ids.length > maxNew ? { type: 'length', length: maxNew } : { type: 'stop', matched: eos };
        ids = ids.slice(0, maxNew);
        const need = b.input_ids.length + maxNew;
        await new Promise<void>((go) => {
          waiting.push({ need, go });
          admit();
        });
        await new Promise((r) => setTimeout(r, (o.baseMs ?? 0) + (o.msPerToken ?? 0) * ids.length));
        used -= need;
        running--;
        stats.completed++;
        admit();
        return json(res, 200, {
          text: tk.decode(ids),
          output_ids: ids,
          meta_info: {
            prompt_tokens: b.input_ids.length,
            completion_tokens: ids.length,
            weight_version: served,
            finish_reason: finish,
            output_token_logprobs: b.return_logprob
              ? ids.map((id, i) => [fakeLogprob(id, i), id, null])
              : undefined,
          },
        });
      }
      json(res, 404, { error: 'not found' });
    } catch (error) {
      json(res, 500, { error: String(error) });
    }
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, '127.0.0.1', () => {
    const addr = server.address() as { port: number };
    process.stderr.write(`listening on http://127.0.0.1:${addr.port}\n`);
  });
}

export interface FakeServer {
  url: string;
  exited: Promise<Exit>;
  stats(): Promise<FakeStats>;
  /** SIGKILL: connections drop mid-request, as when an engine crashes. */
  kill(): Promise<void>;
  /** SIGSTOP: the process hangs, its sockets still accept and nothing answers (a hung engine). */
  pause(): void;
  /** SIGCONT after `pause`. */
  resume(): void;
  close(): Promise<void>;
}

/** Starts the fake server as a child process. */
export async function startFakeSglang(options: FakeOptions): Promise<FakeServer> {
  const server = await startServer({
    name: 'fake-sglang',
    command: process.execPath,
    args: [fileURLToPath(import.meta.url), JSON.stringify(options)],
    env: cleanEnv(),
  });
  const url = server.url;
  let paused = false;
  const signal = (name: 'SIGSTOP' | 'SIGCONT') => {
    if (server.pid !== undefined) process.kill(server.pid, name);
    paused = name === 'SIGSTOP';
  };
  return {
    url,
    exited: server.exited,
    async stats() {
      return (await (await fetch(`${url}/stats`)).json()) as FakeStats;
    },
    kill: async () => void (await server.stop('SIGKILL')),
    pause: () => signal('SIGSTOP'),
    resume: () => signal('SIGCONT'),
    close: async () => {
      if (paused) signal('SIGCONT'); // a stopped process would not see SIGTERM
      await server.stop();
    },
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  void serve(JSON.parse(process.argv[2]) as FakeOptions);
}
