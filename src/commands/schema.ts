import { z } from 'zod';
import { UsageError } from '../errors.js';
import { choice, notOneOf, parse, program } from '../program.js';
import { RECORDS } from '../records/index.js';

export async function run(argv: string[]): Promise<void> {
  const cmd = program('schema', 'print the JSON Schema of a record')
    .argument('<record>', `one of: ${Object.keys(RECORDS).join(', ')}`)
    .addOption(
      choice(
        '--io <side>',
        'input (what readers accept) or output (what writers emit)',
        ['input', 'output'] as const,
        'input',
      ),
    );
  if (!parse(cmd, argv)) return;
  const [name] = cmd.args;
  const schema = RECORDS[name];
  if (!schema) throw new UsageError(`<record>: ${notOneOf(name, Object.keys(RECORDS))}`);
  const { io } = cmd.opts<{ io: 'input' | 'output' }>();
  const json = z.toJSONSchema(schema, { io, unrepresentable: 'any' });
  process.stdout.write(`${JSON.stringify({ title: name, ...json }, null, 2)}\n`);
}
