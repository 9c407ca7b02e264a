import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { execa } from 'execa';
import { findPython } from '../../src/backend/python.js';
import { Doctor } from '../../src/records/doctor.js';
import { lines, rstar } from '../support/helpers.js';

/** The same facts asked of torch directly, so the probe is checked against more than its own word. */
const FACTS = [
  'import json, torch, torch.distributed as d',
  'print(json.dumps({"gpu": torch.cuda.is_available(), "cuda": torch.version.cuda,',
  ' "hip": getattr(torch.version, "hip", None), "torch": torch.__version__,',
  ' "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"), "gloo": d.is_gloo_available()}))',
].join('\n');

describe('rstar doctor', () => {
  test('prints one record valid under its schema, agreeing with torch on this machine', async () => {
    const r = await rstar(['doctor']);
    assert.equal(r.code, 0, r.stderr);
    const records = lines(r.stdout);
    assert.equal(records.length, 1);
    const doc = Doctor.parse(records[0]);
    const python = await findPython();
    const facts = JSON.parse((await execa(python, ['-c', FACTS])).stdout) as {
      gpu: boolean;
      cuda: string | null;
      hip: string | null;
      torch: string;
      sdpa: boolean;
      gloo: boolean;
    };
    assert.equal(doc.torch.version, facts.torch);
    assert.equal(doc.build.kind, facts.hip ? 'rocm' : facts.cuda ? 'cuda' : 'cpu');
    assert.equal(doc.sdpa.available, facts.sdpa);
    assert.equal(doc.collective.backend, facts.gpu ? 'nccl' : 'gloo');
    if (!facts.gpu) {
      // this project's CI machines: a CPU build, gloo for --nproc, the CPU as the only device
      assert.equal(doc.collective.library, 'gloo');
      assert.equal(doc.collective.available, facts.gloo);
      assert.deepEqual(
        doc.devices.map((d) => d.type),
        ['cpu'],
      );
      assert.equal(doc.bf16.device, null);
    }
    assert.ok(doc.blas.matmul_gflops > 0);
    assert.ok((doc.devices.at(-1)?.memory_bytes ?? 1) > 0);
    // every limitation found is a warning, repeated on stderr for a person reading the terminal
    assert.equal(
      doc.warnings.some((w) => w.startsWith('FSDP does not import')),
      doc.fsdp.api === null,
    );
    assert.equal(doc.fsdp.api === null, doc.fsdp.import_error !== null);
    assert.equal(
      doc.warnings.some((w) => w.includes('scaled_dot_product_attention')),
      !facts.sdpa,
    );
    for (const w of doc.warnings) assert.ok(r.stderr.includes(`rstar doctor: warning: ${w}`));
  });

  test('an interpreter without torch: exit 1 with what to install, no record', async () => {
    const r = await rstar(['doctor'], '', { RSTAR_PYTHON: '/nonexistent/python3' });
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /RSTAR_PYTHON=\/nonexistent\/python3 cannot import torch; install PyTorch/);
  });

  test('rstar schema doctor prints its JSON Schema', async () => {
    const r = await rstar(['schema', 'doctor']);
    assert.equal(r.code, 0, r.stderr);
    const schema = JSON.parse(r.stdout) as { title: string; required: string[] };
    assert.equal(schema.title, 'doctor');
    for (const key of ['build', 'devices', 'bf16', 'collective', 'sdpa', 'fsdp', 'blas', 'warnings']) {
      assert.ok(schema.required.includes(key), key);
    }
  });
});
