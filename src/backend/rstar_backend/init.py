"""model-init: a randomly initialised checkpoint from a config.json or a tiny one of a named architecture,
tokenizer files copied beside it."""

import argparse
import json
import os
import sys

from .checkpoint import CheckpointError, copy_tokenizer, save_model
from .model import ARCHITECTURES, INIT_SCHEMES, CausalLM, ModelConfig, UnsupportedConfig, select_arch

# The tiny model of the test fixtures (fixtures/tiny, whose tokenizer has 4096 ids), as each architecture
# has it: small enough for a CPU, and each one's own parts present (Qwen2's q/k/v biases, Llama's rope
# scaling with every frequency band in use and its untied head).
TINY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "tiny")
TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, rope_theta=10000.0,
            rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
TINY_BY_ARCH = {
    "qwen3": {**TINY, "tie_word_embeddings": True},
    "qwen2": {**TINY, "tie_word_embeddings": True},
    "llama": {**TINY, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}},
}


def read_json(path):
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror}")
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return raw


def build_config(config_path, arch):
    """The config to build: config_path's (its own architecture, or `arch` when it names none), else the
    tiny one of `arch`."""
    if config_path is None:
        return ModelConfig.from_dict(TINY_BY_ARCH[arch], arch=arch), TINY_DIR
    raw = read_json(config_path)
    try:
        named = select_arch(raw, default=None)
        if arch and named and named != arch:
            raise UnsupportedConfig(f"architectures/model_type: the config is {named}, not --arch {arch}")
        return ModelConfig.from_dict(raw, arch=arch), os.path.dirname(os.path.abspath(config_path))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{config_path}: {e}")


def main(argv):
    p = argparse.ArgumentParser(prog="rstar-backend init")
    p.add_argument("--config", default=None)
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", choices=INIT_SCHEMES, default="normal")
    p.add_argument("--max-shard-bytes", type=int, default=0)
    args = p.parse_args(argv)
    if args.config is None and args.arch is None:
        p.error("give --config FILE, --arch NAME, or both")
    try:
        cfg, tokenizer_dir = build_config(args.config, args.arch)
        model = CausalLM(cfg)
        model.init_weights(args.seed, args.init)
        save_model(model, args.out, max_shard_bytes=args.max_shard_bytes or None)
        copied = copy_tokenizer(tokenizer_dir, args.out)
        n = sum(t.numel() for t in model.parameters())
        sys.stdout.write(json.dumps({"v": 1, "checkpoint": os.path.abspath(args.out), "arch": cfg.arch,
                                     "parameters": n, "seed": args.seed, "init": args.init,
                                     "tokenizer_files": copied}) + "\n")
    except CheckpointError as e:
        sys.stderr.write(f"rstar model-init: {e}\n")
        return 1
    return 0
