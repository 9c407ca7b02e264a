import type { Submission, SubmissionResult } from '../records/sandbox.js';
import type { RawResult } from './executor.js';

/** Exit code the executor uses when the sandbox itself could not be set up for a call. */
const SETUP_FAILED = 125;

/**
 * The line code-judge's Python runner writes to stdout when a call reaches its time limit; a
 * timed-out call's stdout ends with it here too, so a client written for code-judge (or a model
 * trained on its tool responses) sees the same answer.
 */
export const TIMEOUT_LINE = 'Suicide from timeout.\n';

export function subId(submission: Submission): string | number {
  return submission.sub_id ?? '';
}

export function failure(submission: Submission, reason: string, cost = 0, stderr?: string): SubmissionResult {
  return {
    sub_id: subId(submission),
    success: false,
    run_success: false,
    cost,
    reason,
    stdout: null,
    stderr: stderr ?? null,
  };
}

/**
 * code-judge's result semantics: `run_success` = exited 0; `success` = run_success and, for a
 * judge call, stdout equal to `expected_output` after stripping surrounding whitespace.
 * A program that exits non-zero keeps reason "" (as code-judge) unless a limit explains it.
 */
export function toResult(submission: Submission, raw: RawResult, outputChars: number): SubmissionResult {
  if (raw.error !== undefined || raw.exit === SETUP_FAILED) {
    return failure(submission, 'internal_error', raw.cost ?? 0, raw.error ?? raw.stderr);
  }
  let reason = '';
  if (raw.timed_out || raw.exit === -24 /* SIGXCPU: CPU-time rlimit */) reason = 'worker_timeout';
  else if (raw.output_exceeded) reason = 'output_limit';
  else if (raw.exit === -9 || (raw.exit !== 0 && /^MemoryError\b/m.test(raw.stderr))) reason = 'memory_limit';
  const runSuccess = raw.exit === 0 && reason === '';
  let success = runSuccess;
  const expected = submission.expected_output;
  if (success && expected !== undefined && expected !== null) success = raw.stdout.trim() === expected.trim();
  // code-judge appends its line to what the program printed, then caps the output.
  const stdout = reason === 'worker_timeout' ? raw.stdout + TIMEOUT_LINE : raw.stdout;
  return {
    sub_id: subId(submission),
    success,
    run_success: runSuccess,
    cost: raw.cost,
    reason,
    stdout: stdout.length > outputChars ? Array.from(stdout).slice(0, outputChars).join('') : stdout,
    stderr: raw.stderr,
  };
}
