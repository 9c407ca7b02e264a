import type { SubmissionResult } from '../records/sandbox.js';

/**
 * Default character limit of a tool response. rStar2-Agent's release inherits verl's
 * `max_tool_response_length` of 256 with middle truncation; matching it keeps tool turns the
 * same length the released model was trained on.
 */
export const DEFAULT_TOOL_RESPONSE_CHARS = 256;

export interface ToolResponseOptions {
  /** Characters (code points) kept; longer text keeps its head and tail around a marker. */
  maxChars?: number;
}

/**
 * The text the model sees for one tool call, built as rStar2-Agent's code-judge tool client
 * builds it: a success or failure line, the failure reason, stdout and stderr when non-empty,
 * then the execution time with two decimals, joined by newlines, then middle-truncated.
 */
export function formatToolResponse(result: SubmissionResult, options: ToolResponseOptions = {}): string {
  const ok = result.run_success && result.success;
  const parts = [ok ? 'Tool call success' : 'Tool call failure'];
  if (!ok) parts.push(`reason: ${result.reason}`);
  if (result.stdout) parts.push(`stdout: ${result.stdout}`);
  if (result.stderr) parts.push(`stderr: ${result.stderr}`);
  parts.push(`execution time: ${fixed2(result.cost)}s`);
  return truncateMiddle(parts.join('\n'), options.maxChars ?? DEFAULT_TOOL_RESPONSE_CHARS);
}

/**
 * The release's middle truncation on code points (Python string semantics, not UTF-16 units):
 * `text[:n//2] + "...(truncated)..." + text[-(n//2):]`, including Python's quirk that a
 * zero-length tail slice (`text[-0:]`) is the whole text.
 */
export function truncateMiddle(text: string, maxChars: number): string {
  if (!text) return text;
  const points = Array.from(text);
  if (points.length <= maxChars) return text;
  const half = Math.floor(maxChars / 2);
  const tail = half === 0 ? points : points.slice(points.length - half);
  return `${points.slice(0, half).join('')}...(truncated)...${tail.join('')}`;
}

/**
 * Python's `f"{x:.2f}"`: exact decimal expansion of the double, ties to even. `toFixed` breaks
 * exact ties upwards (0.125 -> "0.13" where Python prints "0.12"), so ties are handled here.
 */
export function fixed2(x: number): string {
  if (!Number.isFinite(x)) return String(x).toLowerCase().replace('infinity', 'inf');
  const negative = x < 0 || Object.is(x, -0);
  const exact = Math.abs(x).toFixed(100);
  const dot = exact.indexOf('.');
  const rest = exact.slice(dot + 3);
  const isTie = rest[0] === '5' && /^0*$/.test(rest.slice(1));
  let out: string;
  if (isTie) {
    const truncated = exact.slice(0, dot + 3);
    const lastDigit = Number(truncated[truncated.length - 1]);
    out = lastDigit % 2 === 0 ? truncated : (Math.abs(x) + 0.005).toFixed(2);
  } else {
    out = Math.abs(x).toFixed(2);
  }
  return negative ? `-${out}` : out;
}
