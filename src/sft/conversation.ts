import { Template } from '@huggingface/jinja';
import { DataError } from '../errors.js';
import { type ProtocolContext, toolTurnIds } from '../rollout/protocol.js';

/** A function call as a chat message carries it (OpenAI's `function` wrapper already removed). */
export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** One message of a conversation, after a source format has been normalised. */
export type Message =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; content: string; tool_calls?: ToolCall[] }
  | { role: 'tool'; content: string };

/** Token ids of a conversation as a rollout would have produced them, plus the SFT mask. */
export interface Rendered {
  prompt_ids: number[];
  response_ids: number[];
  /** 1 on assistant (model) tokens, 0 on tool responses and later user turns. */
  loss_mask: (0 | 1)[];
  text: string;
}

/** System, user and tool messages as the template sees them (assistant turns are never rendered). */
const plain = (messages: Message[]) => messages.map((m) => ({ role: m.role, content: m.content }));

/**
 * Renders conversations token by token the way rollout builds a trajectory (through the rollout
 * protocol's own functions), so an SFT example is exactly what the policy later sees and emits:
 * - prompt: the template over the system/user messages before the first assistant turn, with the
 *   tools and the generation prompt (rStar2: `<|im_start|>assistant\n<reason>`); for one user
 *   message this is `promptIds`;
 * - each assistant turn: its text, the Hermes tool calls as the template writes them, then EOS,
 *   tokenized on its own as an engine would have produced it;
 * - each run of tool messages: `toolTurnIds`; a later user message the same way (rendered alone
 *   with the generation prompt, minus the system prefix).
 * Nothing already tokenized is ever re-tokenized.
 */
export class ConversationRenderer {
  readonly ctx: ProtocolContext;
  readonly #tojson = new Template('{{ value | tojson }}');
  readonly #opened: string | undefined;

  constructor(ctx: ProtocolContext) {
    this.ctx = ctx;
    const head = ctx.template.render([{ role: 'user', content: '' }], { addGenerationPrompt: false });
    const withPrompt = ctx.template.render([{ role: 'user', content: '' }], { addGenerationPrompt: true });
    // The generation prompt may already open the turn's first tag (rStar2 opens `<reason>`).
    this.#opened = /<[a-z_]+>$/.exec(withPrompt.slice(head.length))?.[0];
  }

  /** Text of one assistant turn as the model writes it after the generation prompt (no EOS). */
  assistantText(content: string, toolCalls: ToolCall[] = []): string {
    let text = content;
    const opened = this.#opened;
    if (opened !== undefined) {
      if (text.startsWith(opened)) text = text.slice(opened.length);
      const close = `</${opened.slice(1)}`;
      if (!text.includes(close)) {
        // A source written for plain chat templates: close the tag the generation prompt opened
        // and, for rStar2 (`<reason>`), put a final reply into the answer block it asks for.
        const answer = text.indexOf('<answer>');
        if (toolCalls.length > 0 || opened !== '<reason>') text = `${text.trimEnd()}${close}`;
        else if (answer >= 0) text = `${text.slice(0, answer).trimEnd()}${close}\n${text.slice(answer)}`;
        else text = `${close}\n<answer>${text.trim()}</answer>`;
      }
    }
    for (const call of toolCalls) {
      const args = this.#tojson.render({ value: call.arguments });
      text += `\n<tool_call>\n{"name": "${call.name}", "arguments": ${args}}\n</tool_call>`;
    }
    return text;
  }

  #assistantIds(content: string, toolCalls?: ToolCall[]): number[] {
    const ids = this.ctx.tokenizer.encode(this.assistantText(content, toolCalls));
    if (this.ctx.eosId !== undefined) ids.push(this.ctx.eosId);
    return ids;
  }

  #environmentIds(messages: Message[]): number[] {
    if (messages.every((m) => m.role === 'tool')) {
      return toolTurnIds(
        messages.map((m) => m.content),
        this.ctx,
      );
    }
    const text = this.ctx.template.render(plain(messages), { addGenerationPrompt: true });
    return this.ctx.tokenizer.encode(text).slice(this.ctx.systemPrefixIds.length);
  }

  /**
   * Renders a conversation that starts with optional system + user messages and continues with
   * assistant turns, each optionally followed by tool responses or a user follow-up. Trailing
   * non-assistant turns are dropped: nothing after them is trained.
   */
  render(messages: Message[]): Rendered {
    const first = messages.findIndex((m) => m.role === 'assistant');
    if (first <= 0) throw new DataError('conversation has no user message before the first assistant turn');
    const prompt_ids = this.ctx.tokenizer.encode(
      this.ctx.template.render(plain(messages.slice(0, first)), {
        tools: [...this.ctx.tools],
        addGenerationPrompt: true,
      }),
    );
    const response_ids: number[] = [];
    const loss_mask: (0 | 1)[] = [];
    let i = first;
    while (i < messages.length) {
      const m = messages[i];
      if (m.role === 'assistant') {
        const ids = this.#assistantIds(m.content, m.tool_calls);
        response_ids.push(...ids);
        for (const _ of ids) loss_mask.push(1);
        i += 1;
        continue;
      }
      let j = i;
      while (j < messages.length && messages[j].role !== 'assistant') j += 1;
      if (j === messages.length) break;
      const ids = this.#environmentIds(messages.slice(i, j));
      response_ids.push(...ids);
      for (const _ of ids) loss_mask.push(0);
      i = j;
    }
    return { prompt_ids, response_ids, loss_mask, text: this.ctx.tokenizer.decode(response_ids) };
  }
}
