import { DataError } from '../errors.js';
import { seededRandom, shuffled } from '../random.js';
import type { Problem } from '../records/problem.js';
import { parseCsv } from './csv.js';

export const LETTERS = ['A', 'B', 'C', 'D'] as const;

const REQUIRED = [
  'Question',
  'Correct Answer',
  'Incorrect Answer 1',
  'Incorrect Answer 2',
  'Incorrect Answer 3',
];

/** The instruction appended to every GPQA prompt, so a model knows to answer with a letter. */
export const GPQA_INSTRUCTION = 'Answer with the letter (A, B, C or D) of the correct option.';

export interface GpqaOptions {
  /** Seeds the option shuffle; the same seed and file give the same problems. */
  seed?: number;
  /** Source label written into each problem (default: the file name). */
  source?: string;
}

/**
 * Converts GPQA's CSV (`Question`, `Correct Answer`, `Incorrect Answer 1..3`; other columns such
 * as `Record ID`, `High-level domain`, `Subdomain` go into `meta`) into multiple-choice Problems.
 *
 * The correct option's letter is dealt from a shuffled deck holding each letter equally often,
 * so over the dataset A-D are correct equally often (within one) and a model that always says "A"
 * scores 25%, not whatever the file's order happens to give; distractors fill the other slots in
 * seeded random order.
 */
export function gpqaProblems(text: string, file: string, options: GpqaOptions = {}): Problem[] {
  const seed = options.seed ?? 0;
  const rows = parseCsv(text, file);
  if (rows.length === 0) throw new DataError(`${file}:1: empty GPQA file (expected a header row)`);
  const [header, ...data] = rows;
  const columns = header.fields.map((f) => f.trim());
  for (const name of REQUIRED) {
    if (!columns.includes(name)) throw new DataError(`${file}:${header.line}: ${name}: missing GPQA column`);
  }
  const col = (name: string) => columns.indexOf(name);
  const random = seededRandom(`gpqa:${seed}`);
  const deck = shuffled(
    data.map((_, i) => i % LETTERS.length),
    random,
  );
  return data.map((row, index) => {
    if (row.fields.length !== columns.length) {
      throw new DataError(
        `${file}:${row.line}: (record): ${row.fields.length} fields, the header has ${columns.length}`,
      );
    }
    const get = (name: string) => row.fields[col(name)].trim();
    for (const name of REQUIRED) {
      if (get(name) === '') throw new DataError(`${file}:${row.line}: ${name}: empty`);
    }
    const correct = deck[index];
    const distractors = shuffled(
      [get('Incorrect Answer 1'), get('Incorrect Answer 2'), get('Incorrect Answer 3')],
      random,
    );
    const choices: string[] = [];
    for (let slot = 0; slot < LETTERS.length; slot += 1) {
      choices.push(slot === correct ? get('Correct Answer') : (distractors.shift() as string));
    }
    const meta: Record<string, unknown> = { row: index + 1, seed };
    columns.forEach((name, i) => {
      if (!REQUIRED.includes(name) && name !== '' && row.fields[i] !== '') meta[name] = row.fields[i];
    });
    const recordId = col('Record ID') >= 0 ? get('Record ID') : '';
    const listed = choices.map((choice, i) => `${LETTERS[i]}) ${choice}`).join('\n');
    return {
      v: 1 as const,
      id: recordId !== '' ? `gpqa-${recordId}` : `gpqa-${index + 1}`,
      prompt: `${get('Question')}\n\n${listed}\n\n${GPQA_INSTRUCTION}`,
      answer: LETTERS[correct],
      kind: 'choice' as const,
      choices,
      source: options.source ?? file,
      meta,
    };
  });
}
