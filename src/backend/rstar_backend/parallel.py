"""Mixed precision and sharded data parallelism for the trainer (train-step --dtype, --shard).

Precision: the master weights, the gradients and the AdamW moments stay fp32; --dtype bf16|fp16 only
changes the compute dtype of the forward (and so of the backward). Unsharded, that is torch.autocast
around each forward: matmuls in bf16/fp16, norms, rotary and elementwise ops in fp32. Sharded, FSDP2's
MixedPrecisionPolicy casts the parameters once per layer as it gathers them, so every op computes in
bf16/fp16 (as engine-serve --dtype bf16 does), and gradients are reduced in fp32. Either way the
trainer casts the logits to fp32 before log-softmax, entropy and the losses. fp16 needs a dynamic loss
scaler and a GPU (CPU autocast is bf16 only); bf16 also runs on CPU, where the tests run it.

Sharding (--shard full|grad-op): PyTorch's FSDP2 (`fully_shard`, torch >= 2.4). Each decoder layer
is one group, the root (embeddings, final norm and the head, tied or not) another; every parameter is
split on dim 0 across the ranks, as are its gradient and AdamW moments. `full` frees a layer's
gathered parameters after its forward and gathers them again for the backward (ZeRO-3); `grad-op`
keeps them gathered from forward to backward (ZeRO-2: more memory, one all-gather less). Parameters
become DTensors: whole tensors are gathered (full_tensor) only to write a checkpoint, and a saved one
is split again (distribute_tensor) on load, so checkpoints keep the unsharded Hugging Face layout
whatever the world size. FSDP1 (torch < 2.4) is not supported: a second code path for old releases
that this project cannot test; such a torch gets a clear error, and --shard none (data parallel)
still works there.
"""

import contextlib
import os

import torch
import torch.distributed as dist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHARD_MODES = ("none", "full", "grad-op")


class SetupError(Exception):
    """The precision or sharding asked for cannot run with this torch, device or process count:
    train-step exits 2 with this message, before any training."""


def compute_dtype(name, device):
    """The forward's dtype for --dtype `name` on `device`, or SetupError saying what to use instead."""
    if name not in DTYPES:
        raise SetupError(f"--dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    dtype = DTYPES[name]
    if dtype is torch.float16 and device.type != "cuda":
        raise SetupError(f"--dtype fp16 on {device}: fp16 training needs a GPU (a loss scaler on CUDA or "
                         "ROCm); use --dtype bf16 on CPU")
    if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SetupError(f"--dtype bf16: {torch.cuda.get_device_name(device)} has no bf16; use --dtype fp16")
    return dtype


def torch_version():
    try:
        return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 0)


def fully_shard_api():
    """FSDP2's (fully_shard, MixedPrecisionPolicy), or SetupError naming this torch."""
    if torch_version() < (2, 4):
        raise SetupError(f"--shard: needs torch >= 2.4 (FSDP2 fully_shard); this is torch {torch.__version__}. "
                         "Use --shard none (data parallel: every rank holds the whole model)")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch >= 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # 2.4, 2.5
        except Exception as e:  # a broken build fails in many ways (Debian's 1.13: a dataclass error)
            raise SetupError(f"--shard: torch {torch.__version__} cannot import FSDP2 fully_shard: {e}")
    return fully_shard, MixedPrecisionPolicy


def check_setup(dtype_name, shard, device, world):
    """Everything --dtype/--shard need, checked before the process group starts or a checkpoint is
    read: returns the compute dtype, or raises SetupError."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"--device {device}: torch {torch.__version__} sees no GPU "
                         "(a CPU-only build, or no driver; `rstar doctor` says which)")
    dtype = compute_dtype(dtype_name, device)
    if shard not in SHARD_MODES:
        raise SetupError(f"--shard: expected one of {', '.join(SHARD_MODES)}, got {shard!r}")
    if shard == "none":
        return dtype
    if world < 2 and os.environ.get("RSTAR_SHARD_ONE_RANK") != "1":
        # RSTAR_SHARD_ONE_RANK=1 (bench/gpu-check.py on one GPU): the sharded code path, FSDP2 and its
        # NCCL collectives on a single rank, which is all one GPU can check of them
        raise SetupError(f"--shard {shard}: needs --nproc 2 or more (one process holds the whole model "
                         "anyway); use --shard none")
    if dtype is torch.float16:
        # torch.amp's GradScaler checks each rank's own gradient shard for inf: the ranks would
        # disagree on skipping a step (FSDP1 had ShardedGradScaler; FSDP2 has none)
        raise SetupError(f"--shard {shard} --dtype fp16: the loss scaler does not work on sharded gradients; "
                         "use --dtype bf16")
    fully_shard_api()
    return dtype


def autocast(device, dtype, sharded):
    """The context of every forward: autocast for bf16/fp16 unless sharded (FSDP2 casts instead)."""
    if dtype is torch.float32 or sharded:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(dtype):
    """fp16's dynamic loss scaler (bf16 has fp32's exponent range and needs none)."""
    if dtype is not torch.float16:
        return None
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def shard(model, mode, device, dtype, frozen=False):
    """Shards `model` in place across the default process group (already started) and returns the
    factor its loss must be multiplied by so that the gradients are the SUM over the ranks (1, or the
    world size where FSDP2 can only average). `frozen` (the KL reference, forward only): every group
    reshards after its forward, since no backward would."""
    fully_shard, MixedPrecisionPolicy = fully_shard_api()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=None if dtype is torch.float32 else dtype,
                                  reduce_dtype=torch.float32)
    groups = []
    for layer in model.model.layers:
        groups.append(fully_shard(layer, mesh=mesh, reshard_after_forward=frozen or mode == "full", mp_policy=policy))
    # The root's group: the embeddings, the final norm and the head. A tied head is the embedding's
    # Parameter, so it must be in the same group as the embeddings. The root's parameters are needed
    # first in the backward: kept gathered after the forward, as FSDP2 does by default for the root.
    groups.append(fully_shard(model, mesh=mesh, reshard_after_forward=frozen, mp_policy=policy))
    return sum_gradients(groups)


def sum_gradients(groups):
    """Makes FSDP2 sum the ranks' gradients, as the data-parallel path does (our loss is already
    divided by the batch's global count of loss tokens). FSDP2 averages by default, and on some
    releases silently sums with gloo (pytorch issue 162338): an explicit divide factor of 1 (torch >=
    2.6, per group) is right with both. But from torch 2.8 a divide factor makes FSDP2 reduce fp32
    gradients with a PREMUL_SUM op that gloo rejects: where the group can be told to reduce with a
    plain sum (`set_force_sum_reduction_for_comms`), it is, so the collective is an ordinary SUM on
    every backend. Without either API (2.4, 2.5), the loss is multiplied by the world size instead.
    bench/gpu-check.py's shard check compares the update with one process's."""
    if all(hasattr(g, "set_force_sum_reduction_for_comms") for g in groups):
        for g in groups:
            g.set_force_sum_reduction_for_comms(True)
            g.set_gradient_divide_factor(1.0)
        return 1
    for name in ("set_gradient_divide_factor", "set_reduce_scatter_divide_factor"):
        if all(hasattr(g, name) for g in groups):
            for g in groups:
                getattr(g, name)(1.0)
            return 1
    return dist.get_world_size()


def is_dtensor(t):
    return hasattr(t, "full_tensor") and hasattr(t, "device_mesh")


def gather(tensors, keep, dtype=None):
    """{name: whole CPU tensor (in `dtype`, default its own)} of `tensors` ({name: tensor}), kept only
    where `keep` (rank 0). A DTensor is gathered with full_tensor, a collective: every rank calls this
    with the same names in the same order. One whole tensor at a time is on the device."""
    out = {}
    for name, t in tensors.items():
        if is_dtensor(t):
            t = t.full_tensor()
        if keep:
            out[name] = t.detach().to(dtype=dtype or t.dtype).to("cpu")
    return out


def like(param, whole):
    """`whole` (a saved, unsharded tensor) laid out as `param`: split the same way when it is a DTensor."""
    if is_dtensor(param):
        try:
            from torch.distributed.tensor import distribute_tensor  # torch >= 2.5
        except ImportError:
            from torch.distributed._tensor import distribute_tensor  # 2.4
        whole = whole.to(device=param.to_local().device, dtype=param.dtype)
        return distribute_tensor(whole, param.device_mesh, param.placements)
    return whole.to(device=param.device, dtype=param.dtype)


def norm_value(total):
    """clip_grad_norm_'s result as a float (a DTensor when the gradients are sharded)."""
    if is_dtensor(total):
        total = total.full_tensor()
    return float(total)
