import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from rstar_backend.checkpoint import save_model  # noqa: E402
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from rstar_backend.train import Config, Trainer  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rope_theta=10000.0)


def small_model(seed=0, **over):
    cfg = Qwen3Config.from_dict({**SMALL, **over})
    m = Qwen3ForCausalLM(cfg)
    m.init_weights(seed)
    return m


class TempDirCase(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.tmp = tempfile.mkdtemp(prefix="rstar-backend-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def checkpoint(self, name="m0", seed=0, **over):
        m = small_model(seed, **over)
        save_model(m, self.path(name))
        return self.path(name)

    def trainer(self, model, out, **settings):
        return Trainer(Config({**SETTINGS, "model": model, "out": out, **settings}))


# The settings these tests train with unless one says otherwise: every key the trainer reads (the
# driver sends them all; src/backend/train-options.ts declares them and their defaults).
SETTINGS = dict(loss="sft", lr=1e-6, optimizer="adamw", warmup_steps=0, weight_decay=0.01, beta1=0.9,
                beta2=0.999, eps=1e-8, max_grad_norm=1.0, clip_low=0.2, clip_high=0.28, old_logprobs="recompute",
                kl_coef=0.0, ref=None, entropy_coef=0.0, micro_batch_tokens=16384, mini_batches=1,
                optimizer_state="auto", epochs=1, rollout_correction="token-tis", rollout_correction_cap=2.0,
                max_shard_bytes=0, policy=None, dtype="fp32", shard="none", device="cpu", seed=0,
                lora_rank=None, lora_alpha=None, lora_dropout=0, lora_targets="all-linear", lora_init=None)


def random_records(n, prompt, response, seed, vocab=64, advantages=False):
    """n records of random tokens (ids from 3 up), every response token trained; GRPO ones alternate
    advantage +1 / -1. Shared by the unit tests and bench/gpu-check.py."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        rec = {"prompt_ids": torch.randint(3, vocab, (prompt,), generator=g).tolist(),
               "response_ids": torch.randint(3, vocab, (response,), generator=g).tolist(),
               "loss_mask": [1] * response}
        if advantages:
            rec["advantage"] = 1.0 if i % 2 == 0 else -1.0
        out.append(rec)
    return out


def batch(records):
    return list(records)


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


BACKEND = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(case, script, config, data, world):
    """Runs `script` (argv: backend dir, config JSON) as `world` gloo ranks on 127.0.0.1, rank 0 reading
    `data`; asserts every rank exits 0 and returns rank 0's Step records."""
    path = case.path("rank.py")
    with open(path, "w") as f:
        f.write(script)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    if world > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    procs = []
    with open(data) as stdin:
        for rank in range(world):
            procs.append(subprocess.Popen(
                [sys.executable, path, BACKEND, json.dumps(config)], env=dict(env, RANK=str(rank)),
                stdin=stdin if rank == 0 else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
    outs = []
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        case.assertEqual(p.returncode, 0, err)
    return [json.loads(line) for line in outs[0][0].splitlines() if line.strip()]
