import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { backendEnv, openblasCoreType } from '../../src/backend/python.js';

const cpuinfo = (flags: string) =>
  `processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: ${flags}\n\n`;

describe('backend environment', () => {
  it('names the OpenBLAS kernel family by the instructions the CPU has', () => {
    const avx512 = 'fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl amx_tile';
    assert.equal(openblasCoreType(cpuinfo(avx512)), 'SkylakeX');
    assert.equal(openblasCoreType(cpuinfo('fpu sse sse2 avx avx2 fma avx512f')), 'Haswell'); // partial AVX-512
    assert.equal(openblasCoreType(cpuinfo('fpu sse sse2 avx avx2 fma')), 'Haswell');
    assert.equal(openblasCoreType(cpuinfo('fpu sse sse2 avx')), undefined);
    assert.equal(openblasCoreType('Processor\t: AArch64\nFeatures\t: fp asimd\n'), undefined);
  });

  it('keeps an OPENBLAS_CORETYPE the user set, and makes Python unbuffered', () => {
    const saved = process.env.OPENBLAS_CORETYPE;
    process.env.OPENBLAS_CORETYPE = 'Zen';
    try {
      const env = backendEnv();
      assert.equal(env.OPENBLAS_CORETYPE, 'Zen');
      assert.equal(env.PYTHONUNBUFFERED, '1');
    } finally {
      if (saved === undefined) delete process.env.OPENBLAS_CORETYPE;
      else process.env.OPENBLAS_CORETYPE = saved;
    }
  });
});
