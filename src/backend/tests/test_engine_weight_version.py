"""engine: the weight_version a response reports. SGLang puts the server's weight_version into each
response's meta_info when the response is produced; engine-serve does the same, so a request that
was running when new weights were loaded reports the newer version (rollout records it per turn)."""

import time
import unittest

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from test_engine_dtype import CONFIG, engine_args


def request(rid, new_tokens):
    sp = dict(max_new_tokens=new_tokens, temperature=1.0, seed=3, ignore_eos=True)
    return E.Request(rid, [1, 5, 9, 33], E.parse_sampling(sp, 2, 1024, 4), True, 0)


class WeightVersion(TempDirCase):
    def test_a_response_reports_the_version_it_finished_under(self):
        for name, seed in (("a", 0), ("b", 1)):
            m = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG))
            m.init_weights(seed)
            save_model(m, self.path(name))
        engine = E.Engine(engine_args(self.path("a"), "fp32"))
        try:
            before = request("before", 4)
            engine.submit([before])
            before.done.wait()
            self.assertEqual(E.response_of(before)["meta_info"]["weight_version"], "0")

            running = request("running", 900)
            engine.submit([running])
            deadline = time.time() + 30
            while len(running.output) < 3 and time.time() < deadline:
                time.sleep(0.001)
            self.assertGreaterEqual(len(running.output), 3, "the request never started decoding")
            engine.update_weights(self.path("b"), "1")
            self.assertIsNone(running.finish, "finished before the update: make it longer")
            running.done.wait()
            self.assertEqual(len(running.output), 900)
            self.assertEqual(E.response_of(running)["meta_info"]["weight_version"], "1")
        finally:
            engine.close()


if __name__ == "__main__":
    unittest.main()
