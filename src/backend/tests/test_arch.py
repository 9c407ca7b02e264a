"""The architectures beside Qwen3 (issue 42): Qwen2/Qwen2.5 and Llama 3.x, from the one model file.

Each architecture's forward pass is checked against a reference written out here by hand from Hugging
Face's modeling files (float64, loops over heads, no code shared with model.py), on weights far from
the init so that a missing bias, a misplaced norm or unscaled rope frequencies change the logits by
orders of magnitude more than the tolerance. The config selection and every refusal are checked by the
message a user would read."""

import json
import math
import os
import subprocess
import sys

import torch

from common import SETTINGS, TempDirCase, random_records
from rstar_backend import engine as E
from rstar_backend.checkpoint import CheckpointError, load_model, load_state_dict, read_config, save_model
from rstar_backend.model import (CausalLM, ModelConfig, Qwen3Config, Qwen3ForCausalLM, UnsupportedConfig,
                                 rotary_frequencies)
from rstar_backend.train import Config, Trainer
from test_engine_dtype import engine_args

BACKEND = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024}
CONFIGS = {
    "qwen3": {**TINY, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "qwen2": {**TINY, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
              "sliding_window": 32768, "max_window_layers": 21},
    "llama": {**TINY, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_scaling": LLAMA3_ROPE,
              "tie_word_embeddings": False, "rope_theta": 10000.0},
}


def scrambled(arch, seed=0, **over):
    """A model of `arch` with every weight, bias and norm scale random and O(1)."""
    m = CausalLM(ModelConfig.from_dict({**CONFIGS[arch], **over}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return m.eval()


def llama3_frequencies_by_hand(head_dim, theta, factor, low, high, context):
    """The llama3 rope formula, written out in float64 Python numbers."""
    out = []
    for i in range(0, head_dim, 2):
        f = 1.0 / theta ** (i / head_dim)
        wavelength = 2 * math.pi / f
        if wavelength < context / high:
            out.append(f)
        elif wavelength > context / low:
            out.append(f / factor)
        else:
            s = (context / wavelength - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return out


def reference_logits(m, ids, start=0):
    """Logits of one row by the textbook equations (float64): pre-norm decoder layers, RMSNorm, q/k/v
    biases where the state dict has them, per-head q/k RMSNorm before rotary where it has them,
    half-split rotary at positions start.., GQA causal softmax attention, SwiGLU, final norm, head."""
    cfg = m.config
    sd = {k: v.double() for k, v in m.state_dict().items()}
    H, G, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    T = len(ids)

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def linear(x, name):
        y = x @ sd[name + ".weight"].T
        return y + sd[name + ".bias"] if name + ".bias" in sd else y

    if cfg.rope_scaling:
        r = cfg.rope_scaling
        freqs = llama3_frequencies_by_hand(D, cfg.rope_theta, r["factor"], r["low_freq_factor"],
                                           r["high_freq_factor"], r["original_max_position_embeddings"])
    else:
        freqs = [1.0 / cfg.rope_theta ** (i / D) for i in range(0, D, 2)]

    def rotate(v, t):  # v: (D,) at position t; pair (j, j + D/2) turned by angle t * freqs[j]
        out = v.clone()
        for j, f in enumerate(freqs):
            c, s = math.cos((start + t) * f), math.sin((start + t) * f)
            a, b = v[j], v[j + D // 2]
            out[j], out[j + D // 2] = a * c - b * s, b * c + a * s
        return out

    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = linear(h, p + "self_attn.q_proj").view(T, H, D)
        k = linear(h, p + "self_attn.k_proj").view(T, G, D)
        v = linear(h, p + "self_attn.v_proj").view(T, G, D)
        if p + "self_attn.q_norm.weight" in sd:
            q, k = rms(q, sd[p + "self_attn.q_norm.weight"]), rms(k, sd[p + "self_attn.k_norm.weight"])
        q = torch.stack([torch.stack([rotate(q[t, n], t) for n in range(H)]) for t in range(T)])
        k = torch.stack([torch.stack([rotate(k[t, n], t) for n in range(G)]) for t in range(T)])
        heads = []
        for n in range(H):
            g = n // (H // G)
            scores = q[:, n] @ k[:, g].T / math.sqrt(D)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v[:, g])
        x = x + linear(torch.cat(heads, -1), p + "self_attn.o_proj")
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate, up = linear(h, p + "mlp.gate_proj"), linear(h, p + "mlp.up_proj")
        x = x + linear(gate * torch.sigmoid(gate) * up, p + "mlp.down_proj")
    x = rms(x, sd["model.norm.weight"])
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.T


class Architectures(TempDirCase):
    def write_config(self, name, cfg):
        os.makedirs(self.path(name), exist_ok=True)
        with open(self.path(name, "config.json"), "w") as f:
            json.dump(cfg, f)
        return self.path(name)

    # ---- selection and config.json ------------------------------------------------------------------

    def test_the_architecture_comes_from_architectures_and_model_type(self):
        self.assertIs(Qwen3Config, ModelConfig)
        self.assertIs(Qwen3ForCausalLM, CausalLM)
        for arch, cfg in CONFIGS.items():
            self.assertEqual(ModelConfig.from_dict(cfg).arch, arch)
            self.assertEqual(ModelConfig.from_dict({**cfg, "architectures": None}).arch, arch)  # model_type alone
            self.assertEqual(ModelConfig.from_dict({k: v for k, v in cfg.items() if k != "model_type"}).arch, arch)
            self.assertEqual(read_config(self.write_config(arch, cfg)).arch, arch)
        self.assertEqual(ModelConfig.from_dict(TINY).arch, "qwen3")  # names none: our own Qwen3 configs
        self.assertEqual(ModelConfig.from_dict(TINY, arch="llama").arch, "llama")
        smear = ModelConfig.from_dict({**TINY, "architectures": ["RStarQwen3ForCausalLM"], "rstar_key_smear": True})
        self.assertEqual((smear.arch, smear.rstar_key_smear), ("qwen3", True))

    def test_each_architecture_writes_its_own_config_json_and_tensor_names(self):
        names = {}
        for arch in CONFIGS:
            m = scrambled(arch)
            save_model(m, self.path(arch))
            with open(self.path(arch, "config.json")) as f:
                hf = json.load(f)
            cls = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
            self.assertEqual((hf["architectures"], hf["model_type"]), ([cls], arch))
            names[arch] = set(load_state_dict(self.path(arch)))
            back = load_model(self.path(arch))
            self.assertEqual(back.config, m.config)
            for k, t in m.state_dict().items():
                self.assertTrue(torch.equal(back.state_dict()[k], t), f"{arch} {k}")
            if arch == "llama":
                self.assertEqual(hf["rope_scaling"], LLAMA3_ROPE)
                self.assertIs(hf["tie_word_embeddings"], False)
                self.assertEqual((hf["attention_bias"], hf["mlp_bias"]), (False, False))
            if arch == "qwen2":
                self.assertNotIn("attention_bias", hf)  # Qwen2Config has no such field: its bias is fixed
                self.assertIs(hf["use_sliding_window"], False)
        a = "model.layers.0.self_attn."
        self.assertLessEqual({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, names["qwen2"])
        self.assertNotIn(a + "o_proj.bias", names["qwen2"])  # Qwen2: q, k and v only
        for arch in ("qwen3", "llama"):
            self.assertFalse(any(n.endswith(".bias") for n in names[arch]), arch)
        self.assertLessEqual({a + "q_norm.weight", a + "k_norm.weight"}, names["qwen3"])
        for arch in ("qwen2", "llama"):
            self.assertFalse(any("q_norm" in n or "k_norm" in n for n in names[arch]), arch)
        self.assertIn("lm_head.weight", names["llama"])  # untied, as its config says
        self.assertNotIn("lm_head.weight", names["qwen2"])

    def test_llama_head_ties_and_biases_follow_its_config(self):
        untied = ModelConfig.from_dict({**CONFIGS["llama"], "tie_word_embeddings": None})
        self.assertIs(untied.tie_word_embeddings, False)  # LlamaConfig's default
        m = scrambled("llama", tie_word_embeddings=True, attention_bias=True, mlp_bias=True)
        self.assertIs(m.lm_head.weight, m.model.embed_tokens.weight)
        names = {n for n, _ in m.named_parameters()}
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            self.assertIn(f"model.layers.0.{proj}.bias", names)
        save_model(m, self.path("t"))
        self.assertNotIn("lm_head.weight", load_state_dict(self.path("t")))
        ids = torch.tensor([3, 9, 27, 40, 5])
        with torch.no_grad():
            got = load_model(self.path("t"))(ids[None])[0].double()
        self.assertLess(float((got - reference_logits(m, ids)).abs().max()), 1e-4)
        self.assertEqual(ModelConfig.from_dict({**CONFIGS["llama"], "head_dim": None}).head_dim, 8)  # hidden/heads

    def test_eos_token_list_is_kept(self):
        cfg = ModelConfig.from_dict({**CONFIGS["llama"], "eos_token_id": [7, 8, 9]})
        self.assertEqual(cfg.eos_token_id, 7)
        self.assertEqual(cfg.to_hf()["eos_token_id"], [7, 8, 9])

    # ---- the forward pass against the hand-written reference ---------------------------------------

    def test_forward_matches_the_reference_for_each_architecture(self):
        ids = torch.tensor([3, 9, 27, 40, 5, 61])
        for arch in CONFIGS:
            for layers in (1, 2):
                m = scrambled(arch, seed=layers, num_hidden_layers=layers)
                start = 600 if arch == "llama" else 0  # far out, where the scaled frequencies differ most
                positions = torch.arange(start, start + len(ids))[None]
                with torch.no_grad():
                    got = m(ids[None], positions=positions)[0].double()
                want = reference_logits(m, ids, start)
                self.assertGreater(float(want.std()), 1.0)  # logits of size: the tolerance means something
                self.assertLess(float((got - want).abs().max()), 2e-4, f"{arch}, {layers} layer(s)")

    def test_qwen2_bias_shifts_the_attention_output_by_the_hand_computed_amount(self):
        m = scrambled("qwen2", seed=3)
        at = m.model.layers[0].self_attn
        x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(1))
        cos, sin = m.model.rotary(torch.arange(5)[None], x.dtype)
        with torch.no_grad():
            with_bias = at(x, cos, sin)
            bv = at.v_proj.bias.clone()
            at.v_proj.bias.zero_()
            without = at(x, cos, sin)
            # softmax weights sum to 1, so a value bias comes out of each head whole: o_proj of the
            # KV head's bias, repeated for the query heads sharing it
            rep = at.n_head // at.n_kv
            expected = at.o_proj.weight @ bv.view(at.n_kv, 1, at.head_dim).expand(-1, rep, -1).reshape(-1)
            self.assertGreater(float(expected.abs().max()), 0.1)
            self.assertTrue(torch.allclose(with_bias - without, expected.expand(1, 5, -1), atol=1e-5))
            # q and k biases act through the scores: each changes the output (the reference checks how)
            for proj in (at.q_proj, at.k_proj):
                before = at(x, cos, sin)
                proj.bias.zero_()
                self.assertGreater(float((at(x, cos, sin) - before).abs().max()), 1e-2)

    def test_qk_norm_only_in_qwen3_and_before_rotary(self):
        self.assertEqual([ModelConfig.from_dict(c).qk_norm for c in CONFIGS.values()], [True, False, False])
        m = scrambled("qwen3", seed=4)
        ids = torch.tensor([1, 2, 3, 4])
        with torch.no_grad():
            before = m(ids[None])[0]
            m.model.layers[0].self_attn.k_norm.weight.mul_(1.5)
            self.assertGreater(float((m(ids[None])[0] - before).abs().max()), 1e-2)  # used
        self.assertIsNone(scrambled("qwen2").model.layers[0].self_attn.q_norm)

    # ---- llama3 rope scaling ------------------------------------------------------------------------

    def test_llama3_rope_frequencies_by_hand(self):
        # head_dim 8, theta 10000: frequencies 1, 0.1, 0.01, 0.001, wavelengths 2 pi x 1, 10, 100, 1000.
        # original context 1024, low 1, high 4: kept below a wavelength of 256, divided by 8 above 1024,
        # blended between: 2 pi 100 = 628.3 sits there with weight s = (1024 / 628.3 - 1) / 3 = 0.2099
        s = (1024 / (2 * math.pi * 100) - 1) / 3
        want = [1.0, 0.1, (1 - s) * 0.01 / 8 + s * 0.01, 0.001 / 8]
        self.assertAlmostEqual(want[2], 0.0030868, places=6)
        self.assertEqual(want, llama3_frequencies_by_hand(8, 10000.0, 8.0, 1.0, 4.0, 1024))
        got = rotary_frequencies(8, 10000.0, LLAMA3_ROPE)
        self.assertEqual(got.dtype, torch.float32)
        self.assertTrue(torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0))
        # the model's buffer holds them, and keeps them through a cast (recomputed in fp32 each time)
        m = scrambled("llama")
        for cast in (lambda x: x, lambda x: x.to(torch.bfloat16), lambda x: x.double()):
            self.assertTrue(torch.equal(cast(m).model.rotary.inv_freq, got))
        # transformers 5's spelling: rope_parameters with rope_theta inside
        v5 = {k: v for k, v in CONFIGS["llama"].items() if k not in ("rope_scaling", "rope_theta")}
        cfg = ModelConfig.from_dict({**v5, "rope_parameters": {**LLAMA3_ROPE, "rope_theta": 10000.0}})
        self.assertEqual((cfg.rope_scaling, cfg.rope_theta), (LLAMA3_ROPE, 10000.0))
        plain = ModelConfig.from_dict({**CONFIGS["llama"], "rope_scaling": {"rope_type": "default"}})
        self.assertIsNone(plain.rope_scaling)

    # ---- what is refused ----------------------------------------------------------------------------

    def test_unsupported_configs_are_refused_on_load_naming_file_and_field(self):
        qwen2, llama = CONFIGS["qwen2"], CONFIGS["llama"]
        cases = [
            ({**llama, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8},
             "num_local_experts=8: mixture-of-experts"),
            ({**qwen2, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128},
             "num_experts=128: mixture-of-experts"),
            ({**qwen2, "use_sliding_window": True}, "use_sliding_window: true: sliding-window"),
            ({**qwen2, "layer_types": ["full_attention", "sliding_attention"]}, "layer_types: only full_attention"),
            ({**llama, "sliding_window": 4096}, "sliding_window=4096: sliding-window"),
            ({**llama, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling: rope type 'yarn'"),
            ({**qwen2, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling: rope type 'dynamic'"),
            ({**llama, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling: rope type 'linear'"),
            ({**llama, "rope_scaling": {**LLAMA3_ROPE, "factor": "8"}}, "rope_scaling: factor: expected a positive"),
            ({**llama, "architectures": ["MistralForCausalLM"], "model_type": "mistral"},
             "architectures: MistralForCausalLM is not supported"),
            ({**llama, "architectures": None, "model_type": "gemma2"}, "model_type: 'gemma2' is not supported"),
            ({**llama, "model_type": "qwen2"}, "model_type: 'qwen2' contradicts architectures"),
            ({**llama, "hidden_act": "gelu"}, "hidden_act: 'gelu' is not supported"),
            ({**llama, "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
            ({**qwen2, "rstar_key_smear": True}, "rstar_key_smear: an extension of Qwen3 only"),
            ({**qwen2, "head_dim": 16}, "head_dim: 16 x num_attention_heads 4 differs from hidden_size 32"),
        ]
        for i, (cfg, message) in enumerate(cases):
            folder = self.write_config(f"c{i}", cfg)
            with self.assertRaises(CheckpointError) as caught:
                load_model(folder)
            text = str(caught.exception)
            self.assertIn(message, text)
            self.assertTrue(text.startswith(os.path.join(folder, "config.json") + ": "), text)
            self.assertNotIn("\n", text)
            self.assertRaises(UnsupportedConfig, ModelConfig.from_dict, cfg)

    def test_model_init_refuses_what_it_cannot_build_and_builds_the_config_s_architecture(self):
        mixtral = {**CONFIGS["llama"], "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                   "num_local_experts": 8, "num_experts_per_tok": 2}
        cfg_path = os.path.join(self.write_config("mixtral", mixtral), "config.json")
        r = subprocess.run([sys.executable, os.path.join(BACKEND, "run.py"), "init", "--config", cfg_path,
                            "--out", self.path("out")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn(f"{cfg_path}: num_local_experts=8: mixture-of-experts", r.stderr)
        self.assertFalse(os.path.exists(self.path("out", "model.safetensors")))
        qwen2 = os.path.join(self.write_config("q2", CONFIGS["qwen2"]), "config.json")
        r = subprocess.run([sys.executable, os.path.join(BACKEND, "run.py"), "init", "--config", qwen2, "--arch",
                            "llama", "--out", self.path("out")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("the config is qwen2, not --arch llama", r.stderr)

    # ---- a Qwen2 and a Llama checkpoint train and serve ---------------------------------------------

    def test_qwen2_and_llama_checkpoints_train_one_step_and_serve(self):
        for arch in ("qwen2", "llama"):
            m = scrambled(arch, seed=7, num_hidden_layers=2)
            save_model(m, self.path(arch, "m0"))
            out = self.path(arch, "m1")
            t = Trainer(Config({**SETTINGS, "model": self.path(arch, "m0"), "out": out, "lr": 1e-3}))
            rec = t.step(random_records(4, 3, 5, seed=1))
            self.assertTrue(math.isfinite(rec["loss"]), arch)
            self.assertEqual(read_config(out).arch, arch)
            before, after = load_state_dict(self.path(arch, "m0")), load_state_dict(out)
            self.assertEqual(set(before), set(after))
            moved = [k for k in before if not torch.equal(before[k], after[k])]
            if arch == "qwen2":
                self.assertIn("model.layers.1.self_attn.q_proj.bias", moved)  # the bias trains
            else:
                self.assertIn("lm_head.weight", moved)  # the untied head trains on its own
            engine = E.Engine(engine_args(out, "fp32"))
            try:
                self.assertEqual(engine.cfg.arch, arch)
                prompt = [1, 5, 9, 33]
                sp = E.parse_sampling(dict(max_new_tokens=4, temperature=0, ignore_eos=True),
                                      engine.cfg.eos_token_id, engine.context_len, len(prompt))
                r = E.Request("r", prompt, sp, True, 0)
                engine.submit([r])
                r.done.wait()
                self.assertEqual(len(r.output), 4)
                # greedy: each token is the argmax of the trained model's own forward
                ids = torch.tensor([prompt + list(r.output)])
                with torch.no_grad():
                    logits = load_model(out)(ids)[0]
                self.assertEqual(list(r.output), logits[len(prompt) - 1:-1].argmax(-1).tolist())
            finally:
                engine.close()
