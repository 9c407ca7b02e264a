import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import type { SubmissionResult } from '../../src/records/sandbox.js';
import { scriptedTrajectory } from '../../src/rollout/agent.js';
import {
  loadProtocol,
  type ProtocolContext,
  parseToolCalls,
  promptIds,
  promptText,
  toolTurnIds,
} from '../../src/rollout/protocol.js';
import { pyJsonLoads } from '../../src/rollout/pyjson.js';
import { ROOT } from '../support/helpers.js';

const SYSTEM =
  'A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>.';

/** Runs real Python: `json.dumps` / `json.loads` are the reference for the release's behaviour. */
function python(code: string, input: string): string {
  return execFileSync('python3', ['-c', code], { input, encoding: 'utf8' });
}

const ok = (stdout: string): SubmissionResult => ({
  success: true,
  run_success: true,
  cost: 0.01,
  reason: '',
  stdout,
});

for (const tokenizer of ['fixtures/tiny', 'qwen3']) {
  describe(`protocol with the ${tokenizer} tokenizer`, () => {
    let ctx: ProtocolContext;
    before(async () => {
      ctx = await loadProtocol(tokenizer === 'qwen3' ? 'qwen3' : `${ROOT}${tokenizer}`);
    });

    it('renders the rStar2 prompt and tokenizes it whole', () => {
      const tool = python(
        'import json,sys; print(json.dumps(json.load(sys.stdin)[0], ensure_ascii=False), end="")',
        JSON.stringify(ctx.tools),
      );
      const expected =
        `<|im_start|>system\n${SYSTEM}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n` +
        `You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n${tool}\n</tools>\n\n` +
        'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n' +
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. ' +
        'And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n' +
        'Find x: 2x = 6 — “é” 🙂<|im_end|>\n<|im_start|>assistant\n<reason>';
      const text = promptText('Find x: 2x = 6 — “é” 🙂', ctx);
      assert.equal(text, expected);
      const ids = promptIds({ prompt: 'Find x: 2x = 6 — “é” 🙂' }, ctx);
      assert.deepEqual(ids, ctx.tokenizer.encode(expected));
      assert.equal(ctx.tokenizer.decode(ids), expected);
      assert.equal(ids[0], ctx.tokenizer.tokenToId('<|im_start|>'));
    });

    it('builds tool turns as the release does: grouped responses, system prefix cut off', () => {
      const ids = toolTurnIds(['Tool call success\nstdout: 3\nexecution time: 0.01s', 'second'], ctx);
      const want =
        '<|im_start|>user\n<tool_response>\nTool call success\nstdout: 3\nexecution time: 0.01s\n</tool_response>' +
        '\n<tool_response>\nsecond\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>';
      assert.equal(ctx.tokenizer.decode(ids), want);
      assert.deepEqual(ids, ctx.tokenizer.encode(want));
      // The cut is by token count of the system block, which must be a true token prefix.
      const whole = ctx.tokenizer.encode(`<|im_start|>system\n${SYSTEM}<|im_end|>\n${want}`);
      assert.deepEqual(whole.slice(0, ctx.systemPrefixIds.length), ctx.systemPrefixIds);
      assert.deepEqual(whole.slice(ctx.systemPrefixIds.length), ids);
    });

    it('builds a scripted trajectory: tool tokens masked, lengths agree, no newline after im_end', async () => {
      const assistant = [
        'Let me compute.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(6//2)", "input": ""}}\n</tool_call>',
        'So x = 3.</reason>\n<answer>\\boxed{3}</answer>',
      ];
      const t = await scriptedTrajectory('2x = 6', { assistant, toolResults: [ok('3\n')] }, ctx);
      assert.equal(t.finish, 'stop');
      assert.equal(t.turns, 2);
      assert.equal(t.tool_calls, 1);
      assert.equal(t.tool_errors, 0);
      assert.equal(t.answer_tags, 1);
      assert.equal(t.loss_mask.length, t.response_ids.length);
      assert.equal(t.logprobs.length, t.response_ids.length);
      const a0 = [...ctx.tokenizer.encode(assistant[0]), ctx.eosId!];
      const tool = toolTurnIds(['Tool call success\nstdout: 3\n\nexecution time: 0.01s'], ctx);
      const a1 = [...ctx.tokenizer.encode(assistant[1]), ctx.eosId!];
      assert.deepEqual(t.response_ids, [...a0, ...tool, ...a1]);
      assert.deepEqual(t.loss_mask, [...a0.map(() => 1), ...tool.map(() => 0), ...a1.map(() => 1)]);
      assert.ok(
        t.text.includes('</tool_call><|im_end|><|im_start|>user\n<tool_response>\nTool call success'),
      );
    });

    it('answers a malformed call and an unknown tool instead of dropping them', async () => {
      const assistant = [
        '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"}\n</tool_call>',
        '<tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>',
        'done<answer>1</answer>',
      ];
      const t = await scriptedTrajectory('q', { assistant, toolResults: [] }, ctx);
      assert.equal(t.tool_calls, 2);
      assert.equal(t.tool_errors, 2);
      assert.equal(t.finish, 'stop');
      const want = python(
        'import json,sys\ntry: json.loads(sys.stdin.read())\nexcept Exception as e: print(e, end="")',
        '\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"}\n',
      );
      assert.ok(
        t.text.includes(`<tool_response>\nFailed to decode tool call: ${want}\n</tool_response>`),
        t.text,
      );
      assert.ok(
        t.text.includes("<tool_response>\nError when executing tool: 'calculator'\n</tool_response>"),
      );
    });

    it('stops at max turns, on the budget, and before a tool turn that would overflow it', async () => {
      const call =
        '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)", "input": ""}}</tool_call>';
      const many = { assistant: Array(6).fill(call), toolResults: Array(6).fill(ok('1')) };
      const t1 = await scriptedTrajectory('q', many, ctx, { maxTurns: 3 });
      assert.equal(t1.finish, 'max_turns');
      assert.equal(t1.turns, 3);
      assert.equal(t1.loss_mask.at(-1), 1, 'ends on an assistant turn');

      const a0 = ctx.tokenizer.encode(call).length + 1;
      const tool = toolTurnIds(['Tool call success\nstdout: 1\nexecution time: 0.01s'], ctx).length;
      const t2 = await scriptedTrajectory('q', many, ctx, { maxTokens: a0 + tool });
      assert.equal(t2.finish, 'tool_overflow');
      assert.equal(t2.response_ids.length, a0);

      const t3 = await scriptedTrajectory('q', many, ctx, { maxTokens: a0 + tool + 5 });
      assert.equal(t3.finish, 'length');
      assert.equal(t3.response_ids.length, a0 + tool + 5);
      assert.deepEqual(t3.loss_mask.slice(-5), [1, 1, 1, 1, 1]);
    });
  });
}

describe('--chat-template', () => {
  it('model: the tokenizer config template; FILE: a Jinja file; both drive the same protocol', async () => {
    const rstar2 = await loadProtocol(`${ROOT}fixtures/tiny`);
    const model = await loadProtocol(`${ROOT}fixtures/tiny`, { chatTemplate: 'model' });
    assert.deepEqual(promptIds('q', model), promptIds('q', rstar2));
    const dir = mkdtempSync(join(tmpdir(), 'rstar-template-'));
    try {
      const file = join(dir, 'plain.jinja');
      writeFileSync(
        file,
        "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}" +
          "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
      );
      const plain = await loadProtocol(`${ROOT}fixtures/tiny`, { chatTemplate: file });
      assert.equal(promptText('q', plain), '<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n');
      // No system block: nothing is cut off the tool turn.
      assert.equal(
        plain.tokenizer.decode(toolTurnIds(['r'], plain)),
        '<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n',
      );
      await assert.rejects(
        loadProtocol(`${ROOT}fixtures/tiny`, { chatTemplate: join(dir, 'missing.jinja') }),
        /ENOENT/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('Hermes tool-call parsing', () => {
  it('reports JSON errors with the text Python json.loads gives', () => {
    const cases = [
      '{"name": "x", "arguments": {"code": "print(1)"}',
      "{'name': 'x'}",
      '{"a":1,}',
      '[1,2',
      '"abc',
      '{"a":"x\ty"}',
      '{"a":"\\q"}',
      '',
      '  ',
      '{"a" 1}',
      '01',
      '{"a":1} x',
      '{"a":"\\u12"}',
      '\n{"name": "f",\n "arguments": [1, 2,]}\n',
      'é{',
      '{"name": "é", "arguments": {"code": "print(\'π\')" "input": ""}}',
      '{"a": -}',
      '{"a": [1, {"b": nul}]}',
      '{"a": "\\ud83d\\ude00", "b": NaN}',
    ];
    const want = JSON.parse(
      python(
        'import json,sys\nout=[]\nfor s in json.load(sys.stdin):\n  try: json.loads(s); out.append(None)\n  except Exception as e: out.append(str(e))\nprint(json.dumps(out))',
        JSON.stringify(cases),
      ),
    ) as (string | null)[];
    const got = cases.map((s) => {
      const r = pyJsonLoads(s);
      return r.ok ? null : r.error;
    });
    assert.deepEqual(got, want);
  });

  it('mirrors the release: both tags needed, non-greedy matches, key errors quoted', () => {
    assert.deepEqual(parseToolCalls('<tool_call>{"name": "f", "arguments": {}}'), []);
    const calls = parseToolCalls(
      'a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>b<tool_call>{"arguments": {}}</tool_call>' +
        '<tool_call>[1]</tool_call><tool_call>{"name": "g"}</tool_call>',
    );
    assert.deepEqual(
      calls.map((c) => (c.kind === 'call' ? [c.name, c.arguments] : c.response)),
      [
        ['f', { x: 1 }],
        "Failed to decode tool call: 'name'",
        'Failed to decode tool call: list indices must be integers or slices, not str',
        "Failed to decode tool call: 'arguments'",
      ],
    );
  });
});
