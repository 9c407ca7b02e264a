import torch

from common import TempDirCase, small_model
from rstar_backend.engine import DecodeCache, KVPool, PrefillCache
from rstar_backend.model import Rotary, rotate_half


class Model(TempDirCase):
    def test_kv_cache_decode_equals_full_forward(self):
        self.check_kv_cache_decode(small_model(1).eval())

    def test_smeared_keys_decode_equals_full_forward(self):
        m = small_model(1, rstar_key_smear=True).eval()
        with torch.no_grad():  # away from the even mix init, so a wrong previous key shows
            for layer in m.model.layers:
                layer.self_attn.k_smear.copy_(torch.tensor([1.5, -2.0]))
        self.check_kv_cache_decode(m)

    def test_smeared_keys_mix_in_the_previous_token(self):
        m = small_model(3, rstar_key_smear=True).eval()
        self.assertEqual(sorted(n for n, _ in m.named_parameters() if "smear" in n),
                         [f"model.layers.{i}.self_attn.k_smear" for i in range(2)])
        plain = small_model(3).eval()
        plain.load_state_dict({k: v for k, v in m.state_dict().items() if "smear" not in k})
        x = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            mixed = m(x)[0]
            for layer in m.model.layers:
                layer.self_attn.k_smear.fill_(30.0)  # sigmoid(30) = 1: each key is its own token's alone
            alone = m(x)[0]
            qwen3 = plain(x)[0]
        self.assertTrue(torch.allclose(mixed[0], qwen3[0], atol=1e-5))  # the first token has no previous one
        self.assertFalse(torch.allclose(mixed[1:], qwen3[1:], atol=1e-3))
        self.assertTrue(torch.allclose(alone, qwen3, atol=1e-5))

    def check_kv_cache_decode(self, m):
        seqs = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13], [20, 21, 22, 23, 24, 25]]
        pool = KVPool(m.config, 64, torch.device("cpu"), torch.float32)
        with torch.no_grad():
            full = [m(torch.tensor([s]))[0] for s in seqs]
            prompts = [s[:3] for s in seqs]
            slots = [pool.alloc(len(s)) for s in seqs]
            for p, sl, f in zip(prompts, slots, full):
                logits = m(torch.tensor([p]), cache=PrefillCache(pool, sl[:len(p)]))[0]
                self.assertTrue(torch.allclose(logits, f[:len(p)], atol=1e-5))
            # decode the remaining tokens of all sequences together (ragged lengths)
            for step in range(3, max(len(s) for s in seqs)):
                live = [i for i, s in enumerate(seqs) if step < len(s)]
                lens = [step + 1 for _ in live]
                L = max(lens)
                gather = torch.stack([slots[i][:L] for i in live])
                mask = torch.ones(len(live), 1, 1, L, dtype=torch.bool)
                write = torch.stack([slots[i][step] for i in live])
                ids = torch.tensor([[seqs[i][step]] for i in live])
                pos = torch.tensor([[step] for _ in live])
                prev = torch.stack([slots[i][step - 1] for i in live])
                out = m(ids, pos, DecodeCache(pool, write, gather, mask, prev))[:, -1]
                for j, i in enumerate(live):
                    self.assertTrue(torch.allclose(out[j], full[i][step], atol=1e-5), (step, i))

    def test_padding_right_does_not_change_logits(self):
        m = small_model(2).eval()
        with torch.no_grad():
            a = m(torch.tensor([[1, 2, 3]]))[0]
            b = m(torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]))[0, :3]
        self.assertTrue(torch.allclose(a, b, atol=1e-5))

    def test_rotary_is_a_rotation_with_relative_positions(self):
        rot = Rotary(8, 10000.0)
        q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

        def at(x, p):
            cos, sin = rot(torch.tensor([[p]]), torch.float32)
            return x * cos + rotate_half(x) * sin
        self.assertAlmostEqual(float(at(q, 5).norm()), float(q.norm()), places=5)
        d1 = float((at(q, 7) * at(k, 3)).sum())
        d2 = float((at(q, 14) * at(k, 10)).sum())
        self.assertAlmostEqual(d1, d2, places=4)

    def test_untied_head_and_gqa_shapes(self):
        m = small_model(0, tie_word_embeddings=False, num_key_value_heads=1)
        self.assertIsNot(m.lm_head.weight, m.model.embed_tokens.weight)
        self.assertEqual(tuple(m.model.layers[0].self_attn.k_proj.weight.shape), (8, 32))
        self.assertEqual(tuple(m(torch.tensor([[1, 2]])).shape), (1, 2, 64))


class ScaledDotProductPath(TempDirCase):
    """torch >= 2 takes the scaled_dot_product_attention branch; check our call convention against a
    stand-in with its documented semantics (bool mask: True takes part; is_causal: lower triangle)."""

    def test_sdpa_branch_matches_the_explicit_softmax(self):
        import math

        import rstar_backend.model as M

        def sdpa(q, k, v, attn_mask=None, is_causal=False):
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            if is_causal:
                s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
            if attn_mask is not None:
                s = s.masked_fill(~attn_mask, float("-inf"))
            return torch.softmax(s, -1) @ v

        m = small_model(7).eval()
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        pool = KVPool(m.config, 16, torch.device("cpu"), torch.float32)
        slots = pool.alloc(7)

        def run():
            with torch.no_grad():
                full = m(ids)
                pre = m(ids, cache=PrefillCache(pool, slots[:6]))
                mask = torch.ones(1, 1, 1, 7, dtype=torch.bool)
                dec = m(torch.tensor([[11]]), torch.tensor([[6]]),
                        DecodeCache(pool, slots[6:7], slots[None, :7], mask))
            return full, pre, dec

        saved = M._sdpa
        try:
            M._sdpa = None
            expected = run()
            M._sdpa = sdpa
            got = run()
        finally:
            M._sdpa = saved
        for e, g in zip(expected, got):
            self.assertTrue(torch.allclose(e, g, atol=1e-5))
