// Catches: the vLLM client sending the wrong request (token ids, sampling params, seed) or misreading ids, log-probs, capacity and reloads.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { EngineError, promSample, VllmClient } from '../../src/rollout/engines.js';

/** A minimal vLLM OpenAI server: records requests, answers like vLLM >= 0.10.2. */
describe('vLLM client', () => {
  let server: Server;
  let url: string;
  const bodies: Record<string, unknown>[] = [];
  /** Requests to the development-mode routes, in order: method, path, body. */
  const dev: { method?: string; url?: string; body: string }[] = [];
  /** Whether the server runs with VLLM_SERVER_DEV_MODE=1 (otherwise those routes are 404). */
  let devMode = true;
  before(async () => {
    server = createServer((req, res) => {
      let s = '';
      req.on('data', (d) => {
        s += d;
      });
      req.on('end', () => {
        if (req.url === '/v1/models') {
          res.writeHead(200, { 'content-type': 'application/json' });
          return res.end(JSON.stringify({ object: 'list', data: [{ id: '/models/qwen3-14b' }] }));
        }
        if (req.url === '/metrics') {
          res.writeHead(200, { 'content-type': 'text/plain' });
          return res.end(
            '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n' +
              'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="1000",num_cpu_blocks="0"} 1.0\n' +
              'vllm:kv_cache_usage_perc{engine="0",model_name="/models/qwen3-14b"} 0.25\n',
          );
        }
        if (devMode && (req.url === '/collective_rpc' || req.url === '/reset_prefix_cache')) {
          dev.push({ method: req.method, url: req.url, body: s });
          if (req.url === '/reset_prefix_cache') return res.writeHead(200).end();
          res.writeHead(200, { 'content-type': 'application/json' });
          return res.end(JSON.stringify({ results: [null, null] }));
        }
        if (req.url === '/v1/completions') {
          const body = JSON.parse(s) as { max_tokens: number };
          bodies.push(body);
          if (body.max_tokens === 99) {
            res.writeHead(400, { 'content-type': 'application/json' });
            return res.end('{"error": "bad"}');
          }
          res.writeHead(200, { 'content-type': 'application/json' });
          return res.end(
            JSON.stringify({
              choices: [
                {
                  index: 0,
                  text: 'ok',
                  token_ids: [7, 8, 2],
                  finish_reason: body.max_tokens === 3 ? 'length' : 'stop',
                  logprobs: {
                    tokens: ['a', 'b', 'c'],
                    token_logprobs: [-0.5, -1.25, -0.125],
                    top_logprobs: null,
                  },
                },
              ],
            }),
          );
        }
        res.writeHead(404).end();
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  it('sends token-id prompts and reads token ids and log-probs back', async () => {
    const c = new VllmClient(url);
    const g = await c.generate([1, 2, 3], 16, { temperature: 0.7, topP: 0.9, seed: 5 });
    assert.deepEqual(g, { ids: [7, 8, 2], logprobs: [-0.5, -1.25, -0.125], finishReason: 'stop' });
    assert.deepEqual(bodies[0], {
      model: '/models/qwen3-14b',
      prompt: [1, 2, 3],
      max_tokens: 16,
      temperature: 0.7,
      top_p: 0.9,
      logprobs: 0,
      return_token_ids: true,
      skip_special_tokens: false,
      spaces_between_special_tokens: false,
      seed: 5,
    });
    assert.equal((await c.generate([1], 3, { temperature: 1, topP: 1 })).finishReason, 'length');
    // Sampling values pass as given, and no seed is invented when the run has none.
    assert.deepEqual([bodies[1].temperature, bodies[1].top_p, 'seed' in bodies[1]], [1, 1, false]);
    assert.equal(await c.model(), '/models/qwen3-14b');
  });

  it('computes KV capacity from the metrics and rejects bad requests without retry', async () => {
    const c = new VllmClient(url);
    assert.deepEqual(await c.capacity(), { total: 16_000, used: 4000 });
    await assert.rejects(c.generate([1], 99, { temperature: 1, topP: 1 }), (e: EngineError) => {
      assert.ok(e instanceof EngineError);
      assert.equal(e.retryable, false);
      return true;
    });
  });

  it('reloads a checkpoint through /collective_rpc reload_weights, then resets the prefix cache', async () => {
    const c = new VllmClient(url);
    dev.length = 0;
    devMode = true;
    await c.reload('/ckpt/step-10');
    assert.deepEqual(
      dev.map((d) => [d.method, d.url, JSON.parse(d.body)]),
      [
        ['POST', '/collective_rpc', { method: 'reload_weights', kwargs: { weights_path: '/ckpt/step-10' } }],
        ['POST', '/reset_prefix_cache', {}],
      ],
    );
    // Without VLLM_SERVER_DEV_MODE=1 the routes do not exist: the error says what to do.
    devMode = false;
    await assert.rejects(c.reload('/ckpt/step-10'), (e: EngineError) => {
      assert.equal(e.retryable, false);
      assert.match(e.message, /VLLM_SERVER_DEV_MODE=1/);
      return true;
    });
    devMode = true;
  });

  it('parses Prometheus samples with labels', () => {
    const text = 'sglang:num_used_tokens_total 5\nsglang:num_used_tokens{model_name="m"} 1234\n';
    assert.equal(promSample(text, 'sglang:num_used_tokens')?.value, 1234);
    assert.equal(promSample(text, 'sglang:missing'), undefined);
  });
});
