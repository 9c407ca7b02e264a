"""The trainer's sharded path around FSDP2, on 2 gloo ranks, with fully_shard replaced by a stand-in.

This torch has no FSDP2, so the stand-in keeps plain tensors and sums each gradient over the ranks
inside the backward, as FSDP2 with a divide factor of 1 does: a collective in every backward. The run
must then match one process: every rank runs as many passes (idle ones on the short rank, or the
collectives pair up wrongly), the loss is not scaled twice, and every rank takes part in the save."""

from common import SETTINGS, TempDirCase, run_ranks, write_jsonl
from rstar_backend.checkpoint import load_state_dict

RANK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from rstar_backend import parallel, train


def stand_in_shard(model, mode, device, dtype, frozen=False):
    def summed(g):
        g = g.clone()
        dist.all_reduce(g)
        return g
    for p in model.parameters():
        if p.requires_grad:
            p.register_hook(summed)
    return 1


parallel.check_setup = lambda name, shard, device, world: parallel.compute_dtype(name, device)
parallel.shard = stand_in_shard
sys.exit(train.main(["--config", sys.argv[2]]))
"""


class ShardedGlue(TempDirCase):
    def run_ranks(self, config, data, world):
        return run_ranks(self, RANK, config, data, world)

    def test_two_sharded_ranks_with_uneven_shares_match_one_process(self):
        m0 = self.checkpoint()
        # 3 records: rank 0 gets 2 (two micro-batches of 9 tokens), rank 1 one: one idle pass per update;
        # two mini-batches, so the behaviour log-probs are precomputed (idle passes there too)
        recs = [{"prompt_ids": [1, 2, 3, 4], "response_ids": [5 + i, 6, 7, 8, 9], "loss_mask": [1, 1, 1, 0, 1],
                 "advantage": 1.0 - i} for i in range(3)]
        data = self.path("data.jsonl")
        write_jsonl(data, recs + [{"end_batch": True}] + recs[::-1] + [{"end_batch": True}])
        base = {**SETTINGS, "model": m0, "loss": "grpo", "optimizer": "sgd", "lr": 0.5, "micro_batch_tokens": 9,
                "mini_batches": 2, "kl_coef": 0.1, "rollout_correction": "none"}
        one = self.run_ranks({**base, "out": self.path("one")}, data, 1)
        two = self.run_ranks({**base, "out": self.path("two"), "shard": "full"}, data, 2)
        self.assertEqual([s["world_size"] for s in two], [2, 2])
        self.assertEqual([s["shard"] for s in two], ["full", "full"])
        for a, b in zip(one, two):
            self.assertAlmostEqual(a["loss"], b["loss"], places=6)
            self.assertAlmostEqual(a["grad_norm"], b["grad_norm"], places=5)
        w0, w1, w2 = (load_state_dict(p) for p in (m0, self.path("one"), self.path("two")))
        moved = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
        diff = max(float((w2[k] - w1[k]).abs().max()) for k in w0)
        self.assertGreater(moved, 1e-3)
        self.assertLess(diff, 1e-5 * moved + 1e-7)
