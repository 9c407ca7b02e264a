"""engine-serve's token choice (choose_tokens): one batched pass for the whole batch, seeded draws a pure
function of (seed, output position), the sampled frequencies those of softmax(logits / T) after top-k
and top-p, and the 32-bit hash arithmetic exact."""

import random
import unittest

import torch

import common  # noqa: F401  (puts rstar_backend on the path)

from rstar_backend import engine as E


class Req:
    """The fields choose_tokens reads off a request."""

    def __init__(self, temperature=1.0, top_k=-1, top_p=1.0, seed=None, produced=0):
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.output = range(produced)  # only its length is read


def frequencies(logits, make_req, n):
    """Empirical distribution of n draws of one logits row, all in one batch."""
    reqs = [make_req(i) for i in range(n)]
    toks = E.choose_tokens(logits.expand(n, -1).clone(), reqs)
    return torch.bincount(torch.tensor(toks), minlength=logits.size(-1)).double() / n


class HashTest(unittest.TestCase):
    def test_mul32_is_multiplication_mod_2_32(self):
        rnd = random.Random(0)
        hs = [0, 1, 2 ** 32 - 1, 2 ** 31, 2 ** 31 - 1] + [rnd.randrange(2 ** 32) for _ in range(1000)]
        for c in (0x7FEB352D, 0x846CA68B, 0x9E3779B9, 0xFFFFFFFF):
            got = E._mul32(torch.tensor(hs, dtype=torch.int64), c).tolist()
            self.assertEqual(got, [(h * c) % 2 ** 32 for h in hs])

    def test_uniforms_are_in_range_and_depend_on_seed_and_position(self):
        u = E.seeded_uniforms([7] * 4 + [8, 2 ** 40 + 7, -1], [0, 1, 2, 3, 0, 0, 0], torch.device("cpu"))
        self.assertTrue(bool(((u >= 0) & (u < 1)).all()))
        self.assertEqual(len(set(u.tolist())), 7)
        again = E.seeded_uniforms([2 ** 40 + 7, 7], [0, 2], torch.device("cpu"))
        self.assertEqual(again.tolist(), [u[5].item(), u[2].item()])
        many = E.seeded_uniforms(list(range(20000)), [3] * 20000, torch.device("cpu"))
        self.assertAlmostEqual(many.mean().item(), 0.5, delta=0.01)
        hist = torch.histc(many.float(), bins=10, min=0, max=1) / 20000
        self.assertLess((hist - 0.1).abs().max().item(), 0.01)


class ChooseTokensTest(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.logits = torch.randn(1, 16, generator=g) * 1.5

    def test_temperature_zero_is_argmax(self):
        logits = torch.randn(5, 50)
        toks = E.choose_tokens(logits, [Req(temperature=0.0) for _ in range(5)])
        self.assertEqual(toks, torch.argmax(logits, -1).tolist())

    def test_a_seeded_draw_does_not_depend_on_the_rest_of_the_batch(self):
        logits = torch.randn(6, 100)
        reqs = [Req(seed=11, produced=5), Req(), Req(temperature=0.0), Req(seed=3, produced=0, top_k=20),
                Req(seed=11, produced=6), Req(temperature=0.7, seed=5, top_p=0.8)]
        batch = E.choose_tokens(logits, reqs)
        for i in (0, 3, 4, 5):
            alone = E.choose_tokens(logits[i:i + 1].clone(), [reqs[i]])
            self.assertEqual(alone[0], batch[i], f"row {i}")
        reordered = E.choose_tokens(logits.flip(0), reqs[::-1])
        self.assertEqual([reordered[5 - i] for i in (0, 3, 4, 5)], [batch[i] for i in (0, 3, 4, 5)])

    def test_seeded_and_unseeded_frequencies_follow_the_softmax(self):
        for temperature in (1.0, 0.6):
            want = torch.softmax(self.logits[0] / temperature, -1).double()
            for make in (lambda i: Req(temperature=temperature, seed=1000 + i), lambda i: Req(temperature=temperature),
                         lambda i: Req(temperature=temperature, seed=42, produced=i)):
                got = frequencies(self.logits, make, 40000)
                # 40,000 draws: each frequency within ~5 standard errors
                tol = 5 * (want * (1 - want) / 40000).sqrt() + 1e-4
                self.assertTrue(bool(((got - want).abs() <= tol).all()), f"T={temperature}: {got} vs {want}")

    def test_top_k_and_top_p_never_draw_outside_their_set(self):
        probs = torch.softmax(self.logits[0], -1)
        order = torch.argsort(probs, descending=True)
        got = frequencies(self.logits, lambda i: Req(top_k=3, seed=i), 4000)
        self.assertEqual(set(torch.nonzero(got).flatten().tolist()), set(order[:3].tolist()))
        want = probs[order[:3]] / probs[order[:3]].sum()
        self.assertLess((got[order[:3]] - want.double()).abs().max().item(), 0.04)
        # top-p keeps the smallest prefix of the sorted probabilities whose mass reaches p
        mass = probs[order].cumsum(0)
        keep = int((mass < 0.7).sum()) + 1
        got = frequencies(self.logits, lambda i: Req(top_p=0.7, seed=i), 4000)
        self.assertEqual(set(torch.nonzero(got).flatten().tolist()), set(order[:keep].tolist()))

    def test_a_certain_token_is_always_drawn(self):
        logits = torch.full((3, 10), -1e9)
        logits[:, 4] = 0.0
        toks = E.choose_tokens(logits, [Req(seed=s, produced=s) for s in range(3)])
        self.assertEqual(toks, [4, 4, 4])


if __name__ == "__main__":
    unittest.main()
