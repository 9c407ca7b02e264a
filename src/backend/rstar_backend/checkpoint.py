"""Hugging Face checkpoint folders without transformers or safetensors.

A .safetensors file is: 8 bytes little-endian header length N, N bytes of JSON
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the raw tensor bytes
(little-endian, C order), offsets relative to the end of the header. Big checkpoints are split into
model-0000K-of-0000N.safetensors shards listed by model.safetensors.index.json.
"""

import json
import os
import shutil
import struct

import torch

from .model import CausalLM, ModelConfig

DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
CODES = {v: k for k, v in DTYPES.items()}
BY_NAME = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointError(Exception):
    """A folder that is not a usable checkpoint; the message says what is missing."""


def _bytes_of(t):
    t = t.detach().to("cpu").contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)  # numpy has no bfloat16; same-size views are free
    return t.numpy().tobytes()


def save_safetensors(tensors, path, metadata=None):
    header = {}
    offset = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = metadata or {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors.values():
            f.write(_bytes_of(t))
    os.replace(tmp, path)


class SafetensorsFile:
    """One .safetensors file, read tensor by tensor: the header (names, dtypes, shapes) at once, a
    tensor's bytes only when asked, so loading a big checkpoint holds one tensor at a time in memory
    besides the model itself."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CheckpointError(f"{path}: not a safetensors file (header length {n} beyond the file)")
            try:
                header = json.loads(f.read(n))
            except ValueError as e:
                raise CheckpointError(f"{path}: not a safetensors file (bad header: {e})")
        self.body = 8 + n
        self.entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = DTYPES.get(info["dtype"])
            if dtype is None:
                raise CheckpointError(f"{path}: {name}: unsupported dtype {info['dtype']}")
            begin, end = info["data_offsets"]
            if self.body + end > size:
                raise CheckpointError(f"{path}: {name}: data beyond the end of the file")
            self.entries[name] = (dtype, tuple(info["shape"]), begin, end)

    def names(self):
        return list(self.entries)

    def shape(self, name):
        return self.entries[name][1]

    def read(self, name):
        dtype, shape, begin, end = self.entries[name]
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        # a bytearray: frombuffer on read-only memory warns, and the tensor must own writable storage
        buf = bytearray(end - begin)
        with open(self.path, "rb") as f:
            f.seek(self.body + begin)
            f.readinto(buf)
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)


def load_safetensors(path):
    f = SafetensorsFile(path)
    return {name: f.read(name) for name in f.names()}


def replace_folder(tmp, folder):
    """Puts the complete folder `tmp` in place of `folder`: a reader sees the old one or the new one whole."""
    old = f"{folder}.old-{os.getpid()}"
    if os.path.exists(folder):
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def read_json_object(path, error=None):
    """A JSON file holding one object; anything else raises `error` (CheckpointError) naming the file."""
    error = error or CheckpointError
    try:
        with open(path) as f:
            raw = json.load(f)
    except ValueError as e:
        raise error(f"{path}: invalid JSON: {e}")
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object")
    return raw


def read_config(folder):
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: not a directory (expected a checkpoint folder with config.json)")
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: not a checkpoint: no config.json")
    raw = read_json_object(path)
    # the architecture comes from config.json's architectures/model_type (Qwen3 when it names none);
    # anything model.py cannot compute exactly (MoE, sliding window, another rope) is refused here
    try:
        return ModelConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}")


def open_weights(folder):
    """{tensor name: the SafetensorsFile holding it} of a checkpoint folder, one file or sharded."""
    index = os.path.join(folder, INDEX)
    single = os.path.join(folder, SINGLE)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {}
        for shard in sorted(set(weight_map.values())):
            p = os.path.join(folder, shard)
            if not os.path.isfile(p):
                raise CheckpointError(f"{folder}: shard {shard} listed in {INDEX} is missing")
            f = SafetensorsFile(p)
            files.update({name: f for name in f.names()})
        return files
    if os.path.isfile(single):
        f = SafetensorsFile(single)
        return {name: f for name in f.names()}
    raise CheckpointError(f"{folder}: not a checkpoint: neither {SINGLE} nor {INDEX}")


def load_state_dict(folder):
    return {name: f.read(name) for name, f in open_weights(folder).items()}


def load_model(folder, device="cpu", dtype=None):
    """Builds the model from config.json and loads the weights, checking every tensor name and shape.

    The model is built on the meta device in `dtype` (default fp32), materialised on `device`, and
    each tensor is read from disk and copied into place one at a time: a bf16 model served on a GPU
    never exists as an fp32 copy on the CPU, and no time goes into a random init that is overwritten."""
    cfg = read_config(folder)
    files = open_weights(folder)
    model = CausalLM(cfg, device="meta", dtype=dtype or torch.float32)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        files.pop("lm_head.weight", None)  # some exporters write the tied copy anyway
    missing = [k for k in expected if k not in files]
    unexpected = [k for k in files if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match config.json: missing {missing[:3]}{'...' if len(missing) > 3 else ''}"
            f" unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    for k, f in files.items():
        if f.shape(k) != expected[k]:
            raise CheckpointError(f"{folder}: {k}: shape {list(f.shape(k))} but config.json implies {list(expected[k])}")
    model.to_empty(device=device)
    model.tie_weights()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, f in files.items():
            params[k].copy_(f.read(k))
    return model


def checkpoint_dtype(cfg):
    """The dtype a checkpoint of this config is written in: its torch_dtype (fp32 if unknown)."""
    return BY_NAME.get(cfg.torch_dtype, torch.float32)


def save_model(model, folder, dtype=None, max_shard_bytes=None, state=None):
    """Writes config.json and the weights in HF layout; shards when they exceed max_shard_bytes.

    dtype: default the config's torch_dtype (a bf16 checkpoint trained with fp32 master weights stays
    bf16). state: the tensors to write, default model.state_dict() (a sharded trainer passes the whole
    tensors it gathered)."""
    os.makedirs(folder, exist_ok=True)
    cfg = model.config
    dtype = dtype or checkpoint_dtype(cfg)
    state = {k: v.detach().to(dtype) for k, v in (model.state_dict() if state is None else state).items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    hf = cfg.to_hf()
    hf["torch_dtype"] = {v: k for k, v in BY_NAME.items()}[dtype]
    shards = [{}]
    size = 0
    total = 0
    for k, t in state.items():
        n = t.numel() * t.element_size()
        if max_shard_bytes and shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += n
        total += n
    # Remove the other layout's files so a folder never holds two disagreeing sets of weights.
    for name in os.listdir(folder):
        if (name.startswith("model") and name.endswith(".safetensors")) or name == INDEX:
            os.remove(os.path.join(folder, name))
    if len(shards) == 1:
        save_safetensors(shards[0], os.path.join(folder, SINGLE))
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_safetensors(shard, os.path.join(folder, name))
            weight_map.update({k: name for k in shard})
        with open(os.path.join(folder, INDEX), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
        f.write("\n")
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model")


def copy_tokenizer(src_dir, dst_dir):
    """Copies the tokenizer files that sit in src_dir (if any); returns their names."""
    import shutil
    copied = []
    if os.path.abspath(src_dir) == os.path.abspath(dst_dir):
        return copied
    for name in os.listdir(src_dir):
        if name in TOKENIZER_FILES or name.endswith(".jinja"):
            shutil.copyfile(os.path.join(src_dir, name), os.path.join(dst_dir, name))
            copied.append(name)
    return sorted(copied)
