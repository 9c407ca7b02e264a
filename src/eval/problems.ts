import { readFile } from 'node:fs/promises';
import { basename } from 'node:path';
import { DataError } from '../errors.js';
import { readAll } from '../ndjson/index.js';
import { Problem } from '../records/problem.js';
import { gpqaProblems } from './gpqa.js';

export const PROBLEMS_FORMATS = ['problems', 'gpqa'] as const;
export type ProblemsFormat = (typeof PROBLEMS_FORMATS)[number];

export interface Benchmark {
  /** Short name used in file names and report rows: the file's base name without extension. */
  name: string;
  file: string;
  problems: Problem[];
}

/** `fixtures/aime_2024.jsonl` -> `aime_2024`; `trajectories-aime_2024.jsonl` -> `aime_2024`. */
export function benchmarkName(file: string): string {
  return basename(file)
    .replace(/\.(jsonl|ndjson|json|csv)$/i, '')
    .replace(/^trajectories-/, '');
}

/** A whole input file (a CSV, a report.json) as text; a missing or unreadable one is a DataError naming it. */
export async function readText(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (error) {
    const code = (error as { code?: string }).code;
    throw new DataError(`${file}: ${code === 'ENOENT' ? 'no such file' : (error as Error).message}`);
  }
}

/** Reads one benchmark: NDJSON Problems, or GPQA's CSV shuffled into A-D with `seed`. */
export async function loadBenchmark(file: string, format: ProblemsFormat, seed = 0): Promise<Benchmark> {
  let problems: Problem[];
  if (format === 'gpqa') {
    problems = gpqaProblems(await readText(file), file, { seed, source: `gpqa:${basename(file)}` });
  } else {
    const seen = new Map<string, number>();
    problems = [];
    for (const { record, line, source } of await readAll(file, Problem)) {
      const first = seen.get(record.id);
      if (first !== undefined)
        throw new DataError(`${source}:${line}: id: duplicate '${record.id}' (first on line ${first})`);
      seen.set(record.id, line);
      problems.push(record);
    }
  }
  if (problems.length === 0) throw new DataError(`${file}: no problems`);
  return { name: benchmarkName(file), file, problems };
}

/** Two benchmarks must not share a name, or their output files would overwrite each other. */
export function checkDistinct(names: string[]): void {
  const seen = new Set<string>();
  for (const name of names) {
    if (seen.has(name))
      throw new DataError(`two benchmarks are both named '${name}' (from their file names)`);
    seen.add(name);
  }
}
