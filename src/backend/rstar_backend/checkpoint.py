"""Hugging Face checkpoint folders without transformers or safetensors.

A .safetensors file is: 8 bytes little-endian header length N, N bytes of JSON
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the raw tensor bytes
(little-endian, C order), offsets relative to the end of the header. Big checkpoints are split into
model-0000K-of-0000N.safetensors shards listed by model.safetensors.index.json.
"""

import json
import os
import struct

import torch

from .model import SMEAR_ARCHITECTURE, Qwen3Config, Qwen3ForCausalLM

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


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise CheckpointError(f"{path}: not a safetensors file (header length {n} beyond the file)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise CheckpointError(f"{path}: not a safetensors file (bad header: {e})")
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end > len(body):
            raise CheckpointError(f"{path}: {name}: data beyond the end of the file")
        if end == begin:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        # bytearray copy: frombuffer on read-only memory warns, and the tensor must own writable storage
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        out[name] = t.reshape(shape)
    return out


def read_config(folder):
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: not a directory (expected a checkpoint folder with config.json)")
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: not a checkpoint: no config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}")
    arch = raw.get("architectures") or ["Qwen3ForCausalLM"]
    if raw.get("model_type", "qwen3") != "qwen3" or not {"Qwen3ForCausalLM", SMEAR_ARCHITECTURE} & set(arch):
        raise CheckpointError(f"{path}: not a Qwen3 model (model_type={raw.get('model_type')}, architectures={arch})")
    try:
        return Qwen3Config.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}")


def load_state_dict(folder):
    index = os.path.join(folder, INDEX)
    single = os.path.join(folder, SINGLE)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        state = {}
        for shard in sorted(set(weight_map.values())):
            p = os.path.join(folder, shard)
            if not os.path.isfile(p):
                raise CheckpointError(f"{folder}: shard {shard} listed in {INDEX} is missing")
            state.update(load_safetensors(p))
        return state
    if os.path.isfile(single):
        return load_safetensors(single)
    raise CheckpointError(f"{folder}: not a checkpoint: neither {SINGLE} nor {INDEX}")


def load_model(folder, device="cpu", dtype=None):
    """Builds the model from config.json and loads the weights, checking every tensor name and shape."""
    cfg = read_config(folder)
    state = load_state_dict(folder)
    model = Qwen3ForCausalLM(cfg)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        state.pop("lm_head.weight", None)  # some exporters write the tied copy anyway
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match config.json: missing {missing[:3]}{'...' if len(missing) > 3 else ''}"
            f" unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for k, t in state.items():
            if tuple(t.shape) != tuple(expected[k].shape):
                raise CheckpointError(f"{folder}: {k}: shape {list(t.shape)} but config.json implies "
                                      f"{list(expected[k].shape)}")
            params[k].copy_(t.to(params[k].dtype))
    model.to(device=device, dtype=dtype or torch.float32)
    return model


def save_model(model, folder, dtype=None, max_shard_bytes=None):
    """Writes config.json and the weights in HF layout; shards when they exceed max_shard_bytes."""
    os.makedirs(folder, exist_ok=True)
    cfg = model.config
    dtype = dtype or BY_NAME.get(cfg.torch_dtype, torch.float32)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
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
                   "special_tokens_map.json", "vocab.json", "merges.txt")


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
