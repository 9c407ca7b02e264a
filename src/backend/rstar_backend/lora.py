"""LoRA adapters on the model's linear layers, saved and loaded in PEFT's format.

A LoRA layer computes what PEFT's lora.Linear computes (huggingface/peft, src/peft/tuners/lora/layer.py):

    y = x W^T + b + scaling * B(A(dropout(x))),   scaling = lora_alpha / r

with A (r, in) drawn kaiming-uniform(a = sqrt(5)), i.e. uniform in +-1/sqrt(in), and B (out, r) zero, so
a fresh adapter leaves the model exactly as it was. The base weight and bias stay the wrapped layer's
own parameters under their own names, so the model's state_dict keeps the Hugging Face names of the
base (model.layers.N.self_attn.q_proj.weight) and gains the adapter's beside them
(model.layers.N.self_attn.q_proj.lora_A.weight).

An adapter checkpoint is a folder, as PEFT's save_pretrained writes it:
  adapter_config.json         LoraConfig's fields (peft_type "LORA", r, lora_alpha, target_modules, ...)
  adapter_model.safetensors   base_model.model.<module path>.lora_A.weight / .lora_B.weight
PEFT drops the adapter's name ("default") from the keys when it saves (src/peft/utils/save_and_load.py),
and its PeftModel wraps the causal LM as base_model.model, hence the prefix. rstar's own metadata (the
training step) goes into the safetensors header, never into adapter_config.json: older PEFT releases
pass every field of that file to LoraConfig(...) and fail on one they do not know.
"""

import contextlib
import json
import math
import os
import shutil
import struct
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checkpoint import CheckpointError, SafetensorsFile, read_json_object, replace_folder, save_safetensors

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHORT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
               "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


class AdapterError(CheckpointError):
    """An adapter folder (or a model) that cannot be used; the message names the file and the field."""


@dataclass
class LoraSpec:
    """PEFT LoraConfig's fields that decide the computation."""

    r: int
    alpha: float
    dropout: float = 0.0
    targets: tuple = ALL_TARGETS

    def __post_init__(self):
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise AdapterError(f"LoRA rank must be a positive integer, got {self.r!r}")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not self.alpha > 0:
            raise AdapterError(f"LoRA alpha must be a positive number, got {self.alpha!r}")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise AdapterError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        self.targets = tuple(self.targets)
        if not self.targets or any(t not in ALL_TARGETS for t in self.targets):
            raise AdapterError(f"LoRA targets must be among {', '.join(ALL_TARGETS)}, got {list(self.targets)}")
        self.alpha = float(self.alpha)
        self.dropout = float(self.dropout)

    @property
    def scaling(self):
        return self.alpha / self.r


def parse_targets(text):
    """`all-linear` or a comma list of short (q, k, v, o, gate, up, down) or HF (q_proj, ...) names ->
    the HF module names, in the model's order."""
    if text in ("all-linear", "all"):
        return ALL_TARGETS
    names = set()
    for part in str(text).split(","):
        part = part.strip()
        name = SHORT_NAMES.get(part, part)
        if name not in ALL_TARGETS:
            raise AdapterError(f"--lora-targets: unknown module {part!r} (expected all-linear or a comma list "
                               f"of {', '.join(SHORT_NAMES)})")
        names.add(name)
    return tuple(t for t in ALL_TARGETS if t in names)


class LoraLinear(nn.Linear):
    """An nn.Linear (same weight and bias Parameters) plus a LoRA branch. The adapter's A and B are
    fp32 whatever the base's dtype: they are the trained (master) weights."""

    def __init__(self, base, spec, generator):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.r, self.scaling = spec.r, spec.scaling
        device = base.weight.device
        self.lora_dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        self.lora_A = nn.Linear(self.in_features, spec.r, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(spec.r, self.out_features, bias=False, device=device, dtype=torch.float32)
        # kaiming_uniform_(a=sqrt(5)) has bound gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)):
        # 1 / sqrt(in). Drawn from our generator so the init is the same for a seed on every torch.
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            a = (torch.rand(spec.r, self.in_features, generator=generator) * 2 - 1) * bound
            self.lora_A.weight.copy_(a)
            self.lora_B.weight.zero_()
        self.base_copy = None  # while merged: the base weight exactly as it was before the merge
        self.enabled = True  # False inside disabled(): the base model's forward

    @property
    def merged(self):
        return self.base_copy is not None

    def delta(self):
        """scaling * B @ A in fp32, the change a merge adds to the base weight."""
        return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.merged or not self.enabled:
            return y
        h = self.lora_A(self.lora_dropout(x).to(self.lora_A.weight.dtype))
        return y + (self.lora_B(h) * self.scaling).to(y.dtype)

    def extra_repr(self):
        return f"{super().extra_repr()}, r={self.r}, scaling={self.scaling}"


@contextlib.contextmanager
def disabled(model):
    """The base model's forward inside the block: the LoRA branches are skipped (the trainer's KL
    reference with LoRA is the base itself, so it needs no second copy of the model)."""
    layers = [m for _, m in lora_layers(model)]
    if any(m.merged for m in layers):
        raise AdapterError("disabled(): the adapter is merged into the weights (unmerge_lora first)")
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m in layers:
            m.enabled = True


def lora_layers(model):
    """[(module path, LoraLinear)] of the model, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLinear)]


def _parent(model, path):
    *up, leaf = path.split(".")
    parent = model
    for part in up:
        parent = getattr(parent, part)
    return parent, leaf


def add_lora(model, spec, seed=0):
    """Wraps each target nn.Linear of the model in place and freezes every non-LoRA parameter.
    A target that matches no linear layer of the model is an error (a typo would train nothing)."""
    if lora_layers(model):
        raise AdapterError("the model already has LoRA layers (remove_lora first)")
    g = torch.Generator().manual_seed(seed)
    found = {t: 0 for t in spec.targets}
    for path, module in list(model.named_modules()):
        leaf = path.rsplit(".", 1)[-1]
        if leaf in found and type(module) is nn.Linear:
            parent, name = _parent(model, path)
            setattr(parent, name, LoraLinear(module, spec, g))
            found[leaf] += 1
    absent = [t for t, n in found.items() if n == 0]
    if absent:
        remove_lora(model)
        raise AdapterError(f"target_modules: {', '.join(absent)} matches no linear layer of the model")
    for name, p in model.named_parameters():
        p.requires_grad_(is_lora_key(name))
    model.lora_spec = spec


def remove_lora(model):
    """Back to plain nn.Linear layers holding the base weights (unmerged first when merged)."""
    for path, m in lora_layers(model):
        if m.merged:
            m.weight.data.copy_(m.base_copy)
        plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        plain.weight, plain.bias = m.weight, m.bias
        parent, name = _parent(model, path)
        setattr(parent, name, plain)
    if hasattr(model, "lora_spec"):
        del model.lora_spec


def is_lora_key(name):
    """Whether a model parameter or state_dict name is an adapter weight."""
    return ".lora_A." in name or ".lora_B." in name


def lora_parameters(model):
    """The adapter parameters only (what the optimizer trains), in module order."""
    return [p for name, p in model.named_parameters() if is_lora_key(name)]


def adapter_state_dict(model, state=None, dtype=None):
    """{PEFT key: tensor} of the adapter. state: the model's state dict (or a gathered copy of it, as
    a sharded trainer has), default model.state_dict(); dtype: default the trained dtype (fp32)."""
    state = model.state_dict() if state is None else state
    out = {}
    for name, t in state.items():
        if is_lora_key(name):
            t = t.detach()
            out[PREFIX + name] = t.to(dtype) if dtype is not None else t
    return out


def peft_config(spec, base_model_name_or_path):
    """adapter_config.json as PEFT's LoraConfig.save_pretrained writes it, limited to the fields that
    PEFT releases since 0.9 all know (an unknown field fails LoraConfig(**fields) on older ones).
    Field names: huggingface/peft src/peft/config.py (PeftConfigMixin, PeftConfig) and
    src/peft/tuners/lora/config.py (LoraConfig)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "r": spec.r,
        "lora_alpha": int(spec.alpha) if spec.alpha.is_integer() else spec.alpha,  # PEFT's field is an int
        "lora_dropout": spec.dropout,
        "target_modules": sorted(spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def write_adapter(folder, tensors, spec, base_model_name_or_path, step=None):
    """Writes adapter_config.json and adapter_model.safetensors ({PEFT key: tensor}) into an existing
    folder, as they are (the trainer writes them into its own temporary folder)."""
    if not tensors:
        raise AdapterError("the model has no LoRA layers to save")
    meta = {"format": "pt"}
    if step is not None:
        meta["rstar_step"] = str(step)
    save_safetensors(tensors, os.path.join(folder, WEIGHTS), metadata=meta)
    with open(os.path.join(folder, CONFIG), "w") as f:
        json.dump(peft_config(spec, base_model_name_or_path), f, indent=2, sort_keys=True)  # as PEFT writes it
        f.write("\n")


def save_adapter(model, spec, folder, base_model_name_or_path, step=None, state=None, dtype=None):
    """Writes the adapter folder atomically: into a temporary folder beside it, then renamed over it,
    so a reader never sees half an adapter. The step goes into the safetensors metadata."""
    tensors = adapter_state_dict(model, state, dtype)
    folder = os.path.normpath(folder)
    tmp = f"{folder}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_adapter(tmp, tensors, spec, base_model_name_or_path, step)
    replace_folder(tmp, folder)


def is_adapter(folder):
    return os.path.isfile(os.path.join(folder, CONFIG))


def adapter_metadata(folder):
    """The safetensors header's __metadata__ of an adapter folder ({} when none)."""
    path = os.path.join(folder, WEIGHTS)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(n)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error) as e:
        raise AdapterError(f"{path}: not a safetensors file ({e})")


def adapter_step(folder):
    """The training step an rstar adapter was saved at (metadata rstar_step), or None."""
    step = adapter_metadata(folder).get("rstar_step")
    return int(step) if step is not None and str(step).isdigit() else None


def _field(raw, path, name, check, what):
    if name not in raw:
        raise AdapterError(f"{path}: {name}: missing")
    value = raw[name]
    if not check(value):
        raise AdapterError(f"{path}: {name}: expected {what}, got {json.dumps(value)}")
    return value


def read_adapter(folder):
    """(LoraSpec, {PEFT key: tensor}) of an adapter folder, checked; AdapterError names the file and
    field of the first problem."""
    if not os.path.isdir(folder):
        raise AdapterError(f"{folder}: not a directory (expected an adapter folder with {CONFIG})")
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):
        raise AdapterError(f"{path}: missing (not an adapter folder)")
    raw = read_json_object(path, AdapterError)
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    _field(raw, path, "peft_type", lambda v: v == "LORA", '"LORA"')
    r = _field(raw, path, "r", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
               "a positive integer")
    alpha = _field(raw, path, "lora_alpha", lambda v: num(v) and v > 0, "a positive number")
    dropout = raw.get("lora_dropout", 0.0)
    if not (num(dropout) and 0 <= dropout < 1):
        raise AdapterError(f"{path}: lora_dropout: expected a number in [0, 1), got {json.dumps(dropout)}")
    targets = _field(raw, path, "target_modules",
                     lambda v: isinstance(v, list) and v and all(isinstance(t, str) for t in v),
                     "a list of module names")
    unknown = [t for t in targets if t not in ALL_TARGETS]
    if unknown:
        raise AdapterError(f"{path}: target_modules: {', '.join(unknown)} is not a linear layer of this model "
                           f"(expected among {', '.join(ALL_TARGETS)})")
    # what would change the computation and is not implemented: refused rather than silently ignored
    for name, plain in (("bias", "none"), ("fan_in_fan_out", False), ("use_rslora", False), ("use_dora", False)):
        if raw.get(name, plain) not in (plain, None):
            raise AdapterError(f"{path}: {name}: {json.dumps(raw[name])} is not supported (only {json.dumps(plain)})")
    for name in ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"):
        if raw.get(name):
            raise AdapterError(f"{path}: {name}: {json.dumps(raw[name])} is not supported (only empty)")
    spec = LoraSpec(r=r, alpha=alpha, dropout=dropout, targets=tuple(t for t in ALL_TARGETS if t in targets))

    wpath = os.path.join(folder, WEIGHTS)
    if not os.path.isfile(wpath):
        extra = " (adapter_model.bin, a pickle, is not read: save as safetensors)" if os.path.isfile(
            os.path.join(folder, "adapter_model.bin")) else ""
        raise AdapterError(f"{wpath}: missing{extra}")
    try:
        f = SafetensorsFile(wpath)
    except CheckpointError as e:
        raise AdapterError(str(e))
    tensors = {}
    for key in f.names():
        if not key.startswith(PREFIX) or not (key.endswith(".lora_A.weight") or key.endswith(".lora_B.weight")):
            raise AdapterError(f"{wpath}: {key}: not a LoRA weight (expected {PREFIX}<module>.lora_A.weight "
                               "or .lora_B.weight)")
        module = key[len(PREFIX):].rsplit(".", 2)[0]
        if module.rsplit(".", 1)[-1] not in spec.targets:
            raise AdapterError(f"{wpath}: {key}: module not in {CONFIG} target_modules")
        shape = f.shape(key)
        rank_dim = shape[0] if ".lora_A." in key else shape[-1]
        if len(shape) != 2 or rank_dim != r:
            raise AdapterError(f"{wpath}: {key}: shape {list(shape)} does not have rank r={r} of {CONFIG}")
        tensors[key] = f.read(key)
    if not tensors:
        raise AdapterError(f"{wpath}: no LoRA weights")
    return spec, tensors


def check_adapter(model, folder):
    """(LoraSpec, {PEFT key: tensor}) of the adapter folder, checked against the model's linear
    layers (names and shapes both ways) without touching the model. engine-serve keeps what it
    returns in memory and applies it later with load_adapter(model, folder, checked): the folder may
    be gone by then (train-step --keep-checkpoints prunes old steps)."""
    spec, tensors = read_adapter(folder)
    wpath = os.path.join(folder, WEIGHTS)
    expected = {}
    for path, m in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if leaf in spec.targets and isinstance(m, nn.Linear):  # a LoraLinear (merged or not) is one too
            expected[f"{PREFIX}{path}.lora_A.weight"] = (spec.r, m.in_features)
            expected[f"{PREFIX}{path}.lora_B.weight"] = (m.out_features, spec.r)
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise AdapterError(f"{wpath}: {missing[0]}: missing ({len(missing)} LoRA weights of the model are absent)")
    for key, t in tensors.items():
        if key not in expected:
            raise AdapterError(f"{wpath}: {key}: no such LoRA layer in the model")
        if tuple(t.shape) != expected[key]:
            raise AdapterError(f"{wpath}: {key}: shape {list(t.shape)} but the model's layer is {list(expected[key])}")
    return spec, tensors


def load_adapter(model, folder, checked=None):
    """Loads an adapter into the model: adds the LoRA layers when it has none (or checks that those
    it has match), then copies every weight in. `checked`: what check_adapter(model, folder)
    returned earlier (the folder is not read again); without it the folder is read and checked now."""
    spec, tensors = checked if checked is not None else check_adapter(model, folder)
    have = getattr(model, "lora_spec", None)
    if any(m.merged for _, m in lora_layers(model)):
        # new A and B under weights that hold the old adapter's delta would apply both
        raise AdapterError(f"{folder}: the model's current adapter is merged (unmerge_lora or remove_lora first)")
    if have is None:
        add_lora(model, spec)
    elif (have.r, have.alpha, set(have.targets)) != (spec.r, spec.alpha, set(spec.targets)):
        raise AdapterError(f"{os.path.join(folder, CONFIG)}: r={spec.r} lora_alpha={spec.alpha} target_modules="
                           f"{sorted(spec.targets)} differ from the model's LoRA layers (r={have.r} "
                           f"lora_alpha={have.alpha} target_modules={sorted(have.targets)})")
    params = {PREFIX + name: p for name, p in model.named_parameters() if is_lora_key(name)}
    if params.keys() != tensors.keys():  # `checked` came from check_adapter on another model
        key = sorted(params.keys() ^ tensors.keys())[0]
        raise AdapterError(f"{os.path.join(folder, WEIGHTS)}: {key}: the adapter's LoRA layers differ from the model's")
    with torch.no_grad():
        for key, t in tensors.items():
            params[key].copy_(t.to(device=params[key].device, dtype=params[key].dtype))
    for m in (m for _, m in lora_layers(model)):
        m.scaling = spec.scaling
    return spec


@torch.no_grad()
def merge_lora(model):
    """W += scaling * B @ A in every LoRA layer (computed in fp32); the exact base weight is kept so
    unmerge_lora restores it bit for bit. Merged, the layer skips its LoRA branch."""
    for _, m in lora_layers(model):
        if m.merged:
            continue
        m.base_copy = m.weight.detach().clone()
        m.weight.copy_((m.weight.float() + m.delta().to(m.weight.device)).to(m.weight.dtype))


@torch.no_grad()
def unmerge_lora(model):
    for _, m in lora_layers(model):
        if m.merged:
            m.weight.copy_(m.base_copy)
            m.base_copy = None


@torch.no_grad()
def merge_and_unload(model):
    """Merges every adapter into its base weight for good and leaves plain nn.Linear layers."""
    merge_lora(model)
    for _, m in lora_layers(model):
        m.base_copy = None
    remove_lora(model)


def _same_base(adapter_folder, named, base):
    """None, or why the base the adapter names is not `base`: judged by config.json when the named
    folder is here (a copied checkpoint is the same base under another path)."""
    if not isinstance(named, str) or not os.path.isfile(os.path.join(named, "config.json")):
        return None
    if os.path.realpath(named) == os.path.realpath(base):
        return None
    with open(os.path.join(named, "config.json")) as f:
        theirs = json.load(f)
    with open(os.path.join(base, "config.json")) as f:
        ours = json.load(f)
    keys = ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size")
    differ = [k for k in keys if theirs.get(k) != ours.get(k)]
    if differ:
        return (f"{os.path.join(adapter_folder, CONFIG)}: base_model_name_or_path: {named} differs from --base "
                f"{base} in {', '.join(differ)}")
    return None


def main(argv):
    """`run.py merge --base CKPT --adapter FOLDER --out DIR` (rstar model-merge): the base with the
    adapter merged in, written as a full checkpoint in the base's dtype, tokenizer copied."""
    import argparse
    import sys

    from .checkpoint import checkpoint_dtype, copy_tokenizer, load_model, save_model

    p = argparse.ArgumentParser(prog="rstar-backend merge")
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        spec, _ = read_adapter(a.adapter)
        with open(os.path.join(a.adapter, CONFIG)) as f:
            named = json.load(f).get("base_model_name_or_path")
        model = load_model(a.base, "cpu", torch.float32)
        why = _same_base(a.adapter, named, a.base)
        if why:
            raise AdapterError(why)
        load_adapter(model, a.adapter)
        merge_and_unload(model)
        os.makedirs(a.out, exist_ok=True)
        save_model(model, a.out, dtype=checkpoint_dtype(model.config))
        copied = copy_tokenizer(a.base, a.out)
    except CheckpointError as e:  # AdapterError included
        sys.stderr.write(f"rstar model-merge: {e}\n")
        return 1
    print(json.dumps({"base": os.path.abspath(a.base), "adapter": os.path.abspath(a.adapter), "r": spec.r,
                      "lora_alpha": spec.alpha, "target_modules": list(spec.targets),
                      "dtype": str(checkpoint_dtype(model.config)).replace("torch.", ""), "tokenizer": copied}))
    return 0
