"""Qwen3, Qwen2/Qwen2.5 and Llama 3.x in one file, nanoGPT style.

Module and parameter names follow Hugging Face's Qwen3ForCausalLM, Qwen2ForCausalLM and LlamaForCausalLM
exactly (model.layers.0.self_attn.q_proj.weight, ...) so a state_dict *is* a checkpoint: no renaming table
between us, SGLang and vLLM.

The three differ in a few named places, each a flag of ModelConfig: biases on q/k/v (Qwen2 always; o too
and the MLP's for Llama when its config says so), per-head q/k RMSNorm (Qwen3 only) and Llama 3's rope
frequency scaling. Everything else (pre-norm decoder, GQA, SwiGLU, half-split rotary) is the same code.

The same forward serves training (no cache, causal mask) and the engine (a KV cache object passed in),
so trainer and engine log-probs come from identical arithmetic.
"""

import math
from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

_sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0

# The architecture name a checkpoint with smeared keys declares, so SGLang and vLLM refuse it loudly
# instead of serving it as plain Qwen3 (which would ignore k_smear and compute something else).
SMEAR_ARCHITECTURE = "RStarQwen3ForCausalLM"

# arch -> (Hugging Face class name, model_type)
ARCHITECTURES = {
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "llama": ("LlamaForCausalLM", "llama"),
}
ARCH_BY_CLASS = {cls: arch for arch, (cls, _) in ARCHITECTURES.items()}
ARCH_BY_CLASS[SMEAR_ARCHITECTURE] = "qwen3"
ARCH_BY_TYPE = {mt: arch for arch, (_, mt) in ARCHITECTURES.items()}

# Fields that mean mixture-of-experts in the configs of Mixtral, Qwen2-MoE/Qwen3-MoE and DeepSeek: a dense
# model built from such a config would silently drop the experts.
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
              "num_experts_per_tok")


class UnsupportedConfig(ValueError):
    """A config.json this model file cannot compute faithfully; the message names the field."""


def _rope_settings(d):
    """(rope_theta, rope_scaling dict or None) from either spelling: rope_theta + rope_scaling
    (transformers 4.x) or rope_parameters (5.x, rope_theta inside)."""
    theta = d.get("rope_theta")
    scaling = d.get("rope_scaling")
    params = d.get("rope_parameters")
    name = "rope_scaling"
    if scaling is None and isinstance(params, dict):
        name = "rope_parameters"
        if any(isinstance(v, dict) for v in params.values()):
            raise UnsupportedConfig("rope_parameters: a different rope per layer type is not supported")
        theta = params.get("rope_theta", theta)
        scaling = params
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise UnsupportedConfig(f"{name}: expected an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise UnsupportedConfig(f"{name}: rope type {kind!r} is not supported (only llama3, or none)")
    out = {"rope_type": "llama3"}
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        v = scaling.get(key)
        if key == "original_max_position_embeddings" and v is None:
            v = d.get("max_position_embeddings")  # transformers falls back to it too
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise UnsupportedConfig(f"{name}: {key}: expected a positive number, got {v!r}")
        out[key] = v
    if out["high_freq_factor"] <= out["low_freq_factor"]:
        raise UnsupportedConfig(f"{name}: high_freq_factor must be greater than low_freq_factor")
    return theta, out


def select_arch(d, default="qwen3"):
    """The arch a config.json describes, from `architectures` and `model_type`; `default` when it names
    neither (our own tiny configs). Refuses an architecture this file does not implement, a model_type
    that contradicts the class name, and MoE."""
    for key in MOE_FIELDS:
        v = d.get(key)
        if v not in (None, 0, 1) or (key == "moe_intermediate_size" and v):
            raise UnsupportedConfig(f"{key}={v!r}: mixture-of-experts models are not supported (dense only)")
    classes = d.get("architectures")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise UnsupportedConfig(f"architectures: expected a list of class names, got {classes!r}")
    model_type = d.get("model_type")
    by_class = None
    if classes:
        known = [ARCH_BY_CLASS[c] for c in classes if c in ARCH_BY_CLASS]
        if not known:
            raise UnsupportedConfig(f"architectures: {', '.join(classes)} is not supported "
                                    f"(supported: {', '.join(c for c, _ in ARCHITECTURES.values())})")
        by_class = known[0]
    by_type = None
    if model_type is not None:
        by_type = ARCH_BY_TYPE.get(model_type)
        if by_type is None:
            raise UnsupportedConfig(f"model_type: {model_type!r} is not supported "
                                    f"(supported: {', '.join(ARCH_BY_TYPE)})")
    if by_class and by_type and by_class != by_type:
        raise UnsupportedConfig(f"model_type: {model_type!r} contradicts architectures {classes}")
    return by_class or by_type or default


@dataclass
class ModelConfig:
    arch: str = "qwen3"  # a key of ARCHITECTURES
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    # None, or Llama 3's {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings}
    rope_scaling: dict = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen3 and Llama: a bias on q, k, v and o (Qwen2 ignores it)
    mlp_bias: bool = False  # Llama only: a bias on gate, up and down
    initializer_range: float = 0.02
    bos_token_id: int = 0
    eos_token_id: int = 2
    pad_token_id: int = 0
    # every EOS id when config.json gives a list (Llama 3.1 instruct), written back as it came
    eos_token_ids: list = field(default_factory=list)
    torch_dtype: str = "float32"
    # Our extension, off for every Hugging Face model: each key mixes in the previous token's key (below).
    rstar_key_smear: bool = False

    @property
    def qkv_bias(self):
        return True if self.arch == "qwen2" else self.attention_bias

    @property
    def o_bias(self):
        return False if self.arch == "qwen2" else self.attention_bias

    @property
    def qk_norm(self):
        """Per-head RMSNorm of q and k before rotary: Qwen3's change over Qwen2."""
        return self.arch == "qwen3"

    @classmethod
    def from_dict(cls, d, arch=None):
        """A config from config.json's fields. arch: the architecture to build when `d` names none."""
        arch = select_arch(d, default=arch or "qwen3")
        known = {f.name for f in fields(cls)} - {"arch", "rope_scaling", "eos_token_ids"}
        kw = {k: v for k, v in d.items() if k in known and v is not None}
        kw["arch"] = arch
        theta, kw["rope_scaling"] = _rope_settings(d)
        if theta is not None:
            kw["rope_theta"] = theta
        if "torch_dtype" not in kw and isinstance(d.get("dtype"), str):  # transformers >= 4.56 spelling
            kw["torch_dtype"] = d["dtype"]
        if "head_dim" not in kw and "hidden_size" in kw and "num_attention_heads" in kw:
            kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]
        if isinstance(kw.get("eos_token_id"), list):  # HF allows a list; the first is the primary EOS
            kw["eos_token_ids"] = list(kw["eos_token_id"])
            kw["eos_token_id"] = kw["eos_token_id"][0] if kw["eos_token_id"] else cls.eos_token_id
        if arch == "llama" and "tie_word_embeddings" not in kw:
            kw["tie_word_embeddings"] = False  # LlamaConfig's default, unlike Qwen's
        _refuse_unsupported(d, arch)
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    def validate(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"config: arch: expected one of {', '.join(ARCHITECTURES)}, got {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"config.json: {name}: expected a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
        for name in ("rstar_key_smear", "attention_bias", "mlp_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"config.json: {name}: expected true or false, got {getattr(self, name)!r}")
        if self.rstar_key_smear and self.arch != "qwen3":
            raise UnsupportedConfig(f"rstar_key_smear: an extension of Qwen3 only, not of {self.arch}")
        if self.mlp_bias and self.arch != "llama":
            raise UnsupportedConfig(f"mlp_bias: {self.arch} models have no MLP bias")
        if self.arch == "qwen2" and self.head_dim * self.num_attention_heads != self.hidden_size:
            # Qwen2 derives head_dim from hidden_size in vLLM and older transformers: another one would
            # be served as a different model
            raise UnsupportedConfig(f"head_dim: {self.head_dim} x num_attention_heads {self.num_attention_heads}"
                                    f" differs from hidden_size {self.hidden_size} (Qwen2 has no free head_dim)")
        if self.head_dim % 2 != 0:
            raise ValueError("config.json: head_dim must be even (rotary embeddings rotate pairs)")

    def to_hf(self):
        """config.json as Hugging Face writes it for this architecture, so other tools load our checkpoints."""
        cls, model_type = ARCHITECTURES[self.arch]
        eos = self.eos_token_ids if self.eos_token_ids else self.eos_token_id
        hf = {
            "architectures": [cls],
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "model_type": model_type,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_theta": self.rope_theta,
            "sliding_window": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype,
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": self.vocab_size,
        }
        if self.arch == "qwen2":
            # Qwen2Config has neither field: its q/k/v bias is fixed and head_dim is hidden / heads
            del hf["attention_bias"], hf["head_dim"]
        if self.arch == "llama":
            del hf["max_window_layers"], hf["sliding_window"], hf["use_sliding_window"]
            hf["mlp_bias"] = self.mlp_bias
            hf["pretraining_tp"] = 1
        if self.rstar_key_smear:  # only written when on, so plain Qwen3 configs stay byte-identical
            hf["architectures"] = [SMEAR_ARCHITECTURE]
            hf["rstar_key_smear"] = True
        return hf


def _refuse_unsupported(d, arch):
    """What would make our forward differ from Hugging Face's for this config, named by its field."""
    if d.get("use_sliding_window") is True:
        raise UnsupportedConfig("use_sliding_window: true: sliding-window attention is not supported")
    layer_types = d.get("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        raise UnsupportedConfig("layer_types: only full_attention layers are supported (sliding window is not)")
    if arch == "llama" and d.get("sliding_window") is not None:
        raise UnsupportedConfig(f"sliding_window={d['sliding_window']!r}: sliding-window attention is not supported")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedConfig(f"hidden_act: {act!r} is not supported (only silu)")
    prf = d.get("partial_rotary_factor")
    if prf not in (None, 1, 1.0):
        raise UnsupportedConfig(f"partial_rotary_factor={prf!r}: partial rotary embeddings are not supported")


# Code written before the other architectures imports these names.
Qwen3Config = ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, factory=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **(factory or {})))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()  # the variance in fp32 even for bf16 weights, as Qwen3 does
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_frequencies(head_dim, theta, scaling=None):
    """The inverse frequencies, computed in fp32 on the CPU (the same bits wherever they are used).

    scaling: None, or Llama 3's rope_scaling (ModelConfig.rope_scaling), which leaves the frequencies
    whose wavelength is under original_max_position_embeddings / high_freq_factor alone, divides those
    whose wavelength is over original_max_position_embeddings / low_freq_factor by factor, and blends
    linearly in 1/wavelength between the two (Hugging Face's _compute_llama3_parameters)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if not scaling:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    long_waves = wavelength > context / low  # low frequencies: slowed down by factor
    short_waves = wavelength < context / high  # high frequencies: kept
    slowed = torch.where(long_waves, inv_freq / factor, inv_freq)
    # the blend weight runs from 0 at the low-frequency edge to 1 at the high-frequency one
    weight = (context / wavelength - low) / (high - low)
    blended = (1 - weight) * slowed / factor + weight * slowed
    return torch.where(~long_waves & ~short_waves, blended, slowed)


class Rotary(nn.Module):
    """Rotary embeddings in the half-split layout that Hugging Face's Qwen3, Qwen2 and Llama use.

    inv_freq stays fp32 whatever the model is cast to: a bf16 inv_freq is off by up to 0.4%, a rotation
    wrong by radians a few hundred positions in, so a bf16-served model would disagree with the trainer
    (fp32 weights) on every long sequence. Every cast or move (`.to()`, `.bfloat16()`, `to_empty()`
    after building on the meta device) recomputes it in fp32 on the new device; cos/sin are still cast
    to the compute dtype in forward."""

    def __init__(self, head_dim, theta, device=None, scaling=None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer("inv_freq", rotary_frequencies(head_dim, theta, scaling).to(device or "cpu"),
                             persistent=False)

    def _apply(self, fn, *args, **kwargs):  # torch >= 2.0 passes `recurse`
        super()._apply(fn, *args, **kwargs)
        self.inv_freq = rotary_frequencies(self.head_dim, self.theta, self.scaling).to(self.inv_freq.device)
        return self

    def forward(self, positions, dtype):
        # positions: (B, T) -> cos/sin (B, 1, T, head_dim), broadcast over heads
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg, layer_idx, factory):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        b = cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_head * self.head_dim, bias=b, **factory)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=b, **factory)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=b, **factory)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, cfg.hidden_size, bias=cfg.o_bias, **factory)
        # per-head norms: Qwen3's change over Qwen2 (None elsewhere, so the state dict has no such key)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, factory) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, factory) if cfg.qk_norm else None
        # Smeared keys (Olsson et al. 2022, "In-context learning and induction heads"): key t becomes
        # s*k_t + (1-s)*k_{t-1}, s = sigmoid(k_smear) per KV head, before rotary. A key then says which
        # token came *before* it, so one head can find "the token after the one I just wrote": copying a
        # number from the prompt, which a from-scratch tiny model otherwise learns only after a slow
        # two-layer induction circuit forms. Not part of Qwen3; off unless config.rstar_key_smear.
        self.k_smear = nn.Parameter(torch.zeros(self.n_kv, **factory)) if cfg.rstar_key_smear else None

    def forward(self, x, cos, sin, cache=None, has_prev=None, rows=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if self.k_smear is not None:
            if cache is not None:
                prev = cache.previous_keys(self.layer_idx, k)
            else:  # has_prev zeroes the key "before" position 0
                prev = previous_in_row(k) * has_prev
            s = torch.sigmoid(self.k_smear).view(1, -1, 1, 1).to(k.dtype)
            k = s * k + (1 - s) * prev
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        mask = None  # None means plain causal attention over this call's own tokens
        if cache is not None:
            k, v, mask = cache.update(self.layer_idx, k, v)
        if rows is not None:  # only attention needs the rows apart
            q, k, v = rows.pad(q), rows.pad(k), rows.pad(v)
        rep = self.n_head // self.n_kv
        if rep > 1 and _sdpa is not None:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = attend(q, k, v, mask)
        if rows is not None:
            return self.o_proj(rows.unpad(y))
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class Rows:
    """Right-padded rows of the given lengths, flattened to their real tokens only.

    Training batches are right-padded to the longest row (a third of the tokens are padding with
    uniformly drawn SFT batches), but only attention needs rows apart: projections, norms and the MLP
    run on the N real tokens as one sequence (1, N, C), and attention scatters q, k, v into the padded
    (B, H, T, D) layout and gathers its output back. Padded keys sit after every real query of their
    row, so the causal mask already hides them."""

    def __init__(self, lengths, device):
        self.B, self.T = len(lengths), max(lengths)
        self.offsets = torch.tensor([0] + list(lengths[:-1]), device=device).cumsum(0)  # each row's first token
        self.positions = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        row = torch.cat([torch.full((n,), b, device=device) for b, n in enumerate(lengths)])
        self.index = row * self.T + self.positions[0]  # flat token -> slot in the (B * T) padded layout

    def flatten(self, ids):
        """(B, T) padded ids -> (1, N) real ids."""
        return ids.reshape(-1).index_select(0, self.index)[None]

    def flat_index(self, at):
        """(B, R) positions within rows -> (B, R) indices among the N real tokens."""
        return self.offsets[:, None] + at

    def pad(self, t):
        """(1, H, N, D) -> (B, H, T, D), zeros at padding."""
        _, H, _, D = t.shape
        out = t.new_zeros(self.B * self.T, H, D).index_copy(0, self.index, t[0].transpose(0, 1))
        return out.view(self.B, self.T, H, D).transpose(1, 2)

    def unpad(self, y):
        """(B, H, T, D) -> (1, N, H * D)."""
        B, H, T, D = y.shape
        return y.transpose(1, 2).reshape(B * T, H * D).index_select(0, self.index)[None]


def previous_in_row(k):
    """(B, H, T, D) -> each position's previous column along T, zeros before the first."""
    return F.pad(k, (0, 0, 1, 0))[:, :, :k.size(2)]


def _rows_view(t):
    """(B, G, L, D) -> a (B * G, L, D) view without a copy, or None when the strides do not allow it."""
    B, G, L, D = t.shape
    if t.stride(3) != 1 or t.stride(2) != D or t.stride(0) != G * t.stride(1):
        return None
    return t.view(B * G, L, D)


def attend(q, k, v, mask):
    """Softmax attention. mask: None (causal) or a bool tensor broadcastable to (B, H, Tq, Tk), True = keep."""
    if _sdpa is not None:
        if mask is None:
            return _sdpa(q, k, v, is_causal=True)
        return _sdpa(q, k, v, attn_mask=mask)
    # Grouped-query attention without copying K and V per query head: the query heads that share a KV
    # head are stacked along the query axis, (B, G, H/G * Tq, D), so one plain batched matmul per KV
    # head does it (a decode step otherwise spends ~a quarter of its time in repeat_interleave).
    B, H, Tq, D = q.shape
    G, Tk = k.size(1), k.size(2)
    rep = H // G
    decode_mask = mask is not None and mask.dim() == 4 and mask.size(1) == 1 and mask.size(2) == 1
    kk, vv = _rows_view(k), _rows_view(v)
    if decode_mask and kk is not None and vv is not None:
        # K/V as dense rows (engine-serve's running requests, (B, G) mergeable): one (B * G) batched
        # matmul each on views, the query heads of a KV head stacked along the query axis
        qq = q.reshape(B * G, rep * Tq, D)
        att = torch.bmm(qq, kk.transpose(1, 2)).view(B, G, rep * Tq, Tk) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att.float(), dim=-1).to(q.dtype)
        return torch.bmm(att.view(B * G, rep * Tq, Tk), vv).view(B, H, Tq, D)
    if decode_mask and k.transpose(0, 1).is_contiguous() and v.transpose(0, 1).is_contiguous():
        # K/V stored KV head outermost (engine-serve's decode gathers from its pool that way): one
        # (G * B) batched matmul each, on views, with no transposing copy of the gathered cache
        kk, vv = k.transpose(0, 1).reshape(G * B, Tk, D), v.transpose(0, 1).reshape(G * B, Tk, D)
        qq = q.reshape(B, G, rep * Tq, D).transpose(0, 1).reshape(G * B, rep * Tq, D)
        att = torch.bmm(qq, kk.transpose(1, 2)).view(G, B, rep * Tq, Tk) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~mask.view(1, mask.size(0), 1, Tk), float("-inf"))
        att = torch.softmax(att.float(), dim=-1).to(q.dtype)
        y = torch.bmm(att.view(G * B, rep * Tq, Tk), vv).view(G, B, rep * Tq, D)
        return y.transpose(0, 1).reshape(B, H, Tq, D)
    att = (q.reshape(B, G, rep * Tq, D) @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    if mask is None:
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    if mask.dim() < 4:
        mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if mask.size(1) == H and H != G:  # a mask per query head: grouped like the queries
        mask = mask.expand(mask.size(0), H, Tq, Tk).reshape(mask.size(0), G, rep * Tq, Tk)
    elif mask.size(-2) == Tq and Tq > 1 and rep > 1:
        mask = mask.repeat(1, 1, rep, 1)
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att.float(), dim=-1).to(q.dtype)
    return (att @ v).view(B, H, Tq, D)


class MLP(nn.Module):
    def __init__(self, cfg, factory):
        super().__init__()
        b = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=b, **factory)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=b, **factory)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=b, **factory)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx, factory):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, factory)
        self.self_attn = Attention(cfg, layer_idx, factory)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, factory)
        self.mlp = MLP(cfg, factory)

    def forward(self, x, cos, sin, cache=None, has_prev=None, rows=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, has_prev, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg, factory):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, factory) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, factory)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, factory.get("device"), cfg.rope_scaling)


INIT_SCHEMES = ("normal", "induction")


class CausalLM(nn.Module):
    """Qwen3ForCausalLM, Qwen2ForCausalLM or LlamaForCausalLM, as cfg.arch says."""

    def __init__(self, cfg, device=None, dtype=None):
        """device/dtype: where and in what the parameters are created. device="meta" allocates nothing
        (checkpoint.load_model builds so, then materialises the weights it reads in their place)."""
        super().__init__()
        factory = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
        self.config = cfg
        self.model = Body(cfg, factory)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)
        self.tie_weights()

    def tie_weights(self):
        """The head shares the embedding matrix when the config says so (again after to_empty(), which
        gives each module a parameter of its own)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed, scheme="normal"):
        """scheme "normal": N(0, initializer_range) as Hugging Face does. "induction": the same, then
        the attention heads above the first layer start as copying heads (induction_init below)."""
        if scheme not in INIT_SCHEMES:
            raise ValueError(f"init scheme must be one of {', '.join(INIT_SCHEMES)}, not {scheme!r}")
        g = torch.Generator().manual_seed(seed)
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("k_smear"):
                    p.zero_()  # an even mix of this key and the previous one
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
        if scheme == "induction":
            self.induction_init(g)

    @torch.no_grad()
    def induction_init(self, g, noise=0.5, smear_logit=-2.0):
        """Start each head above the first layer as an induction head, so copying tokens from the
        context is there at step 0.

        Mimetic initialisation (Trockman & Kolter 2023, "Mimetic initialization of self-attention
        layers"): each query head is its KV head's key projection (plus noise), so a query matches keys
        of the same token; each head's block of o_proj is its value projection transposed (plus noise),
        so what a head reads is written back as that token's direction, which the tied embedding turns
        into a logit for the same token. With smeared keys the gate starts at sigmoid(smear_logit),
        0.12: a key mostly describes the token *before* it, so matching the token just written lands
        on the token that followed its earlier occurrence. The first layer keeps the normal init: it
        learns to carry the previous tokens into the residual stream, which the copying heads then
        match as well, so a repeated digit no longer sends them to the wrong occurrence (with every
        layer copying, digit accuracy stalled near 0.78; docs/sft.md). A from-scratch tiny model
        otherwise spends hundreds of SFT steps on a plateau before such heads form."""
        cfg = self.config
        D, std = cfg.head_dim, cfg.initializer_range
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        for layer in self.model.layers[1:]:
            at = layer.self_attn
            for h in range(cfg.num_attention_heads):
                kv = slice((h // rep) * D, (h // rep + 1) * D)
                rows = slice(h * D, (h + 1) * D)
                at.q_proj.weight[rows] = at.k_proj.weight[kv] + noise * std * torch.randn(D, cfg.hidden_size, generator=g)
                at.o_proj.weight[:, rows] = at.v_proj.weight[kv].T + noise * std * torch.randn(cfg.hidden_size, D, generator=g)
            if at.k_smear is not None:
                at.k_smear.fill_(smear_logit)

    def forward(self, input_ids, positions=None, cache=None, logits_at=None, lengths=None):
        """input_ids (B, T) -> logits (B, T, V). positions default to 0..T-1 (right-padded batches).

        logits_at (B, R) picks the positions whose logits are wanted (the response, the last prompt
        token), so the vocabulary projection, the biggest matmul of a small model, skips the rest.
        lengths (B,), training only: the real length of each right-padded row, so everything but
        attention skips the padding (Rows); the logits are the same.
        """
        B, T = input_ids.shape
        rows = None
        if lengths is not None:
            assert cache is None and positions is None, "lengths is for right-padded training batches"
            rows = Rows(lengths, input_ids.device)
            input_ids, positions = rows.flatten(input_ids), rows.positions
        elif positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary(positions, x.dtype)
        # smeared keys: zero the key "before" each row's first token (flat rows: each row's start)
        has_prev = (positions > 0)[:, None, :, None].to(x.dtype) if self.config.rstar_key_smear else None
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, has_prev, rows)
        if rows is not None:
            x = x[0][rows.flat_index(logits_at)] if logits_at is not None else rows.pad(x[:, None])[:, 0]
        elif logits_at is not None:
            x = x.gather(1, logits_at.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        return self.lm_head(self.model.norm(x))


# Code written before the other architectures imports these names.
Qwen3Body = Body
Qwen3ForCausalLM = CausalLM


def token_logprobs(logits, targets, temperature=1.0):
    """log p(target) per position, in fp32, without materialising a (B, T, V) log-softmax twice."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits):
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)
