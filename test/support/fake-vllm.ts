/**
 * A scripted server speaking vLLM's OpenAI API (the subset rollout and train-step --sync use), in
 * process: `/v1/models` (the base, then each loaded LoRA adapter with the base as its `parent`),
 * `/v1/completions` with token-id prompts (>= 0.10.2's `return_token_ids`), and the runtime LoRA
 * routes `/v1/load_lora_adapter` {lora_name, lora_path} and `/v1/unload_lora_adapter` {lora_name},
 * which vLLM serves only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (404 otherwise). A completion
 * names the adapter as its `model`; the reply's `model` is what served it. The reply to a request
 * is the script's text for its assistant turn, tokenized, ending with `<|im_end|>`.
 */
import { createServer } from 'node:http';
import { loadTokenizer } from '../../src/rollout/tokenizer.js';
import { fakeLogprob } from './fake-sglang.js';
import { readJsonBody } from './http-body.js';

export interface FakeVllmOptions {
  tokenizer: string;
  /** Texts per assistant turn. */
  turns: string[];
  /** The base model's id (`--served-model-name`; default "/models/base"). */
  model?: string;
  /** The server runs with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (default true). */
  runtimeLora?: boolean;
  /** `--max-loras`: a load beyond it fails (default 8). */
  maxLoras?: number;
  /** A faulty engine: serves the base whatever `model` names, and says so in the reply (verl #5220). */
  dropLora?: boolean;
}

export interface FakeVllm {
  url: string;
  /** Adapter loads and unloads, in order. */
  adapters: { op: 'load' | 'unload'; name: string; path?: string }[];
  /** The `model` of each completion request. */
  asked: string[];
  close(): Promise<void>;
}

export async function startFakeVllm(o: FakeVllmOptions): Promise<FakeVllm> {
  const tk = await loadTokenizer(o.tokenizer);
  const eos = tk.tokenToId('<|im_end|>')!;
  const base = o.model ?? '/models/base';
  const loras = new Map<string, string>();
  const adapters: FakeVllm['adapters'] = [];
  const asked: string[] = [];
  const error = (status: number, message: string) =>
    JSON.stringify({ error: { message, type: 'BadRequestError', code: status } });
  const server = createServer(async (req, res) => {
    const json = (status: number, text: string) =>
      res.writeHead(status, { 'content-type': 'application/json' }).end(text);
    try {
      const b = req.method === 'POST' ? await readJsonBody(req) : {};
      if (req.url === '/v1/models') {
        const data = [
          { id: base, object: 'model', root: base, parent: null },
          ...[...loras].map(([id, path]) => ({ id, object: 'model', root: path, parent: base })),
        ];
        return json(200, JSON.stringify({ object: 'list', data }));
      }
      if (req.url === '/v1/load_lora_adapter' || req.url === '/v1/unload_lora_adapter') {
        if (o.runtimeLora === false) return json(404, JSON.stringify({ detail: 'Not Found' }));
        const name = b.lora_name;
        if (typeof name !== 'string') return json(400, error(400, 'lora_name is required'));
        if (req.url === '/v1/load_lora_adapter') {
          if (typeof b.lora_path !== 'string') return json(400, error(400, 'lora_path is required'));
          if (loras.has(name))
            return json(400, error(400, `The lora adapter '${name}' has already been loaded.`));
          if (loras.size >= (o.maxLoras ?? 8)) return json(400, error(400, 'more adapters than --max-loras'));
          loras.set(name, b.lora_path);
          adapters.push({ op: 'load', name, path: b.lora_path });
          return res
            .writeHead(200, { 'content-type': 'text/plain' })
            .end(`Success: LoRA adapter '${name}' added successfully.`);
        }
        if (!loras.delete(name)) return json(404, error(404, `The lora adapter '${name}' cannot be found.`));
        adapters.push({ op: 'unload', name });
        return res
          .writeHead(200, { 'content-type': 'text/plain' })
          .end(`Success: LoRA adapter '${name}' removed successfully.`);
      }
      if (req.url === '/v1/completions') {
        const model = String(b.model);
        asked.push(model);
        if (model !== base && !loras.has(model))
          return json(404, error(404, `The model \`${model}\` does not exist.`));
        const prompt = b.prompt as number[];
        const turn = tk.decode(prompt).split('<|im_start|>assistant').length - 2;
        const maxTokens = Number(b.max_tokens);
        const all = [...tk.encode(o.turns[Math.min(turn, o.turns.length - 1)]), eos];
        const ids = all.slice(0, maxTokens);
        return json(
          200,
          JSON.stringify({
            id: 'cmpl-fake',
            object: 'text_completion',
            model: o.dropLora ? base : model,
            choices: [
              {
                index: 0,
                text: tk.decode(ids),
                token_ids: ids,
                finish_reason: all.length > maxTokens ? 'length' : 'stop',
                logprobs: { token_logprobs: ids.map((id, i) => fakeLogprob(id, i)) },
              },
            ],
          }),
        );
      }
      if (req.url === '/metrics') return res.writeHead(200, { 'content-type': 'text/plain' }).end('');
      json(404, JSON.stringify({ detail: 'Not Found' }));
    } catch (e) {
      json(500, error(500, String(e)));
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    url,
    adapters,
    asked,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
