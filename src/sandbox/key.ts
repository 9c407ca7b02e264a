import { createHash } from 'node:crypto';
import type { Submission } from '../records/sandbox.js';

/**
 * Key under which a submission's result is deduplicated: its `sub_id` plus everything that
 * decides what runs, so a retried request gets the first run's answer while a reused id with
 * different code still runs. Submissions without `sub_id` are never deduplicated.
 */
export function submissionKey(submission: Submission): string | undefined {
  if (submission.sub_id === undefined || submission.sub_id === null) return undefined;
  const hash = createHash('sha1');
  for (const part of [
    String(submission.sub_id),
    submission.type ?? 'python',
    submission.solution,
    submission.input ?? '',
    submission.expected_output ?? '\u0000none',
    JSON.stringify((submission as { options?: unknown }).options ?? null),
    submission.session_id ?? '',
    JSON.stringify(submission.files ?? null),
  ]) {
    hash.update(part);
    hash.update('\u0000');
  }
  return hash.digest('hex');
}
