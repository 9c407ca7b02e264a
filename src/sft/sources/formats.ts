import type { Message, ToolCall } from '../conversation.js';

/** A source line that is not a conversation we can read; `field` names where it went wrong. */
export class FormatError extends Error {
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(message);
  }
}

/** A tool call whose JSON or shape is broken; counted and its example dropped, not an input error. */
export class MalformedToolCall extends Error {}

export type SourceFormat = 'openai' | 'sharegpt' | 'pair';

export interface Parsed {
  format: SourceFormat;
  messages: Message[];
}

const isObject = (x: unknown): x is Record<string, unknown> =>
  typeof x === 'object' && x !== null && !Array.isArray(x);

function text(value: unknown, field: string): string {
  if (typeof value === 'string') return value;
  if (value === null || value === undefined) return '';
  // OpenAI's content parts: [{type: "text", text}] — only text parts are kept.
  if (Array.isArray(value)) {
    return value
      .map((part, i) => {
        if (isObject(part) && typeof part.text === 'string') return part.text;
        throw new FormatError(`${field}.${i}`, 'expected a text content part');
      })
      .join('');
  }
  throw new FormatError(field, 'expected a string');
}

function parseArguments(raw: unknown): Record<string, unknown> {
  let args = raw;
  if (typeof raw === 'string') {
    try {
      args = JSON.parse(raw);
    } catch (error) {
      throw new MalformedToolCall(`arguments are not JSON: ${(error as Error).message}`);
    }
  }
  if (!isObject(args)) throw new MalformedToolCall('arguments are not a JSON object');
  return args;
}

/** `{"name": ..., "arguments": ...}` or OpenAI's `{"type":"function","function":{...}}`. */
function toolCall(raw: unknown): ToolCall {
  const fn = isObject(raw) && isObject(raw.function) ? raw.function : raw;
  if (!isObject(fn) || typeof fn.name !== 'string' || fn.name === '') {
    throw new MalformedToolCall('tool call has no name');
  }
  return { name: fn.name, arguments: parseArguments(fn.arguments ?? fn.parameters ?? {}) };
}

/** Hermes writes calls into the assistant text: `<tool_call>\n{json}\n</tool_call>`. */
function splitHermes(value: string): { content: string; calls: ToolCall[] } {
  const calls: ToolCall[] = [];
  const re = /<tool_call>([\s\S]*?)(<\/tool_call>|$)/g;
  let first = -1;
  for (let m = re.exec(value); m !== null; m = re.exec(value)) {
    if (first < 0) first = m.index;
    if (m[2] === '') throw new MalformedToolCall('unclosed <tool_call>');
    let json: unknown;
    try {
      json = JSON.parse(m[1]);
    } catch (error) {
      throw new MalformedToolCall(`tool call is not JSON: ${(error as Error).message}`);
    }
    calls.push(toolCall(json));
  }
  const content = (first < 0 ? value : value.slice(0, first)).trimEnd();
  return { content, calls };
}

function stripToolResponse(value: string): string {
  const m = /^\s*<tool_response>\s*([\s\S]*?)\s*<\/tool_response>\s*$/.exec(value);
  return m ? m[1] : value;
}

function openai(record: Record<string, unknown>): Message[] {
  const list = record.messages;
  if (!Array.isArray(list)) throw new FormatError('messages', 'expected an array');
  return list.map((raw, i): Message => {
    const field = `messages.${i}`;
    if (!isObject(raw)) throw new FormatError(field, 'expected an object');
    const content = text(raw.content, `${field}.content`);
    switch (raw.role) {
      case 'system':
      case 'developer':
        return { role: 'system', content };
      case 'user':
        return { role: 'user', content };
      case 'assistant': {
        const calls = raw.tool_calls ?? (raw.function_call ? [raw.function_call] : []);
        if (!Array.isArray(calls)) throw new FormatError(`${field}.tool_calls`, 'expected an array');
        const hermes = splitHermes(content);
        return {
          role: 'assistant',
          content: hermes.content,
          tool_calls: [...hermes.calls, ...calls.map(toolCall)],
        };
      }
      case 'tool':
      case 'function':
        return { role: 'tool', content };
      default:
        throw new FormatError(`${field}.role`, `unknown role ${JSON.stringify(raw.role)}`);
    }
  });
}

const SHAREGPT_ROLES: Record<string, Message['role'] | 'call'> = {
  system: 'system',
  human: 'user',
  user: 'user',
  gpt: 'assistant',
  assistant: 'assistant',
  tool: 'tool',
  observation: 'tool',
  function_response: 'tool',
  function_call: 'call',
};

/** ShareGPT / Hermes function-calling / Glaive (`function_call` + `observation` turns). */
function sharegpt(record: Record<string, unknown>): Message[] {
  const list = record.conversations;
  if (!Array.isArray(list)) throw new FormatError('conversations', 'expected an array');
  const out: Message[] = [];
  list.forEach((raw, i) => {
    const field = `conversations.${i}`;
    if (!isObject(raw)) throw new FormatError(field, 'expected an object');
    const from = typeof raw.from === 'string' ? raw.from : raw.role;
    const role = typeof from === 'string' ? SHAREGPT_ROLES[from] : undefined;
    if (role === undefined) throw new FormatError(`${field}.from`, `unknown speaker ${JSON.stringify(from)}`);
    const value = text(raw.value ?? raw.content, `${field}.value`);
    if (role === 'assistant') {
      const { content, calls } = splitHermes(value);
      out.push({ role, content, tool_calls: calls });
    } else if (role === 'call') {
      // Glaive puts the call in its own turn: attach it to the assistant turn before, or open one.
      let json: unknown;
      try {
        json = JSON.parse(value);
      } catch (error) {
        throw new MalformedToolCall(`function_call is not JSON: ${(error as Error).message}`);
      }
      const prev = out[out.length - 1];
      if (prev?.role === 'assistant') prev.tool_calls = [...(prev.tool_calls ?? []), toolCall(json)];
      else out.push({ role: 'assistant', content: '', tool_calls: [toolCall(json)] });
    } else if (role === 'tool') {
      out.push({ role, content: stripToolResponse(value) });
    } else {
      out.push({ role, content: value });
    }
  });
  return out;
}

const PROMPT_KEYS = ['instruction', 'prompt', 'question', 'query'];
const RESPONSE_KEYS = ['output', 'response', 'completion', 'answer', 'chosen'];

/** Alpaca-style `instruction` (+ `input`) / `output`, or `prompt`/`response` and kin. */
function pair(record: Record<string, unknown>): Message[] {
  const pk = PROMPT_KEYS.find((k) => k in record) as string;
  const rk = RESPONSE_KEYS.find((k) => k in record);
  if (rk === undefined)
    throw new FormatError(RESPONSE_KEYS[0], `missing (one of ${RESPONSE_KEYS.join(', ')})`);
  let prompt = text(record[pk], pk);
  const input = record.input === undefined ? '' : text(record.input, 'input');
  if (input.trim() !== '') prompt = `${prompt}\n\n${input}`;
  const response = text(record[rk], rk);
  const messages: Message[] = [];
  if (typeof record.system === 'string' && record.system !== '') {
    messages.push({ role: 'system', content: record.system });
  }
  messages.push({ role: 'user', content: prompt }, { role: 'assistant', content: response });
  return messages;
}

/** Recognises the format of one parsed JSON line and normalises it to chat messages. */
export function parseSource(value: unknown): Parsed {
  if (!isObject(value)) throw new FormatError('(record)', 'expected a JSON object');
  if ('messages' in value) return { format: 'openai', messages: openai(value) };
  if ('conversations' in value) return { format: 'sharegpt', messages: sharegpt(value) };
  if (PROMPT_KEYS.some((k) => k in value)) return { format: 'pair', messages: pair(value) };
  throw new FormatError(
    '(record)',
    `unrecognised format: expected "messages", "conversations" or one of ${PROMPT_KEYS.join(', ')}`,
  );
}

/** Checks the conversation's shape: a user turn first (after system), assistant turns answering. */
export function checkShape(messages: Message[]): void {
  const body = messages.filter((m) => m.role !== 'system');
  if (body.length === 0 || body[0].role !== 'user')
    throw new FormatError('messages', 'must start with a user turn');
  if (!body.some((m) => m.role === 'assistant')) throw new FormatError('messages', 'has no assistant turn');
  body.forEach((m, i) => {
    if (m.role === 'tool') {
      const prev = body
        .slice(0, i)
        .reverse()
        .find((x) => x.role !== 'tool');
      if (prev?.role !== 'assistant' || (prev.tool_calls ?? []).length === 0) {
        throw new FormatError(`messages.${i}`, 'tool response without a preceding tool call');
      }
    }
  });
  const sys = messages.findIndex((m) => m.role === 'system');
  if (sys > 0) throw new FormatError(`messages.${sys}`, 'system message after the first turn');
}
