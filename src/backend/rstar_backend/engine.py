"""engine-serve: a small inference server speaking the subset of SGLang's HTTP API that rollouts use.

Threads: the HTTP server answers each connection on its own thread and hands requests to one scheduler
thread, which owns the model and does continuous batching: every iteration it admits waiting requests
whose whole KV reservation (prompt + max_new_tokens) fits into the free slots of a preallocated KV pool,
prefills them, then runs one batched decode step for every running request. A request that does not fit
waits in FIFO order, so `--max-total-tokens` is a real budget, as in SGLang.

Prefix cache (radix.py, on unless --disable-radix-cache): a request reuses the KV of the longest prefix
of its input that the engine has already run and prefills only the rest; the n samples of one prompt
admitted together prefill it once. Cached tokens nobody is using count as free (they are evicted,
least recently used first, when the pool runs short); a weight update drops the cache.

LoRA (SGLang's routes: POST /load_lora_adapter {lora_name, lora_path}, POST /unload_lora_adapter
{lora_name}, `lora_path` on /generate naming a loaded adapter, none: the base): several adapters may be
loaded, as in SGLang, and a request is served by the one it names. engine-serve applies one at a time,
merged into the weights (lora.py; unmerging restores the base bit for bit): a request naming another
waits until the running requests of the merged one have finished, then the scheduler swaps the
merge. One-step-off rollouts need exactly this: step K+1's turns name adapter K-1 while train-step
loads K. A reply's weight_version is the step of the adapter that served it (the N of a name
rstar-lora-step-N, else its safetensors metadata rstar_step), the base's label for the base. A swap,
and an unload or a new base, drops the prefix cache: its K/V came from other weights.

Decode (running_kv.py, unless --decode-kv pool): each running request's K/V is also kept as one dense
row, filled from the pool when it joins and appended to every step, which attention reads in place.
"""

import argparse
import itertools
import json
import os
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from .checkpoint import CheckpointError, load_model, read_config
from .detok import Detokenizer
from .lora import AdapterError, adapter_step, check_adapter, load_adapter, merge_lora, remove_lora
from .model import previous_in_row, token_logprobs
from .radix import RadixCache
from .running_kv import RunningKV


PREFILL_TOKENS = 8192  # padded prompt tokens per prefill forward: bounds the activations' memory
PREFILL_SCORES = 8192 * 4096  # padded (query, key) pairs per prefill forward: bounds attention's scores


# --dtype: the CLI's short names and torch's long ones; "auto" serves a GPU in the checkpoint's dtype.
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class SetupError(Exception):
    """A device or dtype this torch cannot serve with; the message says what to use instead."""


def serving_device(name):
    """auto: the first GPU (ROCm GPUs are `cuda` to torch too), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SetupError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        raise SetupError(f"--device {name}: the engine runs on cpu or cuda (ROCm GPUs are cuda too)")
    if device.type == "cuda" and device.index is not None and torch.cuda.is_available() \
            and device.index >= torch.cuda.device_count():
        raise SetupError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
    return device


def serving_dtype(name, device, model_path):
    """The weights' and KV cache's dtype. Logits are cast to fp32 before log-softmax and sampling
    whatever this is, so only the forward runs in bf16/fp16 (as SGLang and vLLM do)."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(read_config(model_path).torch_dtype,
                                                                           torch.float32)
    return torch.float32


def check_device(device, dtype):
    """Fails before loading a checkpoint: no GPU behind --device cuda, or a dtype the device lacks
    (torch 1.13 has no fp16 matmul on CPU; pre-Ampere GPUs no bf16)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"--device {device}: torch {torch.__version__} sees no GPU "
                         "(a CPU-only build, or no driver; `rstar doctor` says which)")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise SetupError(f"--dtype bf16: {torch.cuda.get_device_name(device)} has no bf16; use fp16 or fp32")
    try:
        x = torch.ones(2, 8, device=device, dtype=dtype)
        torch.nn.functional.linear(x, torch.ones(4, 8, device=device, dtype=dtype)).float().sum().item()
    except (RuntimeError, TypeError) as e:
        name = str(dtype).replace("torch.", "")
        raise SetupError(f"--dtype {name} on {device}: this torch cannot run a {name} matmul there ({e})")


class KVPool:
    """K and V for max_total_tokens token slots per layer, allocated once; requests own slot indices.

    Laid out (layers, kv_heads, slots, head_dim), KV head outermost: a decode step's gather of the
    running requests' slots is then, per KV head, the (rows, length, head_dim) operand of one batched
    matmul as it is, where the (slots, kv_heads, head_dim) layout needed a transposing copy of the
    whole gathered cache for each of the two matmuls (attention took ~half of a decode step)."""

    def __init__(self, cfg, size, device, dtype):
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, size, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # smeared keys need each token's key before the mix, to mix it into the next token's
        self.k_raw = torch.zeros(shape, device=device, dtype=dtype) if cfg.rstar_key_smear else None
        self.size = size
        self.free = list(range(size - 1, -1, -1))
        self.device = device

    @property
    def used(self):
        return self.size - len(self.free)

    @property
    def nbytes(self):
        return (2 if self.k_raw is None else 3) * self.k.numel() * self.k.element_size()

    def alloc(self, n):
        assert n <= len(self.free), "KV pool over-allocated"
        slots = [self.free.pop() for _ in range(n)]
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    def release(self, slots):
        self.free.extend(slots.tolist())


def _write(pool, layer, slots, t):
    """t: (kv_heads, N, head_dim) for N slots."""
    pool[layer].index_copy_(1, slots, t.to(pool.dtype))


def _real_tokens(t, valid):
    """(B, kv_heads, T, head_dim) right-padded -> (kv_heads, N, head_dim), the N real tokens."""
    return t.transpose(1, 2)[valid].transpose(0, 1)


def _gather(t, table):
    """The slots of table (B, L) from one layer's (kv_heads, slots, head_dim) pool: a (B, kv_heads, L,
    head_dim) view of a (kv_heads, B, L, head_dim) tensor, which model.attend multiplies without a copy."""
    B, L = table.shape
    return t.index_select(1, table.reshape(-1)).view(t.size(0), B, L, t.size(2)).transpose(0, 1)


class PrefillCache:
    """New prompts, right-padded into one batch: writes the K/V of their real tokens into their slots;
    attention is plain causal within each row (padding comes after the real tokens, so none sees it)."""

    def __init__(self, pool, slots, valid=None):
        self.pool, self.slots, self.valid = pool, slots, valid

    def _rows(self, t):
        return t[0] if self.valid is None else _real_tokens(t, self.valid)

    def update(self, layer, k, v):
        _write(self.pool.k, layer, self.slots, self._rows(k))
        _write(self.pool.v, layer, self.slots, self._rows(v))
        return k, v, None

    def previous_keys(self, layer, k):
        """Prompts start at position 0, so the previous key is the row's previous column (zero for the first)."""
        _write(self.pool.k_raw, layer, self.slots, self._rows(k))
        return previous_in_row(k)


class DecodeCache:
    """One new token per request: writes it, then gathers each request's slots (padded, masked).

    The gathered K and V are (B, kv_heads, L, head_dim) views of (kv_heads, B, L, head_dim) tensors:
    model.attend's batched matmuls take them without a copy."""

    def __init__(self, pool, write, gather, mask, prev=None):
        self.pool, self.write, self.gather, self.mask, self.prev = pool, write, gather, mask, prev

    def update(self, layer, k, v):
        _write(self.pool.k, layer, self.write, k[:, :, 0].transpose(0, 1))
        _write(self.pool.v, layer, self.write, v[:, :, 0].transpose(0, 1))
        return _gather(self.pool.k[layer], self.gather), _gather(self.pool.v[layer], self.gather), self.mask

    def previous_keys(self, layer, k):
        """prev: the slot of each request's previous token (a decoded token is never at position 0)."""
        _write(self.pool.k_raw, layer, self.write, k[:, :, 0].transpose(0, 1))
        return self.pool.k_raw[layer].index_select(1, self.prev).transpose(0, 1)[:, :, None]


class DenseDecodeCache:
    """One new token per running request: written to the pool (its slot) and to its dense row (at
    pos); attention then reads rows[:B, :, :L] in place, keys at or after a row's length masked."""

    def __init__(self, kv, pool, write, pos, lens):
        self.kv, self.pool, self.write, self.pos = kv, pool, write, pos
        B, L = pos.numel(), int(lens.max())
        self.rows = torch.arange(B, device=pos.device)
        self.B, self.L = B, L
        self.mask = (torch.arange(L, device=pos.device)[None, :] < lens[:, None])[:, None, None, :]

    def update(self, layer, k, v):
        k1, v1 = k[:, :, 0], v[:, :, 0]  # (B, kv_heads, head_dim)
        _write(self.pool.k, layer, self.write, k1.transpose(0, 1))
        _write(self.pool.v, layer, self.write, v1.transpose(0, 1))
        self.kv.k[layer][self.rows, :, self.pos] = k1.to(self.kv.dtype)
        self.kv.v[layer][self.rows, :, self.pos] = v1.to(self.kv.dtype)
        B, L = self.B, self.L
        return self.kv.k[layer, :B, :, :L], self.kv.v[layer, :B, :, :L], self.mask

    def previous_keys(self, layer, k):
        """Each row's last raw key (the token before this one), then this token's becomes the last."""
        k1 = k[:, :, 0]
        _write(self.pool.k_raw, layer, self.write, k1.transpose(0, 1))
        prev = self.kv.prev[layer, :self.B].clone()
        self.kv.prev[layer, :self.B] = k1.to(self.kv.dtype)
        return prev[:, :, None]


class ExtendCache:
    """New tokens after a cached prefix, right-padded into one batch: writes the K/V of the real new
    tokens into their slots, then each row attends over its whole context (the prefix's slots and the
    new ones) gathered from the pool, as a decode step does with one query per row.

    table (B, L): each row's context slots; mask (B, 1, T, L): key l is seen by new token j of row i
    when l <= c_i + j (its position) and l < P_i; prev (B,): the slot of the token before each row's
    first new token, and has_prev (B,) whether there is one (smeared keys)."""

    def __init__(self, pool, slots, valid, table, mask, prev, has_prev):
        self.pool, self.slots, self.valid = pool, slots, valid
        self.table, self.mask, self.prev, self.has_prev = table, mask, prev, has_prev

    def update(self, layer, k, v):
        _write(self.pool.k, layer, self.slots, _real_tokens(k, self.valid))
        _write(self.pool.v, layer, self.slots, _real_tokens(v, self.valid))
        return _gather(self.pool.k[layer], self.table), _gather(self.pool.v[layer], self.table), self.mask

    def previous_keys(self, layer, k):
        """Within the new tokens, the row's previous column; before the first, the cached token's raw key."""
        _write(self.pool.k_raw, layer, self.slots, _real_tokens(k, self.valid))
        prev = previous_in_row(k)
        first = self.pool.k_raw[layer].index_select(1, self.prev).transpose(0, 1)  # (B, kv_heads, head_dim)
        prev[:, :, 0] = first * self.has_prev[:, None, None].to(first.dtype)
        return prev


class EngineDead(Exception):
    """The scheduler thread has died: nothing more can be generated; the reason says why."""


class BadRequest(Exception):
    pass


class Request:
    # a serial number per request object: the decode slot table is keyed by it, not by id(), which
    # CPython hands to a new request as soon as a finished one is freed (a stale table then reads
    # the old request's released slots)
    serials = itertools.count()

    def __init__(self, rid, input_ids, sp, return_logprob, logprob_start_len):
        self.serial = next(Request.serials)
        self.rid = rid
        self.input_ids = input_ids
        self.max_new = sp["max_new_tokens"]
        self.temperature = sp["temperature"]
        self.top_p = sp["top_p"]
        self.top_k = sp["top_k"]
        self.stop_ids = set(sp["stop_token_ids"])
        self.stop_strs = sp["stop"]
        self.stop_window = max((len(x.encode()) for x in self.stop_strs), default=0) + 2
        self.skip_special = sp["skip_special_tokens"]
        self.seed = None if sp.get("seed") is None else int(sp["seed"])
        self.return_logprob = return_logprob
        self.logprob_start_len = logprob_start_len
        self.output = []
        self.out_logprobs = []
        self.in_logprobs = []
        self.slots = None
        self.finish = None
        self.text = ""
        self.done = threading.Event()
        self.created = time.time()
        self.first_token_time = None
        self.weight_version = None  # the engine's when the request finished (SGLang reports it at output time)
        self.lora = None  # the adapter it names (lora_path), None for the base
        # prefix cache: slots[:shared] are the tree's (locked at node of tree until the request
        # finishes), the rest the request's own; cached_tokens: the prefix it did not prefill
        self.tree = None
        self.node = None
        self.shared = 0
        self.cached_tokens = 0
        self.prefilled = False

    @property
    def reserve(self):
        return len(self.input_ids) + self.max_new

    def log_start(self):
        """The first input position with a log-prob in the response: as SGLang, logprob_start_len -1
        (the default) means the last prompt token; the first token has none (None)."""
        P = len(self.input_ids)
        return min(self.logprob_start_len, P - 1) if self.logprob_start_len >= 0 else P - 1

    def logits_from(self):
        """The first input position whose logits are needed: the one before log_start() when input
        log-probs are wanted, else the last (whose logits give the first output token)."""
        return max(0, self.log_start() - 1) if self.return_logprob else len(self.input_ids) - 1


def parse_sampling(sp, eos, context_len, prompt_len):
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params: expected an object")
    out = {
        "max_new_tokens": sp.get("max_new_tokens", 128),
        "temperature": float(sp.get("temperature", 1.0)),
        "top_p": float(sp.get("top_p", 1.0)),
        "top_k": int(sp.get("top_k", -1)),
        "stop_token_ids": list(sp.get("stop_token_ids") or []),
        "stop": sp.get("stop") or [],
        "skip_special_tokens": bool(sp.get("skip_special_tokens", True)),
        "seed": sp.get("seed", sp.get("sampling_seed")),
    }
    if isinstance(out["stop"], str):
        out["stop"] = [out["stop"]]
    if not isinstance(out["stop"], list) or not all(isinstance(x, str) for x in out["stop"]):
        raise BadRequest("sampling_params.stop: expected a string or an array of strings")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in out["stop_token_ids"]):
        raise BadRequest("sampling_params.stop_token_ids: expected an array of token ids")
    mnt = out["max_new_tokens"]
    if not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 0:
        raise BadRequest("sampling_params.max_new_tokens: expected a non-negative integer")
    if out["temperature"] < 0 or not (0 < out["top_p"] <= 1):
        raise BadRequest("sampling_params: temperature must be >= 0 and top_p in (0, 1]")
    if not sp.get("ignore_eos", False):
        out["stop_token_ids"].append(eos)
    # As SGLang does, the completion is clipped so prompt + completion fit the context.
    out["max_new_tokens"] = max(0, min(mnt, context_len - prompt_len))
    return out


_M32 = 0xFFFFFFFF


def _mul32(h, c):
    """(h * c) mod 2^32 for an int64 tensor h in [0, 2^32) and a 32-bit constant c, with no product
    above 2^63 (int64 overflow is not something to rely on across devices)."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(h):
    """A 32-bit integer hash (lowbias32's constants): each output bit depends on every input bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def seeded_uniforms(seeds, positions, device):
    """One uniform in [0, 1) per row, a pure function of (seed, position): a seeded request draws the
    same numbers whatever else shares its batch, on any engine process or device, with no per-request
    generator (one multinomial call per request and token cost a fifth of a decode step at batch 64)."""
    seeds = [int(x) & 0xFFFFFFFFFFFFFFFF for x in seeds]
    lo = torch.tensor([x & _M32 for x in seeds], dtype=torch.int64, device=device)
    hi = torch.tensor([x >> 32 for x in seeds], dtype=torch.int64, device=device)
    pos = torch.tensor(positions, dtype=torch.int64, device=device)
    key = _mix32(lo ^ _mix32((hi + _mix32(pos)) & _M32))
    a = _mix32((key + 0x9E3779B9) & _M32)  # two 32-bit draws -> 53 random bits
    b = _mix32(a ^ key)
    return ((a << 21) + (b >> 11)).double() / float(2 ** 53)


def choose_tokens(logits, reqs):
    """Next token of each request from its (V,) fp32 logits row: greedy at temperature 0, else drawn by
    inverse CDF from softmax(logits / T), top-k and top-p applied; seeded requests draw their uniform
    from (seed, output position), the others from torch's generator. One batched pass for the batch."""
    rows = [i for i, r in enumerate(reqs) if r.temperature > 0]
    if len(rows) < len(reqs):  # greedy rows (a full pass over the vocabulary: skipped when there are none)
        toks = torch.argmax(logits, dim=-1)
        if not rows:
            return toks.tolist()
    else:
        toks = torch.empty(len(reqs), dtype=torch.long, device=logits.device)
    idx = torch.tensor(rows, device=logits.device)
    temps = torch.tensor([reqs[i].temperature for i in rows], dtype=logits.dtype, device=logits.device)
    scaled = logits.index_select(0, idx) / temps[:, None]
    for j, i in enumerate(rows):  # top-k: rare in RL, one row at a time
        k = reqs[i].top_k
        if 0 < k < scaled.size(1):
            kth = torch.topk(scaled[j], k).values[-1]
            scaled[j] = scaled[j].masked_fill(scaled[j] < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1).double()
    for j, i in enumerate(rows):  # top-p: the smallest prefix of the sorted probabilities reaching top_p
        if reqs[i].top_p < 1.0:
            sp, si = torch.sort(probs[j], descending=True)
            keep = (sp.cumsum(0) - sp) < reqs[i].top_p
            probs[j] = torch.zeros_like(probs[j]).scatter(0, si, sp * keep)
    u = torch.rand(len(rows), dtype=torch.float64, device=logits.device)
    seeded = [j for j, i in enumerate(rows) if reqs[i].seed is not None]
    if seeded:
        draws = seeded_uniforms([reqs[rows[j]].seed for j in seeded], [len(reqs[rows[j]].output) for j in seeded],
                                logits.device)
        u[torch.tensor(seeded, device=logits.device)] = draws
    cdf = probs.cumsum(-1)
    # the first token whose cumulative mass exceeds u * total: a zero-probability token never is
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=cdf.size(1) - 1)
    toks[idx] = picked.to(toks.dtype)
    return toks.tolist()


class Engine:
    def __init__(self, args):
        self.args = args
        self.device = serving_device(args.device)
        self.model_path = args.model
        # SGLang's weight_version: a label of the weights served, set by update_weights_from_disk and
        # stamped on every response, so rollout can tell which policy generated a trajectory.
        self.weight_version = args.weight_version
        self.base_version = args.weight_version  # the base's label, served again once the adapter goes
        # the loaded LoRA adapters, in load order: name -> {"name", "path", "version", "checked"}, checked
        # being its (spec, weights) as read at load time
        self.adapters = {}
        self.adapter = None  # the one merged into the weights now (None: the base)
        self.dtype = serving_dtype(args.dtype, self.device, args.model)
        check_device(self.device, self.dtype)
        self.model = self._load(args.model)
        self.cfg = self.model.config
        self.detok = Detokenizer(args.model)
        self.context_len = min(self.cfg.max_position_embeddings, args.max_total_tokens)
        self.pool = KVPool(self.cfg, args.max_total_tokens, self.device, self.dtype)
        self.radix = None if getattr(args, "disable_radix_cache", False) else RadixCache(self.device)
        # decode reads the running requests' K/V as dense rows (running_kv.py), in at most as many
        # bytes as the pool; "pool" gathers them from the pool's slots each step instead
        self.running_kv = None if getattr(args, "decode_kv", "rows") == "pool" else RunningKV(
            self.cfg, self.device, self.dtype, self.pool.nbytes)
        self.retired = []  # caches dropped by a weight update while running requests still held nodes
        self.lock = threading.Condition()
        self.waiting = deque()
        self.running = []
        self.pending_ops = []  # callables run by the scheduler thread between iterations
        self.max_used = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.stopped = False
        self.dead = None  # why the scheduler thread died, once it has: every request then fails at once
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self.thread.start()

    def _load(self, path):
        model = load_model(path, self.device, self.dtype)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    # ---- called from HTTP threads ----
    def submit(self, reqs):
        for r in reqs:
            if r.reserve > self.pool.size:
                raise BadRequest(f"request needs {r.reserve} KV tokens (prompt {len(r.input_ids)} + max_new_tokens "
                                 f"{r.max_new}) but --max-total-tokens is {self.pool.size}")
        with self.lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self.waiting.extend(reqs)
            self.requests_total += len(reqs)
            self.lock.notify()

    def run_op(self, fn):
        """Runs fn on the scheduler thread (between batches) and returns its result."""
        box = {}
        ev = threading.Event()

        def op():
            try:
                box["value"] = fn()
            except Exception as e:  # handed back to the HTTP thread
                box["error"] = e
            ev.set()

        def fail(e):
            box["error"] = e
            ev.set()

        op.fail = fail
        with self.lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self.pending_ops.append(op)
            self.lock.notify()
        # the scheduler thread answers every op, also when it dies (_die); the bounded wait only
        # guards against a thread killed without running its handler
        while not ev.wait(1.0):
            if not self.thread.is_alive():
                raise EngineDead(self.dead or "the scheduler thread is gone")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def abort(self, rid=None, all_=False):
        def op():
            with self.lock:  # HTTP threads append to `waiting` concurrently
                return remove()

        def remove():
            n = 0
            for r in list(self.waiting):
                if all_ or r.rid == rid:
                    self.waiting.remove(r)
                    self._finish(r, {"type": "abort", "message": "Abort before prefill"})
                    n += 1
            for r in list(self.running):
                if all_ or r.rid == rid:
                    self._finish(r, {"type": "abort", "message": "Abort in running"})
                    n += 1
            self.running = [r for r in self.running if r.finish is None]
            return n
        return self.run_op(op)

    def update_weights(self, path, version=None):
        def op():
            cfg = read_config(path)
            if (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) != (
                    self.cfg.num_hidden_layers, self.cfg.num_key_value_heads, self.cfg.head_dim, self.cfg.vocab_size):
                raise CheckpointError(f"{path}: architecture differs from the served model")
            self.model = self._load(path)
            self.model_path = path
            # a new base: no adapter applies to it, and no request for one can be served
            self.adapter = None
            dropped, self.adapters = list(self.adapters), {}
            for name in dropped:
                self._fail_requests_for(name, f"adapter {name} was unloaded: the base weights were replaced")
            self._drop_cache()  # its K/V came from the old weights
            if version is not None:
                self.base_version = version
            self.weight_version = self.base_version
            self.detok = Detokenizer(path) if os.path.isfile(os.path.join(path, "tokenizer.json")) else self.detok
            return True
        return self.run_op(op)

    def flush_cache(self):
        self.run_op(self._drop_cache)
        return True

    def load_lora(self, name, path):
        """Registers adapter `name` from folder `path`, checked against the model; it is merged when a
        request names it (between batches). Returns its weight_version."""
        def op():
            if name in self.adapters:
                raise AdapterError(f"an adapter named {name} is already loaded (unload it first, or use a new "
                                   "name per version: a reused name could serve stale weights)")
            # read now and kept: the folder may be pruned (train-step --keep-checkpoints) before a
            # request for this adapter runs, and a folder rewritten meanwhile must not change it
            checked = check_adapter(self.model, path)
            # the step a name rstar-lora-step-N says (what rollout asks for), else the one saved with it
            prefix = "rstar-lora-step-"
            step = int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() else None
            if step is None:
                step = adapter_step(path)
            version = str(step) if step is not None else name
            self.adapters[name] = {"name": name, "path": path, "version": version, "checked": checked}
            self.weight_version = version  # the engine's label: the newest policy it holds
            return version
        return self.run_op(op)

    def unload_lora(self, name):
        def op():
            if name not in self.adapters:
                raise AdapterError(f"no adapter named {name} is loaded" + (
                    f" (loaded: {', '.join(self.adapters)})" if self.adapters else ""))
            del self.adapters[name]
            self._fail_unloaded(name)
            # running requests of a merged adapter finish on it; the next swap takes it out
            if self.adapter is not None and self.adapter["name"] == name and not self.running:
                self._merge(None)
            self._relabel()
            return True
        return self.run_op(op)

    def _relabel(self):
        """The engine's label once an adapter is gone: the newest one still loaded, else the base's."""
        self.weight_version = list(self.adapters.values())[-1]["version"] if self.adapters else self.base_version

    def _fail_requests_for(self, name, message):
        """Waiting requests naming adapter `name`, which is gone, end as aborts (an answer, never a hang)."""
        with self.lock:
            gone = [r for r in self.waiting if r.lora == name]
            for r in gone:
                self.waiting.remove(r)
        for r in gone:
            self._finish(r, {"type": "abort", "message": message})

    def _fail_unloaded(self, name):
        self._fail_requests_for(name, f"adapter {name} was unloaded before this request ran")

    def _merge(self, name):
        """The weights of adapter `name` (None: the base) in place of the merged one (scheduler thread,
        nothing running)."""
        remove_lora(self.model)  # the base exactly as it was (a no-op without an adapter)
        self.adapter = None
        self._drop_cache()  # its K/V came from the previous weights
        if name is None:
            return
        a = self.adapters[name]
        try:
            load_adapter(self.model, a["path"], a["checked"])
            merge_lora(self.model)
        except BaseException:
            remove_lora(self.model)
            raise
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.adapter = a

    def set_weight_version(self, version):
        def op():
            self.weight_version = version
            if not self.adapters and self.adapter is None:  # with adapters loaded it labels the newest one
                self.base_version = version
            return True
        return self.run_op(op)

    def stats(self):
        with self.lock:
            return {"used": self._used(), "running": len(self.running), "waiting": len(self.waiting),
                    "cached": 0 if self.radix is None else self.radix.tokens}

    def _used(self):
        """KV slots in use, cached tokens nobody is using counted as free (as SGLang reports them)."""
        return self.pool.used - self._evictable()

    def _evictable(self):
        return 0 if self.radix is None else self.radix.evictable

    # ---- scheduler thread ----
    def _loop(self):
        try:
            self._schedule()
        except BaseException as e:  # a bug outside the per-batch guard: fail loudly, never hang a waiter
            self._die(f"engine-serve: scheduler thread died: {e!r}")

    def _die(self, reason):
        sys.stderr.write(reason + "\n")
        with self.lock:
            self.dead = reason
            ops, self.pending_ops = self.pending_ops, []
            stranded = list(self.waiting) + list(self.running)
            self.waiting.clear()
            self.running = []
        for op in ops:  # each op answers its caller with the reason
            op.fail(EngineDead(reason))
        for r in stranded:
            if r.finish is None:
                r.finish = {"type": "abort", "message": reason}
                r.weight_version = self.weight_version
                r.text = ""
                r.done.set()

    def _schedule(self):
        while True:
            with self.lock:
                while not (self.waiting or self.running or self.pending_ops or self.stopped):
                    self.lock.wait()
                if self.stopped:
                    return
                ops, self.pending_ops = self.pending_ops, []
            for op in ops:  # aborts and weight updates, before admission so an abort finds its request
                op()
            swap = False
            with self.lock:
                admit = []
                merged = None if self.adapter is None else self.adapter["name"]
                # FIFO: the head waits until it fits, so a long request is never starved by short ones.
                while self.waiting and len(self.running) + len(admit) < self.args.max_running_requests:
                    if self.waiting[0].lora != merged:
                        # another adapter (or the base): once what runs now has finished, merge it
                        swap = not self.running and not admit
                        break
                    if not self._reserve(self.waiting[0]):
                        break
                    admit.append(self.waiting.popleft())
                self.max_used = max(self.max_used, self._used())
            if swap:
                head = self.waiting[0]
                if head.lora is not None and head.lora not in self.adapters:
                    self._fail_unloaded(head.lora)  # unloaded between its /generate check and its queueing
                    continue
                try:
                    self._merge(head.lora)
                except Exception as e:  # a folder changed since it was checked: its requests fail, not the engine
                    self.adapters.pop(head.lora, None)
                    self._relabel()
                    self._fail_requests_for(head.lora, f"adapter {head.lora} could not be applied: {e}")
                continue
            try:
                with torch.no_grad():
                    if admit:
                        self._prefill(admit)
                    self.running.extend(r for r in admit if r.finish is None)
                    if self.running:
                        self._decode()
            except Exception as e:  # never let one bad batch kill the server: fail its requests
                sys.stderr.write(f"engine-serve: scheduler error: {e!r}\n")
                for r in admit + self.running:
                    if r.finish is None:
                        self._finish(r, {"type": "abort", "message": f"internal error: {e}"}, cache=False)
                self.running = []
            with self.lock:
                self.running = [r for r in self.running if r.finish is None]

    def _reserve(self, r):
        """Takes r's KV reservation: the cached prefix of its input (locked) and free slots for the
        rest, evicting unused cached tokens when the pool is short. False when it does not fit."""
        node, prefix, c = None, None, 0
        if self.radix is not None:  # never past the first position whose logits r needs
            node, prefix, c = self.radix.match(r.input_ids[:r.logits_from()])
            self.radix.lock(node)
        need = r.reserve - c
        # evict only when that makes it fit (a request that must wait anyway keeps the cache intact)
        if len(self.pool.free) < need <= len(self.pool.free) + self._evictable():
            for slots in self.radix.evict(need - len(self.pool.free)):
                self.pool.release(slots)
        if need > len(self.pool.free):
            if node is not None:
                self.radix.unlock(node)
            return False
        own = self.pool.alloc(need)
        r.slots = torch.cat([prefix, own]) if c else own
        r.tree, r.node, r.shared, r.cached_tokens = self.radix, node, c, c
        return True

    def _share(self, r, node, prefix):
        """r's first len(prefix) tokens use the tree's slots `prefix` (the path to node, which r locks
        instead of its previous node); r's own slots that they replace go back to the pool."""
        k = prefix.numel()
        self.radix.lock(node)
        self.radix.unlock(r.node)
        own = r.slots[r.shared:k]
        self.pool.release(own[own != prefix[r.shared:k]])  # a slot the tree adopted from r stays
        r.slots = torch.cat([prefix, r.slots[k:]])
        r.node, r.shared = node, k

    def _rematch(self, r):
        """After other requests' prefill cached more of r's input: takes the longer prefix."""
        node, prefix, c = self.radix.match(r.input_ids[:r.logits_from()])
        if c > r.shared:
            self._share(r, node, prefix)
            r.cached_tokens = c

    def _cache_sequence(self, r, n):
        """Puts r's first n tokens (input, then output), whose K/V are in r.slots[:n], into the cache;
        where another request cached the same tokens first, r uses those and frees its copies.
        Returns False when r's cache is not the current one."""
        if r.tree is None or r.tree is not self.radix or n <= r.shared:
            return False
        ids = (r.input_ids + r.output)[:n] if n > len(r.input_ids) else r.input_ids[:n]
        self.radix.insert(ids, r.slots[:n])
        node, prefix, _ = self.radix.match(ids)
        self._share(r, node, prefix)
        return True

    def _drop_cache(self):
        """Drops the prefix cache (a weight update: its K/V came from the old weights). Nodes running
        requests still hold stay in a retired tree until they finish."""
        if self.radix is None:
            return
        with self.lock:
            self._retire()

    def _retire(self):
        old = self.radix
        for slots in old.evict(old.tokens):
            self.pool.release(slots)
        if old.tokens:
            self.retired.append(old)
        self.radix = RadixCache(self.device)

    def _prefill(self, rs):
        """Prefills new requests: when several carry the same input (a problem's n samples), one of
        them first; the others then find it cached and prefill only its last token."""
        first, rest, seen = [], [], set()
        for r in rs:
            key = tuple(r.input_ids) if self.radix is not None else r.serial
            (rest if key in seen else first).append(r)
            seen.add(key)
        self._prefill_chunks(first)
        if rest:
            with self.lock:  # HTTP threads read the pool's and the cache's counts
                for r in rest:
                    self._rematch(r)
            self._prefill_chunks(rest)

    def _prefill_chunks(self, rs):
        """In chunks of about PREFILL_TOKENS padded new tokens, and PREFILL_SCORES (query, key) pairs."""
        chunk, longest, widest = [], 0, 0
        for r in sorted(rs, key=lambda r: len(r.input_ids) - r.shared):
            n, P = len(r.input_ids) - r.shared, len(r.input_ids)
            size = len(chunk) + 1
            if chunk and (size * max(longest, n) > PREFILL_TOKENS or size * max(longest, n) * max(widest, P) > PREFILL_SCORES):
                self._prefill_chunk(chunk)
                chunk, longest, widest = [], 0, 0
            chunk.append(r)
            longest, widest = max(longest, n), max(widest, P)
        if chunk:
            self._prefill_chunk(chunk)

    def _prefill_chunk(self, rs):
        """Row i runs input tokens c_i..P_i-1 (c_i: its cached prefix) at their positions."""
        B = len(rs)
        lens = [len(r.input_ids) for r in rs]
        cs = [r.shared for r in rs]
        news = [P - c for P, c in zip(lens, cs)]
        T = max(news)
        ids = torch.zeros((B, T), dtype=torch.long)
        slots = torch.zeros((B, T), dtype=torch.long, device=self.device)
        # Logits are computed only from where they are needed (at or after the cached prefix)
        starts, los = [r.log_start() for r in rs], [r.logits_from() for r in rs]
        for i, r in enumerate(rs):
            P, c = lens[i], cs[i]
            ids[i, :P - c] = torch.tensor(r.input_ids[c:])
            slots[i, :P - c] = r.slots[c:P]
        R = max(P - lo for P, lo in zip(lens, los))
        at = torch.tensor([[min(lo + j, P - 1) - c for j in range(R)] for P, lo, c in zip(lens, los, cs)],
                          device=self.device)
        ids = ids.to(self.device)
        news_t = torch.tensor(news, device=self.device)
        valid = torch.arange(T, device=self.device)[None, :] < news_t[:, None]
        if not any(cs):
            logits = self.model(ids, cache=PrefillCache(self.pool, slots[valid], valid), logits_at=at).float()
        else:
            L = max(lens)
            table = torch.zeros((B, L), dtype=torch.long, device=self.device)
            for i, r in enumerate(rs):
                table[i, :lens[i]] = r.slots[:lens[i]]
            cs_t = torch.tensor(cs, device=self.device)
            positions = cs_t[:, None] + torch.arange(T, device=self.device)[None, :]
            keys = torch.arange(L, device=self.device)[None, None, :]
            mask = (keys <= positions[:, :, None]) & (keys < torch.tensor(lens, device=self.device)[:, None, None])
            prev = table.gather(1, (cs_t - 1).clamp(min=0)[:, None])[:, 0]
            cache = ExtendCache(self.pool, slots[valid], valid, table, mask[:, None], prev, cs_t > 0)
            logits = self.model(ids, positions, cache=cache, logits_at=at).float()
        self.prompt_tokens_total += sum(lens)
        self.cached_tokens_total += sum(r.cached_tokens for r in rs)
        for i, r in enumerate(rs):
            P, lo, start, c = lens[i], los[i], starts[i], cs[i]
            r.prefilled = True
            lg = logits[i, :P - lo]  # lg[j] predicts token lo + j + 1
            if r.return_logprob:
                lp = token_logprobs(lg[:-1], torch.tensor(r.input_ids[lo + 1:P], device=lg.device)).tolist() if P > 1 else []
                value = {lo + 1 + j: v for j, v in enumerate(lp)}
                r.in_logprobs = [[value.get(k), r.input_ids[k], None] for k in range(start, P)]
            if self.radix is not None:  # the prompt, for requests that arrive later with the same one
                with self.lock:
                    self._cache_sequence(r, P)
            if r.max_new == 0:
                self._finish(r, {"type": "length", "length": 0})
        go = [i for i, r in enumerate(rs) if r.finish is None]
        if go:
            last = torch.stack([logits[i, lens[i] - los[i] - 1] for i in go])
            self._accept_all([rs[i] for i in go], last)

    def _slot_table(self, rs):
        """(B, longest reservation) slot indices of the running requests, rebuilt only when they change."""
        key = tuple(r.serial for r in rs)
        if getattr(self, "_table_key", None) != key:
            width = max(r.slots.numel() for r in rs)
            table = torch.zeros((len(rs), width), dtype=torch.long, device=self.device)
            for i, r in enumerate(rs):
                table[i, :r.slots.numel()] = r.slots
            self._table_key, self._table = key, table
        return self._table

    def _decode(self):
        kv = self.running_kv
        if kv is not None:
            longest = max(len(r.input_ids) + len(r.output) for r in self.running)
            if kv.fits(len(self.running), longest):
                return self._decode_rows(kv)
            kv.clear()  # rows no step writes to go stale; requests rejoin from the pool when they fit
        rs = self.running
        table = self._slot_table(rs)
        lens = torch.tensor([len(r.input_ids) + len(r.output) for r in rs], device=self.device)  # after this step
        L = int(lens.max())
        ids = torch.tensor([[r.output[-1]] for r in rs], dtype=torch.long, device=self.device)
        positions = (lens - 1)[:, None]
        write = table.gather(1, positions)[:, 0]
        prev = table.gather(1, positions - 1)[:, 0]
        mask = torch.arange(L, device=self.device)[None, :] < lens[:, None]
        logits = self.model(ids, positions, DecodeCache(self.pool, write, table[:, :L], mask[:, None, None, :], prev))
        self._accept_all(rs, logits[:, -1].float())

    def _decode_rows(self, kv):
        # a request's K/V so far: its input and every output token but the last (sampled, not yet run)
        rs = kv.sync(self.running, self.pool, lambda r: len(r.input_ids) + len(r.output) - 1)
        pos, lens = kv.advance()
        write = self._slot_table(rs).gather(1, pos[:, None])[:, 0]
        ids = torch.tensor([[r.output[-1]] for r in rs], dtype=torch.long, device=self.device)
        logits = self.model(ids, pos[:, None], DenseDecodeCache(kv, self.pool, write, pos, lens))
        self._accept_all(rs, logits[:, -1].float())

    def _accept_all(self, rs, logits):
        """rs's next tokens from their (B, V) logits, chosen in one batched pass, with their log-probs
        (of the unscaled logits, as SGLang reports them) gathered likewise."""
        toks = choose_tokens(logits, rs)
        lps = None
        if any(r.return_logprob for r in rs):
            picked = torch.tensor(toks, device=logits.device)[:, None]
            lps = torch.log_softmax(logits, dim=-1).gather(1, picked)[:, 0].tolist()
        for i, r in enumerate(rs):
            self._accept(r, toks[i], None if lps is None else lps[i])

    def _accept(self, r, tok, lp):
        if r.first_token_time is None:
            r.first_token_time = time.time()
        r.output.append(tok)
        self.generation_tokens_total += 1
        if r.return_logprob:
            r.out_logprobs.append([lp, tok, None])
        if tok in r.stop_ids:
            self._finish(r, {"type": "stop", "matched": tok})
            return
        if r.stop_strs:
            # only the tail can hold a new match; decode it, and the whole output once a string matched
            tail = self.detok.decode(r.output[-r.stop_window:], r.skip_special)
            for s in r.stop_strs:
                if s and s in tail:
                    text = self.detok.decode(r.output, r.skip_special)
                    self._finish(r, {"type": "stop", "matched": s}, text[:text.index(s)])
                    return
        if len(r.output) >= r.max_new:
            self._finish(r, {"type": "length", "length": len(r.output)})

    def _finish(self, r, reason, text=None, cache=True):
        """cache=False: r's K/V may be incomplete (a failed batch); nothing of it goes into the cache."""
        r.finish = reason
        r.weight_version = self._served_version(r)
        r.text = text if text is not None else self.detok.decode(r.output, r.skip_special)
        if r.slots is not None:
            with self.lock:  # HTTP threads read the pool's counts
                self._release(r, cache)
        r.done.set()

    def _served_version(self, r):
        """The label of the weights that served r: its adapter's step, else the base's (the engine's
        own label when no adapter is loaded, as update_weight_version sets it)."""
        if r.lora is not None:
            a = self.adapters.get(r.lora) or (self.adapter if self.adapter and self.adapter["name"] == r.lora else None)
            return a["version"] if a else r.lora
        return self.weight_version if not self.adapters and self.adapter is None else self.base_version

    def _release(self, r, cache):
        # The K/V written: the input once prefilled, and every output token but the last (sampled,
        # never run). Cached for a later turn of the same conversation, which starts with them.
        done = len(r.input_ids) + max(len(r.output) - 1, 0) if r.prefilled else r.shared
        kept = r.shared
        if cache and self._cache_sequence(r, done):
            kept = done
        self.pool.release(r.slots[kept:])
        if r.tree is not None:
            r.tree.unlock(r.node)
            if r.tree is not self.radix:  # a dropped cache: free what no running request holds now
                for slots in r.tree.evict(r.tree.tokens):
                    self.pool.release(slots)
                if not r.tree.tokens:
                    self.retired.remove(r.tree)
        r.slots = r.tree = r.node = None

    def close(self):
        with self.lock:
            self.stopped = True
            self.lock.notify()
        self.thread.join(timeout=5)


def response_of(r):
    meta = {
        "id": r.rid,
        "finish_reason": r.finish,
        "prompt_tokens": len(r.input_ids),
        "completion_tokens": len(r.output),
        "cached_tokens": r.cached_tokens,
        "e2e_latency": round(time.time() - r.created, 6),
    }
    if r.weight_version is not None:
        meta["weight_version"] = r.weight_version
    if r.return_logprob:
        meta["input_token_logprobs"] = r.in_logprobs
        meta["output_token_logprobs"] = r.out_logprobs
    return {"text": r.text, "output_ids": r.output, "meta_info": meta}


def build_requests(body, engine):
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        if body.get("text") is not None:
            raise BadRequest("text prompts are not supported by engine-serve: send input_ids")
        raise BadRequest("input_ids: required")
    batched = isinstance(ids, list) and len(ids) > 0 and all(isinstance(x, list) for x in ids)
    prompts = ids if batched else [ids]
    if batched and not prompts:
        raise BadRequest("input_ids: empty batch")
    n = len(prompts)

    def per(key, default):
        v = body.get(key, default)
        if batched and isinstance(v, list) and key != "stop":
            if len(v) != n:
                raise BadRequest(f"{key}: {len(v)} values for {n} prompts")
            return v
        return [v] * n

    sps = per("sampling_params", {})
    loras = per("lora_path", None)
    for i, name in enumerate(loras):
        check_lora(engine, name, f"lora_path[{i}]" if batched else "lora_path")
    rls = per("return_logprob", False)
    lsl = per("logprob_start_len", -1)
    rids = body.get("rid")
    if rids is not None and not batched:
        rids = [rids]
    reqs = []
    V = engine.cfg.vocab_size
    for i, p in enumerate(prompts):
        where = f"input_ids[{i}]" if batched else "input_ids"
        if not isinstance(p, list) or not p:
            raise BadRequest(f"{where}: expected a non-empty array of token ids")
        for t in p:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= V:
                raise BadRequest(f"{where}: token id {t!r} is out of the vocabulary (vocab_size {V})")
        if len(p) >= engine.context_len:
            raise BadRequest(f"{where}: the input ({len(p)} tokens) is longer than the model's context length "
                             f"({engine.context_len} tokens)")
        sp = parse_sampling(sps[i], engine.cfg.eos_token_id, engine.context_len, len(p))
        rid = (rids[i] if rids is not None and i < len(rids) else None) or uuid.uuid4().hex
        reqs.append(Request(str(rid), p, sp, bool(rls[i]), int(lsl[i] if lsl[i] is not None else -1)))
        reqs[-1].lora = loras[i]
    return reqs, batched


def check_lora(engine, name, where):
    """A request is served by what it names: a loaded adapter, or the base when it names none."""
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"{where}: expected an adapter name, got {json.dumps(name)}")
    if name is not None and name not in engine.adapters:
        loaded = f" (loaded: {', '.join(engine.adapters)})" if engine.adapters else ""
        raise BadRequest(f"{where}: LoRA adapter {name} is not loaded{loaded} (POST /load_lora_adapter first)")


def metrics_text(engine):
    s = engine.stats()
    name = os.path.basename(os.path.normpath(engine.model_path))
    label = '{model_name="%s"}' % name.replace('"', "")
    rows = [
        ("sglang:num_used_tokens", "gauge", "KV cache tokens in use", s["used"]),
        ("sglang:token_usage", "gauge", "fraction of the KV budget in use", s["used"] / engine.pool.size),
        ("sglang:num_running_reqs", "gauge", "requests being decoded", s["running"]),
        ("sglang:num_queue_reqs", "gauge", "requests waiting for KV space", s["waiting"]),
        ("sglang:max_total_num_tokens", "gauge", "KV budget in tokens", engine.pool.size),
        ("sglang:prompt_tokens_total", "counter", "prompt tokens processed", engine.prompt_tokens_total),
        ("sglang:cached_tokens_total", "counter", "prompt tokens served from the prefix cache", engine.cached_tokens_total),
        ("sglang:cache_hit_rate", "gauge", "share of prompt tokens served from the prefix cache",
         engine.cached_tokens_total / max(1, engine.prompt_tokens_total)),
        ("rstar:radix_cache_tokens", "gauge", "tokens held by the prefix cache (in use or not)", s["cached"]),
        ("sglang:generation_tokens_total", "counter", "tokens generated", engine.generation_tokens_total),
        ("sglang:num_requests_total", "counter", "requests received", engine.requests_total),
        ("rstar:max_used_tokens", "gauge", "highest KV use seen", engine.max_used),
        ("rstar:kv_cache_bytes", "gauge", "bytes held by the KV pool", engine.pool.nbytes),
    ]
    out = []
    for key, kind, help_, value in rows:
        out += [f"# HELP {key} {help_}", f"# TYPE {key} {kind}", f"{key}{label} {value}"]
    return "\n".join(out) + "\n"


def make_handler(engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code, message):
            self._send(code, {"error": {"message": message}, "object": "error", "code": code})

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError as e:
                raise BadRequest(f"invalid JSON body: {e}")

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/ping"):
                if engine.dead is not None:  # as SGLang: unhealthy is a 503, so a router sets it aside
                    return self._error(503, engine.dead)
                return self._send(200, b"", "text/plain")
            if path in ("/get_server_info", "/server_info"):
                return self._send(200, server_info(engine))
            if path == "/get_weight_version":
                return self._send(200, {"weight_version": engine.weight_version})
            if path == "/get_model_info":
                return self._send(200, {"model_path": engine.model_path, "is_generation": True})
            if path in ("/get_load", "/v1/loads"):
                s = engine.stats()
                return self._send(200, [{"dp_rank": 0, "num_reqs": s["running"] + s["waiting"],
                                         "num_running_reqs": s["running"], "num_waiting_reqs": s["waiting"],
                                         "num_tokens": s["used"], "max_total_num_tokens": engine.pool.size}])
            if path == "/metrics":
                return self._send(200, metrics_text(engine), "text/plain; version=0.0.4")
            if path == "/flush_cache":
                engine.flush_cache()
                return self._send(200, "Cache flushed.\n", "text/plain")
            return self._error(404, f"no route {path}")

        def do_POST(self):
            path = self.path.split("?")[0]
            try:
                body = self._body()
                if path == "/generate":
                    if isinstance(body, dict) and body.get("stream"):
                        raise BadRequest("stream: not supported by engine-serve")
                    reqs, batched = build_requests(body, engine)
                    engine.submit(reqs)
                    for r in reqs:
                        r.done.wait()
                    out = [response_of(r) for r in reqs]
                    return self._send(200, out if batched else out[0])
                if path == "/update_weights_from_disk":
                    mp = body.get("model_path")
                    if not isinstance(mp, str) or not mp:
                        raise BadRequest("model_path: required")
                    version = body.get("weight_version")
                    if version is not None and not isinstance(version, str):
                        raise BadRequest("weight_version: expected a string")
                    try:
                        engine.update_weights(mp, version)
                    except CheckpointError as e:
                        return self._send(400, {"success": False, "message": str(e), "num_paused_requests": 0})
                    return self._send(200, {"success": True, "message": "Succeeded to update model weights.",
                                            "num_paused_requests": 0})
                if path == "/flush_cache":
                    engine.flush_cache()
                    return self._send(200, "Cache flushed.\n", "text/plain")
                if path in ("/load_lora_adapter", "/unload_lora_adapter"):
                    return self._lora(path, body)
                if path == "/update_weight_version":
                    version = body.get("new_version") if isinstance(body, dict) else None
                    if not isinstance(version, str) or not version:
                        raise BadRequest("new_version: expected a non-empty string")
                    engine.set_weight_version(version)
                    return self._send(200, {"success": True, "message": f"weight version updated to {version}"})
                if path == "/abort_request":
                    n = engine.abort(body.get("rid"), bool(body.get("abort_all")))
                    return self._send(200, {"aborted": n})
                return self._error(404, f"no route {path}")
            except BadRequest as e:
                return self._error(400, str(e))
            except EngineDead as e:  # the server cannot serve any more: say why, at once
                return self._error(503, str(e))
            except (BrokenPipeError, ConnectionResetError):
                return None

        def _lora(self, path, body):
            """SGLang's LoRA routes: success, error_message and loaded_adapters (a 400 on failure)."""
            name = body.get("lora_name") if isinstance(body, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest("lora_name: expected a non-empty string")
            try:
                if path == "/load_lora_adapter":
                    folder = body.get("lora_path")
                    if not isinstance(folder, str) or not folder:
                        raise BadRequest("lora_path: expected the adapter folder's path")
                    engine.load_lora(name, folder)
                else:
                    engine.unload_lora(name)
            except CheckpointError as e:  # AdapterError too: the folder, or the name, is wrong
                return self._send(400, {"success": False, "error_message": str(e),
                                        "loaded_adapters": loaded_adapters(engine)})
            return self._send(200, {"success": True, "error_message": "", "loaded_adapters": loaded_adapters(engine)})

    return Handler


def loaded_adapters(engine):
    return {a["name"]: a["path"] for a in list(engine.adapters.values())}


class Server(ThreadingHTTPServer):
    # A rollout opens hundreds of connections at once; the stdlib's backlog of 5 would reset them.
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client dropping an idle keep-alive connection (an HTTP pool closing at exit) resets it while
        # its thread waits for the next request line: nothing was asked, so there is nothing to report,
        # and a traceback per connection would bury the log's real errors.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def server_info(engine):
    cfg = engine.cfg
    return {
        "model_path": engine.model_path, "tokenizer_path": engine.model_path,
        "max_total_num_tokens": engine.pool.size, "context_length": engine.context_len,
        "max_running_requests": engine.args.max_running_requests, "page_size": 1,
        "disable_radix_cache": engine.radix is None,
        "loaded_adapters": loaded_adapters(engine),
        "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", ""),
        "kv_cache_bytes": engine.pool.nbytes, "vocab_size": cfg.vocab_size, "version": "rstar-engine/1",
        "threads": torch.get_num_threads(),
        "internal_states": [{"max_total_num_tokens": engine.pool.size}],
    }


def main(argv):
    p = argparse.ArgumentParser(prog="rstar-backend serve")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-total-tokens", type=int, default=65536)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--weight-version", default="0", help="the label of the weights served at start")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="prefill every request's whole input (no prefix cache), as SGLang's flag")
    p.add_argument("--decode-kv", choices=["rows", "pool"], default="rows",
                   help="rows: decode attends the running requests' K/V as dense rows, kept up to date (at most "
                        "the pool's bytes again); pool: gathers them from the pool's slots every step")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        sys.stderr.write(f"rstar engine-serve: --port {args.port}: expected 0..65535\n")
        return 2
    # Bind before loading anything: a taken port fails in a second, not after the checkpoint loads.
    try:
        server = Server((args.host, args.port), None)
    except OSError as e:
        sys.stderr.write(f"rstar engine-serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}\n")
        return 1
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        engine = Engine(args)
    except (CheckpointError, SetupError) as e:
        server.server_close()
        sys.stderr.write(f"rstar engine-serve: {e}\n")
        return 1
    server.RequestHandlerClass = make_handler(engine)
    serve_until_signal(server, engine)
    return 0


# A stop that has not finished by then (a scheduler step of a long batch) is cut short: the
# caller's grace before SIGKILL is 10 s, and a stopped server owes no one an answer.
STOP_DEADLINE_S = 5.0


def serve_until_signal(server, engine):
    """Serves until SIGINT or SIGTERM, then stops quietly: one line, no traceback.

    A terminal's Ctrl-C reaches the whole process group, and the wrapper forwards it too, so the
    engine sees the signal twice; only the first counts. The handler raises nothing: an exception
    thrown into whatever the main thread was running (a thread start, a lock wait) can leave a lock
    held and hang the exit, so it asks serve_forever to return, from another thread as the stdlib
    requires, and arms a deadline after which the process leaves whatever is still running. The
    process leaves with os._exit once the socket is closed and the scheduler stopped: interpreter
    teardown with torch's threads still around is what aborted in C++ before."""
    import signal

    stopping = threading.Event()

    def stop(signum, frame):
        if stopping.is_set():
            return
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()
        deadline = threading.Timer(STOP_DEADLINE_S, os._exit, args=(0,))
        deadline.daemon = True
        deadline.start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    sys.stderr.write(f"listening on http://{host}:{port}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        if stopping.is_set():
            sys.stderr.write("engine-serve: shutting down\n")
        server.server_close()
        engine.close()
    sys.stderr.flush()
    os._exit(0)
