import { DataError } from '../errors.js';
import { NdjsonWriter, openInput, readAll, readRecords } from '../ndjson/index.js';
import { choice, number, parse, program } from '../program.js';
import { Problem } from '../records/problem.js';
import { type Finish, TRUNCATED } from '../records/trajectory.js';
import { ScoredTrajectory, VerifyCase } from '../records/verify.js';
import { type Compat, extractLoose, isEquivalent, scoreResponse } from '../reward/index.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program('verify', 'extract final answers and check them against references')
    .argument('[file]', 'NDJSON input (default: stdin)')
    .addOption(
      choice(
        '--compat <mode>',
        'strict (not gameable) or rstar (the rStar2-Agent release verdicts)',
        ['strict', 'rstar'] as const satisfies readonly Compat[],
        'strict',
      ),
    )
    .option(
      '--problems <file>',
      'score trajectories: fill `answer` and `reward` against these problems (their prompts give rounding rules)',
    )
    .option('--timeout-ms <ms>', 'time bound of one comparison', number(1, 60_000), 200);
  if (!parse(cmd, argv)) return;
  const opts = cmd.opts<{ compat: Compat; problems?: string; timeoutMs: number }>();
  const compat = opts.compat;
  const timeoutMs = opts.timeoutMs;
  const { stream, source } = openInput(cmd.args[0]);
  const out = new NdjsonWriter(process.stdout);

  if (opts.problems !== undefined) {
    const problems = new Map<string, Problem>();
    for (const { record } of await readAll(opts.problems, Problem)) problems.set(record.id, record);
    for await (const { record, line } of readRecords(stream, source, ScoredTrajectory)) {
      const problem = problems.get(record.problem_id);
      if (!problem) {
        throw new DataError(
          `${source}:${line}: problem_id: no problem '${record.problem_id}' in ${opts.problems}`,
        );
      }
      // The problem's prompt travels with it: its rounding instructions apply.
      const { answer, reward } = scoreResponse(record.text, problem, { compat });
      // A truncated trajectory keeps reward 0 whatever its text says (ARCHITECTURE.md, the agent protocol).
      await out.write({ ...record, answer, reward: TRUNCATED.has(record.finish as Finish) ? 0 : reward });
    }
  } else {
    for await (const { record, line } of readRecords(stream, source, VerifyCase)) {
      // The problem's text, when a pair carries it, brings its rounding instructions.
      const prompt = record.prompt;
      if (prompt !== undefined && typeof prompt !== 'string') {
        throw new DataError(`${source}:${line}: prompt: expected a string, got ${typeof prompt}`);
      }
      const equal = isEquivalent(record.pred, record.ref, { kind: record.kind, compat, timeoutMs, prompt });
      const lenient = compat === 'rstar';
      await out.write({
        ...record,
        equal,
        pred_answer: extractLoose(record.pred, { lenient }),
        ref_answer: extractLoose(record.ref, { lenient: true }),
      });
    }
  }
  await out.end();
}
