import { readFile } from 'node:fs/promises';
import { Template } from '@huggingface/jinja';
import { DataError, UsageError } from '../errors.js';
import type { TextTokenizer } from './tokenizer.js';

/** An OpenAI-style function tool, as the template's `tools` variable expects it. */
export interface ToolSchema {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

export interface ToolCallMessage {
  function: { name: string; arguments: unknown };
}

export interface ChatMessage {
  role: string;
  content?: string;
  tool_calls?: ToolCallMessage[];
}

export interface RenderOptions {
  tools?: ToolSchema[];
  addGenerationPrompt?: boolean;
}

export interface ChatTemplate {
  /** `rstar2`, `model`, or the file it came from. */
  readonly name: string;
  render(messages: ChatMessage[], options?: RenderOptions): string;
}

const fixture = (file: string): URL => new URL(`../../../fixtures/templates/${file}`, import.meta.url);

/** rStar2-Agent's chat template, kept verbatim as a fixture so it renders exactly as the release. */
export const RSTAR2_TEMPLATE_FILE = fixture('rstar2.jinja');
/** The `python_code_with_standard_io` tool schema, in the key order the release serialises it. */
export const RSTAR2_TOOLS_FILE = fixture('python_code_with_standard_io.json');

/** Compiles a Jinja chat template; `vars` are the extra globals transformers passes (bos/eos token). */
export function compileChatTemplate(
  source: string,
  name: string,
  vars: Record<string, unknown> = {},
): ChatTemplate {
  let template: Template;
  try {
    template = new Template(source);
  } catch (error) {
    throw new DataError(`${name}: invalid chat template: ${(error as Error).message}`);
  }
  return {
    name,
    render(messages, { tools, addGenerationPrompt = false } = {}) {
      const context: Record<string, unknown> = {
        ...vars,
        messages,
        add_generation_prompt: addGenerationPrompt,
      };
      // transformers only defines `tools` when some are given; templates test `{% if tools %}`.
      if (tools !== undefined && tools.length > 0) context.tools = tools;
      return template.render(context);
    },
  };
}

function tokenString(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (
    value !== null &&
    typeof value === 'object' &&
    typeof (value as { content?: unknown }).content === 'string'
  ) {
    return (value as { content: string }).content;
  }
  return undefined;
}

/** The `chat_template` of a tokenizer_config.json (a string, or the `default` of a named list). */
function modelTemplateSource(tokenizer: TextTokenizer): string | undefined {
  const t = tokenizer.config.chat_template;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const entry = (t as { name?: string; template?: string }[]).find((x) => x.name === 'default') ?? t[0];
    return typeof entry?.template === 'string' ? entry.template : undefined;
  }
  return undefined;
}

/**
 * `--chat-template rstar2|model|FILE`: the release's template (default), the tokenizer's own
 * `chat_template`, or a Jinja file.
 */
export async function loadChatTemplate(spec: string, tokenizer?: TextTokenizer): Promise<ChatTemplate> {
  const vars = {
    bos_token: tokenString(tokenizer?.config.bos_token) ?? '',
    eos_token: tokenString(tokenizer?.config.eos_token) ?? '',
  };
  if (spec === 'rstar2') {
    return compileChatTemplate(await readFile(RSTAR2_TEMPLATE_FILE, 'utf8'), 'rstar2', vars);
  }
  if (spec === 'model') {
    const source = tokenizer === undefined ? undefined : modelTemplateSource(tokenizer);
    if (source === undefined)
      throw new UsageError('--chat-template model: the tokenizer has no chat_template');
    return compileChatTemplate(source, 'model', vars);
  }
  let source: string;
  try {
    source = await readFile(spec, 'utf8');
  } catch (error) {
    throw new UsageError(`--chat-template: ${(error as Error).message}`);
  }
  return compileChatTemplate(source, spec, vars);
}

/** Tool schemas from a JSON file holding one schema or an array of them (default: the rStar2 tool). */
export async function loadToolSchemas(file: string | URL = RSTAR2_TOOLS_FILE): Promise<ToolSchema[]> {
  let value: unknown;
  try {
    value = JSON.parse(await readFile(file, 'utf8'));
  } catch (error) {
    throw new DataError(`${String(file)}: ${(error as Error).message}`);
  }
  const list = Array.isArray(value) ? value : [value];
  for (const [i, t] of list.entries()) {
    const name = (t as ToolSchema)?.function?.name;
    if ((t as ToolSchema)?.type !== 'function' || typeof name !== 'string') {
      throw new DataError(`${String(file)}: ${i}: expected {type: "function", function: {name, ...}}`);
    }
  }
  return list as ToolSchema[];
}
