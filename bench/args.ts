/** What the sandbox benchmarks share: command-line flags, call and result shapes, process CPU. */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** The repository root, from dist/bench. */
export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The realistic mix (fixtures/tool-calls-sample.jsonl), as submissions. */
export function loadMix(): Sub[] {
  return readFileSync(`${ROOT}fixtures/tool-calls-sample.jsonl`, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Sub)
    .map(({ type, solution, input }) => ({ type, solution, input }));
}

/** The value after `--name` on the command line. */
export function option(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

/** A numeric flag `--name N`. */
export const flag = (name: string, fallback: number): number => Number(option(name) ?? fallback);

/** A submission as the benchmarks send it. */
export interface Sub {
  type: string;
  solution: string;
  input?: string;
}

/** The fields of a result the benchmarks read. */
export interface Res {
  run_success: boolean;
  reason: string;
  stdout: string | null;
}

/** CPU seconds (user + system) of one live process; NaN when it is gone or not given. */
export function cpuOf(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return Number.NaN;
  }
}

/** The results of a `/run/stream` answer, which must hold `count` of them. */
export function streamResults(text: string, count: number): Res[] {
  const results = text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Res);
  if (results.length !== count) throw new Error(`got ${results.length} results for ${count}`);
  return results;
}
