import { createHash } from 'node:crypto';
import { DataError } from '../../errors.js';
import { openInput, readLines } from '../../ndjson/index.js';
import type { ConversationRenderer } from '../conversation.js';
import type { SftRecord } from '../record.js';
import { isMathReasoning, nearDuplicateKey, toolSchemas, validateToolCall } from './filters.js';
import { checkShape, FormatError, MalformedToolCall, parseSource, type SourceFormat } from './formats.js';

export interface SourceOptions {
  renderer: ConversationRenderer;
  tools: unknown[];
  /** Drop examples whose prompt + response exceed this many tokens. */
  maxTokens: number;
  skipInvalid: boolean;
  keepMath: boolean;
  onSkip?: (message: string) => void;
}

export interface SourceStats {
  lines: number;
  formats: Record<SourceFormat, number>;
  invalid: number;
  malformed_tool_calls: number;
  math: number;
  exact_duplicates: number;
  near_duplicates: number;
  too_long: number;
  kept: number;
  tokens: number;
  trained_tokens: number;
}

export function emptyStats(): SourceStats {
  return {
    lines: 0,
    formats: { openai: 0, sharegpt: 0, pair: 0 },
    invalid: 0,
    malformed_tool_calls: 0,
    math: 0,
    exact_duplicates: 0,
    near_duplicates: 0,
    too_long: 0,
    kept: 0,
    tokens: 0,
    trained_tokens: 0,
  };
}

/**
 * Reads source files (or stdin) in any of the supported formats and renders every usable example
 * with the target template and tokenizer. Filters run in order: tool-call validity, math reasoning,
 * exact duplicates (same token ids), near duplicates, length; each drop is counted in `stats`.
 */
export async function readSources(files: string[], options: SourceOptions, stats: SourceStats) {
  const schemas = toolSchemas(options.tools);
  const exact = new Set<string>();
  const near = new Set<string>();
  const out: SftRecord[] = [];
  for (const file of files.length > 0 ? files : ['-']) {
    const { stream, source } = openInput(file);
    for await (const { text, line } of readLines(stream, source)) {
      if (text.trim() === '') continue;
      stats.lines += 1;
      const where = `${source}:${line}`;
      let parsed: ReturnType<typeof parseSource>;
      try {
        let value: unknown;
        try {
          value = JSON.parse(text);
        } catch (error) {
          throw new DataError(`${where}: invalid JSON: ${(error as Error).message}`);
        }
        try {
          parsed = parseSource(value);
          checkShape(parsed.messages);
        } catch (error) {
          if (error instanceof FormatError) throw new DataError(`${where}: ${error.field}: ${error.message}`);
          throw error;
        }
      } catch (error) {
        if (error instanceof MalformedToolCall) {
          stats.malformed_tool_calls += 1;
          continue;
        }
        if (options.skipInvalid && error instanceof DataError) {
          stats.invalid += 1;
          options.onSkip?.(error.message);
          continue;
        }
        throw error;
      }
      const { format, messages } = parsed;
      stats.formats[format] += 1;
      try {
        for (const m of messages) {
          if (m.role === 'assistant') for (const call of m.tool_calls ?? []) validateToolCall(call, schemas);
        }
      } catch (error) {
        if (!(error instanceof MalformedToolCall)) throw error;
        stats.malformed_tool_calls += 1;
        continue;
      }
      if (!options.keepMath && isMathReasoning(messages)) {
        stats.math += 1;
        continue;
      }
      const rendered = options.renderer.render(messages);
      const digest = createHash('sha256')
        .update(`${rendered.prompt_ids.join(',')}|${rendered.response_ids.join(',')}`)
        .digest('hex');
      if (exact.has(digest)) {
        stats.exact_duplicates += 1;
        continue;
      }
      exact.add(digest);
      const key = createHash('sha256').update(nearDuplicateKey(messages)).digest('hex');
      if (near.has(key)) {
        stats.near_duplicates += 1;
        continue;
      }
      near.add(key);
      const length = rendered.prompt_ids.length + rendered.response_ids.length;
      if (length > options.maxTokens) {
        stats.too_long += 1;
        continue;
      }
      stats.kept += 1;
      stats.tokens += length;
      stats.trained_tokens += rendered.loss_mask.reduce<number>((s, x) => s + x, 0);
      out.push({ v: 1, id: `${source}:${line}`, ...rendered, source: `${source}:${line}:${format}` });
    }
  }
  return out;
}
