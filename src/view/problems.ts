import { readFile } from 'node:fs/promises';

/** What a trajectory page shows of its problem: trajectories carry only the prompt's token ids. */
export interface ProblemInfo {
  prompt: string;
  answer: string;
  kind: string;
  choices?: string[];
  family: string;
}

/**
 * A problem's family: the curriculum's `meta.family`, else its id's prefix (the curriculum names
 * problems `<family>-<hash>`; benchmarks `aime_2024-3` give their benchmark), else `other`.
 */
export function familyOf(id: string, meta?: unknown): string {
  const family = (meta as { family?: unknown } | undefined)?.family;
  if (typeof family === 'string' && family !== '') return family;
  const dash = id.lastIndexOf('-');
  return dash > 0 ? id.slice(0, dash) : 'other';
}

/** Reads problem files into `into` (later files win); returns the lines it could not read. */
export async function readProblems(
  path: string,
  into: Map<string, ProblemInfo>,
): Promise<{ line: number; message: string }[]> {
  const text = await readFile(path, 'utf8').catch(() => '');
  const bad: { line: number; message: string }[] = [];
  text.split('\n').forEach((raw, i) => {
    if (raw.trim() === '') return;
    try {
      const p = JSON.parse(raw) as Record<string, unknown>;
      if (typeof p.id !== 'string' || typeof p.prompt !== 'string')
        throw new Error('id, prompt: expected strings');
      into.set(p.id, {
        prompt: p.prompt,
        answer: String(p.answer ?? ''),
        kind: typeof p.kind === 'string' ? p.kind : 'math',
        ...(Array.isArray(p.choices) ? { choices: p.choices.map(String) } : {}),
        family: familyOf(p.id, p.meta),
      });
    } catch (error) {
      bad.push({ line: i + 1, message: (error as Error).message });
    }
  });
  return bad;
}
