import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { loadChatTemplate } from '../../src/rollout/chat-template.js';
import { loadTokenizer } from '../../src/rollout/tokenizer.js';
import { ROOT } from '../support/helpers.js';

const TINY = `${ROOT}fixtures/tiny`;
const FIXED = [
  '<|endoftext|>',
  '<|im_start|>',
  '<|im_end|>',
  '<tool_call>',
  '</tool_call>',
  '<tool_response>',
  '</tool_response>',
  '<reason>',
  '</reason>',
  '<answer>',
  '</answer>',
  '<think>',
  '</think>',
];

describe('tiny tokenizer', () => {
  it('has at most 4096 ids and the ChatML/rStar2 tokens at fixed ids', async () => {
    const tk = await loadTokenizer(TINY);
    assert.ok(tk.vocabSize <= 4096, `vocab ${tk.vocabSize}`);
    FIXED.forEach((t, id) => {
      assert.equal(tk.tokenToId(t), id, t);
      assert.deepEqual(tk.encode(t), [id], t);
    });
    const json = JSON.parse(readFileSync(`${TINY}/tokenizer.json`, 'utf8'));
    const special = json.added_tokens
      .filter((t: { special: boolean }) => t.special)
      .map((t: { id: number }) => t.id);
    assert.deepEqual(special, [0, 1, 2]);
    const config = JSON.parse(readFileSync(`${TINY}/tokenizer_config.json`, 'utf8'));
    assert.equal(config.eos_token, '<|im_end|>');
    assert.equal(config.pad_token, '<|endoftext|>');
    assert.equal(config.chat_template, readFileSync(`${ROOT}fixtures/templates/rstar2.jinja`, 'utf8'));
  });

  it('round-trips any text, byte for byte', async () => {
    const tk = await loadTokenizer(TINY);
    const samples = [
      '<|im_start|>assistant\n<reason>Use Python.</reason>\n<tool_call>\n{"name": "python_code_with_standard_io"}',
      'Tool call failure\nreason: runtime_error\nstderr: Traceback (most recent call last):\n  File "<string>"',
      'héllo wörld — 日本語 🙂 \t\r\n\n  x__init__ 12345678901234567890 \\boxed{-3/4}',
      '\u0000\u0001 control \u007f and lone spaces    ',
    ];
    for (const s of samples) assert.equal(tk.decode(tk.encode(s)), s);
    // Digits are single tokens (Qwen's pre-tokenizer), which makes copying numbers learnable.
    assert.equal(tk.encode('98765').length, 5);
  });

  it('is rebuilt by the stdlib-only script into a loadable tokenizer', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-tok-'));
    try {
      const corpus = join(dir, 'corpus.txt');
      writeFileSync(corpus, 'print(sum(map(int, input().split())))\n'.repeat(50));
      const res = spawnSync(
        'python3',
        [
          `${ROOT}scripts/build-tiny-tokenizer.py`,
          '--template',
          `${ROOT}fixtures/templates/rstar2.jinja`,
          '--corpus',
          corpus,
          '--vocab-size',
          '700',
          '--out',
          dir,
        ],
        { encoding: 'utf8' },
      );
      assert.equal(res.status, 0, res.stderr);
      const tk = await loadTokenizer(dir);
      assert.ok(tk.vocabSize <= 700);
      assert.equal(tk.tokenToId('<answer>'), 9);
      const text = 'print(sum(map(int, input().split()))) <answer>ok</answer>';
      assert.equal(tk.decode(tk.encode(text)), text);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Catches: `--chat-template model` missing a checkpoint's template that newer transformers save
// beside the config as chat_template.jinja (a brought model's folder), or that file overriding a
// template the config itself holds.
describe('a checkpoint folder’s chat template', () => {
  it('comes from chat_template.jinja when tokenizer_config.json has none, never over the config’s own', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar-template-'));
    try {
      writeFileSync(join(dir, 'tokenizer.json'), readFileSync(join(ROOT, 'fixtures/tiny/tokenizer.json')));
      const config = JSON.parse(readFileSync(join(ROOT, 'fixtures/tiny/tokenizer_config.json'), 'utf8'));
      delete config.chat_template;
      writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
      writeFileSync(join(dir, 'chat_template.jinja'), '{% for m in messages %}[{{ m.content }}]{% endfor %}');
      const template = await loadChatTemplate('model', await loadTokenizer(dir));
      assert.equal(template.render([{ role: 'user', content: 'hi' }], {}), '[hi]');
      writeFileSync(
        join(dir, 'tokenizer_config.json'),
        JSON.stringify({ ...config, chat_template: '<{{ messages[0].content }}>' }),
      );
      const own = await loadChatTemplate('model', await loadTokenizer(dir));
      assert.equal(own.render([{ role: 'user', content: 'hi' }], {}), '<hi>');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
