import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadProtocol, type ProtocolContext, promptIds } from '../../src/rollout/protocol.js';
import { ConversationRenderer } from '../../src/sft/conversation.js';
import { isMathReasoning } from '../../src/sft/sources/filters.js';
import { lines, ROOT, rstar } from '../support/helpers.js';

const SRC = `${ROOT}fixtures/sft-sources/`;

interface Out {
  id: string;
  prompt_ids: number[];
  response_ids: number[];
  loss_mask: number[];
  text: string;
  source: string;
}

let ctx: ProtocolContext;
let dir: string;

before(async () => {
  ctx = await loadProtocol(`${ROOT}fixtures/tiny`);
  dir = mkdtempSync(join(tmpdir(), 'rstar-sft-data-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

function stats(stderr: string): Record<string, unknown> {
  const line = stderr.split('\n').find((l) => l.startsWith('sft-data: {'));
  assert.ok(line, stderr);
  return JSON.parse(line.slice('sft-data: '.length));
}

/** The tokens a mask selects, as maximal runs of text. */
function runs(r: Out, want: 0 | 1): string[] {
  const out: string[] = [];
  let cur: number[] = [];
  r.response_ids.forEach((id, i) => {
    if (r.loss_mask[i] === want) cur.push(id);
    else if (cur.length > 0) {
      out.push(ctx.tokenizer.decode(cur));
      cur = [];
    }
  });
  if (cur.length > 0) out.push(ctx.tokenizer.decode(cur));
  return out;
}

describe('sft-data sources', () => {
  it('reads OpenAI messages with tool calls; loss mask covers exactly the assistant turns', async () => {
    const res = await rstar(['sft-data', `${SRC}openai.jsonl`]);
    assert.equal(res.code, 0, res.stderr);
    const out = lines<Out>(res.stdout);
    assert.equal(out.length, 3);
    const tool = out.find((r) => r.id.endsWith('openai.jsonl:1'));
    assert.ok(tool);
    // The prompt is the rStar2 prompt: system block with tools, user prefix, `<reason>` opened.
    const prompt = ctx.tokenizer.decode(tool.prompt_ids);
    assert.match(prompt, /^<\|im_start\|>system\nYou are a helpful assistant\.\n\n# Tools/);
    assert.ok(prompt.endsWith('<|im_start|>assistant\n<reason>'));
    assert.equal(tool.loss_mask.length, tool.response_ids.length);
    assert.deepEqual(runs(tool, 1), [
      'I will run Python to reverse it.</reason>\n<tool_call>\n{"name": "python_code_with_standard_io", ' +
        '"arguments": {"code": "print(input()[::-1])", "input": "tool use"}}\n</tool_call><|im_end|>',
      'The program printed the reversed text.</reason>\n<answer>esu loot</answer><|im_end|>',
    ]);
    assert.deepEqual(runs(tool, 0), [
      '<|im_start|>user\n<tool_response>\nTool call success\nstdout: esu loot\n\nexecution time: 0.02s\n' +
        '</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>',
    ]);
    // A follow-up user turn is environment (0); both answers are trained (1).
    const multi = out.find((r) => r.id.endsWith('openai.jsonl:3'));
    assert.ok(multi);
    const trained = runs(multi, 1);
    assert.equal(trained.length, 2);
    assert.match(trained[0], /<answer>Red, yellow and blue\.<\/answer><\|im_end\|>$/);
    assert.match(runs(multi, 0)[0], /This is the problem:\nAnd secondary ones\?/);
  });

  it('reads ShareGPT/Hermes and Glaive conversations into the same token layout', async () => {
    const res = await rstar(['sft-data', `${SRC}sharegpt.jsonl`, `${SRC}glaive.jsonl`]);
    assert.equal(res.code, 0, res.stderr);
    const out = lines<Out>(res.stdout);
    assert.equal(out.length, 3);
    const hermes = out.find((r) => r.id.endsWith('sharegpt.jsonl:1'));
    assert.ok(hermes);
    assert.match(
      runs(hermes, 1)[0],
      /^Let me count them with code\.<\/reason>\n<tool_call>\n\{"name": "python/,
    );
    assert.match(runs(hermes, 0)[0], /^<\|im_start\|>user\n<tool_response>\nTool call success\nstdout: 6\n/);
    const glaive = out.find((r) => r.id.includes('glaive'));
    assert.ok(glaive);
    assert.match(runs(glaive, 1)[0], /^<\/reason>\n<tool_call>\n/);
    assert.deepEqual(stats(res.stderr).formats, { openai: 0, sharegpt: 3, pair: 0 });
  });

  it('reads instruction/response pairs and puts the reply in the answer block', async () => {
    const res = await rstar(['sft-data', `${SRC}pairs.jsonl`]);
    assert.equal(res.code, 0, res.stderr);
    const out = lines<Out>(res.stdout);
    assert.equal(out.length, 3);
    const fr = out.find((r) => r.id.endsWith(':1'));
    assert.ok(fr);
    assert.match(
      ctx.tokenizer.decode(fr.prompt_ids),
      /This is the problem:\nTranslate to French\.\n\nGood morning/,
    );
    assert.equal(fr.text, '</reason>\n<answer>Bonjour</answer><|im_end|>');
    assert.ok(fr.loss_mask.every((m) => m === 1));
  });

  it('drops and counts malformed tool calls', async () => {
    const res = await rstar(['sft-data', `${SRC}malformed.jsonl`]);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(lines(res.stdout).length, 0);
    assert.equal(stats(res.stderr).malformed_tool_calls, 5);
  });

  it('filters math reasoning, documented heuristic', async () => {
    const res = await rstar(['sft-data', `${SRC}math.jsonl`]);
    const out = lines<Out>(res.stdout);
    assert.equal(out.length, 1);
    assert.match(out[0].text, /hash map/);
    assert.equal(stats(res.stderr).math, 2);
    const kept = await rstar(['sft-data', '--keep-math', `${SRC}math.jsonl`]);
    assert.equal(lines(kept.stdout).length, 3);
    const msg = (content: string, answer: string) => [
      { role: 'user' as const, content },
      { role: 'assistant' as const, content: answer },
    ];
    assert.equal(isMathReasoning(msg('Tell me a joke.', 'Why did the chicken cross the road?')), false);
    assert.equal(isMathReasoning(msg('How many apples?', 'x = 3, y = 4, z = 5')), true);
  });

  it('removes exact and near duplicates, caps length, shuffles with a seed', async () => {
    const file = join(dir, 'dups.jsonl');
    const pair = (p: string, r: string) => JSON.stringify({ prompt: p, response: r });
    writeFileSync(
      file,
      [
        pair('Name a colour.', 'Blue.'),
        pair('Name a colour.', 'Blue.'),
        pair('name a colour', 'blue'),
        pair('Name an animal.', 'A cat.'),
        pair('Write a long text.', 'word '.repeat(300)),
        '',
      ].join('\n'),
    );
    const res = await rstar(['sft-data', '--max-seq-tokens', '600', file]);
    assert.equal(res.code, 0, res.stderr);
    const s = stats(res.stderr);
    assert.equal(s.exact_duplicates, 1);
    assert.equal(s.near_duplicates, 1);
    assert.equal(s.too_long, 1);
    assert.equal(s.kept, 2);
    const a = await rstar(['sft-data', '--seed', '3', `${SRC}pairs.jsonl`, `${SRC}openai.jsonl`]);
    const b = await rstar(['sft-data', '--seed', '3', `${SRC}pairs.jsonl`, `${SRC}openai.jsonl`]);
    assert.equal(a.stdout, b.stdout);
  });

  it('names file and line of bad input, or counts it with --skip-invalid', async () => {
    const file = join(dir, 'bad.jsonl');
    writeFileSync(
      file,
      `${JSON.stringify({ prompt: 'Hi', response: 'Hello' })}\n{"messages": [\n` +
        `${JSON.stringify({ messages: [{ role: 'wizard', content: 'x' }] })}\n${JSON.stringify({ text: 'x' })}\n`,
    );
    const res = await rstar(['sft-data', file]);
    assert.equal(res.code, 1);
    assert.match(res.stderr, new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2: invalid JSON`));
    const skip = await rstar(['sft-data', '--skip-invalid', file]);
    assert.equal(skip.code, 0, skip.stderr);
    assert.equal(lines(skip.stdout).length, 1);
    assert.equal(stats(skip.stderr).invalid, 3);
    assert.match(skip.stderr, /bad\.jsonl:3: messages\.0\.role: unknown role "wizard"/);
    assert.match(skip.stderr, /bad\.jsonl:4: \(record\): unrecognised format/);
    const usage = await rstar(['sft-data', '--max-seq-tokens', 'x']);
    assert.equal(usage.code, 2);
  });

  it('renders a one-question conversation with exactly rollout’s prompt ids', () => {
    const renderer = new ConversationRenderer(ctx);
    const r = renderer.render([
      { role: 'user', content: 'What is 2 + 2?' },
      { role: 'assistant', content: 'Easy.</reason>\n<answer>\\boxed{4}</answer>' },
    ]);
    assert.deepEqual(r.prompt_ids, promptIds('What is 2 + 2?', ctx));
    assert.equal(r.text, 'Easy.</reason>\n<answer>\\boxed{4}</answer><|im_end|>');
  });
});
