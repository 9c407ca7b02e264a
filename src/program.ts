import { Command, type CommanderError, InvalidArgumentError, Option } from 'commander';
import { UsageError } from './errors.js';

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
  try {
    command.parse(argv, { from: 'user' });
    return true;
  } catch (error) {
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

export function integer(min = Number.MIN_SAFE_INTEGER): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected an integer >= ${min}`);
    return n;
  };
}

export function number(min = -Infinity, max = Infinity): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n < min || n > max) {
      throw new InvalidArgumentError(`expected a number in [${min}, ${max}]`);
    }
    return n;
  };
}

/**
 * An enum flag: the one way every command declares one, so the usage error (exit 2) reads the same
 * everywhere ("Allowed choices are a, b.") and `--help` lists the values.
 */
export function choice<const T extends readonly string[]>(
  flags: string,
  description: string,
  values: T,
  fallback?: T[number],
): Option {
  const option = new Option(flags, description).choices(values);
  return fallback === undefined ? option : option.default(fallback);
}

/** For repeatable flags such as `--engine URL --engine URL`. */
export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** Spinners and progress bars only when a person is watching stderr. */
export const interactive = (): boolean => Boolean(process.stderr.isTTY) && !process.env.CI;
