import { DataError, UsageError } from '../../errors.js';
import { fnv1a, Rng } from '../../random.js';
import type { Problem } from '../../records/problem.js';
import type { SubmissionResult } from '../../records/sandbox.js';
import { scriptedTrajectory } from '../../rollout/agent.js';
import type { ToolState } from '../../rollout/tool-state.js';
import type { ConversationRenderer } from '../conversation.js';
import { mapLimit } from '../map-limit.js';
import type { SftRecord } from '../record.js';
import type { CodeCall, ToolRunner } from '../tool-runner.js';
import { DEMO_CONCURRENCY } from './agentic.js';
import { brokenCode, CURRICULA, family, type Task } from './families.js';

export { CURRICULA, FAMILIES, familiesOf, parseFamilyWeights, type Task } from './families.js';

export const TOOL_NAME = 'python_code_with_standard_io';

/** Every problem's split is a function of its text alone, so no seed can leak test into train. */
export function isTestPrompt(prompt: string, testPercent = 20): boolean {
  return fnv1a(prompt) % 100 < testPercent;
}

export interface SplitOptions {
  train: number;
  test: number;
  seed: number;
  /**
   * Family weights of the training side (`--family-weights`). The held-out side stays the
   * curriculum's uniform draw, the very problems an unweighted split of the seed holds, so runs
   * with other weights are evaluated on the same problems.
   */
  weights?: Readonly<Record<string, number>>;
}

export interface Split {
  train: Task[];
  test: Task[];
}

/** Seeded, duplicate-free, disjoint train and held-out test tasks of one curriculum. */
export function split(name: string, { train, test, seed, weights }: SplitOptions): Split {
  if (weights !== undefined) {
    // (disjoint still: which side a problem is on is a function of its prompt)
    return { train: draw(name, train, 0, seed, weights).train, test: draw(name, train, test, seed).test };
  }
  return draw(name, train, test, seed);
}

function draw(
  name: string,
  train: number,
  test: number,
  seed: number,
  weights?: Readonly<Record<string, number>>,
): Split {
  const make = family(name, weights);
  if (make === undefined)
    throw new UsageError(`unknown curriculum '${name}'; known: ${CURRICULA.join(', ')}`);
  const rng = new Rng(seed);
  const seen = new Set<string>();
  const out: Split = { train: [], test: [] };
  let attempts = 0;
  while (out.train.length < train || out.test.length < test) {
    if (++attempts > 100 * (train + test) + 1000) {
      throw new DataError(`curriculum '${name}' ran out of distinct problems`);
    }
    const task = make(rng);
    if (seen.has(task.prompt)) continue;
    seen.add(task.prompt);
    const bucket = isTestPrompt(task.prompt) ? out.test : out.train;
    if (bucket.length < (bucket === out.test ? test : train)) bucket.push(task);
  }
  return out;
}

export function problemOf(task: Task, name: string, split: 'train' | 'test'): Problem {
  return {
    v: 1,
    id: `${task.family}-${fnv1a(task.prompt).toString(16).padStart(8, '0')}`,
    prompt: task.prompt,
    answer: task.answer,
    kind: 'math',
    ...(task.files ? { files: task.files } : {}),
    source: `synthetic/${name}`,
    // `steps`: the calls its demonstration makes, so evaluations can tell the multi-step problems
    meta: { family: task.family, ...task.meta, ...(task.steps ? { steps: task.steps.length } : {}), split },
  };
}

export interface DemoOptions {
  /** Fraction of demonstrations whose first call fails and is fixed after the traceback. */
  errorRate: number;
  /**
   * Train on the slipped first call too. Off by default: the loss then teaches reading the
   * traceback and fixing the call, not making the slip (a model that learnt the slip repeats it
   * at about errorRate when sampled, spending budget on a call it knew how to write).
   */
  slipLoss?: boolean;
  seed: number;
  name: string;
  /**
   * `--tool-state` of the demonstrations (default `stateless`). `session`: a demonstration's calls
   * run as the cells of one session (a slipped first call and its fix run one after the other in
   * it), and `REUSE_SHARE` of the one-line tasks without a slip become `reuse` demonstrations: the
   * first call keeps the value in a variable, the second prints it. The prompts carry the session
   * sentence (the renderer's protocol), so SFT teaches what RL's sessions then do.
   */
  toolState?: ToolState;
}

/** Session mode: the share of slip-free one-line tasks demonstrated in two calls sharing a variable. */
export const REUSE_SHARE = 0.2;

/** `print(EXPR)` on one line, no stdin: a task whose value a first call can keep in a variable. */
const ONE_LINE = /^print\((.+)\)$/;

/** The two calls of a `reuse` demonstration, or undefined when the task's program is not one line. */
export function reuseCalls(task: Pick<Task, 'code' | 'input'>): [CodeCall, CodeCall] | undefined {
  const expr = ONE_LINE.exec(task.code)?.[1];
  if (expr === undefined || task.input !== '' || task.code.includes('\n')) return undefined;
  return [
    { code: `value = ${expr}`, input: '' },
    { code: 'print(value)', input: '' },
  ];
}

function call(code: string, input: string) {
  return { name: TOOL_NAME, arguments: { code, input } };
}

/**
 * The execution time a demonstration shows: 0.00s for a call that ran to its end, the limit (whole
 * seconds) for one stopped at it. The curriculum's programs take milliseconds, so a measured time
 * says only how loaded the machine was: shown at 0.01 s, 30 of 5,000 demonstrations changed from run
 * to run of the same seed; floored to 0.1 s, a call stalled for 100 ms under load still showed 0.10s
 * (one of 5,000, and the SFT model of that run ended 11 points of greedy accuracy away).
 */
function steadyCost(result: SubmissionResult): SubmissionResult {
  return { ...result, cost: result.reason === 'worker_timeout' ? Math.floor(result.cost) : 0 };
}

/**
 * Runs each distinct (code, input) once and hands its result to every call that asked for it. The
 * curriculum's programs are deterministic (their output is checked against the answer, their time
 * shown as steadyCost's), so a repeat would only print the same again: a fifth of the mix's calls
 * (1,152 of 5,787 at 5,000 demonstrations) are repeats, each a sandbox fork.
 */
async function runDistinct(runner: ToolRunner, calls: CodeCall[]): Promise<SubmissionResult[]> {
  const first = new Map<string, number>();
  const distinct: CodeCall[] = [];
  const slot = calls.map((c) => {
    const key = JSON.stringify([c.code, c.input]);
    let at = first.get(key);
    if (at === undefined) {
      at = distinct.push(c) - 1;
      first.set(key, at);
    }
    return at;
  });
  const results = distinct.length > 0 ? await runner.run(distinct) : [];
  if (results.length !== distinct.length)
    throw new Error(`tool runner answered ${results.length} of ${distinct.length} calls`);
  return slot.map((at) => results[at]);
}

/**
 * SFT demonstrations in the rStar2 agent protocol: `<reason>` text, one tool call, the real tool
 * response, then the boxed answer; some first calls fail and are corrected. Every program runs in
 * `runner`, the trajectory is built by rollout's own agent loop (`scriptedTrajectory`), and a
 * demonstration whose program output differs from the task's answer is a bug: it throws.
 */
export async function demonstrations(
  tasks: Task[],
  runner: ToolRunner,
  renderer: ConversationRenderer,
  { errorRate, slipLoss = false, seed, name, toolState = 'stateless' }: DemoOptions,
): Promise<{ records: SftRecord[]; failedFirst: number; reused: number }> {
  const rng = new Rng(seed ^ 0x5f3759df);
  const broken = tasks.map((t) => (rng.next() < errorRate ? brokenCode(t.code, rng) : undefined));
  const good = (
    await runDistinct(
      runner,
      tasks.map((t) => ({ code: t.code, input: t.input })),
    )
  ).map(steadyCost);
  const slips = tasks.flatMap((t, i) =>
    broken[i] === undefined ? [] : [{ code: broken[i] as string, input: t.input }],
  );
  const session = toolState === 'session';
  // (in session mode a slip runs in its demonstration's session, below)
  const bad = (await runDistinct(runner, session ? [] : slips)).map(steadyCost);
  // Session mode: the demonstrations of more than one call run as sessions. (One call is the first
  // cell of a fresh session, which is a fresh interpreter: those keep the results above.) A
  // stream of its own picks the reuse demonstrations, so the stateless ones are drawn as before.
  const pick = new Rng(seed ^ 0x2545f491);
  const reuse = tasks.map((t, i) =>
    session && broken[i] === undefined && pick.next() < REUSE_SHARE ? reuseCalls(t) : undefined,
  );
  const cells = new Map<number, SubmissionResult[]>();
  if (session) {
    const runs = tasks.flatMap((t, i) => {
      const calls = reuse[i] ?? (broken[i] !== undefined ? [{ code: broken[i], input: t.input }, t] : []);
      return calls.length > 1 ? [{ i, calls: calls.map((c) => ({ code: c.code, input: c.input })) }] : [];
    });
    const done = await mapLimit(runs, DEMO_CONCURRENCY, ({ calls }) => runner.runCells(calls));
    for (const [k, { i }] of runs.entries()) cells.set(i, (done[k] as SubmissionResult[]).map(steadyCost));
  }
  const records: SftRecord[] = [];
  let b = 0;
  let failedFirst = 0;
  let reused = 0;
  for (const [i, task] of tasks.entries()) {
    const inSession = cells.get(i);
    // A slip that happened to run is left out below: its fix is then a fresh session's first cell.
    const result =
      inSession !== undefined && (reuse[i] !== undefined || !inSession[0].run_success)
        ? inSession[1]
        : good[i];
    const printed = (result.stdout ?? '').trim();
    if (!result.run_success || printed !== task.answer) {
      throw new DataError(
        `curriculum bug: ${JSON.stringify(task.prompt)}: program printed ${JSON.stringify(printed)} ` +
          `(${result.reason}), expected ${task.answer}`,
      );
    }
    const assistant: string[] = [];
    const toolResults: SubmissionResult[] = [];
    const pair = reuse[i];
    if (pair !== undefined && inSession !== undefined) {
      // The second call prints a variable only the first call's cell defined.
      reused += 1;
      const trajectory = await scriptedTrajectory(
        task.prompt,
        {
          assistant: [
            renderer.assistantText(`${task.reason} I will keep the value in a variable.</reason>`, [
              call(pair[0].code, ''),
            ]),
            renderer.assistantText('The variable persists between calls. I will print it.</reason>', [
              call(pair[1].code, ''),
            ]),
            `The tool printed the answer.</reason>\n<answer>\\boxed{${printed}}</answer>`,
          ],
          toolResults: inSession,
        },
        renderer.ctx,
      );
      if (trajectory.finish !== 'stop' || trajectory.turns !== 3 || !inSession[0].run_success) {
        throw new DataError(
          `curriculum bug: ${JSON.stringify(task.prompt)}: reuse replay ended with ${trajectory.finish}`,
        );
      }
      records.push(record(task, name, trajectory, trajectory.loss_mask));
      continue;
    }
    if (broken[i] !== undefined) {
      const first = inSession?.[0] ?? bad[b];
      b += 1;
      // A slip that happens to run is no lesson in reading tracebacks; leave it out.
      if (!first.run_success) {
        failedFirst += 1;
        assistant.push(renderer.assistantText(`${task.reason}</reason>`, [call(broken[i], task.input)]));
        toolResults.push(first);
      }
    }
    const slipped = assistant.length > 0;
    const retry = slipped ? 'The code has an error. I will fix it.' : task.reason;
    assistant.push(
      renderer.assistantText(`${retry}</reason>`, [call(task.code, task.input)]),
      `The tool printed the answer.</reason>\n<answer>\\boxed{${printed}}</answer>`,
    );
    toolResults.push(result);
    const trajectory = await scriptedTrajectory(task.prompt, { assistant, toolResults }, renderer.ctx);
    if (trajectory.finish !== 'stop' || trajectory.turns !== assistant.length) {
      throw new DataError(
        `curriculum bug: ${JSON.stringify(task.prompt)}: replay ended with ${trajectory.finish}`,
      );
    }
    const lossMask = trajectory.loss_mask;
    if (slipped && !slipLoss) {
      // The slipped call is the first assistant turn: the first run of 1s in the mask.
      for (let j = lossMask.indexOf(1); j >= 0 && lossMask[j] === 1; j++) lossMask[j] = 0;
    }
    records.push(record(task, name, trajectory, lossMask));
  }
  return { records, failedFirst, reused };
}

function record(
  task: Task,
  name: string,
  trajectory: Awaited<ReturnType<typeof scriptedTrajectory>>,
  lossMask: (0 | 1)[],
): SftRecord {
  const problem = problemOf(task, name, 'train');
  return {
    v: 1,
    id: `${problem.id}/sft`,
    problem_id: problem.id,
    prompt_ids: trajectory.prompt_ids,
    response_ids: trajectory.response_ids,
    loss_mask: lossMask,
    text: trajectory.text,
    answer: task.answer,
    source: problem.source as string,
  };
}
