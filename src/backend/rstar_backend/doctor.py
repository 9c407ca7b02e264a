"""rstar doctor: what the backend's Python and torch can do here, as one JSON object on stdout.

Self-contained on purpose (no imports from the package): `rstar doctor` runs it by path, and
bench/gpu-check.py imports it as its environment record, on machines where the rest may not import.
Every probe catches its own failure so one broken piece (a driver, FSDP's import) never hides the rest.
"""

import json
import os
import platform
import re
import sys
import time

# OpenBLAS kernel families older than Haswell: what OpenBLAS falls back to on a CPU model it does not know.
SLOW_OPENBLAS_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "generic"}


def _error(e):
    return f"{type(e).__name__}: {e}".strip()


def build_info(torch):
    hip = getattr(torch.version, "hip", None)
    cuda = torch.version.cuda
    if hip:
        return {"kind": "rocm", "cuda_version": None, "hip_version": str(hip)}
    if cuda:
        return {"kind": "cuda", "cuda_version": str(cuda), "hip_version": None}
    return {"kind": "cpu", "cuda_version": None, "hip_version": None}


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def devices(torch):
    """The accelerators torch sees (ROCm GPUs answer through torch.cuda too), then the CPU."""
    out = []
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver: reported as no device, the warning says why
        n = 0
    for i in range(n):
        d = {"type": "cuda", "index": i}
        try:
            p = torch.cuda.get_device_properties(i)
            d.update(name=p.name, memory_bytes=int(p.total_memory),
                     capability=f"{p.major}.{p.minor}")
            arch = getattr(p, "gcnArchName", None)  # ROCm: gfx90a, gfx942 (MI300X), ...
            if arch:
                d["arch"] = str(arch)
        except Exception as e:
            d.update(name="?", memory_bytes=None, error=_error(e))
        try:
            free, _total = torch.cuda.mem_get_info(i)
            d["free_bytes"] = int(free)
        except Exception:
            pass
        out.append(d)
    out.append({"type": "cpu", "index": 0, "name": _cpu_name(),
                "memory_bytes": _meminfo_bytes(), "threads": torch.get_num_threads(),
                "cores": os.cpu_count()})
    return out


def bf16_support(torch):
    """Whether bf16 runs on the GPU, and whether CPU autocast produces bf16 matmuls (the tests' path)."""
    out = {"device": None, "cpu_autocast": False, "cpu_autocast_error": None}
    try:
        if torch.cuda.is_available():
            out["device"] = bool(torch.cuda.is_bf16_supported())
    except Exception:
        out["device"] = False
    try:
        x, w = torch.randn(4, 8), torch.randn(16, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(x, w)
        out["cpu_autocast"] = y.dtype == torch.bfloat16 and bool(torch.isfinite(y.float()).all())
    except Exception as e:
        out["cpu_autocast_error"] = _error(e)
    return out


def collective(torch, build):
    """What train-step --nproc would use: nccl with GPUs (RCCL under the same name on ROCm), else gloo."""
    import torch.distributed as dist
    gpu = torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"
    if not dist.is_available():
        return {"backend": backend, "library": None, "available": False}
    available = dist.is_nccl_available() if gpu else dist.is_gloo_available()
    library = ("rccl" if build["kind"] == "rocm" else "nccl") if gpu else "gloo"
    out = {"backend": backend, "library": library, "available": bool(available)}
    if gpu and available:
        try:
            v = torch.cuda.nccl.version()
            out["version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    return out


def sdpa(torch):
    import torch.nn.functional as F
    fn = getattr(F, "scaled_dot_product_attention", None)
    out = {"available": fn is not None, "works": None}
    if fn is None:
        return out
    try:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        q = torch.randn(1, 2, 4, 8, device=dev, dtype=dtype)
        fn(q, q, q, is_causal=True)
        out["works"] = True
    except Exception as e:
        out.update(works=False, error=_error(e))
    return out


def fsdp(torch):
    """FSDP2 (fully_shard, torch >= 2.4) if it imports, else FSDP1, else why neither does."""
    errors = []
    for module, name, api in (("torch.distributed.fsdp", "fully_shard", "fsdp2"),
                              ("torch.distributed._composable.fsdp", "fully_shard", "fsdp2"),
                              ("torch.distributed.fsdp", "FullyShardedDataParallel", "fsdp1")):
        try:
            mod = __import__(module, fromlist=[name])
            getattr(mod, name)
            return {"api": api, "import": f"{module}.{name}", "import_error": None}
        except Exception as e:
            errors.append(_error(e))
    return {"api": None, "import": None, "import_error": errors[-1] if errors else "unknown"}


def _loaded_libraries():
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line})
    except OSError:
        return []


def _openblas(paths):
    import ctypes
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            corename, config = lib.openblas_get_corename, lib.openblas_get_config
        except (OSError, AttributeError):
            continue
        corename.restype = config.restype = ctypes.c_char_p
        return corename().decode(), config().decode(), path
    return None


def blas(torch, seconds=0.3):
    """Which BLAS the CPU matmuls use and how fast they are. torch's own BLAS_INFO says "generic" on
    Debian (it links libblas.so.3, whichever package provides it), so the loaded library decides."""
    shown = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]+)", shown)
    info = m.group(1) if m else None
    a = torch.randn(512, 512)
    a @ a  # loads the BLAS library and warms it up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        n += 1
    gflops = n * 2 * 512 ** 3 / (time.perf_counter() - t0) / 1e9
    libs = _loaded_libraries()
    blas_libs = [p for p in libs if any(k in os.path.basename(p) for k in ("blas", "mkl", "blis"))]
    ob = _openblas(blas_libs)
    out = {"build_info": info, "library": "unknown", "path": None, "matmul_gflops": round(gflops, 1)}
    if ob:
        out.update(library="openblas", openblas_core=ob[0], openblas_config=ob[1], path=ob[2])
    elif info == "mkl" or any("mkl" in os.path.basename(p) for p in blas_libs):
        out["library"] = "mkl"
    elif any("blis" in os.path.basename(p) for p in blas_libs):
        out["library"] = "blis"
    elif blas_libs:
        out.update(library="reference", path=blas_libs[0])  # netlib's libblas: no SIMD kernels
    out["openblas_coretype_env"] = os.environ.get("OPENBLAS_CORETYPE")
    return out


def warnings_of(r):
    w = []
    b = r["blas"]
    if b["library"] == "reference":
        w.append(f"CPU matmuls use the reference BLAS ({b['path']}, {b['matmul_gflops']} GFLOP/s): install "
                 "OpenBLAS (Debian: apt-get install libopenblas0-pthread) for several times faster CPU steps")
    elif b["library"] == "openblas" and b.get("openblas_core", "").lower() in SLOW_OPENBLAS_CORES:
        w.append(f"OpenBLAS chose its {b['openblas_core']} kernels (it does not know this CPU model): set "
                 "OPENBLAS_CORETYPE=Haswell or SkylakeX to match the CPU's AVX2/AVX-512")
    elif b["library"] == "unknown":
        w.append("could not tell which BLAS CPU matmuls use (torch BLAS_INFO="
                 f"{b['build_info']}); {b['matmul_gflops']} GFLOP/s on a 512x512 fp32 matmul")
    if r["build"]["kind"] == "cpu":
        w.append("CPU-only torch build: fine for the tests and tiny models; install a CUDA or ROCm build "
                 "from pytorch.org for real models (docs/gpu.md)")
    elif not any(d["type"] == "cuda" for d in r["devices"]):
        w.append(f"{r['build']['kind']} torch build but no GPU visible (driver, CUDA_VISIBLE_DEVICES / "
                 "HIP_VISIBLE_DEVICES?): everything runs on CPU")
    if r["bf16"]["device"] is False:
        w.append("this GPU has no bf16: serve and train in fp16 or fp32")
    if not r["bf16"]["cpu_autocast"]:
        w.append("bf16 autocast does not work on this CPU torch: CPU bf16 steps will fail")
    if not r["sdpa"]["available"]:
        w.append("no torch.nn.functional.scaled_dot_product_attention (torch < 2.0): attention takes the "
                 "explicit-matmul path, slower and O(T^2) memory at long contexts")
    elif r["sdpa"]["works"] is False:
        w.append(f"scaled_dot_product_attention fails here ({r['sdpa'].get('error')})")
    if r["fsdp"]["api"] is None:
        w.append(f"FSDP does not import ({r['fsdp']['import_error']}): sharded training is unavailable, "
                 "only data-parallel (every rank holds the whole model and optimiser state)")
    elif r["fsdp"]["api"] == "fsdp1":
        w.append("only FSDP1 (torch < 2.4): train-step --shard needs FSDP2 (torch >= 2.4); only data-parallel "
                 "training (--shard none) runs here")
    if not r["collective"]["available"]:
        w.append(f"the {r['collective']['backend']} collective backend is unavailable: --nproc > 1 will fail")
    return w


def probe():
    import torch
    build = build_info(torch)
    r = {
        "python": {"executable": sys.executable, "version": platform.python_version()},
        "torch": {"version": torch.__version__, "path": os.path.dirname(torch.__file__)},
        "build": build,
        "devices": devices(torch),
        "bf16": bf16_support(torch),
        "collective": collective(torch, build),
        "sdpa": sdpa(torch),
        "fsdp": fsdp(torch),
        "blas": blas(torch),
    }
    r["warnings"] = warnings_of(r)
    return r


def main():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"rstar doctor: {sys.executable} cannot import torch: {e}\n")
        return 1
    sys.stdout.write(json.dumps(probe()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
