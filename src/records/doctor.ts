import { z } from 'zod';
import { version } from './common.js';

const bytes = z.int().nonnegative().nullable();

/** A GPU (CUDA or ROCm: torch names both `cuda`) or the CPU. */
export const DoctorDevice = z.looseObject({
  type: z.enum(['cuda', 'cpu']),
  index: z.int().nonnegative(),
  name: z.string(),
  memory_bytes: bytes,
  /** GPUs: free memory when probed. */
  free_bytes: bytes.optional(),
  /** GPUs: compute capability (CUDA) or what ROCm reports in its place. */
  capability: z.string().optional(),
  /** ROCm: the GPU architecture, e.g. gfx942 for MI300X. */
  arch: z.string().optional(),
  /** CPU: torch's intra-op threads and the cores the OS reports. */
  threads: z.int().positive().optional(),
  cores: z.int().positive().nullable().optional(),
  error: z.string().optional(),
});

/** Output of `rstar doctor`: what the backend's Python and torch can do on this machine. */
export const Doctor = z.looseObject({
  v: version,
  /** RSTAR_PYTHON as set, or null when the default search picked the interpreter. */
  rstar_python: z.string().nullable(),
  python: z.looseObject({ executable: z.string(), version: z.string() }),
  torch: z.looseObject({ version: z.string(), path: z.string() }),
  build: z.looseObject({
    kind: z.enum(['cpu', 'cuda', 'rocm']),
    cuda_version: z.string().nullable(),
    hip_version: z.string().nullable(),
  }),
  devices: z.array(DoctorDevice),
  bf16: z.looseObject({
    /** torch.cuda.is_bf16_supported(); null without a GPU. */
    device: z.boolean().nullable(),
    /** A matmul under torch.autocast('cpu', bfloat16) comes out in bf16 (the CPU tests' path). */
    cpu_autocast: z.boolean(),
    cpu_autocast_error: z.string().nullable(),
  }),
  /** What `train-step --nproc N` initialises: nccl with GPUs (RCCL on ROCm), gloo on CPU. */
  collective: z.looseObject({
    backend: z.enum(['nccl', 'gloo']),
    library: z.enum(['nccl', 'rccl', 'gloo']).nullable(),
    available: z.boolean(),
    version: z.string().optional(),
  }),
  /** torch.nn.functional.scaled_dot_product_attention: present (torch >= 2.0), and a call succeeds. */
  sdpa: z.looseObject({
    available: z.boolean(),
    works: z.boolean().nullable(),
    error: z.string().optional(),
  }),
  /** FSDP2 `fully_shard` (torch >= 2.4), FSDP1, or the import error (Debian's torch 1.13 on Python 3.11). */
  fsdp: z.looseObject({
    api: z.enum(['fsdp2', 'fsdp1']).nullable(),
    import: z.string().nullable(),
    import_error: z.string().nullable(),
  }),
  blas: z.looseObject({
    /** torch.__config__'s BLAS_INFO ("generic" on Debian, whichever libblas.so.3 is installed). */
    build_info: z.string().nullable(),
    /** The library actually loaded for CPU matmuls; "reference" is netlib's, without SIMD kernels. */
    library: z.enum(['openblas', 'mkl', 'blis', 'reference', 'unknown']),
    path: z.string().nullable(),
    /** A 512x512 fp32 matmul, timed for ~0.3 s. */
    matmul_gflops: z.number().nonnegative(),
    openblas_core: z.string().optional(),
    openblas_config: z.string().optional(),
    openblas_coretype_env: z.string().nullable().optional(),
  }),
  /** Where this setup will be slow or limited; empty when nothing was found. */
  warnings: z.array(z.string()),
});
export type Doctor = z.output<typeof Doctor>;
