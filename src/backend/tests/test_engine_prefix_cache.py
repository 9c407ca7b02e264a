"""engine: the prefix cache. A later turn prefills only what its context adds and a prompt's n samples
prefill it once, with the tokens and log-probs of an engine that prefills everything; input log-probs,
a short pool, a weight update and an abort leave every slot accounted for."""

import unittest

import torch

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from test_engine_dtype import CONFIG, engine_args

PROMPT = [1, 5, 9, 33, 70, 12, 480, 2, 7]


def request(engine, rid, ids, new_tokens, seed=None, temperature=1.0, logprob_start_len=-1):
    sp = dict(max_new_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    if seed is not None:
        sp["seed"] = seed
    sp = E.parse_sampling(sp, engine.cfg.eos_token_id, engine.context_len, len(ids))
    return E.Request(rid, list(ids), sp, True, logprob_start_len)


def run(engine, reqs):
    engine.submit(reqs)
    for r in reqs:
        r.done.wait()
    return reqs


def out_logprobs(r):
    return torch.tensor([x[0] for x in r.out_logprobs])


class PrefixCacheCase(TempDirCase):
    smear = False

    def setUp(self):
        super().setUp()
        cfg = Qwen3Config.from_dict({**CONFIG, "rstar_key_smear": self.smear})
        m = Qwen3ForCausalLM(cfg)
        m.init_weights(3)
        save_model(m, self.path("m"))
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        super().tearDown()

    def engine(self, cache=True, tokens=2048, model="m"):
        args = engine_args(self.path(model), "fp32")
        args.max_total_tokens, args.disable_radix_cache = tokens, not cache
        e = E.Engine(args)
        self.engines.append(e)
        return e

    def assertSameGeneration(self, a, b):
        self.assertEqual(a.output, b.output)
        torch.testing.assert_close(out_logprobs(a), out_logprobs(b), atol=1e-4, rtol=0)

    def assertAccounted(self, engine):
        """Once nothing runs, every used slot is the cache's, none locked, and the engine reports 0 used."""
        engine.run_op(lambda: None)
        self.assertEqual(engine.pool.used, engine.radix.tokens + sum(t.tokens for t in engine.retired))
        self.assertEqual(engine.radix.locked, 0)
        self.assertEqual(engine.stats()["used"], 0)

    def test_a_second_turn_prefills_only_what_it_adds(self):
        cached, plain = self.engine(), self.engine(cache=False)
        turns = []
        for e in (cached, plain):
            (first,) = run(e, [request(e, "t1", PROMPT, 20, seed=1)])
            context = PROMPT + first.output + [4, 8, 15, 16, 23, 42]  # a tool's answer
            (second,) = run(e, [request(e, "t2", context, 20, seed=2)])
            turns.append((first, second))
        (c1, c2), (p1, p2) = turns
        self.assertSameGeneration(c1, p1)
        self.assertSameGeneration(c2, p2)
        # everything the first turn ran: its input and its output but the last token (never run)
        self.assertEqual(c2.cached_tokens, len(PROMPT) + len(c1.output) - 1)
        self.assertEqual((c1.cached_tokens, p2.cached_tokens), (0, 0))
        self.assertAccounted(cached)

    def test_a_prompts_samples_prefill_it_once(self):
        cached, plain = self.engine(), self.engine(cache=False)
        got = [run(e, [request(e, f"s{i}", PROMPT, 16, seed=i) for i in range(6)]) for e in (cached, plain)]
        for a, b in zip(*got):
            self.assertSameGeneration(a, b)
        # all but the last two tokens: the last one's input log-prob is reported (SGLang's default
        # logprob_start_len -1), so the logits before it are computed
        self.assertEqual([r.cached_tokens for r in got[0]], [0] + [len(PROMPT) - 2] * 5)
        self.assertEqual(cached.cached_tokens_total, 5 * (len(PROMPT) - 2))
        self.assertGreater(len({tuple(r.output) for r in got[0]}), 1, "the samples should differ")
        self.assertAccounted(cached)

    def test_input_logprobs_are_computed_not_cached(self):
        cached, plain = self.engine(), self.engine(cache=False)
        for e in (cached, plain):
            run(e, [request(e, "warm", PROMPT, 8, seed=0)])
        a, b = (run(e, [request(e, "lp", PROMPT + [3, 3], 4, temperature=0, logprob_start_len=0)])[0]
                for e in (cached, plain))
        self.assertEqual(a.cached_tokens, 0)
        self.assertEqual(len(a.in_logprobs), len(PROMPT) + 2)
        self.assertIsNone(a.in_logprobs[0][0])
        torch.testing.assert_close(torch.tensor([x[0] for x in a.in_logprobs[1:]]),
                                   torch.tensor([x[0] for x in b.in_logprobs[1:]]), atol=1e-4, rtol=0)
        # from position 5 on: the prefix before the token whose logits give position 5's log-prob
        (c,) = run(cached, [request(cached, "lp5", PROMPT + [3, 3], 4, temperature=0, logprob_start_len=5)])
        self.assertEqual(c.cached_tokens, 4)
        self.assertEqual([x[1] for x in c.in_logprobs], (PROMPT + [3, 3])[5:])
        torch.testing.assert_close(torch.tensor([x[0] for x in c.in_logprobs]),
                                   torch.tensor([x[0] for x in b.in_logprobs[5:]]), atol=1e-4, rtol=0)

    def test_a_short_pool_evicts_unused_prefixes_and_never_a_running_ones(self):
        e = self.engine(tokens=160)
        prompts = [[1, 100 + i, 7, 7, 9, 200 + i] for i in range(24)]
        # one after another: each fits only after older prefixes are evicted
        for i, p in enumerate(prompts):
            (r,) = run(e, [request(e, f"a{i}", p, 40, seed=i)])
            self.assertEqual(r.finish["type"], "length")
        self.assertAccounted(e)
        # least recently used first: the first prompt's own tokens are gone, the last one's are there
        def cached(p):
            return e.run_op(lambda: e.radix.match(p)[2])

        self.assertLess(cached(prompts[0]), len(prompts[0]))
        self.assertEqual(cached(prompts[-1]), len(prompts[-1]))
        # many at once, more than fit together, each with a second turn on its own prefix
        firsts = run(e, [request(e, f"b{i}", p, 30, seed=i) for i, p in enumerate(prompts)])
        seconds = run(e, [request(e, f"c{i}", p + r.output + [5], 10, seed=i) for i, (p, r) in enumerate(zip(prompts, firsts))])
        self.assertTrue(all(r.finish["type"] == "length" for r in firsts + seconds))
        self.assertAccounted(e)
        # the outputs are those of an engine with room for everything and no cache
        plain = self.engine(cache=False)
        for p, r, s in zip(prompts[:4], firsts, seconds):
            (pr,) = run(plain, [request(plain, "p", p, 30, seed=prompts.index(p))])
            self.assertSameGeneration(r, pr)
            (ps,) = run(plain, [request(plain, "q", p + pr.output + [5], 10, seed=prompts.index(p))])
            self.assertSameGeneration(s, ps)

    def test_a_weight_update_drops_the_cache_even_under_a_running_request(self):
        other = Qwen3ForCausalLM(Qwen3Config.from_dict({**CONFIG, "rstar_key_smear": self.smear}))
        other.init_weights(11)
        save_model(other, self.path("m2"))
        e = self.engine()
        run(e, [request(e, "x", PROMPT, 8, seed=0)])
        long = request(e, "long", PROMPT + [3], 300, seed=5)  # reuses the prefix, runs across the update
        e.submit([long])
        while not long.output:
            long.done.wait(0.001)
        e.update_weights(self.path("m2"), "1")
        self.assertEqual(len(e.retired), 1)  # the old tree, held by the running request
        (after,) = run(e, [request(e, "y", PROMPT, 8, seed=0)])
        long.done.wait()
        self.assertEqual(after.cached_tokens, 0)
        (fresh,) = run(self.engine(model="m2"), [request(e, "y", PROMPT, 8, seed=0)])
        self.assertSameGeneration(after, fresh)
        self.assertEqual(e.retired, [])
        self.assertAccounted(e)

    def test_an_aborted_request_returns_its_slots(self):
        e = self.engine()
        r = request(e, "gone", PROMPT, 500, seed=0)
        e.submit([r])
        while not r.output:
            r.done.wait(0.001)
        self.assertEqual(e.abort("gone"), 1)
        r.done.wait()
        self.assertEqual(r.finish["type"], "abort")
        self.assertAccounted(e)
        (again,) = run(e, [request(e, "again", PROMPT + r.output + [3], 4, seed=0)])
        self.assertEqual(again.cached_tokens, len(PROMPT) + len(r.output) - 1)

    def test_the_cache_is_reported_as_free_and_in_metrics(self):
        e = self.engine()
        run(e, [request(e, "m", PROMPT, 12, seed=0)])
        self.assertGreater(e.radix.tokens, 0)
        self.assertEqual(e.stats()["used"], 0)
        text = E.metrics_text(e)
        self.assertIn("sglang:num_used_tokens", text)
        self.assertRegex(text, r"rstar:radix_cache_tokens\S* %d\n" % e.radix.tokens)
        e.flush_cache()
        self.assertEqual((e.radix.tokens, e.pool.used), (0, 0))


class PrefixCacheSmearedKeys(PrefixCacheCase):
    """The same with smeared keys: the first new token mixes in the cached token's key."""

    smear = True



if __name__ == "__main__":
    unittest.main()
