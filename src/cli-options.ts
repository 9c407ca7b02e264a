/**
 * The two rules every command's flags follow, kept in one place: a bad value reads
 * `--flag: VALUE is not ...` (exit 2) whatever the flag, and a renamed flag's old spelling still
 * works for a while, hidden from `--help`, with one deprecation line.
 */
import { type Command, InvalidArgumentError, Option } from 'commander';
import { UsageError } from './errors.js';

/** The value-error wording shared by enum flags and enum arguments. */
export function notOneOf(value: string, values: readonly string[]): string {
  return `${value} is not one of ${values.join(', ')}`;
}

/** A parser for an enum value: `--help` still lists the choices (commander's argChoices). */
export function oneOf(values: readonly string[]): (value: string) => string {
  return (value) => {
    if (!values.includes(value)) throw new InvalidArgumentError(notOneOf(value, values));
    return value;
  };
}

/** Old spelling (hidden alias) -> the long flag it now is. */
const aliases = new WeakMap<Option, string>();
/** Deprecation lines already printed: once per process, however many commands parse. */
const warned = new Set<string>();

/**
 * A hidden option standing for `current` under its old spelling (`--token <token>`): it parses
 * values as `current` does, and `applyAliases` moves its value onto `current` after parsing.
 */
export function deprecatedAlias(oldFlags: string, current: Option): Option {
  const alias = new Option(oldFlags, `deprecated: use ${current.long}`).hideHelp();
  if (current.parseArg) alias.argParser(current.parseArg);
  if (!current.long) throw new Error(`deprecatedAlias: ${current.flags} has no long name`);
  aliases.set(alias, current.long);
  return alias;
}

/** `deprecatedAlias` for a flag already on `cmd` (declared by a shared table, e.g. train-step's). */
export function addDeprecatedAlias(cmd: Command, oldFlags: string, currentLong: string): Command {
  const current = cmd.options.find((o) => o.long === currentLong);
  if (!current) throw new Error(`addDeprecatedAlias: ${cmd.name()} has no ${currentLong}`);
  return cmd.addOption(deprecatedAlias(oldFlags, current));
}

function renames(cmd: Command): [Option, Option][] {
  return cmd.options.flatMap((alias) => {
    const long = aliases.get(alias);
    const current = long === undefined ? undefined : cmd.options.find((o) => o.long === long);
    return current ? [[alias, current] as [Option, Option]] : [];
  });
}

/** Lists a command's deprecated spellings under its `--help`. */
export function describeAliases(cmd: Command): void {
  const pairs = renames(cmd);
  if (pairs.length === 0) return;
  const list = pairs.map(([alias, current]) => `${alias.long} (use ${current.long})`).join(', ');
  cmd.addHelpText('after', `\nDeprecated spellings, still accepted: ${list}.`);
}

/** Moves each given alias's value onto its flag; both spellings together are a usage error. */
export function applyAliases(cmd: Command): void {
  for (const [alias, current] of renames(cmd)) {
    const oldKey = alias.attributeName();
    const value: unknown = cmd.getOptionValue(oldKey);
    if (value === undefined) continue;
    const key = current.attributeName();
    const source = cmd.getOptionValueSource(key);
    if (source === 'cli' || source === 'env') {
      throw new UsageError(`${alias.long} and ${current.long} are one setting: give ${current.long} only`);
    }
    cmd.setOptionValueWithSource(key, value, 'cli');
    cmd.setOptionValueWithSource(oldKey, undefined, 'default');
    const line = `${cmd.name()}: ${alias.long} is deprecated; use ${current.long}`;
    if (!warned.has(line)) {
      warned.add(line);
      process.stderr.write(`${line}\n`);
    }
  }
}

const named = new WeakSet<Option>();

/**
 * Makes each value parser's complaint name its flag (`--top-p: 2 is not a number in [0, 1]`) and
 * leave as a UsageError, instead of commander's `option '--top-p <p>' argument '2' is invalid.`
 */
export function nameValueErrors(cmd: Command): void {
  for (const option of cmd.options) {
    const inner = option.parseArg;
    if (!inner || named.has(option)) continue;
    named.add(option);
    const flag = option.long ?? option.flags;
    option.parseArg = <T>(value: string, previous: T): T => {
      try {
        return inner(value, previous);
      } catch (error) {
        if (error instanceof InvalidArgumentError) throw new UsageError(`${flag}: ${error.message}`);
        throw error;
      }
    };
  }
}
