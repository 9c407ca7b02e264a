import { execa } from 'execa';
import { BACKEND_DIR, backendEnv, backendMessage, findPython } from '../backend/python.js';
import { DataError } from '../errors.js';
import { parse, program } from '../program.js';
import { Doctor } from '../records/doctor.js';

/** The probe runs by path: it imports nothing from the package, so it works where the rest fails. */
const PROBE = `${BACKEND_DIR}rstar_backend/doctor.py`;

export async function run(argv: string[]): Promise<void> {
  const cmd = program(
    'doctor',
    'what the PyTorch backend finds here: Python, torch build, GPUs, bf16, collectives, FSDP, BLAS',
  ).addHelpText(
    'after',
    '\nPrints one record (`rstar schema doctor`) on stdout and its warnings on stderr; exit 0 with warnings,' +
      '\nexit 1 when no Python with torch is found (RSTAR_PYTHON picks the interpreter).',
  );
  if (!parse(cmd, argv)) return;
  const python = await findPython(); // exit 1 with install instructions when there is none
  const result = await execa(python, [PROBE], { env: backendEnv(), reject: false, timeout: 300_000 });
  if (result.exitCode !== 0) {
    throw new DataError(backendMessage(String(result.stderr), `${python} ${PROBE} failed`));
  }
  let raw: unknown;
  try {
    raw = JSON.parse(String(result.stdout));
  } catch {
    throw new DataError(`${PROBE}: output is not one JSON object: ${String(result.stdout).slice(0, 200)}`);
  }
  const parsed = Doctor.safeParse({
    v: 1,
    rstar_python: process.env.RSTAR_PYTHON || null,
    ...(raw as object),
  });
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new DataError(`${PROBE}: ${issue?.path.join('.') || '(record)'}: ${issue?.message}`);
  }
  process.stdout.write(`${JSON.stringify(parsed.data)}\n`);
  for (const warning of parsed.data.warnings) process.stderr.write(`rstar doctor: warning: ${warning}\n`);
}
