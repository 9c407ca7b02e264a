import { Command, type CommanderError, InvalidArgumentError, Option } from 'commander';
import { applyAliases, describeAliases, nameValueErrors, oneOf } from './cli-options.js';
import { UsageError } from './errors.js';

export { addDeprecatedAlias, deprecatedAlias, notOneOf } from './cli-options.js';

/** A commander program for one `rstar` command: usage errors become exit 2, help exits 0. */
export function program(name: string, description: string): Command {
  return new Command(`rstar ${name}`)
    .description(description)
    .exitOverride()
    .configureOutput({ outputError: () => {} })
    .allowExcessArguments(false);
}

/** Parses argv; returns false when only help or the version was asked for. */
export function parse(command: Command, argv: string[]): boolean {
  nameValueErrors(command);
  describeAliases(command);
  try {
    command.parse(argv, { from: 'user' });
    applyAliases(command);
    return true;
  } catch (error) {
    if (error instanceof UsageError) throw error;
    const e = error as CommanderError;
    if (
      e.code === 'commander.helpDisplayed' ||
      e.code === 'commander.version' ||
      e.code === 'commander.help'
    ) {
      return false;
    }
    throw new UsageError(e.message.replace(/^error: /, ''));
  }
}

/** `[min, max]` as a bad value's message says it: `>= 1`, `in [0, 1]`. */
function range(min: number, max: number): string {
  if (max === Infinity || max === Number.MAX_SAFE_INTEGER) return min === -Infinity ? '' : ` >= ${min}`;
  return ` in [${min}, ${max}]`;
}

export function integer(
  min = Number.MIN_SAFE_INTEGER,
  max = Number.MAX_SAFE_INTEGER,
): (value: string) => number {
  const expected = `an integer${range(min === Number.MIN_SAFE_INTEGER ? -Infinity : min, max)}`;
  return (value) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`${value} is not ${expected}`);
    }
    return n;
  };
}

export function number(min = -Infinity, max = Infinity): (value: string) => number {
  const expected = `a number${range(min, max)}`;
  return (value) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n < min || n > max) {
      throw new InvalidArgumentError(`${value} is not ${expected}`);
    }
    return n;
  };
}

/**
 * An enum flag: the one way every command declares one, so the usage error (exit 2) reads the same
 * everywhere (`--flag: VALUE is not one of a, b`) and `--help` lists the values.
 */
export function choice<const T extends readonly string[]>(
  flags: string,
  description: string,
  values: T,
  fallback?: T[number],
): Option {
  const option = new Option(flags, description).choices(values).argParser(oneOf(values));
  return fallback === undefined ? option : option.default(fallback);
}

/** For repeatable flags such as `--engine URL --engine URL`. */
export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** Spinners and progress bars only when a person is watching stderr. */
export const interactive = (): boolean => Boolean(process.stderr.isTTY) && !process.env.CI;
