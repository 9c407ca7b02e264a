"""Catches: a loss normalised per sequence (or per rank, or per micro-batch) instead of by the batch's
token count N (docs/backend.md: "N = number of loss_mask = 1 response tokens in the whole batch, over
all ranks and micro-batches"). The records have 1, 3 and 7 loss tokens (and one of 2), so every other
normalisation gives another loss and another gradient; both are checked against a hand derivation,
in one process over several micro-batches and on two data-parallel gloo ranks with uneven shares."""

import torch

from common import SETTINGS, TempDirCase, run_ranks, write_jsonl
from rstar_backend.checkpoint import load_model, load_state_dict
from rstar_backend.model import token_logprobs

# loss tokens: 1, 3 (one masked tool token), 7 (one masked), 2
RECORDS = [
    {"prompt_ids": [1, 5], "response_ids": [10], "loss_mask": [1], "advantage": 1.0},
    {"prompt_ids": [2, 6, 3], "response_ids": [20, 21, 22, 23], "loss_mask": [1, 0, 1, 1], "advantage": -0.5},
    {"prompt_ids": [4], "response_ids": [30, 31, 32, 33, 34, 35, 36, 37], "loss_mask": [1, 1, 1, 0, 1, 1, 1, 1],
     "advantage": 0.75},
    {"prompt_ids": [7, 8], "response_ids": [40, 41], "loss_mask": [1, 1], "advantage": -1.0},
]
COUNTS = [1, 3, 7, 2]
N = sum(COUNTS)

# SGD with lr 1 and no decay or clipping: the update is exactly minus the gradient.
SGD = dict(optimizer="sgd", lr=1.0, weight_decay=0.0, max_grad_norm=0.0, rollout_correction="none")

PLAIN_RANK = """
import sys
sys.path.insert(0, sys.argv[1])
from rstar_backend import train
sys.exit(train.main(["--config", sys.argv[2]]))
"""


def expected_gradient(model_dir, weight_of):
    """d/dθ of sum_i weight_of(i) * sum_{j masked} logp_ij / N (weight_of(i): the coefficient of a token's
    log-prob in record i's per-token loss: -1 for SFT, -A for GRPO at ratio 1), by a plain forward per record (no
    packing, no micro-batches), i.e. the gradient of the token-level mean the docs promise."""
    m = load_model(model_dir)
    total = 0.0
    for i, rec in enumerate(RECORDS):
        ids = torch.tensor([rec["prompt_ids"] + rec["response_ids"]])
        p = len(rec["prompt_ids"])
        logp = token_logprobs(m(ids)[0][p - 1:-1], ids[0, p:])
        total = total + weight_of(i) * (logp * torch.tensor(rec["loss_mask"], dtype=torch.float32)).sum()
    (total / N).backward()
    return {k: v.grad.detach().clone() for k, v in m.named_parameters()}


def plain_logprobs(model_dir, rec):
    m = load_model(model_dir)
    ids = torch.tensor([rec["prompt_ids"] + rec["response_ids"]])
    p = len(rec["prompt_ids"])
    with torch.no_grad():
        logp = token_logprobs(m(ids)[0][p - 1:-1], ids[0, p:])
    return [x for x, k in zip(logp.tolist(), rec["loss_mask"]) if k]


class TokenLevelMean(TempDirCase):
    def assert_update_is(self, m0, out, want):
        """The update the trainer wrote to `out` is minus `want` (SGD, lr 1), to float32 rounding."""
        w0, w1 = load_state_dict(m0), load_state_dict(out)
        scale = max(float(g.abs().max()) for g in want.values())
        self.assertGreater(scale, 1e-4)
        worst = max(float(((w0[k] - w1[k]) - want[k]).abs().max()) for k in want)
        self.assertLess(worst, 1e-4 * scale, f"update differs from the token-level gradient by {worst}")

    def per_sequence_gap(self, m0, weight_of):
        """How far the per-sequence-mean gradient is from the token-level one: the margin the checks need."""
        tok = expected_gradient(m0, weight_of)
        seq = expected_gradient(m0, lambda i: weight_of(i) * N / (COUNTS[i] * len(RECORDS)))
        return max(float((tok[k] - seq[k]).abs().max()) for k in tok) / max(
            float(g.abs().max()) for g in tok.values())

    def test_grpo_loss_and_gradient_over_micro_batches(self):
        m0 = self.checkpoint()
        # recompute: ratio 1 on every token, so each token's loss is -A and the loss needs no model:
        loss = -sum(r["advantage"] * n for r, n in zip(RECORDS, COUNTS)) / N  # -(1 - 1.5 + 5.25 - 2) / 13
        self.assertAlmostEqual(loss, -2.75 / 13)
        rec = self.trainer(m0, self.path("o"), loss="grpo", micro_batch_tokens=9, **SGD).step(list(RECORDS))
        self.assertGreaterEqual(rec["micro_batches"], 3)
        self.assertEqual(rec["loss_tokens"], N)
        self.assertAlmostEqual(rec["loss"], loss, places=6)
        self.assertGreater(self.per_sequence_gap(m0, lambda i: -RECORDS[i]["advantage"]), 0.05)
        self.assert_update_is(m0, self.path("o"), expected_gradient(m0, lambda i: -RECORDS[i]["advantage"]))

    def test_sft_loss_and_gradient_over_micro_batches(self):
        m0 = self.checkpoint()
        nll = [-x for rec in RECORDS for x in plain_logprobs(m0, rec)]
        self.assertEqual(len(nll), N)
        rec = self.trainer(m0, self.path("o"), loss="sft", micro_batch_tokens=9, **SGD).step(list(RECORDS))
        self.assertGreaterEqual(rec["micro_batches"], 3)
        self.assertAlmostEqual(rec["loss"], sum(nll) / N, places=5)
        # the per-sequence mean of the same terms, which the check above must tell apart
        at, per_seq = 0, []
        for n in COUNTS:
            per_seq.append(sum(nll[at:at + n]) / n)
            at += n
        self.assertGreater(abs(sum(per_seq) / len(per_seq) - sum(nll) / N), 1e-3)
        self.assert_update_is(m0, self.path("o"), expected_gradient(m0, lambda i: -1.0))

    def test_two_ranks_with_uneven_token_counts_match_the_hand_gradient(self):
        m0 = self.checkpoint()
        # rank r takes records r, r+2: rank 0 holds 1 + 7 = 8 loss tokens, rank 1 holds 3 + 2 = 5, so a
        # rank-local mean or a mean over ranks (instead of the sum of the ranks' N-divided gradients) differ
        data = self.path("data.jsonl")
        write_jsonl(data, RECORDS + [{"end_batch": True}])
        base = {**SETTINGS, **SGD, "model": m0, "loss": "grpo", "micro_batch_tokens": 9}
        [one] = run_ranks(self, PLAIN_RANK, {**base, "out": self.path("one")}, data, 1)
        [two] = run_ranks(self, PLAIN_RANK, {**base, "out": self.path("two")}, data, 2)
        self.assertEqual([one["world_size"], two["world_size"]], [1, 2])
        loss = -2.75 / 13
        self.assertAlmostEqual(one["loss"], loss, places=6)
        self.assertAlmostEqual(two["loss"], loss, places=6)
        self.assertEqual(two["loss_tokens"], N)
        want = expected_gradient(m0, lambda i: -RECORDS[i]["advantage"])
        self.assert_update_is(m0, self.path("one"), want)
        self.assert_update_is(m0, self.path("two"), want)
