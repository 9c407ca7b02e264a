/**
 * RoC's penalties, computed from a trajectory's decoded `text` exactly as rStar2-Agent's
 * `rstar2_agent/down_sample/roc.py` does (`calc_error_ratio_penalty_weights` and
 * `calc_format_penalty_weights`). Both are in [0, 1]; lower is better.
 */

// Python's `re.findall(r'<tool_response>.*?</tool_response>', text, re.DOTALL)`: lazy, non-overlapping,
// `.` matching newlines too ([\s\S] is DOTALL's `.` without the `s` flag's Unicode subtleties).
const TOOL_RESPONSE = /<tool_response>[\s\S]*?<\/tool_response>/g;
const ANSWER_BLOCK = /<answer>[\s\S]*?<\/answer>/g;
const ASSISTANT_TURN = /<\|im_start\|>assistant[\s\S]*?<\|im_end\|>/g;
const OPEN_ANSWER = '<answer>';
const CLOSE_ANSWER = '</answer>';

/** Penalty when a trajectory made no tool call at all: the release neither rewards nor punishes it fully. */
export const NO_TOOL_RESPONSE_PENALTY = 0.5;

export interface ToolErrorPenalty {
  /** Share of tool responses that mention "error" (case-insensitive), 0.5 when there is none. */
  penalty: number;
  errors: number;
  responses: number;
}

/** Mirrors `error_ratio` inside `calc_error_ratio_penalty_weights`. */
export function toolErrorPenalty(text: string): ToolErrorPenalty {
  let responses = 0;
  let errors = 0;
  for (const match of text.matchAll(TOOL_RESPONSE)) {
    responses += 1;
    // The release lower-cases the whole block (Unicode `str.lower`) before the substring test.
    if (match[0].toLowerCase().includes('error')) errors += 1;
  }
  if (responses === 0) return { penalty: NO_TOOL_RESPONSE_PENALTY, errors: 0, responses: 0 };
  return { penalty: errors / responses, errors, responses };
}

export interface FormatPenalty {
  penalty: number;
  /** Closed `<answer>…</answer>` blocks as the release counts them (0 when either tag is missing). */
  answerTags: number;
}

/** Non-overlapping occurrences, like Python's `str.count`. */
function countOf(text: string, needle: string): number {
  let n = 0;
  let at = text.indexOf(needle);
  while (at !== -1) {
    n += 1;
    at = text.indexOf(needle, at + needle.length);
  }
  return n;
}

function countMatches(text: string, pattern: RegExp): number {
  let n = 0;
  for (const _ of text.matchAll(pattern)) n += 1;
  return n;
}

/**
 * Mirrors `answer_tag_repetition` inside `calc_format_penalty_weights`: 1.0 for a missing or unbalanced
 * answer, 1.0 when no assistant turn is delimited, else (answers - 1) / turns capped at 1, so one
 * answer costs nothing and repeating it costs more the fewer turns there were.
 */
export function formatPenalty(text: string): FormatPenalty {
  if (!text.includes(OPEN_ANSWER) || !text.includes(CLOSE_ANSWER)) return { penalty: 1, answerTags: 0 };
  const closed = countMatches(text, ANSWER_BLOCK);
  if (countOf(text, OPEN_ANSWER) !== closed || countOf(text, CLOSE_ANSWER) !== closed) {
    return { penalty: 1, answerTags: closed };
  }
  const turns = countMatches(text, ASSISTANT_TURN);
  if (turns === 0) return { penalty: 1, answerTags: closed };
  return { penalty: Math.min((closed - 1) / turns, 1), answerTags: closed };
}

/** Which penalties enter `total` (the release's `roc_error_ratio` / `roc_answer_format` switches). */
export type PenaltyMode = 'rstar' | 'tool-error' | 'format' | 'none';
export const PENALTY_MODES: readonly PenaltyMode[] = ['rstar', 'tool-error', 'format', 'none'];

export interface PenaltyScore {
  tool_error: number;
  format: number;
  total: number;
}

export interface ScoredText {
  penalty: PenaltyScore;
  toolErrors: number;
  toolResponses: number;
  answerTags: number;
}

/** Both penalties and their total under `mode`, summed in the release's order (error ratio, then format). */
export function scoreText(text: string, mode: PenaltyMode = 'rstar'): ScoredText {
  const tool = toolErrorPenalty(text);
  const format = formatPenalty(text);
  let total = 0;
  if (mode === 'rstar' || mode === 'tool-error') total += tool.penalty;
  if (mode === 'rstar' || mode === 'format') total += format.penalty;
  return {
    penalty: { tool_error: tool.penalty, format: format.penalty, total },
    toolErrors: tool.errors,
    toolResponses: tool.responses,
    answerTags: format.answerTags,
  };
}
