import json
import math
import os

import torch

from common import TempDirCase, batch
from rstar_backend.checkpoint import load_model
from rstar_backend.model import token_logprobs
from rstar_backend.train import DataError, micro_batches, read_batches

A = {"prompt_ids": [1, 5, 9], "response_ids": [10, 11, 12, 13], "loss_mask": [1, 1, 0, 1]}
B = {"prompt_ids": [2, 6], "response_ids": [20, 21, 22], "loss_mask": [1, 1, 1]}


def logprobs_of(model_dir, rec):
    """Per-response-token log-probs by a plain forward, independent of the trainer's packing."""
    m = load_model(model_dir)
    ids = torch.tensor([rec["prompt_ids"] + rec["response_ids"]])
    with torch.no_grad():
        logits = m(ids)[0]
    p = len(rec["prompt_ids"])
    return token_logprobs(logits[p - 1:-1], ids[0, p:]).tolist()


def weights(folder):
    return load_model(folder).state_dict()


class Losses(TempDirCase):
    def test_sft_loss_is_masked_token_mean_nll(self):
        m0 = self.checkpoint()
        rec = self.trainer(m0, self.path("o"), loss="sft").step(batch([A, B]))
        la, lb = logprobs_of(m0, A), logprobs_of(m0, B)
        terms = [-x for x, k in zip(la, A["loss_mask"]) if k] + [-x for x in lb]
        self.assertAlmostEqual(rec["loss"], sum(terms) / len(terms), places=5)
        self.assertEqual(rec["loss_tokens"], 6)
        self.assertEqual(rec["step"], 1)
        self.assertEqual(rec["sequences"], 2)
        self.assertEqual(rec["tokens"], 12)

    def test_grpo_loss_and_clipping_match_hand_computation(self):
        m0 = self.checkpoint()
        la, lb = logprobs_of(m0, A), logprobs_of(m0, B)
        # behaviour log-probs shifted so the ratios r = exp(logp - old) land inside and outside [0.8, 1.28]
        shift_a = [-0.5, 0.1, 0.0, 0.4]   # ratios 1.65 (clipped for A>0), 0.90, masked, 0.67
        shift_b = [0.5, -0.1, -0.4]       # ratios 0.61 (clipped for A<0), 1.11, 1.49
        a = dict(A, advantage=1.5, logprobs=[x - s for x, s in zip(la, shift_a)])
        b = dict(B, advantage=-0.7, logprobs=[x - s for x, s in zip(lb, shift_b)])
        rec = self.trainer(m0, self.path("o"), loss="grpo", old_logprobs="rollout").step(batch([a, b]))
        terms, clipped = [], 0
        for r, shifts in ((a, shift_a), (b, shift_b)):
            for s, k in zip(shifts, r["loss_mask"]):
                if not k:
                    continue
                ratio = math.exp(s)
                adv = r["advantage"]
                u, c = -adv * ratio, -adv * min(max(ratio, 0.8), 1.28)
                terms.append(max(u, c))
                clipped += c > u
        self.assertAlmostEqual(rec["loss"], sum(terms) / len(terms), places=5)
        self.assertAlmostEqual(rec["pg_clipfrac"], clipped / len(terms), places=6)
        self.assertEqual(clipped, 2)
        mismatch = sum(abs(s) for r, sh in ((a, shift_a), (b, shift_b)) for s, k in zip(sh, r["loss_mask"]) if k)
        self.assertAlmostEqual(rec["logprob_mismatch"], mismatch / 6, places=5)

    def test_fully_clipped_tokens_give_no_gradient(self):
        m0 = self.checkpoint()
        la = logprobs_of(m0, A)
        a = dict(A, advantage=1.0, logprobs=[x - 1.0 for x in la])  # every ratio e^1 > 1.28 with A > 0
        rec = self.trainer(m0, self.path("o"), loss="grpo", old_logprobs="rollout").step(batch([a]))
        self.assertEqual(rec["pg_clipfrac"], 1.0)
        self.assertEqual(rec["grad_norm"], 0.0)

    def test_recompute_default_has_unit_ratio(self):
        m0 = self.checkpoint()
        a = dict(A, advantage=1.0, logprobs=[-1.0] * 4)
        b = dict(B, advantage=-1.0)
        rec = self.trainer(m0, self.path("o"), loss="grpo", rollout_correction="none").step(batch([a, b]))
        self.assertEqual(rec["pg_clipfrac"], 0.0)
        self.assertEqual(rec["approx_kl"], 0.0)
        self.assertAlmostEqual(rec["loss"], (-1.0 * 3 + 1.0 * 3) / 6, places=6)
        self.assertIn("logprob_mismatch", rec)  # rollout log-probs present on A: reported, not used
        self.assertEqual(rec["rollout_correction"], "none")

    def test_entropy_bonus_and_kl(self):
        m0 = self.checkpoint()
        base = self.trainer(m0, self.path("o1"), loss="sft").step(batch([A]))
        bonus = self.trainer(m0, self.path("o2"), loss="sft", entropy_coef=0.1).step(batch([A]))
        self.assertAlmostEqual(bonus["loss"], base["loss"] - 0.1 * base["entropy"], places=5)
        t = self.trainer(m0, self.path("o3"), loss="grpo", kl_coef=0.5, ref=m0, lr=1e-2)
        first = t.step(batch([dict(A, advantage=1.0)]))
        self.assertAlmostEqual(first["kl"], 0.0, places=7)
        second = t.step(batch([dict(A, advantage=1.0)]))
        self.assertGreater(second["kl"], 0.0)


class Updates(TempDirCase):
    def test_grpo_moves_logprobs_with_the_advantage(self):
        m0 = self.checkpoint()
        a, b = dict(A, advantage=1.0), dict(B, advantage=-1.0)
        before_a, before_b = sum(logprobs_of(m0, A)), sum(logprobs_of(m0, B))
        self.trainer(m0, self.path("m1"), loss="grpo", lr=1e-2).step(batch([a, b]))
        self.assertGreater(sum(logprobs_of(self.path("m1"), A)), before_a + 0.01)
        self.assertLess(sum(logprobs_of(self.path("m1"), B)), before_b - 0.01)

    def test_sft_overfits_a_fixed_batch(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), loss="sft", lr=1e-2)
        first = t.step(batch([A, B]))
        for _ in range(40):
            last = t.step(batch([A, B]))
        self.assertGreater(first["loss"], 3.0)
        self.assertLess(last["loss"], 0.05)
        self.assertEqual(last["step"], 41)

    def test_masked_tokens_get_no_gradient(self):
        m0 = self.checkpoint()
        # the last response token is masked: changing it must not change the update at all
        a1 = {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "loss_mask": [1, 1, 0]}
        a2 = dict(a1, response_ids=[3, 4, 60])
        self.trainer(m0, self.path("x"), loss="sft", lr=1e-2).step(batch([a1]))
        self.trainer(m0, self.path("y"), loss="sft", lr=1e-2).step(batch([a2]))
        wx, wy = weights(self.path("x")), weights(self.path("y"))
        for k in wx:
            self.assertTrue(torch.equal(wx[k], wy[k]), k)
        # a fully masked record contributes nothing either
        # a fully masked record contributes nothing either (SGD: the update is the gradient itself;
        # AdamW's first step is sign-like where |grad| ~ eps and would amplify rounding)
        c = {"prompt_ids": [7], "response_ids": [8, 9], "loss_mask": [0, 0]}
        sgd = dict(loss="sft", lr=1, optimizer="sgd", weight_decay=0)
        rx = self.trainer(m0, self.path("x2"), **sgd).step(batch([a1]))
        rz = self.trainer(m0, self.path("z"), **sgd).step(batch([a1, c]))
        self.assertAlmostEqual(rx["grad_norm"], rz["grad_norm"], places=6)
        self.assertAlmostEqual(rx["loss"], rz["loss"], places=6)
        wx, wz = weights(self.path("x2")), weights(self.path("z"))
        for k in wx:
            self.assertTrue(torch.allclose(wx[k], wz[k], atol=1e-7), k)

    def test_micro_batches_accumulate_to_the_same_update(self):
        m0 = self.checkpoint()
        recs = [A, B, dict(A, prompt_ids=[4]), dict(B, response_ids=[30, 31, 32])]
        sgd = dict(loss="sft", lr=1, optimizer="sgd", weight_decay=0)
        r1 = self.trainer(m0, self.path("x"), **sgd).step(batch(recs))
        r2 = self.trainer(m0, self.path("y"), **sgd, micro_batch_tokens=8).step(batch(recs))
        self.assertEqual(r1["micro_batches"], 1)
        self.assertEqual(r2["micro_batches"], 4)
        self.assertAlmostEqual(r1["loss"], r2["loss"], places=5)
        self.assertAlmostEqual(r1["grad_norm"], r2["grad_norm"], places=6)
        wx, wy = weights(self.path("x")), weights(self.path("y"))
        for k in wx:
            self.assertTrue(torch.allclose(wx[k], wy[k], atol=1e-7), k)
        self.assertFalse(torch.equal(wx["model.norm.weight"], weights(m0)["model.norm.weight"]))

    def test_micro_batches_pack_in_length_order(self):
        def seq(n):
            return {"prompt": [1] * 2, "response": [3] * (n - 2), "n": n}

        lengths = [40, 5, 38, 6, 7, 39, 5, 41]  # a long one in every pair, as a shuffle leaves them
        mbs = micro_batches([seq(n) for n in lengths], budget=82)
        # the four short ones pad to 7 together, the long ones to 41 in pairs; in input order every
        # micro-batch would pad a short sequence to a long one's length
        self.assertEqual([[s["n"] for s in mb] for mb in mbs], [[5, 5, 6, 7], [38, 39], [40, 41]])
        self.assertEqual(sorted(s["n"] for mb in mbs for s in mb), sorted(lengths))
        padded = sum(len(mb) * max(s["n"] for s in mb) for mb in mbs)
        self.assertEqual(padded, 4 * 7 + 2 * 39 + 2 * 41)  # in input order: 2 * (40 + 38 + 39 + 41) = 316
        self.assertEqual(len(micro_batches([seq(n) for n in lengths], budget=10 ** 6)), 1)
        self.assertEqual(micro_batches([], budget=82), [])

    def test_optimiser_state_continues_across_processes(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("r"), loss="sft", lr=1e-2)
        t.step(batch([A]))
        t.step(batch([B]))
        self.trainer(m0, self.path("s1"), loss="sft", lr=1e-2).step(batch([A]))
        rec = self.trainer(self.path("s1"), self.path("s2"), loss="sft", lr=1e-2).step(batch([B]))
        self.assertEqual(rec["step"], 2)
        wr, ws = weights(self.path("r")), weights(self.path("s2"))
        for k in wr:
            self.assertTrue(torch.allclose(wr[k], ws[k], atol=1e-7), k)
        # in place, as in `train-step --model ckpt/ --out ckpt/`
        inplace = self.checkpoint("inplace")
        self.trainer(inplace, inplace, loss="sft", lr=1e-2).step(batch([A]))
        self.trainer(inplace, inplace, loss="sft", lr=1e-2).step(batch([B]))
        wi = weights(inplace)
        for k in wr:
            self.assertTrue(torch.allclose(wr[k], wi[k], atol=1e-7), k)
        self.assertTrue(os.path.isfile(os.path.join(inplace, "optimizer.safetensors")))

    def test_warmup_and_grad_clipping(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), loss="sft", lr=1e-2, warmup_steps=4,
                         max_grad_norm=0.5)
        lrs = [t.step(batch([A]))["lr"] for _ in range(5)]
        self.assertEqual([round(x, 8) for x in lrs], [0.0025, 0.005, 0.0075, 0.01, 0.01])
        g = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in t.params))
        self.assertLessEqual(float(g), 0.5 + 1e-5)  # the stored gradients are the clipped ones


class Protocol(TempDirCase):
    """What only the trainer can tell, and the batch protocol (records are checked by the driver)."""

    def test_a_batch_without_loss_tokens_is_refused(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), loss="grpo")
        with self.assertRaisesRegex(DataError, "no loss tokens"):
            t.step(batch([{**A, "advantage": 1, "loss_mask": [0, 0, 0, 0]}]))
        with self.assertRaisesRegex(DataError, "no loss tokens"):
            t.step(batch([]))

    def test_end_batch_line_sets_the_steps_learning_rate(self):
        lines = ['{"a":1}\n', '{"end_batch":true,"lr":0.003}\n', '{"a":2}\n', '{"end_batch":true}\n']
        got = [(b[0]["a"], b.lr) for b in read_batches(iter(lines))]
        self.assertEqual(got, [(1, 0.003), (2, None)])
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), loss="sft", lr=1e-2, warmup_steps=4)
        lines = [json.dumps(A) + "\n", '{"end_batch":true,"lr":0.0005}\n', json.dumps(A) + "\n",
                 '{"end_batch":true}\n']
        lrs = [t.step(b)["lr"] for b in read_batches(iter(lines))]
        self.assertEqual([round(x, 8) for x in lrs], [0.0005, 0.005])  # the override, then the schedule

    def test_batches_end_at_end_batch_lines_only(self):
        lines = ['{"a":1}\n', '{"end_batch":true}\n', '{"end_batch":true}\n', '{"a":2}\n', '{"a":3}\n',
                 '{"end_batch":true}\n', '{"end_batch":true,"step":5}\n', '{"a":4}\n']
        got = [([r["a"] for r in b], b.step) for b in read_batches(iter(lines))]
        # an empty batch is skipped unless numbered; records after the last end_batch are dropped
        self.assertEqual(got, [([1], None), ([2, 3], None), ([], 5)])


C = {"prompt_ids": [3, 4], "response_ids": [30, 31, 32], "loss_mask": [1, 1, 1]}
D = {"prompt_ids": [8], "response_ids": [40, 41], "loss_mask": [1, 1]}


class RolloutCorrection(TempDirCase):
    """Truncated importance sampling on the engine-vs-trainer mismatch, against hand computations."""

    def shifted(self, m0, shift_a, shift_b):
        la, lb = logprobs_of(m0, A), logprobs_of(m0, B)
        # the engine's log-probs are the trainer's minus a shift: pi_old / pi_rollout = exp(shift)
        a = dict(A, advantage=1.5, logprobs=[x - s for x, s in zip(la, shift_a)])
        b = dict(B, advantage=-0.7, logprobs=[x - s for x, s in zip(lb, shift_b)])
        return a, b

    def test_token_tis_weights_each_token_by_the_capped_ratio(self):
        m0 = self.checkpoint()
        shift_a, shift_b = [1.0, 0.1, 0.0, -0.3], [0.9, -0.2, 0.0]  # ratios 2.72 (capped), 1.1, -, 0.74 | 2.46 (capped)...
        a, b = self.shifted(m0, shift_a, shift_b)
        rec = self.trainer(m0, self.path("o"), loss="grpo").step(batch([a, b]))
        terms, capped, k3 = [], 0, []
        for r, shifts in ((a, shift_a), (b, shift_b)):
            for s, k in zip(shifts, r["loss_mask"]):
                if not k:
                    continue
                w = min(math.exp(s), 2.0)
                capped += math.exp(s) > 2.0
                terms.append(-r["advantage"] * 1.0 * w)  # recomputed old: the PPO ratio is 1
                k3.append(math.exp(s) - s - 1)
        self.assertEqual(rec["rollout_correction"], "token-tis")
        self.assertAlmostEqual(rec["loss"], sum(terms) / len(terms), places=5)
        self.assertAlmostEqual(rec["tis_capped_frac"], capped / len(terms), places=6)
        self.assertEqual(capped, 2)
        self.assertAlmostEqual(rec["rollout_kl"], sum(k3) / len(k3), places=5)
        cap3 = self.trainer(m0, self.path("o2"), loss="grpo", rollout_correction_cap=3).step(batch([a, b]))
        self.assertEqual(cap3["tis_capped_frac"], 0.0)

    def test_seq_mask_drops_sequences_whose_mean_ratio_is_out_of_bounds(self):
        m0 = self.checkpoint()
        shift_a, shift_b = [1.0, 0.9, 5.0, 0.8], [0.1, -0.1, 0.05]  # A: mean log-ratio 0.9 > log 2 (masked token ignored)
        a, b = self.shifted(m0, shift_a, shift_b)
        rec = self.trainer(m0, self.path("o"), loss="grpo", rollout_correction="seq-mask").step(batch([a, b]))
        self.assertAlmostEqual(rec["seq_masked_frac"], 0.5)
        self.assertAlmostEqual(rec["loss"], (0.7 * 3) / 6, places=5)  # only B's three tokens count

    def test_rollout_old_logprobs_make_no_correction(self):
        m0 = self.checkpoint()
        a, b = self.shifted(m0, [1.0, 0.1, 0.0, -0.3], [0.9, -0.2, 0.0])
        rec = self.trainer(m0, self.path("o"), loss="grpo", old_logprobs="rollout").step(batch([a, b]))
        self.assertEqual(rec["rollout_correction"], "none")
        self.assertNotIn("tis_capped_frac", rec)
        self.assertGreater(rec["rollout_kl"], 0.0)


class MiniBatches(TempDirCase):
    def records(self):
        return [dict(A, advantage=1.0), dict(B, advantage=-1.0), dict(C, advantage=0.5), dict(D, advantage=-0.5)]

    def test_k_updates_per_batch_against_the_behaviour_policy(self):
        m0 = self.checkpoint()
        sgd = dict(loss="grpo", optimizer="sgd", weight_decay=0, lr=0.5, max_grad_norm=0)
        t = self.trainer(m0, self.path("o"), **sgd, mini_batches=2)
        recs = self.records()
        first, second = t.mini_batches([dict(r, i=i) for i, r in enumerate(recs)], 0)
        rec = t.step(batch(recs))
        self.assertEqual(rec["updates"], 2)
        self.assertEqual(rec["mini_batches"], 2)
        # update 1 alone, from m0: the weights the second mini-batch is scored with
        only_first = [recs[s["i"]] for s in first]
        self.trainer(m0, self.path("m1"), **sgd).step(batch(only_first))
        old, new, n = 0.0, 0.0, 0
        for s in second:
            r = recs[s["i"]]
            for x0, x1, k in zip(logprobs_of(m0, r), logprobs_of(self.path("m1"), r), r["loss_mask"]):
                if k:
                    old, new, n = old + x0, new + x1, n + 1
        total = sum(sum(r["loss_mask"]) for r in recs)
        # approx_kl: mean of (old - logp) over every update's tokens; update 1's ratios are exactly 1
        self.assertAlmostEqual(rec["approx_kl"], (old - new) / total, places=4)
        self.assertNotEqual(rec["approx_kl"], 0.0)

    def test_a_moving_ratio_engages_the_clip(self):
        m0 = self.checkpoint()
        t = self.trainer(m0, self.path("o"), loss="grpo", lr=0.05, mini_batches=2, epochs=3)
        rec = t.step(batch(self.records()))
        self.assertEqual(rec["updates"], 6)
        self.assertGreater(rec["pg_clipfrac"], 0.0)
        one = self.trainer(m0, self.path("o1"), loss="grpo", lr=0.05).step(batch(self.records()))
        self.assertEqual(one["updates"], 1)
        self.assertEqual(one["pg_clipfrac"], 0.0)

    def test_end_batch_step_names_the_checkpoint(self):
        m0 = self.checkpoint()
        lines = [json.dumps(dict(A, advantage=1.0)), json.dumps({"v": 1, "end_batch": True, "step": 7})]
        batches = list(read_batches(lines))
        self.assertEqual(batches[0].step, 7)
        rec = self.trainer(m0, self.path("s-{step}"), loss="grpo", policy="rl-{step}").step(batches[0])
        self.assertEqual(rec["step"], 7)
        self.assertEqual(rec["policy"], "rl-7")
        self.assertTrue(os.path.isfile(self.path("s-7", "trainer_state.json")))
        self.assertEqual([n for n in os.listdir(self.tmp) if "partial" in n or ".old-" in n], [])


class OptimizerState(TempDirCase):
    def test_auto_starts_afresh_when_the_loss_changes(self):
        m0 = self.checkpoint()
        self.trainer(m0, self.path("sft"), loss="sft").step(batch([A, B]))
        grpo = self.trainer(self.path("sft"), self.path("rl"), loss="grpo")
        self.assertEqual(grpo.step_no, 0)  # the SFT step count and moments are not continued
        self.assertEqual(len(grpo.opt.state), 0)
        rec = grpo.step(batch([dict(A, advantage=1.0)]))
        self.assertEqual(rec["step"], 1)
        more = self.trainer(self.path("rl"), self.path("rl2"), loss="grpo")
        self.assertEqual(more.step_no, 1)  # same loss: continued
        self.assertGreater(len(more.opt.state), 0)
        load = self.trainer(self.path("sft"), self.path("rl3"), loss="grpo", optimizer_state="load")
        self.assertEqual(load.step_no, 1)
        reset = self.trainer(self.path("rl"), self.path("rl4"), loss="grpo", optimizer_state="reset")
        self.assertEqual(reset.step_no, 0)
