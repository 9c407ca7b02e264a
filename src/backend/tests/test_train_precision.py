"""train-step --dtype (bf16 compute, fp32 master weights and AdamW state) and the setup errors of
--dtype/--shard; the parts of the sharded path that run without FSDP2 (this torch has none)."""

import math
import unittest

import torch

from common import TempDirCase, batch, random_records, read_json
from rstar_backend import engine as E
from rstar_backend import parallel
from rstar_backend.checkpoint import load_model, load_safetensors, load_state_dict, save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM, rotary_frequencies, token_logprobs
from rstar_backend.parallel import SetupError
from rstar_backend.train import pack, sequence
from test_engine_dtype import CONFIG, engine_args, generate

# peaked next-token distributions (init std 0.2), so bf16 tolerances mean something
PEAKED = dict(initializer_range=0.2)


records = random_records


def trainer_logprobs(trainer, recs):
    """The trainer's own log-probs (its dtype, packing and forward) of each record's response."""
    seqs = [{"prompt": r["prompt_ids"], "response": r["response_ids"], "mask": r["loss_mask"], "logprobs": None,
             "advantage": 0.0} for r in recs]
    with torch.no_grad():
        ids, pos, tgt, mask, *_rest, lengths = pack(seqs, trainer.device, trainer.cfg.pad_token_id)
        lp = token_logprobs(trainer.logits(trainer.model, ids, pos, lengths), tgt)
    return [lp[i, :int(mask[i].sum())] for i in range(len(seqs))]


class Bf16Training(TempDirCase):
    def test_bf16_sft_steps_lower_the_loss_with_fp32_master_weights_and_moments(self):
        m0 = self.checkpoint(**PEAKED)
        data = records(6, 6, 10, seed=1)
        t = self.trainer(m0, self.path("o"), dtype="bf16", lr=3e-3)
        self.assertEqual(t.dtype, torch.bfloat16)
        steps = [t.step(batch(data)) for _ in range(4)]
        losses = [s["loss"] for s in steps]
        self.assertTrue(all(math.isfinite(x) for x in losses), losses)
        self.assertTrue(all(b < a for a, b in zip(losses, losses[1:])), losses)
        self.assertEqual(steps[-1]["dtype"], "bf16")
        self.assertEqual(steps[-1]["shard"], "none")
        # the master weights and AdamW's moments stay fp32; the checkpoint keeps the config's dtype
        self.assertEqual({p.dtype for p in t.model.parameters()}, {torch.float32})
        self.assertEqual({st["exp_avg"].dtype for st in t.opt.state.values()}, {torch.float32})
        self.assertEqual(read_json(self.path("o", "config.json"))["torch_dtype"], "float32")
        self.assertEqual({v.dtype for v in load_state_dict(self.path("o")).values()}, {torch.float32})
        self.assertEqual({v.dtype for k, v in load_safetensors(self.path("o", "optimizer.safetensors")).items()
                          if k.startswith("exp_avg")}, {torch.float32})

    def test_bf16_compute_really_runs_and_stays_close_to_fp32(self):
        m0 = self.checkpoint(**PEAKED)
        data = records(6, 6, 10, seed=2)
        fp32 = self.trainer(m0, self.path("a"), dtype="fp32").step(batch(data))["loss"]
        bf16 = self.trainer(m0, self.path("b"), dtype="bf16").step(batch(data))["loss"]
        self.assertNotEqual(fp32, bf16)  # fp32 would reproduce the loss to the last bit
        self.assertLess(abs(fp32 - bf16), 0.02 * abs(fp32))
        # the logits are bf16 (autocast), the log-probs computed from them fp32
        t = self.trainer(m0, self.path("c"), dtype="bf16")
        ids = torch.tensor([[1, 5, 9, 11]])
        pos = torch.tensor([[0, 1, 2]])
        self.assertEqual(t.logits(t.model, ids, pos, [4]).dtype, torch.bfloat16)
        self.assertEqual(trainer_logprobs(t, data[:1])[0].dtype, torch.float32)

    def test_bf16_grpo_steps_move_log_probs_towards_positive_advantages(self):
        m0 = self.checkpoint(**PEAKED)
        data = records(8, 6, 10, seed=3, advantages=True)
        t = self.trainer(m0, self.path("g"), loss="grpo", old_logprobs="rollout", dtype="bf16", lr=3e-3)
        # the rollout's log-probs fixed at the start: the clipped surrogate falls as the policy moves
        start = trainer_logprobs(t, data)
        data = [dict(r, logprobs=lp.tolist()) for r, lp in zip(data, start)]
        margins, losses = [], []
        for _ in range(3):
            lps = trainer_logprobs(t, data)
            pos = torch.cat([lp for lp, r in zip(lps, data) if r["advantage"] > 0]).mean()
            neg = torch.cat([lp for lp, r in zip(lps, data) if r["advantage"] < 0]).mean()
            margins.append(float(pos - neg))
            losses.append(t.step(batch(data))["loss"])
        self.assertTrue(all(math.isfinite(x) for x in losses + margins))
        self.assertTrue(all(b < a for a, b in zip(losses, losses[1:])), losses)
        self.assertTrue(all(b > a for a, b in zip(margins, margins[1:])), margins)

    def test_a_bf16_checkpoint_stays_bf16_while_training_in_fp32_master_weights(self):
        m0 = self.checkpoint(torch_dtype="bfloat16", **PEAKED)
        t = self.trainer(m0, self.path("o"), dtype="bf16", lr=3e-3)
        self.assertEqual({p.dtype for p in t.model.parameters()}, {torch.float32})
        t.step(batch(records(4, 5, 6, seed=4)))
        self.assertEqual(read_json(self.path("o", "config.json"))["torch_dtype"], "bfloat16")
        self.assertEqual({v.dtype for v in load_state_dict(self.path("o")).values()}, {torch.bfloat16})
        # the fp32 moments continue from the bf16 checkpoint
        again = self.trainer(self.path("o"), self.path("o2"), dtype="bf16")
        self.assertEqual(again.step_no, 1)
        self.assertEqual({st["exp_avg"].dtype for st in again.opt.state.values()}, {torch.float32})


class ServeAndTrainInBf16(TempDirCase):
    """engine-serve --dtype bf16 and train-step --dtype bf16 on the same sequences."""

    def setUp(self):
        super().setUp()
        m = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG))
        m.init_weights(3)
        self.model = self.path("m")
        save_model(m, self.model)
        self.engine = E.Engine(engine_args(self.model, "bf16"))

    def tearDown(self):
        self.engine.close()
        super().tearDown()

    def test_bf16_serve_and_bf16_train_logprobs_agree_within_bf16_tolerance(self):
        reqs = generate(self.engine, [[1, 5, 9, 33], [1, 70, 3], [1, 200, 201, 202, 203, 9]], 64)
        recs = [{"prompt_ids": r.input_ids, "response_ids": r.output, "loss_mask": [1] * len(r.output)}
                for r in reqs]
        served = torch.cat([torch.tensor([x[0] for x in r.out_logprobs]) for r in reqs])
        bf16 = torch.cat(trainer_logprobs(self.trainer("bf16"), recs))
        fp32 = torch.cat(trainer_logprobs(self.trainer("fp32"), recs))
        self.assertGreater(float(served.std()), 1.0)  # peaked distributions
        d = (served - bf16).abs()
        self.assertLess(float(d.mean()), 0.05, f"mean |serve bf16 - train bf16| {float(d.mean()):.4f}")
        self.assertLess(float(d.max()), 0.5, f"max |serve bf16 - train bf16| {float(d.max()):.4f}")
        self.assertLess(float((served - fp32).abs().mean()), 0.05)
        self.assertGreater(float((bf16 - fp32).abs().max()), 1e-4)  # the trainer's bf16 really ran
        # the GRPO step reports the same mismatch, as the pipeline sees it
        rec = self.trainer("bf16", loss="grpo", old_logprobs="rollout").step(batch(
            dict(r, advantage=1.0, logprobs=[x[0] for x in q.out_logprobs]) for r, q in zip(recs, reqs)))
        self.assertAlmostEqual(rec["logprob_mismatch"], float(d.mean()), places=5)

    def trainer(self, dtype, **over):
        return super().trainer(self.model, self.path(f"t-{dtype}"), dtype=dtype, **over)


class SetupErrors(TempDirCase):
    def test_fp16_needs_a_gpu_and_fails_before_reading_the_checkpoint(self):
        with self.assertRaisesRegex(SetupError, r"--dtype fp16 on cpu: .*use --dtype bf16"):
            self.trainer(self.path("no-such-checkpoint"), self.path("o"), dtype="fp16")

    @unittest.skipIf(torch.cuda.is_available(), "a GPU is present")
    def test_cuda_without_a_gpu_is_a_clear_error(self):
        with self.assertRaisesRegex(SetupError, r"--device cuda: torch .* sees no GPU"):
            self.trainer(self.path("no-such-checkpoint"), self.path("o"), device="cuda", dtype="bf16")

    def test_shard_needs_two_processes(self):
        with self.assertRaisesRegex(SetupError, r"--shard full: needs --nproc 2 or more"):
            self.trainer(self.path("no-such-checkpoint"), self.path("o"), shard="full")

    def test_shard_on_a_torch_without_fsdp2_is_a_clear_error(self):
        cpu = torch.device("cpu")
        try:
            parallel.fully_shard_api()
        except SetupError:
            if parallel.torch_version() < (2, 4):
                with self.assertRaisesRegex(SetupError, r"^--shard: needs torch >= 2\.4 .*Use --shard none"):
                    parallel.check_setup("fp32", "grad-op", cpu, 2)
            else:
                with self.assertRaisesRegex(SetupError, r"^--shard: torch .* cannot import FSDP2"):
                    parallel.check_setup("fp32", "grad-op", cpu, 2)
        else:
            self.assertIs(parallel.check_setup("bf16", "full", cpu, 2), torch.bfloat16)
        self.assertIs(parallel.check_setup("bf16", "none", cpu, 2), torch.bfloat16)

    @unittest.skipIf(not torch.cuda.is_available(), "needs a GPU")
    def test_fp16_with_shard_is_refused(self):
        with self.assertRaisesRegex(SetupError, "loss scaler does not work on sharded gradients"):
            parallel.check_setup("fp16", "full", torch.device("cuda"), 2)

    def test_unknown_names(self):
        with self.assertRaisesRegex(SetupError, "--dtype: expected one of fp32, bf16, fp16"):
            parallel.check_setup("int8", "none", torch.device("cpu"), 1)
        with self.assertRaisesRegex(SetupError, "--shard: expected one of none, full, grad-op"):
            parallel.check_setup("fp32", "zero3", torch.device("cpu"), 2)


class ShardedPathWithoutFsdp(TempDirCase):
    """What the sharded path does besides FSDP2's own calls: equal pass counts, idle passes, gathering."""

    def test_every_rank_runs_as_many_micro_batches_when_sharded(self):
        t = self.trainer(self.checkpoint(), self.path("o"), micro_batch_tokens=10)
        # 1 and 2 micro-batches of at most 2 sequences of 5 tokens
        short, long = ([sequence(r) for r in records(n, 2, 3, seed=n)] for n in (1, 4))
        t.rank, t.world = 0, 2
        self.assertEqual(len(t.my_micro_batches([short, long])), 1)  # data parallel: its own count
        t.sharded = True
        mine = t.my_micro_batches([short, long])
        self.assertEqual(len(mine), 2)
        self.assertIsNone(mine[1])
        t.rank = 1
        self.assertEqual([len(mb) for mb in t.my_micro_batches([short, long])], [2, 2])
        self.assertEqual(t.my_micro_batches([[], []]), [])

    def test_an_idle_pass_leaves_the_gradients_zero(self):
        t = self.trainer(self.checkpoint(), self.path("o"), kl_coef=0.1)
        t.idle_pass(train=True)
        grads = [p.grad for p in t.params]
        self.assertTrue(all(g is not None for g in grads))
        self.assertTrue(all(float(g.abs().max()) == 0.0 for g in grads))

    def test_gather_keeps_whole_cpu_tensors_on_rank_0_only(self):
        x = {"a": torch.ones(2, 3), "b": torch.arange(4.0)}
        got = parallel.gather(x, True, torch.bfloat16)
        self.assertEqual({k: v.dtype for k, v in got.items()}, {"a": torch.bfloat16, "b": torch.bfloat16})
        self.assertTrue(torch.equal(got["b"].float(), x["b"]))
        self.assertEqual(parallel.gather(x, False), {})
        p = torch.zeros(3, dtype=torch.float32)
        self.assertEqual(parallel.like(p, torch.ones(3, dtype=torch.bfloat16)).dtype, torch.float32)
        self.assertEqual(parallel.norm_value(torch.tensor(2.5)), 2.5)


class RotaryStaysFp32(TempDirCase):
    def test_casts_and_moves_keep_fp32_frequencies(self):
        m = self.checkpoint()
        cfg = load_model(m).config
        exact = rotary_frequencies(cfg.head_dim, cfg.rope_theta)
        for model in (load_model(m, dtype=torch.bfloat16), load_model(m).bfloat16(), load_model(m).to(torch.float16),
                      load_model(m).half().float()):
            inv = model.model.rotary.inv_freq
            self.assertEqual(inv.dtype, torch.float32)
            self.assertTrue(torch.equal(inv, exact))

    def test_load_model_builds_in_the_target_dtype_with_the_head_tied(self):
        m = self.checkpoint()
        model = load_model(m, dtype=torch.bfloat16)
        self.assertEqual({p.dtype for p in model.parameters()}, {torch.bfloat16})
        self.assertIs(model.lm_head.weight, model.model.embed_tokens.weight)
        whole = load_model(m)
        for k, v in whole.state_dict().items():
            self.assertTrue(torch.equal(model.state_dict()[k], v.bfloat16()), k)


if __name__ == "__main__":
    unittest.main()
