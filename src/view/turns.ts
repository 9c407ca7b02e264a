/**
 * A trajectory's decoded response cut into what the page shows: the model's turns (reasoning, tool
 * calls with their code) and the tool responses between them. The response is one text with the
 * template's markers kept (`<|im_end|>`, `<|im_start|>user`, `<tool_response>`), as rollout decodes it.
 * Everything here stays text: the page puts it in text nodes.
 */
export interface ToolCallView {
  name: string;
  /** The `code` argument (Python), or the raw call when it is not the JSON a call should be. */
  code: string;
  input: string;
  /** False when the call did not parse: the page shows it as text, unhighlighted. */
  parsed: boolean;
}

export type Segment =
  | { role: 'assistant'; turn: number; text: string; calls: ToolCallView[]; version: string | null }
  | { role: 'tool'; text: string; responses: string[] };

const MARKER = /<\|im_start\|>(\w+)\n?|<\|im_end\|>\n?/g;
const CALL = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;
const RESPONSE = /<tool_response>\n?([\s\S]*?)\n?<\/tool_response>/g;

function parseCall(raw: string): ToolCallView {
  try {
    const call = JSON.parse(raw) as { name?: unknown; arguments?: unknown };
    let args = call.arguments;
    if (typeof args === 'string') args = JSON.parse(args);
    const a = (args ?? {}) as { code?: unknown; input?: unknown };
    return {
      name: String(call.name ?? ''),
      code: typeof a.code === 'string' ? a.code : JSON.stringify(args, null, 2),
      input: typeof a.input === 'string' ? a.input : '',
      parsed: true,
    };
  } catch {
    return { name: '', code: raw, input: '', parsed: false };
  }
}

/** Cuts `text` at the chat markers; each assistant turn takes the next of `versions`. */
export function splitTurns(text: string, versions: readonly string[] | null): Segment[] {
  const out: Segment[] = [];
  let role = 'assistant';
  let at = 0;
  let turn = 0;
  const flush = (body: string) => {
    if (role === 'assistant') {
      if (body.trim() === '' && out.length > 0) return;
      const calls = [...body.matchAll(CALL)].map((m) => parseCall(m[1]));
      out.push({
        role: 'assistant',
        turn,
        text: body.replace(CALL, '').trim(),
        calls,
        version: versions?.[turn] ?? null,
      });
      turn += 1;
    } else if (body.trim() !== '') {
      out.push({ role: 'tool', text: body, responses: [...body.matchAll(RESPONSE)].map((m) => m[1]) });
    }
  };
  for (const m of text.matchAll(MARKER)) {
    flush(text.slice(at, m.index));
    at = (m.index ?? 0) + m[0].length;
    // `<|im_end|>` closes a turn; the role of what follows is set by the next `<|im_start|>`.
    role = m[1] === undefined ? 'between' : m[1] === 'assistant' ? 'assistant' : 'tool';
  }
  flush(text.slice(at));
  return out;
}
