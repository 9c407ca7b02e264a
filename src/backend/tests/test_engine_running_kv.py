"""engine: decode over dense rows (running_kv.py) generates what decode over the pool's slots does,
while requests join and leave the batch at different steps, with plain and smeared keys, across a
weight update, and when the rows' memory budget runs out mid-generation (decode falls back to the
pool, and the rows never exceed their budget)."""

import unittest

import torch

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from rstar_backend.running_kv import RunningKV
from test_engine_dtype import CONFIG, engine_args
from test_engine_prefix_cache import out_logprobs, request, run

# prompts of different lengths and budgets: rows join and leave at different steps, a short request's
# row is refilled by the last one while the others keep decoding
PROMPTS = [[1, 5, 9, 33, 70, 12, 480, 2, 7], [1, 300, 12], [1, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55],
           [1, 7], [1, 5, 9, 33, 70], [1, 400, 401, 402, 403, 404]]
NEW = [24, 5, 40, 13, 1, 31]


class RunningKVCase(TempDirCase):
    smear = False

    def setUp(self):
        super().setUp()
        cfg = Qwen3Config.from_dict({**CONFIG, "rstar_key_smear": self.smear})
        for name, seed in (("m", 3), ("m2", 4)):
            m = Qwen3ForCausalLM(cfg)
            m.init_weights(seed)
            save_model(m, self.path(name))
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        super().tearDown()

    def engine(self, decode_kv, running=4, budget=None):
        args = engine_args(self.path("m"), "fp32")
        args.decode_kv, args.max_running_requests = decode_kv, running
        e = E.Engine(args)
        if budget is not None:
            e.running_kv.budget = budget
        self.engines.append(e)
        return e

    def generate(self, e, copies=2):
        """Each prompt `copies` times with its own seed, more requests than run at once."""
        reqs = [request(e, f"r{i}.{c}", p, n, seed=10 * i + c)
                for c in range(copies) for i, (p, n) in enumerate(zip(PROMPTS, NEW))]
        return run(e, reqs)

    def assertSameGenerations(self, a, b):
        for x, y in zip(a, b):
            self.assertEqual(x.output, y.output, x.rid)
            torch.testing.assert_close(out_logprobs(x), out_logprobs(y), atol=1e-4, rtol=0)

    def test_rows_generate_what_the_pool_does(self):
        rows, pool = self.engine("rows"), self.engine("pool")
        a, b = self.generate(rows), self.generate(pool)
        self.assertEqual([len(r.output) for r in a], NEW * 2)
        self.assertSameGenerations(a, b)
        self.assertGreater(rows.running_kv.cap_rows, 0, "the rows were never used")
        self.assertEqual(pool.running_kv, None)

    def test_one_row_at_a_time_and_many(self):
        for running in (1, 12):
            a = self.generate(self.engine("rows", running=running))
            b = self.generate(self.engine("pool", running=running))
            self.assertSameGenerations(a, b)

    def test_a_budget_that_runs_out_falls_back_to_the_pool(self):
        rows, pool = self.engine("rows"), self.engine("pool")
        kv = rows.running_kv
        # room for 4 rows of 20 tokens: the long requests outgrow it mid-generation
        kv.budget = kv._bytes(4, 20)
        a, b = self.generate(rows), self.generate(pool)
        self.assertSameGenerations(a, b)
        self.assertLessEqual(kv._bytes(kv.cap_rows, kv.cap_len), kv.budget)
        self.assertGreater(kv.cap_rows, 0, "the rows were never used")
        # nothing fits: every step gathers from the pool
        none = self.engine("rows", budget=0)
        self.assertSameGenerations(self.generate(none), b)
        self.assertEqual(none.running_kv.cap_rows, 0)

    def test_rows_written_before_a_weight_update_stay_valid(self):
        rows, pool = self.engine("rows"), self.engine("pool")
        outs = []
        for e in (rows, pool):
            long_ = request(e, "long", PROMPTS[2], 60, seed=1)
            e.submit([long_])
            while len(long_.output) < 10:  # mid-generation
                e.run_op(lambda: None)
            e.update_weights(self.path("m2"), "2")
            (after,) = run(e, [request(e, "after", PROMPTS[0], 20, seed=2)])
            long_.done.wait()
            outs.append((long_, after))
        # the update lands at a step that depends on timing: compare what runs on fixed weights
        self.assertSameGenerations([outs[0][1]], [outs[1][1]])
        self.assertEqual(len(outs[0][0].output), 60)


class RunningKVSmeared(RunningKVCase):
    smear = True


class RowsShapeTest(unittest.TestCase):
    """The rows' shape within the budget: judged by what is needed, and with headroom, so that decode
    does not reallocate the rows every step near the budget, nor stay on the pool path because the
    shape held now is wider than what is needed."""

    def rows(self, budget_rows, budget_len):
        cfg = Qwen3Config.from_dict({**CONFIG, "rstar_key_smear": True})
        kv = RunningKV(cfg, torch.device("cpu"), torch.float32, 0)
        kv.budget = kv._bytes(budget_rows, budget_len)
        return kv

    def test_near_the_budget_a_growing_batch_is_reallocated_once(self):
        kv = self.rows(10, 100)
        kv._grow(10, 60)
        kv.serials, kv.lens = list(range(10)), [60] * 10
        buffers = {kv.k.data_ptr()}
        for _ in range(40):  # 60 -> 100 tokens, one a step: doubling to 120 does not fit
            self.assertTrue(kv.fits(10, max(kv.lens) + 1))
            kv.advance()
            buffers.add(kv.k.data_ptr())
        self.assertEqual(max(kv.lens), 100)
        self.assertLessEqual(len(buffers), 2, "reallocated the rows step after step")
        self.assertLessEqual(kv._bytes(kv.cap_rows, kv.cap_len), kv.budget)

    def test_a_wide_batch_then_a_long_one_still_fits(self):
        kv = self.rows(10, 100)
        kv._grow(20, 50)  # 20 short rows: the whole budget
        kv.serials, kv.lens = list(range(8)), [50] * 8  # 12 of them left
        self.assertTrue(kv.fits(8, 120))  # 8 x 120 is within 10 x 100's bytes
        kv._grow(8, 120)
        self.assertGreaterEqual(kv.cap_len, 120)
        self.assertLessEqual(kv._bytes(kv.cap_rows, kv.cap_len), kv.budget)
        self.assertFalse(kv.fits(11, 100))


if __name__ == "__main__":
    unittest.main()
