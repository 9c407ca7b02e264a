"""model-init: a randomly initialised checkpoint from a config.json, tokenizer files copied beside it."""

import argparse
import json
import os
import sys

from .checkpoint import CheckpointError, copy_tokenizer, save_model
from .model import INIT_SCHEMES, Qwen3Config, Qwen3ForCausalLM


def main(argv):
    p = argparse.ArgumentParser(prog="rstar-backend init")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", choices=INIT_SCHEMES, default="normal")
    p.add_argument("--max-shard-bytes", type=int, default=0)
    args = p.parse_args(argv)
    try:
        try:
            with open(args.config) as f:
                raw = json.load(f)
        except OSError as e:
            raise CheckpointError(f"{args.config}: {e.strerror}")
        except ValueError as e:
            raise CheckpointError(f"{args.config}: invalid JSON: {e}")
        if not isinstance(raw, dict):
            raise CheckpointError(f"{args.config}: expected a JSON object")
        try:
            cfg = Qwen3Config.from_dict(raw)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{args.config}: {e}")
        model = Qwen3ForCausalLM(cfg)
        model.init_weights(args.seed, args.init)
        save_model(model, args.out, max_shard_bytes=args.max_shard_bytes or None)
        copied = copy_tokenizer(os.path.dirname(os.path.abspath(args.config)), args.out)
        n = sum(t.numel() for t in model.parameters())
        sys.stdout.write(json.dumps({"v": 1, "checkpoint": os.path.abspath(args.out), "parameters": n,
                                     "seed": args.seed, "init": args.init, "tokenizer_files": copied}) + "\n")
    except CheckpointError as e:
        sys.stderr.write(f"rstar model-init: {e}\n")
        return 1
    return 0
