import contextlib
import io
import json
import math
import os
import struct

import torch

from common import SETTINGS, TempDirCase, random_records, run_ranks, small_model, write_jsonl
from rstar_backend import lora as L
from rstar_backend.checkpoint import load_model, save_model
from rstar_backend.model import CausalLM, ModelConfig, token_logprobs

IDS = torch.tensor([[3, 9, 14, 22, 5, 7, 31, 40], [8, 8, 12, 50, 61, 4, 17, 2]])


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids)


def randomise_adapter(model, seed=1, std=0.2):
    """Non-zero B (a fresh adapter's B is 0: it would hide every merge or scaling mistake)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in L.lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * std)


def logprobs(model, ids=IDS):
    with torch.no_grad():
        return token_logprobs(model(ids)[:, :-1], ids[:, 1:])


class Layers(TempDirCase):
    def test_fresh_adapter_gives_the_base_logits_exactly(self):
        m = small_model()
        base = logits(m)
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        self.assertTrue(torch.equal(logits(m), base))

    def test_init_is_peft_s(self):
        # huggingface/peft src/peft/tuners/lora/layer.py (reset_lora_parameters, init_lora_weights=True):
        # A kaiming_uniform_(a=sqrt(5)), bound 1/sqrt(in_features); B zeros; scaling lora_alpha / r
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        q = m.model.layers[0].self_attn.q_proj
        self.assertEqual(tuple(q.lora_A.weight.shape), (4, 32))
        self.assertEqual(tuple(q.lora_B.weight.shape), (32, 4))
        self.assertLessEqual(float(q.lora_A.weight.abs().max()), 1 / math.sqrt(32))
        self.assertGreater(float(q.lora_A.weight.abs().max()), 0.5 / math.sqrt(32))
        self.assertEqual(float(q.lora_B.weight.abs().max()), 0.0)
        self.assertEqual(q.scaling, 2.0)
        self.assertEqual(q.lora_A.weight.dtype, torch.float32)

    def test_the_branch_is_scaling_times_B_A_x(self):
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=4, alpha=12))
        randomise_adapter(m)
        up = m.model.layers[1].mlp.up_proj
        x = torch.randn(3, 32)
        with torch.no_grad():
            want = x @ up.weight.T + 3.0 * (x @ up.lora_A.weight.T @ up.lora_B.weight.T)
            self.assertLess(float((up(x) - want).abs().max()), 1e-5)

    def test_merged_equals_unmerged_and_unmerge_restores_the_base_exactly(self):
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        randomise_adapter(m)
        base = {k: v.clone() for k, v in m.state_dict().items() if not L.is_lora_key(k)}
        unmerged = logits(m)
        L.merge_lora(m)
        self.assertLess(float((logits(m) - unmerged).abs().max()), 1e-5)
        q = "model.layers.0.self_attn.q_proj.weight"
        self.assertFalse(torch.equal(m.state_dict()[q], base[q]))
        L.unmerge_lora(m)
        for k, v in m.state_dict().items():
            if not L.is_lora_key(k):
                self.assertTrue(torch.equal(v, base[k]), k)
        self.assertTrue(torch.equal(logits(m), unmerged))

    def test_remove_lora_gives_back_the_plain_model(self):
        m = small_model()
        base = logits(m)
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        randomise_adapter(m)
        L.merge_lora(m)
        L.remove_lora(m)
        self.assertEqual(L.lora_layers(m), [])
        self.assertTrue(torch.equal(logits(m), base))
        self.assertEqual(set(m.state_dict()), set(small_model().state_dict()))

    def test_disabled_is_the_base(self):
        m = small_model()
        base = logits(m)
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        randomise_adapter(m)
        with L.disabled(m):
            self.assertTrue(torch.equal(logits(m), base))
        self.assertFalse(torch.equal(logits(m), base))

    def test_targets(self):
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=2, alpha=2, targets=L.parse_targets("q,v")))
        names = [n for n, _ in L.lora_layers(m)]
        self.assertEqual(names, ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                 "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"])
        self.assertEqual(L.parse_targets("all-linear"), L.ALL_TARGETS)
        with self.assertRaisesRegex(L.AdapterError, "unknown module 'x'"):
            L.parse_targets("q,x")


class Peft(TempDirCase):
    def saved(self, r=4, alpha=8, step=7):
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=r, alpha=alpha))
        randomise_adapter(m)
        L.save_adapter(m, m.lora_spec, self.path("ad"), "/models/base", step=step)
        return m, self.path("ad")

    def test_key_names_shapes_and_config_fields_are_peft_s(self):
        # Keys: huggingface/peft src/peft/utils/save_and_load.py get_peft_model_state_dict drops the
        # adapter name (".default") from PeftModel's keys, which wrap the causal LM as base_model.model.
        # Fields: src/peft/config.py (peft_type, task_type, base_model_name_or_path, revision,
        # inference_mode) and src/peft/tuners/lora/config.py (LoraConfig).
        _, ad = self.saved()
        self.assertEqual(sorted(os.listdir(ad)), ["adapter_config.json", "adapter_model.safetensors"])
        _, tensors = L.read_adapter(ad)
        self.assertEqual(len(tensors), 2 * 7 * 2)
        q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        self.assertEqual(tuple(tensors[q_a].shape), (4, 32))
        self.assertEqual(tuple(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape), (32, 4))
        self.assertEqual(tuple(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].shape), (4, 64))
        self.assertIn("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight", tensors)
        with open(os.path.join(ad, "adapter_config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["peft_type"], "LORA")
        self.assertEqual(cfg["task_type"], "CAUSAL_LM")
        self.assertEqual(cfg["r"], 4)
        self.assertEqual(cfg["lora_alpha"], 8)
        self.assertEqual(cfg["lora_dropout"], 0.0)
        self.assertEqual(cfg["base_model_name_or_path"], "/models/base")
        self.assertEqual(sorted(cfg["target_modules"]), sorted(L.ALL_TARGETS))
        self.assertEqual(cfg["bias"], "none")
        self.assertIs(cfg["fan_in_fan_out"], False)
        self.assertIs(cfg["inference_mode"], True)
        # every field is one PEFT's LoraConfig declares (an unknown one fails older PEFT releases)
        peft_fields = {"peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "r",
                       "lora_alpha", "lora_dropout", "target_modules", "bias", "fan_in_fan_out",
                       "init_lora_weights", "use_rslora", "use_dora", "modules_to_save", "layers_to_transform",
                       "layers_pattern", "rank_pattern", "alpha_pattern"}
        self.assertEqual(set(cfg) - peft_fields, set())
        self.assertNotIn("rstar_step", cfg)
        self.assertEqual(L.adapter_metadata(ad), {"format": "pt", "rstar_step": "7"})
        self.assertEqual(L.adapter_step(ad), 7)

    def test_load_adapter_gives_the_saved_model(self):
        m, ad = self.saved()
        fresh = small_model()
        spec = L.load_adapter(fresh, ad)
        self.assertEqual((spec.r, spec.alpha), (4, 8.0))
        self.assertTrue(torch.equal(logits(fresh), logits(m)))

    def test_loading_over_a_merged_adapter_is_refused(self):
        m, ad = self.saved()
        L.merge_lora(m)
        with self.assertRaisesRegex(L.AdapterError, "current adapter is merged"):
            L.load_adapter(m, ad)
        L.unmerge_lora(m)
        L.load_adapter(m, ad)

    def rewrite_config(self, ad, **change):
        path = os.path.join(ad, "adapter_config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg.update(change)
        with open(path, "w") as f:
            json.dump(cfg, f)

    def test_bad_adapters_fail_with_one_line_naming_file_and_field(self):
        _, ad = self.saved()
        self.rewrite_config(ad, r=8)
        with self.assertRaisesRegex(L.AdapterError, r"adapter_model.safetensors: .*lora_A.weight: shape \[4, 32\] "
                                                    r"does not have rank r=8"):
            L.read_adapter(ad)
        self.rewrite_config(ad, r=4, target_modules=["q_proj", "lm_head"])
        with self.assertRaisesRegex(L.AdapterError, "adapter_config.json: target_modules: lm_head"):
            L.read_adapter(ad)
        self.rewrite_config(ad, target_modules=["q_proj"])
        with self.assertRaisesRegex(L.AdapterError, "k_proj.lora_A.weight: module not in adapter_config.json"):
            L.read_adapter(ad)
        self.rewrite_config(ad, target_modules=L.ALL_TARGETS, use_dora=True)
        with self.assertRaisesRegex(L.AdapterError, "adapter_config.json: use_dora: true is not supported"):
            L.read_adapter(ad)
        self.rewrite_config(ad, use_dora=False, peft_type="IA3")
        with self.assertRaisesRegex(L.AdapterError, 'adapter_config.json: peft_type: expected "LORA"'):
            L.read_adapter(ad)
        self.rewrite_config(ad, peft_type="LORA")
        L.read_adapter(ad)
        os.remove(os.path.join(ad, "adapter_model.safetensors"))
        with self.assertRaisesRegex(L.AdapterError, "adapter_model.safetensors: missing"):
            L.read_adapter(ad)
        with self.assertRaisesRegex(L.AdapterError, "adapter_config.json: missing"):
            L.read_adapter(self.tmp)

    def test_an_adapter_of_another_shape_is_refused(self):
        _, ad = self.saved()
        wider = small_model(hidden_size=48)
        with self.assertRaisesRegex(L.AdapterError,
                                    r"q_proj.lora_A.weight: shape \[4, 32\] but the model's layer is \[4, 48\]"):
            L.load_adapter(wider, ad)
        deeper = small_model(num_hidden_layers=3)
        with self.assertRaisesRegex(L.AdapterError, r"layers.2.self_attn.q_proj.lora_A.weight: missing"):
            L.load_adapter(deeper, ad)


class Merge(TempDirCase):
    def test_model_merge_output_has_the_log_probs_of_base_plus_adapter(self):
        base_dir = self.checkpoint("base")
        m = load_model(base_dir)
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        randomise_adapter(m)
        L.save_adapter(m, m.lora_spec, self.path("ad"), base_dir)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = L.main(["--base", base_dir, "--adapter", self.path("ad"), "--out", self.path("merged")])
        self.assertEqual(rc, 0)
        summary = json.loads(out.getvalue())
        self.assertEqual((summary["r"], summary["target_modules"]), (4, list(L.ALL_TARGETS)))
        merged = load_model(self.path("merged"))
        self.assertEqual(L.lora_layers(merged), [])
        self.assertLess(float((logprobs(merged) - logprobs(m)).abs().max()), 1e-5)
        # and it is not the base
        self.assertGreater(float((logprobs(merged) - logprobs(load_model(base_dir))).abs().max()), 1e-3)

    def test_model_merge_refuses_an_adapter_of_another_base(self):
        other = self.checkpoint("other", hidden_size=48)
        base_dir = self.checkpoint("base")
        m = load_model(other)
        L.add_lora(m, L.LoraSpec(r=4, alpha=8))
        L.save_adapter(m, m.lora_spec, self.path("ad"), other)
        err = self.path("err")
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            rc = L.main(["--base", base_dir, "--adapter", self.path("ad"), "--out", err])
        self.assertEqual(rc, 1)
        self.assertRegex(buf.getvalue(), r"^rstar model-merge: .*ad/adapter_config.json: base_model_name_or_path: "
                                         r".*differs from --base .* in hidden_size\n$")


class Training(TempDirCase):
    def test_gradients_reach_only_the_adapter(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), lora_rank=4, lr=1e-2)
        base = {k: v.clone() for k, v in t.model.state_dict().items() if not L.is_lora_key(k)}
        adapter = {k: v.clone() for k, v in t.model.state_dict().items() if L.is_lora_key(k)}
        t.step(random_records(4, 5, 6, seed=1))
        for name, p in t.model.named_parameters():
            if L.is_lora_key(name):
                self.assertTrue(p.requires_grad, name)
                self.assertIsNotNone(p.grad, name)
            else:
                self.assertFalse(p.requires_grad, name)
                self.assertIsNone(p.grad, name)
        for k, v in t.model.state_dict().items():
            if k in base:
                self.assertTrue(torch.equal(v, base[k]), k)
        moved = [k for k, v in t.model.state_dict().items() if k in adapter and not torch.equal(v, adapter[k])]
        self.assertEqual(len(moved), len(adapter))  # A and B of every layer (B from its zero start)

    def test_optimizer_state_is_the_adapter_s_only(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), lora_rank=4)
        full = self.trainer(m0, self.path("f"))
        recs = random_records(2, 4, 4, seed=1)
        t.step(recs)
        full.step(recs)
        self.assertEqual(t.opt.param_groups[0]["params"], L.lora_parameters(t.model))

        def moment_bytes(opt):
            return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                       if torch.is_tensor(v) and v.dim() > 0)

        adapter_numel = sum(p.numel() for p in L.lora_parameters(t.model))
        self.assertEqual(moment_bytes(t.opt), 2 * 4 * adapter_numel)  # exp_avg and exp_avg_sq, fp32
        print(f"\n  lora r=4 tiny: optimizer state {moment_bytes(t.opt)} B vs full {moment_bytes(full.opt)} B "
              f"({moment_bytes(t.opt) / moment_bytes(full.opt):.1%})")

    def test_train_step_learns_and_writes_an_adapter_folder(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("a{step}"), lora_rank=8, lr=2e-2)
        recs = random_records(4, 4, 8, seed=3)
        losses = [t.step(recs)["loss"] for _ in range(12)]
        self.assertLess(losses[-1], losses[0] - 0.3, losses)
        ad = self.path("a12")
        self.assertEqual(sorted(os.listdir(ad)), ["adapter_config.json", "adapter_model.safetensors",
                                                  "optimizer.safetensors", "step.json", "trainer_state.json"])
        with open(os.path.join(ad, "step.json")) as f:
            record = json.load(f)
        self.assertIs(record["adapter"], True)
        self.assertEqual(L.adapter_step(ad), 12)
        spec, _ = L.read_adapter(ad)
        self.assertEqual((spec.r, spec.alpha), (8, 8.0))  # alpha defaults to the rank
        with open(os.path.join(ad, "adapter_config.json")) as f:
            self.assertEqual(json.load(f)["base_model_name_or_path"], os.path.abspath(m0))
        # the folder is the trained model: base + adapter gives the trainer's log-probs
        m = load_model(m0)
        L.load_adapter(m, ad)
        t.model.eval()
        self.assertTrue(torch.equal(logprobs(m), logprobs(t.model)))

    def test_lora_init_warm_starts_adapter_and_moments(self):
        m0 = self.checkpoint()
        recs = random_records(4, 4, 8, seed=3)
        t = self.trainer(m0, self.path("a{step}"), lora_rank=4, lr=1e-2)
        for _ in range(3):
            t.step(recs)
        warm = self.trainer(m0, self.path("b{step}"), lora_init=self.path("a3"), lr=1e-2)
        self.assertEqual(warm.step_no, 3)
        t.model.eval()
        warm.model.eval()
        self.assertTrue(torch.equal(logprobs(warm.model), logprobs(t.model)))
        for p, q in zip(L.lora_parameters(t.model), L.lora_parameters(warm.model)):
            self.assertTrue(torch.equal(t.opt.state[p]["exp_avg_sq"], warm.opt.state[q]["exp_avg_sq"]))
        t.model.train()
        warm.model.train()
        # so the next step is the one the first trainer would have taken
        self.assertEqual(warm.step(recs)["loss"], t.step(recs)["loss"])
        with self.assertRaisesRegex(L.AdapterError, r"a3/adapter_config.json: r: 4 but --lora-rank 8"):
            self.trainer(m0, self.path("c"), lora_init=self.path("a3"), lora_rank=8)
        with self.assertRaisesRegex(L.AdapterError, r"a3/adapter_config.json: target_modules: .* but --lora-targets q"):
            self.trainer(m0, self.path("c"), lora_init=self.path("a3"), lora_targets="q")

    def test_kl_reference_is_the_base_without_a_second_model(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), lora_rank=4, loss="grpo", kl_coef=0.1, lr=1e-2)
        self.assertIsNone(t.ref)
        recs = random_records(4, 4, 6, seed=2, advantages=True)
        self.assertEqual(t.step(recs)["kl"], 0.0)  # B = 0: the policy is the base
        self.assertGreater(t.step(recs)["kl"], 0.0)

    def test_bf16_keeps_the_base_in_bf16_and_the_adapter_in_fp32(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), lora_rank=4, dtype="bf16", lr=1e-2)
        for name, p in t.model.named_parameters():
            self.assertEqual(p.dtype, torch.float32 if L.is_lora_key(name) else torch.bfloat16, name)
        rec = t.step(random_records(2, 4, 4, seed=1))
        self.assertTrue(math.isfinite(rec["loss"]))


class Sharded(TempDirCase):
    def test_two_sharded_ranks_with_lora_match_one_process(self):
        """The sharded path's glue with LoRA (test_sharded_glue's stand-in for FSDP2, 2 gloo ranks): the
        adapter-off KL reference's idle passes, the adapter-only gather and save."""
        from test_sharded_glue import RANK

        m0 = self.checkpoint()
        recs = [{"prompt_ids": [1, 2, 3, 4], "response_ids": [5 + i, 6, 7, 8, 9], "loss_mask": [1, 1, 1, 0, 1],
                 "advantage": 1.0 - i} for i in range(3)]
        data = self.path("data.jsonl")
        write_jsonl(data, recs + [{"end_batch": True}] + recs[::-1] + [{"end_batch": True}])
        base = {**SETTINGS, "model": m0, "loss": "grpo", "optimizer": "sgd", "lr": 0.5, "micro_batch_tokens": 9,
                "kl_coef": 0.1, "rollout_correction": "none", "lora_rank": 4}
        one = run_ranks(self, RANK, {**base, "out": self.path("one")}, data, 1)
        two = run_ranks(self, RANK, {**base, "out": self.path("two"), "shard": "full"}, data, 2)
        self.assertEqual([s["adapter"] for s in two], [True, True])
        for a, b in zip(one, two):
            self.assertAlmostEqual(a["loss"], b["loss"], places=6)
            self.assertAlmostEqual(a["kl"], b["kl"], places=6)
        (_, w1), (_, w2) = L.read_adapter(self.path("one")), L.read_adapter(self.path("two"))
        moved = max(float(w1[k].abs().max()) for k in w1 if ".lora_B." in k)
        diff = max(float((w2[k] - w1[k]).abs().max()) for k in w1)
        self.assertGreater(moved, 1e-3)
        self.assertLess(diff, 1e-5 * moved + 1e-7)


class Sizes(TempDirCase):
    def test_adapter_bytes_against_a_full_checkpoint(self):
        """Tiny (measured) and Qwen2.5-0.5B's shape (counted on the meta device, bf16 checkpoint)."""
        m = small_model()
        save_model(m, self.path("full"))
        L.add_lora(m, L.LoraSpec(r=4, alpha=4))
        L.save_adapter(m, m.lora_spec, self.path("ad"), "base")
        tiny = (os.path.getsize(self.path("ad", "adapter_model.safetensors"))
                / os.path.getsize(self.path("full", "model.safetensors")))
        cfg = ModelConfig.from_dict(dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                         head_dim=64, tie_word_embeddings=True, max_position_embeddings=32768,
                                         rope_theta=1e6))
        big = CausalLM(cfg, device="meta")
        full = sum(p.numel() for p in big.parameters())
        L.add_lora(big, L.LoraSpec(r=32, alpha=32))
        adapter = sum(p.numel() for p in L.lora_parameters(big))
        self.assertEqual(full, 494_008_192)  # Qwen2.5-0.5B's shape (its q/k/v biases aside: not LoRA's concern)
        ratio = adapter / full  # both bf16 on disk
        print(f"\n  adapter/full bytes: tiny r=4 {tiny:.1%}; 0.5B-class r=32 all-linear {ratio:.2%} "
              f"({adapter * 2 / 2**20:.1f} MiB vs {full * 2 / 2**20:.0f} MiB); optimizer {ratio:.2%} of full")
        self.assertLess(ratio, 0.05)

    def test_safetensors_header_is_well_formed(self):
        m = small_model()
        L.add_lora(m, L.LoraSpec(r=2, alpha=2, targets=("q_proj",)))
        L.save_adapter(m, m.lora_spec, self.path("ad"), "base", step=3)
        with open(self.path("ad", "adapter_model.safetensors"), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.assertEqual(n % 8, 0)
        self.assertEqual(header["__metadata__"], {"format": "pt", "rstar_step": "3"})
        self.assertEqual(header["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]["dtype"], "F32")
