/**
 * One setting, one name: each renamed flag's old spelling still works (same behaviour, one
 * deprecation line), both spellings together are a usage error, every bad value reads
 * `rstar CMD: --flag: VALUE is not ...` (exit 2), and every command's --help lists its enum
 * choices and names no source file.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import { Option } from 'commander';
import { backendConfig, trainOptions } from '../../src/backend/train-options.js';
import { COMMANDS } from '../../src/cli.js';
import { UsageError } from '../../src/errors.js';
import { deprecatedAlias, integer, parse, program } from '../../src/program.js';
import { ROOT, rstar } from '../support/helpers.js';

const SOURCE = `${ROOT}fixtures/sft-sources/openai.jsonl`;
const deprecation = (cmd: string, old: string, now: string) =>
  `rstar ${cmd}: ${old} is deprecated; use ${now}\n`;

describe('a renamed flag (the helper)', () => {
  const make = () => {
    const cmd = program('demo', 'demo');
    const current = new Option('--new-name <n>', 'the setting').argParser(integer(1)).default(5);
    return cmd.addOption(current).addOption(deprecatedAlias('--old-name <n>', current));
  };

  it('maps the old spelling onto the new one, parsed alike; both together are a usage error', () => {
    const cmd = make();
    assert.equal(parse(cmd, ['--old-name', '7']), true);
    assert.equal(cmd.opts().newName, 7);
    assert.equal(cmd.opts().oldName, undefined);
    assert.equal(cmd.getOptionValueSource('newName'), 'cli');
    const fresh = make();
    parse(fresh, []);
    assert.equal(fresh.opts().newName, 5);
    assert.throws(
      () => parse(make(), ['--old-name', '7', '--new-name', '7']),
      (e: unknown) =>
        e instanceof UsageError &&
        e.message === '--old-name and --new-name are one setting: give --new-name only',
    );
    assert.throws(
      () => parse(make(), ['--old-name', '0']),
      (e: unknown) => e instanceof UsageError && e.message === '--old-name: 0 is not an integer >= 1',
    );
  });

  it('is hidden from --help, which lists it as deprecated', () => {
    const cmd = make();
    let help = '';
    cmd.configureOutput({ writeOut: (s) => (help += s) });
    assert.equal(parse(cmd, ['--help']), false);
    assert.doesNotMatch(help, /--old-name <n>/);
    assert.match(help, /Deprecated spellings, still accepted: --old-name \(use --new-name\)\./);
  });

  it('train-step/sft-train: --passes-per-batch is the backend epochs (passes over each batch)', () => {
    const o = trainOptions({ loss: 'sft', model: 'm', out: 'o', passesPerBatch: 3 });
    assert.equal(backendConfig(o).epochs, 3);
  });
});

/** Every rename: a command line that parses and then stops at once, the same with either spelling. */
const RENAMES: { cmd: string; old: string; now: string; value: string; rest: string[] }[] = [
  { cmd: 'rollout', old: '--kv-tokens', now: '--max-total-tokens', value: '64', rest: [] },
  { cmd: 'rollout', old: '--timeout', now: '--engine-timeout', value: '5', rest: [] },
  {
    cmd: 'sandbox-serve',
    old: '--token',
    now: '--sandbox-token',
    value: 't',
    rest: ['--host', 'x', '--port', '70000'],
  },
  { cmd: 'sandbox-serve', old: '--timeout', now: '--tool-timeout', value: '3', rest: ['--port', '70000'] },
  { cmd: 'sandbox-run', old: '--timeout', now: '--tool-timeout', value: '3', rest: ['--concurrency', '0'] },
  {
    cmd: 'sft-train',
    old: '--batch',
    now: '--batch-records',
    value: '4',
    rest: ['--data', 'd', '--model', 'm', '--out', 'o'],
  },
  {
    cmd: 'sft-train',
    old: '--epochs',
    now: '--passes-per-batch',
    value: '2',
    rest: ['--data', 'd', '--model', 'm', '--out', 'o'],
  },
  { cmd: 'train-step', old: '--epochs', now: '--passes-per-batch', value: '2', rest: ['--loss', 'nope'] },
];

describe('every renamed flag, from the command line', () => {
  for (const { cmd, old, now, value, rest } of RENAMES) {
    it(`${cmd} ${old} -> ${now}`, async () => {
      const fresh = await rstar([cmd, now, value, ...rest]);
      const aliased = await rstar([cmd, old, value, ...rest]);
      assert.equal(fresh.code, 2, fresh.stderr);
      assert.doesNotMatch(fresh.stderr, /deprecated/);
      assert.equal(aliased.code, fresh.code);
      // a usage error past parsing prints the line first; one that parsing itself raises does not
      const stopped = aliased.stderr.replace(deprecation(cmd, old, now), '');
      assert.equal(stopped, fresh.stderr);
      const both = await rstar([cmd, old, value, now, value, ...rest]);
      assert.equal(both.code, 2);
      if (aliased.stderr !== fresh.stderr) {
        assert.equal(both.stderr, `rstar ${cmd}: ${old} and ${now} are one setting: give ${now} only\n`);
      }
    });
  }

  it('sandbox-run --token and --sandbox-token (and RSTAR_SANDBOX_TOKEN) send the same bearer token', async () => {
    const seen: (string | undefined)[] = [];
    const server = createServer((req, res) => {
      seen.push(req.headers.authorization);
      req.resume();
      res.writeHead(401).end('no');
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const input = '{"solution":"print(1)"}\n';
    try {
      const fresh = await rstar(['sandbox-run', '--sandbox', url, '--sandbox-token', 'abc'], input);
      const aliased = await rstar(
        ['sandbox-run', '--sandbox', url, '--token', 'abc', '--token', 'abc'],
        input,
      );
      const env = await rstar(['sandbox-run', '--sandbox', url], input, { RSTAR_SANDBOX_TOKEN: 'abc' });
      assert.deepEqual(new Set(seen), new Set(['Bearer abc']));
      assert.equal(seen.length >= 3, true);
      assert.equal(fresh.code, 1);
      assert.equal(aliased.code, 1);
      assert.equal(env.code, 1);
      assert.equal(aliased.stderr, deprecation('sandbox-run', '--token', '--sandbox-token') + fresh.stderr);
      const both = await rstar(['sandbox-run', '--token', 'a', '--sandbox-token', 'a'], input);
      assert.equal(both.code, 2);
      assert.equal(
        both.stderr,
        'rstar sandbox-run: --token and --sandbox-token are one setting: give --sandbox-token only\n',
      );
    } finally {
      server.close();
    }
  });

  it('sft-data --max-tokens keeps its length-filter meaning as --max-seq-tokens', async () => {
    const all = await rstar(['sft-data', SOURCE]);
    const fresh = await rstar(['sft-data', '--max-seq-tokens', '60', SOURCE]);
    const aliased = await rstar(['sft-data', '--max-tokens', '60', SOURCE]);
    assert.equal(fresh.code, 0, fresh.stderr);
    assert.equal(aliased.code, 0, aliased.stderr);
    const count = (s: string) => s.split('\n').filter(Boolean).length;
    assert.ok(count(fresh.stdout) < count(all.stdout), 'the filter drops the longer examples');
    assert.equal(aliased.stdout, fresh.stdout);
    assert.equal(aliased.stderr, deprecation('sft-data', '--max-tokens', '--max-seq-tokens') + fresh.stderr);
    const both = await rstar(['sft-data', '--max-tokens', '60', '--max-seq-tokens', '60', SOURCE]);
    assert.equal(both.code, 2);
  });
});

/** Every enum flag of every command (the lists their bad values must quote). */
const ENUMS: Record<string, string[]> = {
  advantage: ['--baseline'],
  'engine-serve': ['--dtype', '--decode-kv'],
  eval: ['--problems-format', '--engine-kind', '--schedule', '--compat', '--tool-cache'],
  'model-init': ['--init'],
  'roc-filter': ['--positives', '--penalty'],
  rollout: ['--engine-kind', '--schedule', '--compat', '--tool-cache', '--refill'],
  schema: ['--io'],
  'sft-data': ['--synthetic'],
  'sft-train': ['--optimizer', '--optimizer-state', '--dtype', '--shard'],
  'train-step': [
    '--loss',
    '--optimizer',
    '--old-logprobs',
    '--optimizer-state',
    '--rollout-correction',
    '--dtype',
    '--shard',
    '--engine-kind',
  ],
  verify: ['--compat'],
};

describe('--help and bad values, every command', () => {
  it('every --help exits 0, names no source file, and lists each enum flag with the choices its error quotes', async () => {
    for (const name of Object.keys(COMMANDS)) {
      const help = await rstar([name, '--help']);
      assert.equal(help.code, 0, `${name}: ${help.stderr}`);
      assert.doesNotMatch(help.stdout, /\.(ts|py)\b|\bsrc\//, `${name} --help names a source file`);
      const flat = help.stdout.replace(/\s+/g, ' ');
      for (const flag of ENUMS[name] ?? []) {
        const bad = await rstar([name, flag, 'bogus']);
        assert.equal(bad.code, 2, `${name} ${flag}`);
        const m = new RegExp(`^rstar ${name}: ${flag}: bogus is not one of ([\\w, -]+)\\n$`).exec(bad.stderr);
        assert.ok(m, `${name} ${flag}: ${bad.stderr}`);
        const listed = (m[1] as string)
          .split(', ')
          .map((c) => `"${c}"`)
          .join(', ');
        assert.ok(flat.includes(`(choices: ${listed}`), `${name} --help: ${flag} lists ${listed}`);
      }
    }
  });

  it('a bad number reads the same in every command', async () => {
    const cases: [string[], string][] = [
      [['rollout', '--top-p', '2'], 'rstar rollout: --top-p: 2 is not a number in [0, 1]'],
      [
        ['engine-serve', '--model', 'm', '--port', '70000'],
        'rstar engine-serve: --port: 70000 is not an integer in [0, 65535]',
      ],
      [
        ['hard-problems', '--min-samples', '0', 'x'],
        'rstar hard-problems: --min-samples: 0 is not an integer >= 1',
      ],
      [['sandbox-run', '--timeout', '0'], 'rstar sandbox-run: --timeout: 0 is not a number in [0.01, 3600]'],
    ];
    for (const [argv, line] of cases) {
      const r = await rstar(argv);
      assert.equal(r.code, 2, argv.join(' '));
      assert.equal(r.stderr, `${line}\n`);
    }
  });
});
