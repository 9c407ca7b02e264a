import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from rstar_backend.checkpoint import save_model  # noqa: E402
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from rstar_backend.train import Trainer, parser  # noqa: E402

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

    def trainer(self, model, out, *flags):
        return Trainer(parser().parse_args(["--model", model, "--out", out, *flags]))


def batch(records):
    return [(f"test:{i + 1}", r) for i, r in enumerate(records)]


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
