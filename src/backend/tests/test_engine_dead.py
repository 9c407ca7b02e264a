"""engine: a scheduler thread that dies fails every waiter at once, with the reason, and every later
request and weight update is refused with it. Catches: a waiter that hangs forever on `done.wait()`
or `run_op` when the thread died outside the per-batch guard (in admission, say)."""

import time
import unittest

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from test_engine_dtype import CONFIG, engine_args


def request(rid):
    sp = dict(max_new_tokens=4, temperature=1.0, seed=3, ignore_eos=True)
    return E.Request(rid, [1, 5, 9, 33], E.parse_sampling(sp, 2, 1024, 4), False, 0)


class SchedulerDeath(TempDirCase):
    def test_a_dead_scheduler_fails_waiters_and_refuses_new_work(self):
        m = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG))
        m.init_weights(0)
        save_model(m, self.path("m"))
        engine = E.Engine(engine_args(self.path("m"), "fp32"))
        try:
            ok = request("ok")
            engine.submit([ok])
            self.assertTrue(ok.done.wait(30))
            self.assertEqual(ok.finish["type"], "length")

            def broken(r):  # admission is outside the per-batch try: the thread itself dies
                raise RuntimeError("reserve broke")

            engine._reserve = broken
            r = request("doomed")
            engine.submit([r])
            self.assertTrue(r.done.wait(10), "the waiter hangs on a dead scheduler")
            self.assertEqual(r.finish["type"], "abort")
            self.assertIn("reserve broke", r.finish["message"])
            self.assertIsNotNone(engine.dead)
            with self.assertRaises(E.EngineDead) as late:
                engine.submit([request("late")])
            self.assertIn("reserve broke", str(late.exception))
            t0 = time.time()
            with self.assertRaises(E.EngineDead):
                engine.flush_cache()
            self.assertLess(time.time() - t0, 5)
        finally:
            engine.close()


if __name__ == "__main__":
    unittest.main()
