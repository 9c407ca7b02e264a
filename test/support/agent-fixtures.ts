/** What the rollout tests script the fake engine with: the tiny tokenizer, turns, problems. */
import { ROOT } from './helpers.js';

export const TINY = `${ROOT}fixtures/tiny`;

/** An assistant turn that calls `python_code_with_standard_io` with `code`. */
export const toolCall = (code: string) =>
  `I will compute it.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": ${JSON.stringify(code)}, "input": ""}}\n</tool_call>`;
export const CALL = toolCall('print(6 // 2)');
export const ANSWER = 'So x = 3.</reason>\n<answer>\\boxed{3}</answer>';

/** `k` problems whose answer is 3. */
export const problems = (k: number) =>
  Array.from({ length: k }, (_, i) => ({
    v: 1 as const,
    kind: 'math' as const,
    id: `p${i}`,
    prompt: `Solve 2x = 6 (variant ${i}).`,
    answer: '3',
  }));

export async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}
