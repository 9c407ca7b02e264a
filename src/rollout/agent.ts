import { type CallStatus, resultStatus } from '../algo/tool-use.js';
import type { SubmissionResult } from '../records/sandbox.js';
import type { Finish, TrajectoryError } from '../records/trajectory.js';
import { formatToolResponse } from '../sandbox/tool-response.js';
import { ROLLOUT_DEFAULTS } from './defaults.js';
import { type ProtocolContext, promptIds, toolTurnIds } from './protocol.js';
import { type CodeCall, parseToolCalls, resolveToolCall } from './tool-parser.js';

/** One assistant turn as an engine returns it: the sampled ids and their log-probs. */
export interface Generation {
  ids: number[];
  logprobs: number[];
  /** `length` when the engine stopped at max_new_tokens. */
  finishReason: 'stop' | 'length' | 'abort';
  /** The engine's weight_version when the turn finished (SGLang's meta_info), if it labels its weights. */
  weightVersion?: string;
}

/** The two effects of the agent loop; rollout gives engines and the sandbox, SFT a script. */
export interface AgentIO {
  /** Continues `contextIds` (prompt + response so far) for at most `maxNewTokens` tokens. */
  generate(contextIds: readonly number[], maxNewTokens: number, turn: number): Promise<Generation>;
  /**
   * Runs the calls of one turn; a rejection becomes `Error when executing tool: <message>`, except
   * a `ServiceFailure` (the trajectory ends with `finish: "error"`) and an `AgentAbort`.
   */
  runTools(calls: CodeCall[]): Promise<SubmissionResult[]>;
  /**
   * Tree rollouts: called when a turn's calls did not all succeed, once their tool turn is appended,
   * with the state just after it (what a branch continues from). The loop waits for it, so a
   * session can be forked before this trajectory runs another cell.
   */
  afterFailure?(at: AgentSnapshot): Promise<void>;
}

/**
 * A trajectory's state between turns: its response so far and its counts. A branch (tree rollouts)
 * starts from a copy of its parent's, taken just after a failed call's response.
 */
export interface AgentSnapshot {
  response_ids: number[];
  loss_mask: (0 | 1)[];
  logprobs: number[];
  turns: number;
  tool_calls: number;
  tool_errors: number;
  tool_status: CallStatus[];
  answer_tags: number;
  /** Consecutive calls that were malformed or failed (`maxInvalidCalls`). */
  invalid_run: number;
}

export interface AgentOptions {
  /** Assistant turns (the release's max_assistant_turns, default 5). */
  maxTurns?: number;
  /** Response token budget: generated plus tool tokens (the release's response_length). */
  maxTokens?: number;
  /** Tool calls executed per turn; the rest of the turn's calls are ignored (default 1). */
  maxParallelCalls?: number;
  /** Tool-response characters kept, middle-truncated (default 256, as the release). */
  toolResponseMaxChars?: number;
  /** The prompt already tokenized (`promptIds(prompt, ctx)`), e.g. shared by a problem's samples. */
  promptIds?: readonly number[];
  /**
   * End the trajectory (`invalid_calls`) after this many consecutive tool calls that were malformed
   * or failed; the last tool turn is not appended. 0 or absent: no cap (the release).
   */
  maxInvalidCalls?: number;
  /** Continue from this state (a branch of tree rollouts) instead of the prompt alone. */
  resume?: AgentSnapshot;
}

/** The token-level result of one rollout; the Trajectory record minus identity, answer and reward. */
export interface AgentResult {
  prompt_ids: number[];
  response_ids: number[];
  loss_mask: (0 | 1)[];
  logprobs: number[];
  text: string;
  turns: number;
  tool_calls: number;
  tool_errors: number;
  /** Each call's status, in call order, from the call itself (not its truncated response text). */
  tool_status?: CallStatus[];
  answer_tags: number;
  finish: Finish;
  /** With `finish: "error"`: the service that failed. */
  error?: TrajectoryError;
  timing: { generate_ms: number; tool_ms: number };
}

/** Thrown by an AgentIO to end the trajectory with an error instead of answering the model. */
export class AgentAbort extends Error {
  override name = 'AgentAbort';
}

/**
 * Thrown by an AgentIO when a service failed the trajectory (the sandbox after its retries, the
 * engines after theirs): the trajectory ends with `finish: "error"` and this as its `error`, so the
 * failure is neither shown to the model nor scored as the model's.
 */
export class ServiceFailure extends Error {
  override name = 'ServiceFailure';
  constructor(
    readonly service: TrajectoryError['kind'],
    message: string,
  ) {
    super(message);
  }
}

const ANSWER = /<answer>[\s\S]*?<\/answer>/g;

/**
 * rStar2-Agent's agent loop (`RStar2AgentLoop.run`): generate with max_new_tokens = budget left;
 * stop on a spent budget, on max turns, or on a turn without tool calls; otherwise answer the
 * turn's first `maxParallelCalls` calls (parse failures answered with their error text), append
 * the tool turn's ids with mask 0 unless they would reach the budget (`tool_overflow`), repeat.
 * The ids the engine produced are kept as they are; only tool turns are tokenized.
 */
export async function runAgent(
  prompt: string,
  ctx: ProtocolContext,
  io: AgentIO,
  options: AgentOptions = {},
): Promise<AgentResult> {
  const maxTurns = options.maxTurns ?? ROLLOUT_DEFAULTS.maxTurns;
  const maxTokens = options.maxTokens ?? ROLLOUT_DEFAULTS.maxTokens;
  const maxParallel = options.maxParallelCalls ?? ROLLOUT_DEFAULTS.maxParallelCalls;
  const maxChars = options.toolResponseMaxChars ?? ROLLOUT_DEFAULTS.toolResponseMaxChars;
  // A problem's samples may share one prompt array: this trajectory copies it into a context of
  // its own only when its first turn returns, so a batch waiting for admission holds no copies.
  const prompt_ids: readonly number[] = options.promptIds ?? promptIds(prompt, ctx);
  const from = options.resume;
  const response_ids: number[] = from ? [...from.response_ids] : [];
  const loss_mask: (0 | 1)[] = from ? [...from.loss_mask] : [];
  const logprobs: number[] = from ? [...from.logprobs] : [];
  let context: number[] | undefined = from ? [...prompt_ids, ...response_ids] : undefined;
  const timing = { generate_ms: 0, tool_ms: 0 };
  let turns = from?.turns ?? 0;
  let toolCalls = from?.tool_calls ?? 0;
  let toolErrors = from?.tool_errors ?? 0;
  const toolStatus: CallStatus[] = from ? [...from.tool_status] : [];
  let answerTags = from?.answer_tags ?? 0;
  let invalidRun = from?.invalid_run ?? 0;
  let finish: Finish;
  let error: TrajectoryError | undefined;
  const maxInvalid = options.maxInvalidCalls ?? ROLLOUT_DEFAULTS.maxInvalidCalls;
  const failed = (e: unknown): e is ServiceFailure => {
    if (!(e instanceof ServiceFailure)) return false;
    error = { kind: e.service, message: e.message };
    return true;
  };

  for (;;) {
    const t0 = performance.now();
    let gen: Generation;
    try {
      gen = await io.generate(context ?? prompt_ids, maxTokens - response_ids.length, turns);
    } catch (e) {
      if (!failed(e)) throw e;
      finish = 'error';
      break;
    }
    timing.generate_ms += performance.now() - t0;
    if (gen.ids.length !== gen.logprobs.length) {
      throw new Error(`engine returned ${gen.ids.length} ids but ${gen.logprobs.length} logprobs`);
    }
    context ??= [...prompt_ids];
    context.push(...gen.ids);
    response_ids.push(...gen.ids);
    for (const lp of gen.logprobs) {
      loss_mask.push(1);
      logprobs.push(lp);
    }
    turns++;
    const turnText = ctx.tokenizer.decode(gen.ids);
    answerTags += turnText.match(ANSWER)?.length ?? 0;

    if (response_ids.length >= maxTokens || gen.finishReason === 'length') {
      finish = 'length';
      break;
    }
    const calls = parseToolCalls(turnText).slice(0, maxParallel);
    if (calls.length === 0) {
      finish = 'stop';
      break;
    }
    if (turns >= maxTurns) {
      finish = 'max_turns';
      break;
    }
    toolCalls += calls.length;

    const resolved = calls.map((c) => resolveToolCall(c, ctx.toolNames));
    const runnable = resolved.filter((r): r is CodeCall => !('error' in r));
    const t1 = performance.now();
    let results: SubmissionResult[] | Error = [];
    if (runnable.length > 0) {
      results = await io.runTools(runnable).catch((e: unknown) => {
        if (e instanceof AgentAbort) throw e;
        return e instanceof Error ? e : new Error(String(e));
      });
    }
    timing.tool_ms += performance.now() - t1;
    if (failed(results)) {
      finish = 'error';
      break;
    }
    let k = 0;
    // Each call's status comes from the call (parse) and the sandbox's answer: a small
    // toolResponseMaxChars may cut the success or failure line out of the text.
    const statuses: CallStatus[] = [];
    const texts = resolved.map((r) => {
      if ('error' in r) {
        statuses.push('unparsable');
        return r.error;
      }
      if (results instanceof Error) {
        statuses.push('failed');
        return `Error when executing tool: ${results.message}`;
      }
      const result = results[k++];
      statuses.push(resultStatus(result));
      return formatToolResponse(result, { maxChars });
    });
    toolStatus.push(...statuses);
    toolErrors += statuses.filter((s) => s !== 'ok').length;
    for (const s of statuses) invalidRun = s !== 'ok' ? invalidRun + 1 : 0;
    if (maxInvalid > 0 && invalidRun >= maxInvalid) {
      finish = 'invalid_calls';
      break;
    }

    const toolIds = toolTurnIds(texts, ctx);
    // The release stops here so the sequence never ends on a user turn.
    if (response_ids.length + toolIds.length >= maxTokens) {
      finish = 'tool_overflow';
      break;
    }
    context.push(...toolIds);
    response_ids.push(...toolIds);
    for (let i = 0; i < toolIds.length; i++) {
      loss_mask.push(0);
      logprobs.push(0);
    }
    if (io.afterFailure && statuses.some((st) => st !== 'ok')) {
      await io.afterFailure({
        response_ids: [...response_ids],
        loss_mask: [...loss_mask],
        logprobs: [...logprobs],
        turns,
        tool_calls: toolCalls,
        tool_errors: toolErrors,
        tool_status: [...toolStatus],
        answer_tags: answerTags,
        invalid_run: invalidRun,
      });
    }
  }

  return {
    prompt_ids: [...prompt_ids],
    response_ids,
    loss_mask,
    logprobs,
    // An engine failure on the first turn leaves nothing to decode (the tokenizer refuses []).
    text: response_ids.length > 0 ? ctx.tokenizer.decode(response_ids) : '',
    turns,
    tool_calls: toolCalls,
    tool_errors: toolErrors,
    tool_status: toolStatus,
    answer_tags: answerTags,
    finish,
    ...(error ? { error } : {}),
    timing,
  };
}

/** A conversation to replay: the assistant's turns and, per tool call made, the sandbox result. */
export interface Script {
  assistant: string[];
  toolResults: SubmissionResult[];
}

/**
 * Builds the trajectory rollout would produce had the model written `script.assistant` and the
 * sandbox answered `script.toolResults` (in call order), through the same loop. Each assistant
 * text is tokenized on its own and ends with `<|im_end|>` (appended when missing), the way an
 * engine stops; it is cut at the budget like a generation would be. Log-probs are 0. This is how
 * `sft-data` builds demonstrations token-identical to what rollout trains on.
 */
export async function scriptedTrajectory(
  prompt: string,
  script: Script,
  ctx: ProtocolContext,
  options: AgentOptions = {},
): Promise<AgentResult> {
  let nextTool = 0;
  const io: AgentIO = {
    async generate(_context, maxNewTokens, turn) {
      const text = script.assistant[turn];
      if (text === undefined) throw new Error(`script has no assistant turn ${turn + 1}`);
      let ids = ctx.tokenizer.encode(text);
      const eos = ctx.eosId;
      if (eos !== undefined && ids[ids.length - 1] !== eos) ids.push(eos);
      const finishReason = ids.length > maxNewTokens ? 'length' : 'stop';
      ids = ids.slice(0, maxNewTokens);
      return { ids, logprobs: ids.map(() => 0), finishReason };
    },
    async runTools(calls) {
      const out = script.toolResults.slice(nextTool, nextTool + calls.length);
      if (out.length < calls.length)
        throw new AgentAbort(`script has no result for tool call ${nextTool + out.length + 1}`);
      nextTool += calls.length;
      return out;
    },
  };
  return runAgent(prompt, ctx, io, options);
}
