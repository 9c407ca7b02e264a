/** Bad data (a malformed record, an unreadable file): exit 1. */
export class DataError extends Error {
  readonly exitCode: number = 1;
  override name = 'DataError';
}

/** Bad usage (unknown flag, missing argument, invalid option value): exit 2. */
export class UsageError extends Error {
  readonly exitCode: number = 2;
  override name = 'UsageError';
}

export function exitCodeOf(error: unknown): number {
  if (error instanceof DataError || error instanceof UsageError) return error.exitCode;
  const code = (error as { exitCode?: unknown })?.exitCode;
  return typeof code === 'number' && code > 0 ? code : 1;
}
