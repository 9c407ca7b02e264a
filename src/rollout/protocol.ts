import {
  type ChatMessage,
  type ChatTemplate,
  loadChatTemplate,
  loadToolSchemas,
  type ToolSchema,
} from './chat-template.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import { loadTokenizer, type TextTokenizer } from './tokenizer.js';
import { describeToolState, type ToolState } from './tool-state.js';

export type { ToolCall } from './tool-parser.js';
export { parseToolCalls, resolveToolCall } from './tool-parser.js';

/** Everything the token-level protocol needs: tokenizer, template, tool schemas. */
export interface ProtocolContext {
  readonly tokenizer: TextTokenizer;
  readonly template: ChatTemplate;
  /** The tool schemas as the model sees them (session mode: described with `SESSION_NOTE`). */
  readonly tools: readonly ToolSchema[];
  readonly toolNames: readonly string[];
  /**
   * `--tool-state`: `session` runs a trajectory's calls as the cells of one sandbox session, and
   * the tools' description says so; `stateless` (the release) runs each call fresh. One field for
   * both, so the prompt and the execution cannot disagree.
   */
  readonly toolState: ToolState;
  /**
   * Ids of what the template renders for `[{}]` without a generation prompt: the default system
   * block. The release renders tool messages as a conversation of their own and cuts this many
   * tokens off the front, so the tool turn starts at `<|im_start|>user`.
   */
  readonly systemPrefixIds: readonly number[];
  /** `<|im_end|>`: ends every assistant turn. */
  readonly eosId: number | undefined;
}

export function createProtocol(
  tokenizer: TextTokenizer,
  template: ChatTemplate,
  tools: readonly ToolSchema[],
  toolState: ToolState = 'stateless',
): ProtocolContext {
  let systemPrefix = '';
  try {
    systemPrefix = template.render([{} as ChatMessage], { addGenerationPrompt: false });
  } catch {
    // A template that cannot render an empty message emits no system block for tool-only input.
  }
  const eos = typeof tokenizer.config.eos_token === 'string' ? tokenizer.config.eos_token : '<|im_end|>';
  return {
    tokenizer,
    template,
    tools: describeToolState(tools, toolState),
    toolNames: tools.map((t) => t.function.name),
    toolState,
    systemPrefixIds: tokenizer.encode(systemPrefix),
    eosId: tokenizer.tokenToId(eos) ?? tokenizer.tokenToId('<|im_end|>'),
  };
}

export interface LoadProtocolOptions {
  /** `rstar2` (default), `model`, or a Jinja file. */
  chatTemplate?: string;
  /** JSON file of tool schemas; default: `python_code_with_standard_io`. */
  toolsFile?: string;
  /** `--tool-state` (default `stateless`). */
  toolState?: ToolState;
}

/** Loads tokenizer folder (or `qwen3`), chat template and tool schemas (described for `toolState`) into one context. */
export async function loadProtocol(
  tokenizer: string | TextTokenizer,
  { chatTemplate = ROLLOUT_DEFAULTS.chatTemplate, toolsFile, toolState }: LoadProtocolOptions = {},
): Promise<ProtocolContext> {
  const tk = typeof tokenizer === 'string' ? await loadTokenizer(tokenizer) : tokenizer;
  const template = await loadChatTemplate(chatTemplate, tk);
  return createProtocol(tk, template, await loadToolSchemas(toolsFile), toolState);
}

/** The release's raw prompt: one user message holding the problem text. */
export function promptMessages(problem: { prompt: string } | string): ChatMessage[] {
  return [{ role: 'user', content: typeof problem === 'string' ? problem : problem.prompt }];
}

/** Rendered prompt text: system block with tools, user turn, `<|im_start|>assistant\n<reason>`. */
export function promptText(problem: { prompt: string } | string, ctx: ProtocolContext): string {
  return ctx.template.render(promptMessages(problem), { tools: [...ctx.tools], addGenerationPrompt: true });
}

export function promptIds(problem: { prompt: string } | string, ctx: ProtocolContext): number[] {
  return ctx.tokenizer.encode(promptText(problem, ctx));
}

/**
 * Token ids appended after an assistant turn that called tools, exactly as the release builds
 * them: the tool responses rendered as `tool` messages with the generation prompt, tokenized
 * whole, minus the length of the system prefix. Note the result starts at `<|im_start|>user`,
 * directly after the assistant's `<|im_end|>` (no newline between them, as in the release), and
 * ends with `<|im_start|>assistant\n<reason>`.
 */
export function toolTurnIds(toolResponseTexts: readonly string[], ctx: ProtocolContext): number[] {
  const messages = toolResponseTexts.map((content) => ({ role: 'tool', content }));
  const ids = ctx.tokenizer.encode(ctx.template.render(messages, { addGenerationPrompt: true }));
  return ids.slice(ctx.systemPrefixIds.length);
}
