import json
import os
import struct

import torch

from common import TempDirCase, read_json, small_model, write_json
from rstar_backend.checkpoint import (CheckpointError, load_model, load_safetensors, load_state_dict,
                                      save_model, save_safetensors)


class SafetensorsFormat(TempDirCase):
    def test_round_trip_all_dtypes_bit_exact(self):
        g = torch.Generator().manual_seed(1)
        tensors = {
            "a.f32": torch.randn(3, 5, generator=g),
            "b.bf16": torch.randn(7, generator=g).to(torch.bfloat16),
            "c.f16": torch.randn(2, 2, 2, generator=g).to(torch.float16),
            "d.i64": torch.arange(6).reshape(2, 3),
            "e.empty": torch.zeros(0, 4),
            "f.scalar": torch.tensor(3.5),
        }
        p = self.path("t.safetensors")
        save_safetensors(tensors, p)
        back = load_safetensors(p)
        self.assertEqual(set(back), set(tensors))
        for k, t in tensors.items():
            self.assertEqual(back[k].dtype, t.dtype, k)
            self.assertEqual(tuple(back[k].shape), tuple(t.shape), k)
            self.assertTrue(torch.equal(back[k], t), k)

    def test_header_layout(self):
        p = self.path("t.safetensors")
        save_safetensors({"x": torch.ones(2, 3)}, p)
        with open(p, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual(n % 8, 0)
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header["x"], {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})
        self.assertEqual(header["__metadata__"], {"format": "pt"})
        self.assertEqual(len(raw), 8 + n + 24)
        self.assertEqual(struct.unpack("<6f", raw[8 + n:]), (1.0,) * 6)

    def test_garbage_is_rejected(self):
        p = self.path("bad.safetensors")
        with open(p, "wb") as f:
            f.write(b"\xff" * 16)
        with self.assertRaises(CheckpointError):
            load_safetensors(p)


class Checkpoints(TempDirCase):
    def assert_same_weights(self, a, b):
        sa, sb = a.state_dict(), b.state_dict()
        self.assertEqual(set(sa), set(sb))
        for k in sa:
            self.assertTrue(torch.equal(sa[k], sb[k]), k)

    def test_single_file_round_trip_bit_exact(self):
        m = small_model(3)
        save_model(m, self.path("c"))
        self.assertTrue(os.path.isfile(self.path("c", "model.safetensors")))
        cfg = read_json(self.path("c", "config.json"))
        self.assertEqual(cfg["architectures"], ["Qwen3ForCausalLM"])
        self.assertEqual(cfg["model_type"], "qwen3")
        names = set(load_state_dict(self.path("c")))
        self.assertIn("model.layers.0.self_attn.q_proj.weight", names)
        self.assertIn("model.layers.1.self_attn.k_norm.weight", names)
        self.assertIn("model.layers.0.mlp.gate_proj.weight", names)
        self.assertNotIn("lm_head.weight", names)  # tied: HF omits it
        self.assert_same_weights(m, load_model(self.path("c")))

    def test_smeared_keys_round_trip_under_their_own_architecture_name(self):
        m = small_model(5, rstar_key_smear=True)
        with torch.no_grad():
            m.model.layers[1].self_attn.k_smear.copy_(torch.tensor([0.25, -1.5]))
        save_model(m, self.path("s"))
        cfg = read_json(self.path("s", "config.json"))
        self.assertEqual(cfg["architectures"], ["RStarQwen3ForCausalLM"])  # SGLang/vLLM refuse, not misread
        self.assertIs(cfg["rstar_key_smear"], True)
        self.assertIn("model.layers.1.self_attn.k_smear", set(load_state_dict(self.path("s"))))
        self.assert_same_weights(m, load_model(self.path("s")))
        self.assertNotIn("rstar_key_smear", small_model(5).config.to_hf())

    def test_sharded_round_trip_bit_exact(self):
        m = small_model(4, tie_word_embeddings=False)
        save_model(m, self.path("s"), max_shard_bytes=20_000)
        index = read_json(self.path("s", "model.safetensors.index.json"))
        shards = sorted(set(index["weight_map"].values()))
        self.assertGreater(len(shards), 1)
        self.assertTrue(all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards))
        self.assertIn("lm_head.weight", index["weight_map"])
        self.assertFalse(os.path.exists(self.path("s", "model.safetensors")))
        self.assert_same_weights(m, load_model(self.path("s")))
        # rewriting as one file removes the shards, so the folder never holds two weight sets
        save_model(m, self.path("s"))
        self.assertEqual(sorted(f for f in os.listdir(self.path("s")) if "safetensors" in f), ["model.safetensors"])

    def test_bf16_checkpoint(self):
        m = small_model(5)
        save_model(m, self.path("b"), dtype=torch.bfloat16)
        self.assertEqual(read_json(self.path("b", "config.json"))["torch_dtype"], "bfloat16")
        back = load_model(self.path("b"), dtype=torch.bfloat16)
        for k, t in m.state_dict().items():
            self.assertTrue(torch.equal(back.state_dict()[k], t.to(torch.bfloat16)), k)

    def test_not_a_checkpoint(self):
        os.makedirs(self.path("empty"))
        with self.assertRaisesRegex(CheckpointError, "no config.json"):
            load_model(self.path("empty"))
        with self.assertRaisesRegex(CheckpointError, "not a directory"):
            load_model(self.path("missing"))
        m = small_model()
        save_model(m, self.path("c"))
        os.remove(self.path("c", "model.safetensors"))
        with self.assertRaisesRegex(CheckpointError, "neither model.safetensors"):
            load_model(self.path("c"))
        save_model(m, self.path("c"))
        cfg = read_json(self.path("c", "config.json"))
        cfg["hidden_size"] = 48
        write_json(self.path("c", "config.json"), cfg)
        with self.assertRaisesRegex(CheckpointError, "shape"):
            load_model(self.path("c"))
        cfg["model_type"] = "llama"
        write_json(self.path("c", "config.json"), cfg)
        with self.assertRaisesRegex(CheckpointError, "model_type: .llama. contradicts architectures"):
            load_model(self.path("c"))
