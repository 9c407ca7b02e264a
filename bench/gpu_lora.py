"""LoRA checks for a lent GPU (issue 42), run by bench/gpu-check.py or alone:

    python3 bench/gpu_lora.py [--cpu] [--only lora-peft,lora-bench] [--out DIR]

  lora-peft   our adapter folder (src/backend/rstar_backend/lora.py) loaded through peft's
              PeftModel.from_pretrained onto transformers' Qwen3ForCausalLM gives our log-probs
              (max |delta| <= 1e-4, fp32), and an adapter that peft saves loads into our model with the
              same log-probs: PEFT's key names and adapter_config.json fields both ways
  lora-bench  LoRA (r=32, all linear layers) against full fine-tuning on a ~0.5B-class random config
              (Qwen2.5-0.5B's shape) in bf16: peak GPU memory, optimizer-state bytes and training
              tokens/s, through train.py's Trainer (checkpoint writes left out of the timing)
  lora-shard  one rank of FSDP2 (--shard full) with LoRA against the unsharded LoRA step: same adapter

Needs torch; lora-peft also transformers (>= 4.51, for Qwen3) and peft, and is skipped without them.
Importing this file runs nothing. Each check returns a dict: ok, or skipped with a reason, and figures.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = os.path.join(ROOT, "src", "backend")
if BACKEND not in sys.path:
    sys.path.insert(0, BACKEND)
if os.path.join(BACKEND, "tests") not in sys.path:
    sys.path.insert(0, os.path.join(BACKEND, "tests"))

import torch  # noqa: E402

from rstar_backend import lora as L  # noqa: E402
from rstar_backend.checkpoint import load_model, save_model  # noqa: E402
from rstar_backend.model import CausalLM, ModelConfig, token_logprobs  # noqa: E402

PEFT_TOLERANCE = 1e-4

# small enough for fp32 on any GPU or a CPU, big enough that every target layer has a distinct shape
PEFT_CONFIG = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rope_theta=1e6,
                   tie_word_embeddings=False)
# Qwen2.5-0.5B's shape with Qwen3's layout (q/k norms, no biases): 494M parameters
HALF_B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=32768, rope_theta=1e6,
              tie_word_embeddings=True, torch_dtype="bfloat16")
BENCH_CPU = dict(HALF_B, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, head_dim=16)


def _model(cfg_dict, seed, device="cpu", dtype=torch.float32):
    m = CausalLM(ModelConfig.from_dict(cfg_dict))
    m.init_weights(seed)
    return m.to(device=device, dtype=dtype)


def _randomise(model, seed, std=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in L.lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _logprobs(logits, ids):
    return token_logprobs(logits[:, :-1].float(), ids[:, 1:])


def check_peft(device, tmp):
    try:
        import peft
        import transformers
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import Qwen3ForCausalLM
    except ImportError as e:
        return {"skipped": True, "reason": f"transformers (>= 4.51) and peft not importable: {e}"}
    base_dir, ours_dir, theirs_dir = (os.path.join(tmp, n) for n in ("peft-base", "peft-ours", "peft-theirs"))
    ours = _model(PEFT_CONFIG, seed=5)
    save_model(ours, base_dir)
    L.add_lora(ours, L.LoraSpec(r=8, alpha=16), seed=1)
    _randomise(ours, seed=2)
    L.save_adapter(ours, ours.lora_spec, ours_dir, base_dir, step=3)
    ours = ours.to(device).eval()
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, PEFT_CONFIG["vocab_size"], (2, 48), generator=g).to(device)
    with torch.no_grad():
        ours_lp = _logprobs(ours(ids), ids)

    dtype_kw = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
    hf = Qwen3ForCausalLM.from_pretrained(base_dir, **{dtype_kw: torch.float32}).to(device).eval()
    with torch.no_grad():
        base_lp = _logprobs(hf(ids).logits, ids)
    peft_model = PeftModel.from_pretrained(hf, ours_dir).to(device).eval()
    with torch.no_grad():
        peft_lp = _logprobs(peft_model(ids).logits, ids)
    ours_into_peft = float((peft_lp - ours_lp).abs().max())
    adapter_effect = float((peft_lp - base_lp).abs().max())  # an adapter peft silently ignored: ~0

    # the other way: an adapter peft saves, into our model
    fresh = Qwen3ForCausalLM.from_pretrained(base_dir, **{dtype_kw: torch.float32})
    cfg = LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
    theirs = get_peft_model(fresh, cfg)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    theirs.save_pretrained(theirs_dir)
    theirs = theirs.to(device).eval()
    with torch.no_grad():
        theirs_lp = _logprobs(theirs(ids).logits, ids)
    mine = load_model(base_dir)
    spec = L.load_adapter(mine, theirs_dir)
    mine = mine.to(device).eval()
    with torch.no_grad():
        mine_lp = _logprobs(mine(ids), ids)
    peft_into_ours = float((mine_lp - theirs_lp).abs().max())
    with open(os.path.join(theirs_dir, "adapter_config.json")) as f:
        peft_fields = sorted(json.load(f))
    ok = ours_into_peft <= PEFT_TOLERANCE and peft_into_ours <= PEFT_TOLERANCE and adapter_effect > 1e-3
    return {"ok": ok, "peft": peft.__version__, "transformers": transformers.__version__,
            "max_abs_logprob_diff_ours_in_peft": ours_into_peft, "max_abs_logprob_diff_peft_in_ours": peft_into_ours,
            "adapter_effect": adapter_effect, "tolerance": PEFT_TOLERANCE,
            "peft_adapter_spec": {"r": spec.r, "alpha": spec.alpha, "targets": list(spec.targets)},
            "peft_config_fields": peft_fields}


def _bench_one(cfg_dir, device, lora_rank, steps, records):
    from common import SETTINGS
    from rstar_backend.train import Config, Trainer

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    settings = {**SETTINGS, "model": cfg_dir, "out": os.path.join(cfg_dir + "-out"), "device": str(device),
                "dtype": "bf16", "lr": 1e-5, "lora_rank": lora_rank, "lora_alpha": lora_rank}
    t = Trainer(Config(settings))
    t.save = lambda *a, **k: None  # the step's compute only: a 0.5B full checkpoint is 6 GB of writes
    seconds, tokens = [], 0
    for i in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        rec = t.step(list(records))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i > 0:  # the first step pays for allocator warm-up and kernel selection
            seconds.append(time.perf_counter() - t0)
            tokens += rec["tokens"]
    opt_bytes = sum(v.numel() * v.element_size() for st in t.opt.state.values() for v in st.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    trained = sum(p.numel() for p in t.params)
    out = {"trainable_parameters": trained, "optimizer_state_bytes": opt_bytes,
           "tokens_per_s": round(tokens / sum(seconds), 1), "step_seconds": round(sum(seconds) / len(seconds), 4),
           "loss": rec["loss"]}
    if device.type == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    del t
    return out


def check_bench(device, tmp, steps=4, rank=32):
    from common import random_records

    cfg = HALF_B if device.type == "cuda" else BENCH_CPU
    folder = os.path.join(tmp, "bench-base")
    m = CausalLM(ModelConfig.from_dict(cfg))
    m.init_weights(0)
    total = sum(p.numel() for p in m.parameters())
    save_model(m, folder)  # bf16 on disk (torch_dtype)
    del m
    n, prompt, response = (8, 64, 448) if device.type == "cuda" else (4, 16, 32)
    records = random_records(n, prompt, response, seed=1, vocab=cfg["vocab_size"])
    full = _bench_one(folder, device, None, steps, records)
    lora = _bench_one(folder, device, rank, steps, records)
    ratio = lora["optimizer_state_bytes"] / full["optimizer_state_bytes"]
    adapter_bytes = 2 * lora["trainable_parameters"]  # bf16 on disk, as a bf16 base's adapter is saved
    # the goal (optimizer state <= 10% of full's) is about the 0.5B shape: a tiny model's embeddings are
    # too small a share for it to hold there
    gpu = device.type == "cuda"
    result = {"ok": ratio <= 0.10 if gpu else True, "config": "Qwen2.5-0.5B shape" if gpu else "tiny (CPU)",
              "parameters": total, "lora_rank": rank, "tokens_per_step": n * (prompt + response),
              "full": full, "lora": lora, "optimizer_state_ratio": round(ratio, 4),
              "adapter_vs_checkpoint_bytes": round(adapter_bytes / (2 * total), 4)}
    if "peak_memory_gib" in full:
        result["peak_memory_ratio"] = round(lora["peak_memory_gib"] / full["peak_memory_gib"], 3)
        result["tokens_per_s_ratio"] = round(lora["tokens_per_s"] / full["tokens_per_s"], 3)
    return result


def check_shard(device, tmp):
    """One rank, FSDP2 (fully_shard) with LoRA on the GPU against the same two steps unsharded: the
    same adapter. Checks what the CPU suite cannot (its torch has no FSDP2): a partly frozen model
    sharded, the adapter's DTensors gathered into the adapter folder."""
    import socket

    import torch.distributed as dist
    from common import SETTINGS, random_records
    from rstar_backend import parallel
    from rstar_backend.train import Config, Trainer

    if device.type != "cuda":
        return {"skipped": True, "reason": "needs a GPU (NCCL)"}
    if parallel.torch_version() < (2, 4):
        return {"skipped": True, "reason": f"torch {torch.__version__} has no FSDP2"}
    folder = os.path.join(tmp, "shard-base")
    save_model(_model(PEFT_CONFIG, seed=4), folder)
    records = random_records(4, 16, 32, seed=3, vocab=PEFT_CONFIG["vocab_size"])
    settings = {**SETTINGS, "model": folder, "device": str(device), "lr": 1e-3, "lora_rank": 8}
    outs = {}
    # fp32 sharded vs unsharded must agree closely; bf16 sharded (FSDP2's MixedPrecisionPolicy over an
    # fp32 base and adapter) must run and learn about the same
    for shard, dtype in (("none", "fp32"), ("full", "fp32"), ("full", "bf16")):
        out = os.path.join(tmp, f"shard-{shard}-{dtype}")
        env = {}
        if shard != "none":
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "RSTAR_SHARD_ONE_RANK": "1"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            t = Trainer(Config({**settings, "out": out, "shard": shard, "dtype": dtype}))
            losses = [t.step(list(records))["loss"] for _ in range(2)]
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        outs[shard, dtype] = (L.read_adapter(out)[1], losses)
    (plain, lp), (sharded, ls), (_, lb) = outs["none", "fp32"], outs["full", "fp32"], outs["full", "bf16"]
    diff = max(float((plain[k] - sharded[k]).abs().max()) for k in plain)
    size = max(float(plain[k].abs().max()) for k in plain if ".lora_B." in k)  # B moved off zero
    bf16_ok = all(abs(a - b) <= 0.05 * abs(a) for a, b in zip(lp, lb))
    ok = set(plain) == set(sharded) and size > 0 and diff <= 1e-3 * size and bf16_ok
    return {"ok": ok, "max_adapter_diff": diff, "max_lora_B": size,
            "losses": {"none-fp32": lp, "full-fp32": ls, "full-bf16": lb}}


CHECKS = {"lora-peft": check_peft, "lora-bench": check_bench, "lora-shard": check_shard}


def run_checks(device, emit, only=None):
    """Runs the checks (all, or those in `only`) and hands each result to emit(name, dict)."""
    tmp = tempfile.mkdtemp(prefix="rstar-gpu-lora-")
    try:
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                result = check(device, tmp)
            except Exception as e:  # a crashing check is a failed one, with its reason
                result = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
            emit(name, {**result, "seconds": round(time.monotonic() - t0, 2)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_all(device, tmp):
    """bench/gpu-check.py's `lora` check: every check above, one record ({name: its result})."""
    results = {}
    for name, check in CHECKS.items():
        t0 = time.monotonic()
        try:
            results[name] = check(device, tmp)
        except Exception as e:
            results[name] = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
        results[name]["seconds"] = round(time.monotonic() - t0, 2)
    failed = [n for n, r in results.items() if not r.get("ok", r.get("skipped"))]
    out = {"ok": not failed, **results}
    if failed:
        out["reason"] = f"failed: {', '.join(failed)}"
    return out


def main(argv):
    p = argparse.ArgumentParser(prog="gpu_lora.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="a tiny config on the CPU (lora-bench's code path only)")
    p.add_argument("--only", default=None, help=f"comma-separated among {', '.join(CHECKS)}")
    p.add_argument("--out", default=None, help="also write the results to DIR/gpu-lora.jsonl")
    a = p.parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        sys.stderr.write("gpu_lora.py: no GPU; run with --cpu\n")
        return 2
    device = torch.device("cpu" if a.cpu else "cuda:0")
    failed = []

    def emit(name, result):
        line = json.dumps({"check": name, **result})
        print(line, flush=True)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "gpu-lora.jsonl"), "a") as f:
                f.write(line + "\n")
        if not result.get("ok", result.get("skipped")):
            failed.append(name)

    run_checks(device, emit, a.only.split(",") if a.only else None)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
