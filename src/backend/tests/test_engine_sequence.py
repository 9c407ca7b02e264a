"""engine: one request after another on the same engine. Each finished request's slots go back to the
pool and the next request gets others; its decode must read its own slots, also when the new request
object sits at the address of one that finished (CPython then gives it the same id(); CI once saw a
seeded request decode from the previous request's released slots)."""

import unittest

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from test_engine_dtype import CONFIG, engine_args

# two prompts of one length: a decode that read the other's slots would continue the other's text
PROMPT = [1, 5, 9, 33, 70]
OTHER = [1, 300, 12, 480, 2]


class EngineSequence(TempDirCase):
    def test_a_request_at_a_finished_requests_address_decodes_from_its_own_slots(self):
        cfg = Qwen3Config.from_dict(CONFIG)
        m = Qwen3ForCausalLM(cfg)
        m.init_weights(5)
        save_model(m, self.path("m"))
        engine = E.Engine(engine_args(self.path("m"), "fp32"))

        def sampling(new_tokens):
            sp = dict(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
            return E.parse_sampling(sp, engine.cfg.eos_token_id, engine.context_len, len(PROMPT))

        def run(r):
            engine.submit([r])
            r.done.wait()
            return list(r.output)

        decode, prompt_only = sampling(24), sampling(0)
        try:
            expected = run(E.Request("r", PROMPT, decode, False, -1))
            expected_other = run(E.Request("o", OTHER, decode, False, -1))
            self.assertNotEqual(expected, expected_other)
            reused = 0
            for i in range(8):
                first = E.Request("r", PROMPT, decode, False, -1)
                self.assertEqual(run(first), expected, f"round {i}")
                # a request with no decode step takes the finished one's place in the scheduler's
                # hands; then the last reference goes and the next object is allocated straight away,
                # which in CPython usually lands on the block just freed
                run(E.Request("p", PROMPT, prompt_only, False, -1))
                address = id(first)
                del first
                again = E.Request("o", OTHER, decode, False, -1)
                reused += id(again) == address
                self.assertEqual(run(again), expected_other, f"round {i}, id reused: {id(again) == address}")
            self.assertGreater(reused, 0, "no request object reused a finished one's address: the test proves nothing")
        finally:
            engine.close()


if __name__ == "__main__":
    unittest.main()
