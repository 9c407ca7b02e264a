import { type PyJson, pyJsonDumps, pyJsonLoads, pyRepr, pyTypeName } from './pyjson.js';

/**
 * One `<tool_call>` block of an assistant turn. A block that does not decode is kept (the release
 * answers it instead of dropping it), carrying the text the model will read back.
 */
export type ToolCall =
  | { kind: 'call'; name: string; arguments: PyJson; raw: string }
  | { kind: 'invalid'; response: string; raw: string };

const TOOL_CALL = /<tool_call>([\s\S]*?)<\/tool_call>/g;

/** Python's message for `obj["name"]` / `obj["arguments"]` when that lookup fails. */
function subscriptError(obj: PyJson, key: string): string | undefined {
  if (obj !== null && typeof obj === 'object' && !Array.isArray(obj)) {
    return Object.hasOwn(obj, key) ? undefined : pyRepr(key);
  }
  if (Array.isArray(obj)) return 'list indices must be integers or slices, not str';
  if (typeof obj === 'string') return "string indices must be integers, not 'str'";
  return `'${pyTypeName(obj)}' object is not subscriptable`;
}

/**
 * Hermes tool-call parsing as rStar2-Agent's `rstar2_agent_hermes` parser does it: nothing unless
 * both tags appear; every non-greedy `<tool_call>…</tool_call>` match is JSON-decoded with Python's
 * rules, and a failure becomes `Failed to decode tool call: <Python's error text>`.
 */
export function parseToolCalls(text: string): ToolCall[] {
  if (!text.includes('<tool_call>') || !text.includes('</tool_call>')) return [];
  const calls: ToolCall[] = [];
  for (const m of text.matchAll(TOOL_CALL)) {
    const raw = m[1];
    const fail = (reason: string): void => {
      calls.push({ kind: 'invalid', response: `Failed to decode tool call: ${reason}`, raw });
    };
    const decoded = pyJsonLoads(raw);
    if (!decoded.ok) {
      fail(decoded.error);
      continue;
    }
    const obj = decoded.value;
    const missing = subscriptError(obj, 'name') ?? subscriptError(obj, 'arguments');
    if (missing !== undefined) {
      fail(missing);
      continue;
    }
    const { name, arguments: args } = obj as Record<string, PyJson>;
    if (typeof name !== 'string') {
      // pydantic's FunctionCall(name: str) rejects it; its first line is what matters to the model.
      fail(`1 validation error for FunctionCall\nname\n  Input should be a valid string`);
      continue;
    }
    calls.push({ kind: 'call', name, arguments: args, raw });
  }
  return calls;
}

/** What the sandbox runs for one `python_code_with_standard_io` call. */
export interface CodeCall {
  code: string;
  input: string;
}

/**
 * The checks the release's `_call_tool` makes before running anything: the tool must exist and
 * its arguments must be an object. Failures read `Error when executing tool: <Python's error>`.
 */
export function resolveToolCall(call: ToolCall, toolNames: readonly string[]): CodeCall | { error: string } {
  if (call.kind === 'invalid') return { error: call.response };
  if (!toolNames.includes(call.name)) return { error: `Error when executing tool: ${pyRepr(call.name)}` };
  const args = call.arguments;
  if (args === null || typeof args !== 'object' || Array.isArray(args)) {
    return { error: `Error when executing tool: '${pyTypeName(args)}' object has no attribute 'get'` };
  }
  const text = (v: PyJson | undefined): string =>
    v === undefined || v === null ? '' : typeof v === 'string' ? v : pyJsonDumps(v);
  return { code: text(args.code), input: text(args.input) };
}
