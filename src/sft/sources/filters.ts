import type { Message, ToolCall } from '../conversation.js';
import { MalformedToolCall } from './formats.js';

interface JsonSchemaProperty {
  type?: string | string[];
  enum?: unknown[];
}

interface ToolSchema {
  name: string;
  required: string[];
  properties: Record<string, JsonSchemaProperty>;
}

/** Reads OpenAI-style tool definitions (`{type: "function", function: {name, parameters}}`). */
export function toolSchemas(tools: unknown[]): Map<string, ToolSchema> {
  const out = new Map<string, ToolSchema>();
  for (const tool of tools) {
    const t = tool as { function?: { name?: string; parameters?: Record<string, unknown> } };
    const fn = t.function ?? (tool as { name?: string; parameters?: Record<string, unknown> });
    if (typeof fn.name !== 'string') continue;
    const params = fn.parameters ?? {};
    out.set(fn.name, {
      name: fn.name,
      required: Array.isArray(params.required) ? (params.required as string[]) : [],
      properties: (params.properties ?? {}) as Record<string, JsonSchemaProperty>,
    });
  }
  return out;
}

const JSON_TYPES: Record<string, (v: unknown) => boolean> = {
  string: (v) => typeof v === 'string',
  number: (v) => typeof v === 'number',
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === 'boolean',
  object: (v) => typeof v === 'object' && v !== null && !Array.isArray(v),
  array: (v) => Array.isArray(v),
  null: (v) => v === null,
};

/** Throws MalformedToolCall unless `call` names a known tool with arguments its schema accepts. */
export function validateToolCall(call: ToolCall, schemas: Map<string, ToolSchema>): void {
  const schema = schemas.get(call.name);
  if (schema === undefined) throw new MalformedToolCall(`unknown tool '${call.name}'`);
  for (const key of schema.required) {
    if (!(key in call.arguments)) throw new MalformedToolCall(`${call.name}: missing argument '${key}'`);
  }
  for (const [key, value] of Object.entries(call.arguments)) {
    const prop = schema.properties[key];
    if (prop === undefined) throw new MalformedToolCall(`${call.name}: unknown argument '${key}'`);
    const types = prop.type === undefined ? [] : Array.isArray(prop.type) ? prop.type : [prop.type];
    if (types.length > 0 && !types.some((t) => JSON_TYPES[t]?.(value))) {
      throw new MalformedToolCall(`${call.name}: argument '${key}' is not ${types.join(' | ')}`);
    }
    if (prop.enum !== undefined && !prop.enum.includes(value)) {
      throw new MalformedToolCall(`${call.name}: argument '${key}' is not one of its enum values`);
    }
  }
}

const MATH_WORDS =
  /\b(solve|equation|prove|proof|theorem|lemma|integral|derivative|polynomial|probability|simplify|remainder|how many|find the (value|sum|number|area|product)|compute the|evaluate)\b/i;
const LATEX = /\\(frac|sqrt|sum|int|cdot|times|le|ge|neq|pi|binom|angle|triangle|mathbb|dfrac)\b/;

/**
 * rStar2-Agent's SFT is deliberately non-reasoning: it teaches the tool and answer formats, and
 * leaves math reasoning to RL. An example counts as math reasoning when any of these hold:
 * - any turn contains `\boxed{` (a graded final answer);
 * - at least two of: a math keyword in a user turn (solve, equation, prove, integral, remainder,
 *   how many, find the value…), LaTeX math commands (`\frac`, `\sqrt`, …) or `$…$` inline math
 *   anywhere, and three or more `= <number>` steps in the assistant's text.
 */
export function isMathReasoning(messages: Message[]): boolean {
  const all = messages.map((m) => m.content).join('\n');
  if (all.includes('\\boxed{')) return true;
  const user = messages
    .filter((m) => m.role === 'user')
    .map((m) => m.content)
    .join('\n');
  const assistant = messages
    .filter((m) => m.role === 'assistant')
    .map((m) => m.content)
    .join('\n');
  let signals = 0;
  if (MATH_WORDS.test(user)) signals += 1;
  if (LATEX.test(all) || /\$[^$\n]{1,200}\$/.test(all)) signals += 1;
  if ((assistant.match(/=\s*-?\d/g) ?? []).length >= 3) signals += 1;
  return signals >= 2;
}

/**
 * Near-duplicate key: the conversation's words, lower-cased, with punctuation, markup and
 * whitespace removed, so examples differing only in case, spacing or punctuation collide.
 */
export function nearDuplicateKey(messages: Message[]): string {
  return messages
    .map((m) => {
      const calls = (m.role === 'assistant' ? (m.tool_calls ?? []) : []).map((c) => JSON.stringify(c));
      return `${m.role}:${[m.content, ...calls].join(' ')}`;
    })
    .join('\u0000')
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\u0000:]+/gu, '');
}
