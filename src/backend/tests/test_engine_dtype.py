"""engine-serve --dtype/--device: bf16 weights and KV cache, fp32 logits, and the trainer's fp32
log-probs of the served sequences within a bf16 tolerance."""

import argparse
import unittest

import torch

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import load_model, save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM, token_logprobs

# head_dim != hidden / heads and GQA, as Qwen3; initializer_range 0.2 so the next-token distributions
# are peaked (log-prob std ~1.6 nats) rather than the near-uniform ones of a 0.02 init, where any
# arithmetic agrees with any other.
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, initializer_range=0.2)
PROMPTS = [[1, 5, 9, 33], [1, 70, 3], [1, 200, 201, 202, 203, 9], [1, 11]]
NEW_TOKENS = 96


def engine_args(model, dtype, device="cpu"):
    return argparse.Namespace(model=model, device=device, dtype=dtype, max_total_tokens=2048,
                              max_running_requests=8, weight_version="0")


def generate(engine, prompts, new_tokens=NEW_TOKENS):
    sp = dict(max_new_tokens=new_tokens, temperature=1.0, seed=7, ignore_eos=True)
    reqs = [E.Request(str(i), p, E.parse_sampling(sp, engine.cfg.eos_token_id, engine.context_len, len(p)), True, 0)
            for i, p in enumerate(prompts)]
    engine.submit(reqs)
    for r in reqs:
        r.done.wait()
    return reqs


def trainer_logprobs(model_dir, reqs):
    """fp32 log-probs of every token after the first, by the training forward (right-padded rows with
    lengths, logits only where wanted), independent of the engine's KV cache."""
    model = load_model(model_dir)
    seqs = [r.input_ids + r.output for r in reqs]
    lengths = [len(s) for s in seqs]
    T = max(lengths)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    pos = torch.zeros(len(seqs), T - 1, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        pos[i, :len(s) - 1] = torch.arange(len(s) - 1)
    with torch.no_grad():
        lp = token_logprobs(model(ids, logits_at=pos, lengths=lengths), ids[:, 1:])
    return [lp[i, :n - 1] for i, n in enumerate(lengths)]


def served_logprobs(r):
    """The engine's log-probs of tokens 1.. of prompt + output (logprob_start_len 0)."""
    prompt = [x[0] for x in r.in_logprobs[1:]]
    return torch.tensor(prompt + [x[0] for x in r.out_logprobs])


class EngineDtype(TempDirCase):
    def setUp(self):
        super().setUp()
        cfg = Qwen3Config.from_dict(CONFIG)
        m = Qwen3ForCausalLM(cfg)
        m.init_weights(3)
        self.model = self.path("m")
        save_model(m, self.model)
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        super().tearDown()

    def serve(self, dtype, device="cpu"):
        e = E.Engine(engine_args(self.model, dtype, device))
        self.engines.append(e)
        return e

    def mismatch(self, dtype):
        e = self.serve(dtype)
        reqs = generate(e, PROMPTS)
        for r in reqs:
            self.assertEqual(len(r.output), NEW_TOKENS)
            self.assertEqual(r.finish["type"], "length")
        served = torch.cat([served_logprobs(r) for r in reqs])
        train = torch.cat(trainer_logprobs(self.model, reqs))
        self.assertEqual(served.shape, train.shape)
        return served, (served - train).abs()

    def test_bf16_serving_holds_bf16_weights_and_cache_with_fp32_rotary(self):
        e = self.serve("bf16")
        self.assertEqual(e.dtype, torch.bfloat16)
        self.assertEqual({p.dtype for p in e.model.parameters()}, {torch.bfloat16})
        self.assertEqual(e.pool.k.dtype, torch.bfloat16)
        self.assertEqual(e.model.model.rotary.inv_freq.dtype, torch.float32)
        self.assertEqual(E.server_info(e)["dtype"], "bfloat16")
        self.assertEqual(E.server_info(e)["device"], "cpu")
        # an fp32 KV cache would be twice the size: the budget is really held in bf16
        shape = (CONFIG["num_hidden_layers"], 2048, CONFIG["num_key_value_heads"], CONFIG["head_dim"])
        self.assertEqual(e.pool.nbytes, 2 * 2 * torch.Size(shape).numel())
        # a weight reload keeps the served dtype and the fp32 rotary frequencies
        e.update_weights(self.model, "1")
        self.assertEqual({p.dtype for p in e.model.parameters()}, {torch.bfloat16})
        self.assertEqual(e.model.model.rotary.inv_freq.dtype, torch.float32)

    def test_bf16_serve_and_fp32_train_logprobs_agree_within_bf16_tolerance(self):
        served, diff = self.mismatch("bf16")
        # the distributions are peaked (a tolerance on near-uniform ones would test nothing)
        self.assertGreater(float(served.std()), 1.0)
        self.assertLess(float(diff.mean()), 0.05, f"mean |serve - train| {float(diff.mean()):.4f}")
        self.assertLess(float(diff.max()), 0.3, f"max |serve - train| {float(diff.max()):.4f}")
        # bf16 arithmetic really ran (fp32 would agree to ~1e-5) ...
        self.assertGreater(float(diff.max()), 1e-3)
        # ... and log-softmax and sampling ran on fp32 logits: the log-probs are not bf16-rounded
        rounded = served.bfloat16().float()
        self.assertGreater(float((rounded != served).float().mean()), 0.9)

    def test_fp32_serving_matches_training_closely(self):
        _, diff = self.mismatch("fp32")
        self.assertLess(float(diff.max()), 1e-4)

    def test_dtype_spellings(self):
        for name, dtype in (("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp32", torch.float32),
                            ("float32", torch.float32), ("fp16", torch.float16), ("float16", torch.float16)):
            self.assertEqual(E.serving_dtype(name, torch.device("cpu"), self.model), dtype)
        # auto: fp32 on CPU whatever the checkpoint says
        self.assertEqual(E.serving_dtype("auto", torch.device("cpu"), self.model), torch.float32)

    def test_a_dtype_the_device_cannot_run_is_a_clear_error(self):
        # torch 1.13 has no fp16 matmul on CPU; newer builds do: either it serves, or it says why
        try:
            E.check_device(torch.device("cpu"), torch.float16)
        except E.SetupError as e:
            self.assertIn("--dtype float16 on cpu: this torch cannot run a float16 matmul there", str(e))

    @unittest.skipIf(torch.cuda.is_available(), "a GPU is present")
    def test_cuda_without_a_gpu_is_a_clear_error(self):
        with self.assertRaisesRegex(E.SetupError, r"--device cuda: torch .* sees no GPU"):
            self.serve("bf16", "cuda")

    def test_an_unknown_device_is_a_clear_error(self):
        for name in ("gpu0", "meta"):
            with self.assertRaisesRegex(E.SetupError, f"--device {name}: "):
                E.serving_device(name)


if __name__ == "__main__":
    unittest.main()
