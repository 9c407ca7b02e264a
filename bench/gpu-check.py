#!/usr/bin/env python3
"""The one-shot GPU check: run it once on a new GPU machine (CUDA or ROCm), read its records.

    HF_HUB_OFFLINE=1 python bench/gpu-check.py --budget 420 --out gpu-check-out   # a first run on a GPU box
    python bench/gpu-check.py --cpu      # what runs without a GPU, in well under a minute (the test suite)
    python bench/gpu-check.py --only engine,ddp --tolerance engine_mean=0.02

Needs only Python and torch (no Node: GPU machines may lack it). Prints one NDJSON record per check,
{"check", "ok", "skipped"?, "reason"?, figures...}, then {"summary": true, ...} as the LAST line of stdout;
exits 1 when a check failed, 2 on bad usage (e.g. no GPU visible without --cpu). With --out DIR (default
$OUT when set) the records also go to DIR/gpu-check.jsonl as they are made, and each check's log
(tracebacks, each distributed rank's stderr) to DIR/<check>.log, so nothing is lost to a runner that
keeps only the tail of the output. No wait is unbounded: each distributed launch is capped
(--launch-timeout, default 120 s), its process group times out within that, an engine request has a
deadline, and a dead engine thread is a failed check with its reason. The checks:

  environment   what `rstar doctor` prints (torch build, devices, bf16, collective, SDPA, FSDP, BLAS)
  hf-reference  our model.py vs transformers' Qwen3ForCausalLM, Qwen2ForCausalLM and LlamaForCausalLM on
                random-weight checkpoints written by our save_model (Qwen3: GQA, head_dim != hidden/heads,
                tied and untied head; Qwen2: random q/k/v biases; Llama: llama3 rope scaling with every
                frequency band in use and an untied head, and a tied one with attention and MLP biases):
                max |d log-prob| in fp32 and bf16; from_pretrained of our folder loads every tensor
  train-fp32    SFT then GRPO steps through train.py's Trainer on the device: SFT loss falls, GRPO moves
                log-probs towards the positive advantages, no NaN; tokens/s
  train-bf16    the same with bf16 compute (skipped until train-step has --dtype)
  engine        the engine on the device in bf16: generated tokens/s at batch 1 and 64, and the
                trainer-engine log-prob mismatch on the sampled sequences
  ddp           train-step with 2 processes (today's data parallel) vs 1 process: same weights
  shard         the same with FSDP sharding (skipped until train-step has --shard); 2 GPUs with nccl,
                else 2 CPU processes with gloo (then NCCL and FSDP2 on a GPU are NOT checked by these two:
                their records say so)
  shard-gpu     one rank, on the GPU: an FSDP2 fully_shard training step with NCCL (the sharded code path
                and its collectives on one device) against the unsharded step on the same device

Every coupling to train.py (which is changing) sits in the adapter section right below.
"""

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = os.path.join(ROOT, "src", "backend")
sys.path.insert(0, BACKEND)

import torch  # noqa: E402

from rstar_backend import doctor  # noqa: E402
from rstar_backend import engine as E  # noqa: E402
from rstar_backend.checkpoint import load_model, save_model  # noqa: E402
from rstar_backend.model import CausalLM, ModelConfig, token_logprobs  # noqa: E402

# ======================================================================================================
# Adapter: ALL coupling to src/backend/rstar_backend/train.py, which takes every setting in one config
# (src/backend/train-options.ts declares them; train-step sends them all).
# ======================================================================================================
from rstar_backend import parallel  # noqa: E402
from rstar_backend import train as T  # noqa: E402

sys.path.insert(0, os.path.join(BACKEND, "tests"))
# Every key train-step sends, at its default (device "cpu"): the backend's unit-test settings, which
# test/backend.test.ts keeps equal to train-options.ts's table, so this script needs no Node.
from common import SETTINGS as TRAIN_DEFAULTS  # noqa: E402
from common import random_records  # noqa: E402

DTYPE_SETTINGS = {"dtype": "bf16"}  # bf16 compute, fp32 master weights and optimiser state
SHARD_SETTINGS = {"shard": "full"}  # FSDP2: parameters, gradients and optimiser state sharded
HAS_DTYPE = "dtype" in TRAIN_DEFAULTS
HAS_SHARD = "shard" in TRAIN_DEFAULTS
NOT_YET = "needs train-step --dtype/--shard"
RUN_PY = os.path.join(BACKEND, "run.py")


def train_config(model_dir, out, loss, device, **settings):
    return {**TRAIN_DEFAULTS, "model": model_dir, "out": out, "loss": loss, "device": str(device), **settings}


def make_trainer(model_dir, out, loss, device, **settings):
    """train.py's in-process Trainer, as `rstar train-step` would configure it."""
    return T.Trainer(T.Config(train_config(model_dir, out, loss, device, **settings)))


def train_step(trainer, records):
    """One optimiser step on TrainRecord-shaped dicts; returns the Step record."""
    return trainer.step(T.Batch(records))


def trainer_logprobs(trainer, records):
    """The trainer's log-probs of each record's response tokens (its dtype, packing and forward, no grad)."""
    seqs = [T.sequence(r) for r in records]
    out = []
    with torch.no_grad():
        for mb in T.micro_batches(seqs, 16384):
            ids, pos, tgt, mask, *_rest, lengths = T.pack(mb, trainer.device, trainer.cfg.pad_token_id)
            lp = token_logprobs(trainer.logits(trainer.model, ids, pos, lengths), tgt).float().cpu()
            out += [lp[i, :int(mask[i].sum())] for i in range(len(mb))]
    return out


def train_cli(model_dir, out, device, **settings):
    """argv of one train-step rank; rank 0 reads the batches on stdin and broadcasts them."""
    config = train_config(model_dir, out, "sft", device, optimizer="sgd", lr=0.5, seed=0, **settings)
    return [sys.executable, RUN_PY, "train", "--config", json.dumps(config)]

# ======================================================================================================


TOLERANCES = {
    "hf_fp32": 1e-4,       # max |d log-prob| ours vs HF, fp32 (independent Qwen3s agree to ~1e-5)
    "hf_bf16_ratio": 1.5,  # our bf16 path's mean error vs fp32 at most this times HF bf16's (+1e-3)
    "engine_mean": 0.05,   # mean |engine bf16 - trainer fp32| log-prob on sampled tokens
    "engine_max": 0.5,
    "dist_weights": 1e-4,  # max |w(2 processes) - w(1 process)| relative to the largest update
    "dist_loss": 1e-4,     # |loss(2) - loss(1)| relative
}

# Sizes: logits' std ~1.6 nats at init (init std 1.6 / sqrt(hidden)), so distributions are peaked and
# log-prob tolerances mean something; head_dim != hidden / heads and GQA as in Qwen3.
GPU_CONFIG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                  rope_theta=1000000.0, initializer_range=1.6 / math.sqrt(768))
CPU_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                  rope_theta=1000000.0, initializer_range=0.2)
SIZES = {  # per mode: sequence lengths, batch sizes, steps, generated tokens
    "gpu": dict(hf_len=256, seqs=32, prompt=64, response=448, sft_steps=4, grpo_steps=3, gen=256, lr=3e-4),
    "cpu": dict(hf_len=48, seqs=8, prompt=8, response=24, sft_steps=3, grpo_steps=2, gen=12, lr=3e-3),
}


RECORDS = []  # files the records are also appended to (--out DIR/gpu-check.jsonl)


def emit(record):
    line = json.dumps(record) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    for path in RECORDS:  # appended and closed per record: a kill later loses nothing written
        with open(path, "a") as f:
            f.write(line)


class Tee:
    """stderr to the console and to one check's log file."""

    def __init__(self, stream, path):
        self.stream, self.file = stream, open(path, "a")

    def write(self, text):
        self.stream.write(text)
        self.file.write(text)
        self.file.flush()
        return len(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()

    def close(self):
        self.file.close()


def r6(x):
    return float(f"{float(x):.6g}")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checkpoint(folder, cfg_dict, seed, tie=True, arch="qwen3", bias_std=0.0):
    """A random checkpoint of `arch` (cfg_dict's fields over its defaults); bias_std > 0 makes its biases
    random too (init_weights zeroes them, and a zero bias proves nothing about how it is applied)."""
    cfg = ModelConfig.from_dict({**cfg_dict, "tie_word_embeddings": tie}, arch=arch)
    m = CausalLM(cfg)
    m.init_weights(seed)
    if bias_std > 0:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith(".bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * bias_std)
    save_model(m, folder)
    return folder


def records_for(vocab, n, prompt, response, seed, advantages=False):
    return random_records(n, prompt, response, seed, vocab=vocab, advantages=advantages)


# ---- hf-reference -------------------------------------------------------------------------------------

# Llama 3's rope scaling with its original context shrunk to 64 tokens: at hf_len positions every band of
# the formula (kept, blended, divided by factor) is in use, as it is only past 8192 tokens in Llama 3.1.
HF_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


def hf_reference_cases(config):
    """(tag, transformers class name, arch, tie, bias_std, config fields): the architectures against
    transformers. The Qwen3 tags stay "tied"/"untied" (docs/gpu.md's figures name them)."""
    qwen2 = {**config, "head_dim": config["hidden_size"] // config["num_attention_heads"]}  # Qwen2's is fixed
    llama = {**config, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "rope_scaling": HF_LLAMA3_ROPE}
    return [
        ("tied", "Qwen3ForCausalLM", "qwen3", True, 0.0, config),
        ("untied", "Qwen3ForCausalLM", "qwen3", False, 0.0, config),
        ("qwen2", "Qwen2ForCausalLM", "qwen2", True, 0.3, qwen2),
        ("llama", "LlamaForCausalLM", "llama", False, 0.0, llama),
        ("llama_bias", "LlamaForCausalLM", "llama", True, 0.3,
         {**config, "attention_bias": True, "mlp_bias": True}),
    ]


def check_hf_reference(ctx):
    try:
        import transformers
        from transformers import Qwen3ForCausalLM  # noqa: F401  (>= 4.51 has all three)
    except ImportError as e:
        return {"skipped": True, "reason": f"transformers with Qwen3 (>= 4.51) not importable: {e}"}
    dev, S = ctx.device, ctx.sizes
    dtype_kw = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
    figures = {"transformers": transformers.__version__}
    ok = True
    for tag, hf_class, arch, tie, bias_std, cfg in hf_reference_cases(ctx.config):
        HF = getattr(transformers, hf_class)
        folder = checkpoint(ctx.path(f"hf-{tag}"), cfg, seed=11, tie=tie, arch=arch, bias_std=bias_std)
        ids = torch.randint(0, cfg["vocab_size"], (2, S["hf_len"]),
                            generator=torch.Generator().manual_seed(5)).to(dev)
        lp = {}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            hf, info = HF.from_pretrained(folder, output_loading_info=True, attn_implementation="eager",
                                          **{dtype_kw: dtype})
            bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
            if bad or info.get("error_msgs"):
                return {"ok": False, **figures, "reason": f"{hf_class}.from_pretrained({folder}): "
                                                          f"{bad or info['error_msgs']}"}
            hf = hf.to(dev).eval()
            ours = load_model(folder, dev, dtype).eval()  # rotary inv_freq stays fp32, as the engine serves
            with torch.no_grad():
                lp[f"hf_{name}"] = torch.log_softmax(hf(input_ids=ids, use_cache=False).logits.float(), -1)
                lp[f"ours_{name}"] = torch.log_softmax(ours(ids).float(), -1)
            del hf, ours
        d32 = (lp["ours_fp32"] - lp["hf_fp32"]).abs()
        d16 = (lp["ours_bf16"] - lp["hf_bf16"]).abs()
        ours_err = float((lp["ours_bf16"] - lp["hf_fp32"]).abs().mean())
        hf_err = float((lp["hf_bf16"] - lp["hf_fp32"]).abs().mean())
        figures.update({f"{tag}_fp32_max": r6(d32.max()), f"{tag}_bf16_max": r6(d16.max()),
                        f"{tag}_bf16_mean": r6(d16.mean()), f"{tag}_ours_bf16_err": r6(ours_err),
                        f"{tag}_hf_bf16_err": r6(hf_err)})
        case_ok = float(d32.max()) <= ctx.tol["hf_fp32"] and ours_err <= ctx.tol["hf_bf16_ratio"] * hf_err + 1e-3
        if not case_ok:
            figures.setdefault("failed_cases", []).append(tag)
        ok = ok and case_ok
    figures["from_pretrained"] = True
    return {"ok": ok, **figures}


def _version(v):
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


# ---- train-fp32 / train-bf16 --------------------------------------------------------------------------

def check_train(ctx, dtype):
    if dtype == "bf16" and not HAS_DTYPE:
        return {"skipped": True, "reason": NOT_YET}
    if dtype == "bf16" and ctx.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return {"skipped": True, "reason": "this GPU has no bf16"}
    settings = DTYPE_SETTINGS if dtype == "bf16" else {}
    dev, S, V = ctx.device, ctx.sizes, ctx.config["vocab_size"]
    m0 = checkpoint(ctx.path(f"train-{dtype}-m0"), ctx.config, seed=21)
    sft = records_for(V, S["seqs"], S["prompt"], S["response"], seed=1)
    out = ctx.path(f"train-{dtype}-out")
    t = make_trainer(m0, out, "sft", dev, lr=S["lr"], **settings)
    losses, tokens, seconds = [], 0, 0.0
    for i in range(S["sft_steps"]):
        rec = train_step(t, sft)
        losses.append(rec["loss"])
        if i > 0:  # the first step pays for kernel selection and allocator warm-up
            tokens += rec["tokens"]
            seconds += rec["seconds"]
    sft_falls = all(b < a for a, b in zip(losses, losses[1:]))
    del t
    # GRPO from the SFT checkpoint: positive-advantage responses should gain log-prob over negative ones
    grpo = records_for(V, S["seqs"], S["prompt"], S["response"], seed=2, advantages=True)
    g = make_trainer(out, ctx.path(f"train-{dtype}-grpo"), "grpo", dev, lr=S["lr"], optimizer_state="reset",
                     **settings)
    margins, grpo_losses = [], []
    for _ in range(S["grpo_steps"]):
        margins.append(_margin(trainer_logprobs(g, grpo), grpo))
        grpo_losses.append(train_step(g, grpo)["loss"])
    margins.append(_margin(trainer_logprobs(g, grpo), grpo))
    finite = all(math.isfinite(x) for x in losses + margins + grpo_losses)
    ok = sft_falls and margins[-1] > margins[0] and finite
    return {"ok": ok, "dtype": dtype, "device": str(dev), "sft_losses": [r6(x) for x in losses],
            "grpo_margin": [r6(x) for x in margins], "grpo_losses": [r6(x) for x in grpo_losses],
            "finite": finite, "tokens_per_s": r6(tokens / seconds) if seconds > 0 else None}


def _margin(lps, records):
    """Mean log-prob of positive-advantage responses minus that of negative ones."""
    pos = torch.cat([lp for lp, r in zip(lps, records) if r["advantage"] > 0]).mean()
    neg = torch.cat([lp for lp, r in zip(lps, records) if r["advantage"] < 0]).mean()
    return float(pos - neg)


# ---- engine -------------------------------------------------------------------------------------------

def check_engine(ctx):
    dev, S, V = ctx.device, ctx.sizes, ctx.config["vocab_size"]
    dtype = "bf16" if dev.type == "cpu" or torch.cuda.is_bf16_supported() else "fp16"
    folder = checkpoint(ctx.path("engine-m"), ctx.config, seed=31)
    prompt = 32
    budget = 64 * (prompt + S["gen"]) + 1024
    args = argparse.Namespace(model=folder, device=str(dev), dtype=dtype, max_total_tokens=budget,
                              max_running_requests=64, weight_version="0")
    eng = E.Engine(args)
    try:
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, V, (prompt,), generator=g).tolist() for _ in range(64)]

        def run(batch, new, seed=1, logprobs=False):
            sp = dict(max_new_tokens=new, temperature=1.0, ignore_eos=True)
            reqs = [E.Request(f"{seed}-{i}", p, E.parse_sampling(dict(sp), eng.cfg.eos_token_id, eng.context_len,
                                                                 len(p)), logprobs, -1)
                    for i, p in enumerate(prompts[:batch])]
            t0 = time.perf_counter()
            eng.submit(reqs)
            for r in reqs:  # every wait has a deadline: a hung engine is a failed check, not a hung run
                left = max(1.0, min(ctx.deadline + 60, time.monotonic() + ENGINE_WAIT) - time.monotonic())
                if not r.done.wait(left):
                    why = getattr(eng, "dead", None) or "the engine neither finished nor failed it"
                    raise RuntimeError(f"engine request {r.rid} not done after {left:.0f} s: {why}")
            return reqs, time.perf_counter() - t0

        run(4, 8)  # warm-up: allocator, kernels
        one, t1 = run(1, S["gen"], 2)
        many, t64 = run(64, S["gen"], 3, logprobs=True)
        for r in one + many:
            if r.finish["type"] != "length":  # an abort carries the reason (e.g. the scheduler died)
                return {"ok": False, "reason": f"request {r.rid} finished with {r.finish}"}
        records = [{"prompt_ids": r.input_ids, "response_ids": r.output, "loss_mask": [1] * len(r.output)}
                   for r in many]
        served = torch.cat([torch.tensor([x[0] for x in r.out_logprobs]) for r in many])
    finally:
        eng.close()
    figures = {}
    ok = bool(torch.isfinite(served).all())
    # the trainer in fp32, and in the engine's dtype where train-step has --dtype (its autocast forward)
    for name, settings in (("", {}), ("_train_" + dtype, {"dtype": dtype} if HAS_DTYPE else None)):
        if settings is None or (settings and dtype == "fp16" and dev.type != "cuda"):
            continue
        trainer = make_trainer(folder, ctx.path("engine-trainer"), "sft", dev, **settings)
        trainer.model.eval()
        d = (served - torch.cat(trainer_logprobs(trainer, records))).abs()
        del trainer
        figures.update({f"logprob_mismatch{name}_mean": r6(d.mean()), f"logprob_mismatch{name}_max": r6(d.max())})
        ok = ok and float(d.mean()) <= ctx.tol["engine_mean"] and float(d.max()) <= ctx.tol["engine_max"]
    return {"ok": ok, "dtype": dtype, "device": str(dev), "tokens_per_s_batch1": r6(S["gen"] / t1),
            "tokens_per_s_batch64": r6(64 * S["gen"] / t64), "generated": S["gen"], **figures,
            "logprob_std": r6(served.std())}


# ---- ddp / shard --------------------------------------------------------------------------------------

def shard_unavailable(ctx):
    """Why the sharded path cannot run with this torch (a skip record), or None."""
    if not HAS_SHARD:
        return {"skipped": True, "reason": NOT_YET}
    if ctx.env["fsdp"]["api"] is None:
        return {"skipped": True, "reason": f"FSDP does not import: {ctx.env['fsdp']['import_error']}"}
    try:
        parallel.fully_shard_api()
    except parallel.SetupError as e:  # e.g. only FSDP1 (torch < 2.4)
        return {"skipped": True, "reason": str(e)}
    return None


def two_batches(path, cfg, seed):
    """A train-step input of two batches of 6 records, each closed by its end_batch line."""
    with open(path, "w") as f:
        for step in range(2):
            for r in records_for(cfg["vocab_size"], 6, 5, 7, seed=seed + step):
                f.write(json.dumps(r) + "\n")
            f.write(json.dumps({"end_batch": True}) + "\n")
    return path


def check_distributed(ctx, name, settings):
    if name == "shard" and shard_unavailable(ctx):
        return shard_unavailable(ctx)
    two_gpus = ctx.device.type == "cuda" and torch.cuda.device_count() >= 2
    device = "auto" if two_gpus else "cpu"  # auto: each rank its own GPU (LOCAL_RANK)
    # the CPU fallback keeps the model small: two ranks of the GPU-sized model would take minutes
    cfg = ctx.config if two_gpus else CPU_CONFIG
    m0 = checkpoint(ctx.path(f"{name}-m0"), cfg, seed=41)
    data = two_batches(ctx.path(f"{name}-data.jsonl"), cfg, seed=100)
    runs = {}
    for world in (1, 2):
        out = ctx.path(f"{name}-w{world}")
        argv = train_cli(m0, out, device, **(settings if world > 1 else {}))
        runs[world] = (_launch(ctx, f"{name}-w{world}", argv, data, world), out)
    (steps1, out1), (steps2, out2) = runs[1], runs[2]
    w0, w1, w2 = (load_model(p).state_dict() for p in (m0, out1, out2))
    update = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
    diff = max(float((w2[k] - w1[k]).abs().max()) for k in w0)
    loss_diff = max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12) for a, b in zip(steps1, steps2))
    ok = len(steps1) == len(steps2) == 2 and steps2[0].get("world_size") == 2 and update > 0 and \
        diff <= ctx.tol["dist_weights"] * update and loss_diff <= ctx.tol["dist_loss"]
    extra = {}
    if not two_gpus and ctx.device.type == "cuda":
        extra = {"gpu_collectives_checked": False,
                 "note": "one GPU: two CPU ranks on gloo; NCCL across GPUs and multi-rank FSDP2 on GPUs are "
                         "not checked here (shard-gpu checks FSDP2 + NCCL on one rank)"}
    return {"ok": ok, "processes": 2, "device": "cuda" if two_gpus else "cpu", **extra,
            "backend": "nccl" if two_gpus else "gloo", "settings": settings, "max_update": r6(update),
            "max_weight_diff": r6(diff), "loss_rel_diff": r6(loss_diff),
            "losses": [[r6(s["loss"]) for s in steps1], [r6(s["loss"]) for s in steps2]]}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(ctx, tag, argv, data, world, extra_env=None):
    """Runs `world` ranks as torchrun would set them up (torchrun itself fails on Debian's torch 1.13
    under Python 3.11), rank 0 reading `data` on stdin; returns rank 0's Step records. The launch is
    capped at --launch-timeout (and the budget left), its process group times out well within that,
    and each rank's stderr goes to a file (ctx.logs/<tag>-rank<R>.log): an unread pipe can fill and
    stall a rank, and its last lines name the failure."""
    cap = min(ctx.launch_timeout, max(10.0, ctx.deadline - time.monotonic()))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "RSTAR_DIST_TIMEOUT": str(max(10, int(cap / 2))), **(extra_env or {})}
    if world > 1 or extra_env:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world))
    if world > 1:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    procs, logs = [], []
    with open(data) as stdin:
        for rank in range(world):
            log = os.path.join(ctx.logs, f"{tag}-rank{rank}.log")
            logs.append(log)
            rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank)) if "WORLD_SIZE" in env else env
            with open(log, "w") as err:
                procs.append(subprocess.Popen(argv, env=rank_env, stdin=stdin if rank == 0 else subprocess.DEVNULL,
                                              stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                              stderr=err, text=True))
    end = time.monotonic() + cap
    out = ""
    try:
        out = procs[0].communicate(timeout=cap)[0]
        for p in procs[1:]:
            p.wait(timeout=max(1.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"train-step with {world} process(es) did not finish within {cap:.0f} s; "
                           f"rank logs: {', '.join(logs)}; {_tail(logs[0])}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError(f"train-step ({world} process(es)) rank {rank} exited {p.returncode}: "
                               f"{_tail(logs[rank])}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _tail(path, n=3):
    try:
        with open(path) as f:
            return " | ".join(line.strip() for line in f.read().strip().splitlines()[-n:])
    except OSError:
        return ""


# ---- shard-gpu ----------------------------------------------------------------------------------------

def check_shard_gpu(ctx):
    """One rank on the GPU: the FSDP2 path (fully_shard, DTensor parameters, NCCL reduce-scatter and
    all-gather, the sharded save) against the same step unsharded, same device."""
    if ctx.device.type != "cuda":
        return {"skipped": True, "reason": "needs a GPU"}
    if shard_unavailable(ctx):
        return shard_unavailable(ctx)
    cfg = CPU_CONFIG
    m0 = checkpoint(ctx.path("shard-gpu-m0"), cfg, seed=43)
    data = two_batches(ctx.path("shard-gpu-data.jsonl"), cfg, seed=200)
    device = str(ctx.device)
    plain_out, shard_out = ctx.path("shard-gpu-plain"), ctx.path("shard-gpu-sharded")
    plain = _launch(ctx, "shard-gpu-plain", train_cli(m0, plain_out, device), data, 1)
    sharded = _launch(ctx, "shard-gpu-sharded", train_cli(m0, shard_out, device, **SHARD_SETTINGS), data, 1,
                      extra_env={"RSTAR_SHARD_ONE_RANK": "1"})
    w0, w1, w2 = (load_model(p).state_dict() for p in (m0, plain_out, shard_out))
    update = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
    diff = max(float((w2[k] - w1[k]).abs().max()) for k in w0)
    loss_diff = max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12) for a, b in zip(plain, sharded))
    ok = len(plain) == len(sharded) == 2 and update > 0 and diff <= ctx.tol["dist_weights"] * update and \
        loss_diff <= ctx.tol["dist_loss"]
    return {"ok": ok, "processes": 1, "device": device, "backend": "nccl", "settings": SHARD_SETTINGS,
            "max_update": r6(update), "max_weight_diff": r6(diff), "loss_rel_diff": r6(loss_diff),
            "losses": [[r6(x["loss"]) for x in plain], [r6(x["loss"]) for x in sharded]]}


# ---- driver -------------------------------------------------------------------------------------------

ENGINE_WAIT = 120.0  # seconds one engine request may take before the engine check fails


class Context:
    def __init__(self, device, mode, tol, deadline, env, launch_timeout, logs):
        self.device, self.mode, self.tol, self.deadline, self.env = device, mode, tol, deadline, env
        self.launch_timeout = launch_timeout
        self.sizes = SIZES[mode]
        self.config = GPU_CONFIG if mode == "gpu" else CPU_CONFIG
        self.tmp = tempfile.mkdtemp(prefix="rstar-gpu-check-")
        self.logs = logs or self.tmp  # each distributed rank's stderr

    def path(self, name):
        return os.path.join(self.tmp, name)


CHECKS = ("environment", "hf-reference", "train-fp32", "train-bf16", "engine", "ddp", "shard", "shard-gpu", "lora")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gpu-check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="skip what needs a GPU; small models, well under a minute")
    p.add_argument("--only", default=None, help=f"comma-separated checks among {', '.join(CHECKS)}")
    p.add_argument("--tolerance", action="append", default=[], metavar="NAME=VALUE",
                   help=f"override a tolerance ({', '.join(TOLERANCES)})")
    p.add_argument("--budget", type=float, default=480.0,
                   help="seconds; checks not started by then are skipped (default 480)")
    p.add_argument("--device", default="cuda:0", help="the GPU to check (default cuda:0)")
    p.add_argument("--out", default=os.environ.get("OUT") or None, metavar="DIR",
                   help="also write the records to DIR/gpu-check.jsonl and each check's log to DIR/CHECK.log "
                        "(default $OUT when set)")
    p.add_argument("--launch-timeout", type=float, default=120.0, metavar="S",
                   help="seconds one distributed launch may take, all its ranks together (default 120)")
    args = p.parse_args(argv)
    tol = dict(TOLERANCES)
    for item in args.tolerance:
        key, _, value = item.partition("=")
        if key not in tol:
            p.error(f"--tolerance {item}: unknown name; known: {', '.join(tol)}")
        try:
            tol[key] = float(value)
        except ValueError:
            p.error(f"--tolerance {item}: expected a number")
    only = CHECKS if args.only is None else tuple(c.strip() for c in args.only.split(",") if c.strip())
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        p.error(f"--only: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return args, tol, only


def main(argv):
    args, tol, only = parse_args(argv)
    start = time.monotonic()
    if args.cpu:
        device, mode = torch.device("cpu"), "cpu"
    else:
        if not torch.cuda.is_available():
            sys.stderr.write(f"gpu-check.py: torch {torch.__version__} sees no GPU; run with --cpu, or see "
                             "docs/gpu.md for the CUDA/ROCm builds\n")
            return 2
        device, mode = torch.device(args.device), "gpu"
        if device.type != "cuda":
            sys.stderr.write(f"gpu-check.py: --device {args.device}: expected cuda or cuda:N (ROCm GPUs are cuda too)\n")
            return 2
        if device.index is None:  # set_device and the ranks want an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        RECORDS.append(os.path.join(args.out, "gpu-check.jsonl"))
        open(RECORDS[0], "w").close()
    env = doctor.probe()
    ctx = Context(device, mode, tol, start + args.budget, env, args.launch_timeout, args.out)
    checks = {
        "environment": lambda: {"ok": True, "mode": mode, "torch": env["torch"]["version"], "build": env["build"],
                                "devices": env["devices"], "bf16": env["bf16"], "collective": env["collective"],
                                "sdpa": env["sdpa"], "fsdp": env["fsdp"], "blas_library": env["blas"]["library"],
                                "train_api": {"dtype": HAS_DTYPE, "shard": HAS_SHARD}, "warnings": env["warnings"]},
        "hf-reference": lambda: check_hf_reference(ctx),
        "train-fp32": lambda: check_train(ctx, "fp32"),
        "train-bf16": lambda: check_train(ctx, "bf16"),
        "engine": lambda: check_engine(ctx),
        "ddp": lambda: check_distributed(ctx, "ddp", {}),
        "shard": lambda: check_distributed(ctx, "shard", SHARD_SETTINGS),
        "shard-gpu": lambda: check_shard_gpu(ctx),
        "lora": lambda: __import__("gpu_lora").check_all(ctx.device, ctx.tmp),  # bench/gpu_lora.py (issue 42)
    }
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    try:
        for name in CHECKS:
            if name not in only:
                continue
            t0 = time.monotonic()
            if t0 > ctx.deadline:
                result = {"skipped": True, "reason": f"time budget of {args.budget:.0f} s spent"}
            else:
                stderr = sys.stderr
                if args.out:
                    sys.stderr = Tee(stderr, os.path.join(args.out, f"{name}.log"))
                try:
                    result = checks[name]()
                except Exception as e:  # a crashing check is a failed check, with the reason
                    last = traceback.format_exception_only(type(e), e)[-1].strip()
                    result = {"ok": False, "reason": last}
                    traceback.print_exc(file=sys.stderr)
                finally:
                    if sys.stderr is not stderr:
                        sys.stderr.close()
                        sys.stderr = stderr
            skipped = bool(result.get("skipped"))
            record = {"check": name, "ok": bool(result.get("ok", skipped)), **result,
                      "seconds": round(time.monotonic() - t0, 3)}
            counts["skipped" if skipped else "passed" if record["ok"] else "failed"] += 1
            emit(record)
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    emit({"summary": True, "ok": counts["failed"] == 0, "mode": mode, **counts,
          "seconds": round(time.monotonic() - start, 3)})
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
