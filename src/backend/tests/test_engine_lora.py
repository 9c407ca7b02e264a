"""engine-serve's LoRA routes, over HTTP as rollout and train-step --sync use them (SGLang's
POST /load_lora_adapter {lora_name, lora_path}, POST /unload_lora_adapter {lora_name}, `lora_path` on
/generate). Catches: an adapter that is loaded but never applied (verl #3516), an unload that does not
give the base back exactly, a prefix cache that serves K/V computed under other weights after an
adapter change (vLLM #42125), a request served by the base or another adapter than it named, and a
weight_version that does not say which adapter served a reply."""

import json
import os
import threading
import unittest
import urllib.error
import urllib.request

import torch

from common import TempDirCase
from rstar_backend import engine as E
from rstar_backend.checkpoint import save_model
from rstar_backend.lora import LoraSpec, add_lora, lora_layers, save_adapter
from rstar_backend.model import Qwen3Config, Qwen3ForCausalLM
from test_engine_dtype import CONFIG, engine_args

PROMPT = [1, 5, 9, 33, 70, 3, 200, 201, 202, 203, 9, 11]


class EngineLora(TempDirCase):
    def setUp(self):
        super().setUp()
        base = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG))
        base.init_weights(0)
        save_model(base, self.path("base"))
        args = engine_args(self.path("base"), "fp32")
        self.engine = E.Engine(args)
        self.server = E.Server(("127.0.0.1", 0), E.make_handler(self.engine))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()
        self.engine.close()
        super().tearDown()

    def adapter(self, name, step=None, seed=1, zero=False):
        """An adapter folder for the base: rank 4 on every linear layer, B random (or zero)."""
        m = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG))
        spec = LoraSpec(r=4, alpha=8)
        add_lora(m, spec, seed=seed)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, layer in lora_layers(m):
                if not zero:
                    layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * 0.05)
        save_adapter(m, spec, self.path(name), self.path("base"), step=step)
        return self.path(name)

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.loads(r.read())

    def score(self, lora=None):
        """The prompt's log-probs (a prefill: no sampling) and the reply's meta_info."""
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True, "logprob_start_len": 0}
        if lora is not None:
            body["lora_path"] = lora
        code, out = self.post("/generate", body)
        self.assertEqual(code, 200, out)
        meta = out["meta_info"]
        return [x[0] for x in meta["input_token_logprobs"][1:]], meta

    def test_an_adapter_is_applied_and_unloading_gives_the_base_back_exactly(self):
        base, meta = self.score()
        self.assertEqual(meta["weight_version"], "0")
        code, out = self.post("/load_lora_adapter", {"lora_name": "tuned", "lora_path": self.adapter("a3", step=3)})
        self.assertEqual((code, out["success"]), (200, True), out)
        self.assertEqual(list(out["loaded_adapters"]), ["tuned"])
        tuned, meta = self.score("tuned")
        self.assertEqual(meta["weight_version"], "3", "the adapter's step (safetensors rstar_step)")
        self.assertEqual(self.get("/get_weight_version"), {"weight_version": "3"})
        diff = max(abs(a - b) for a, b in zip(base, tuned))
        self.assertGreater(diff, 1e-3, "the adapter changed nothing: loaded but not applied")

        code, out = self.post("/unload_lora_adapter", {"lora_name": "tuned"})
        self.assertEqual((code, out["success"], out["loaded_adapters"]), (200, True, {}), out)
        again, meta = self.score()
        self.assertEqual(meta["weight_version"], "0")
        self.assertEqual(again, base, "unloading must restore the base bit for bit")

    def test_a_zero_adapter_is_the_base_and_the_step_comes_from_the_name_without_metadata(self):
        base, _ = self.score()
        code, out = self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-5",
                                                     "lora_path": self.adapter("z", zero=True)})
        self.assertEqual(code, 200, out)
        same, meta = self.score("rstar-lora-step-5")
        self.assertEqual(meta["weight_version"], "5")
        self.assertEqual(same, base)

    def cached(self, lora=None):
        """Tokens of the prompt the prefix cache served (a request that needs no prompt log-probs)."""
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        if lora is not None:
            body["lora_path"] = lora
        code, out = self.post("/generate", body)
        self.assertEqual(code, 200, out)
        return out["meta_info"]["cached_tokens"]

    def test_a_new_adapter_replaces_the_old_one_and_the_prefix_cache_is_flushed(self):
        first, second = self.cached(), self.cached()
        self.assertEqual(first, 0)
        self.assertGreater(second, 0, "the prefix cache should serve a repeated prompt")
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-1", "lora_path": self.adapter("a1", 1, seed=1)})
        self.assertEqual(self.cached("rstar-lora-step-1"), 0, "K/V cached under the base served the adapter")
        self.assertGreater(self.cached("rstar-lora-step-1"), 0)
        one, _ = self.score("rstar-lora-step-1")
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-2", "lora_path": self.adapter("a2", 2, seed=2)})
        self.assertEqual(self.cached("rstar-lora-step-2"), 0, "K/V cached under step 1's adapter served step 2's")
        two, meta = self.score("rstar-lora-step-2")
        self.assertEqual(meta["weight_version"], "2")
        self.assertNotEqual(one, two)
        self.post("/unload_lora_adapter", {"lora_name": "rstar-lora-step-2"})
        self.assertEqual(self.cached(), 0, "K/V cached under the adapter served the base")
        # step 2's adapter went onto the base, not onto step 1's merged weights: loaded alone it agrees
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-2b", "lora_path": self.path("a2")})
        fresh, _ = self.score("rstar-lora-step-2b")
        self.assertEqual(fresh, two)

    def test_requests_are_served_only_by_the_adapter_they_name(self):
        code, out = self.post("/generate", {"input_ids": PROMPT, "lora_path": "rstar-lora-step-1"})
        self.assertEqual(code, 400)
        self.assertIn("LoRA adapter rstar-lora-step-1 is not loaded", out["error"]["message"])
        base, _ = self.score()
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-1", "lora_path": self.adapter("a1", 1)})
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-2", "lora_path": self.adapter("a2", 2, seed=2)})
        one, meta1 = self.score("rstar-lora-step-1")
        two, meta2 = self.score("rstar-lora-step-2")
        again, meta0 = self.score()  # the base, beside two loaded adapters, as SGLang serves it
        self.assertEqual([meta0["weight_version"], meta1["weight_version"], meta2["weight_version"]], ["0", "1", "2"])
        self.assertEqual(again, base, "the base beside loaded adapters is the base bit for bit")
        self.assertNotEqual(one, two)
        self.assertEqual(self.score("rstar-lora-step-1")[0], one, "swapping back gives step 1's adapter exactly")
        code, out = self.post("/generate", {"input_ids": PROMPT, "lora_path": "rstar-lora-step-0"})
        self.assertEqual(code, 400)
        self.assertIn("rstar-lora-step-0 is not loaded (loaded: rstar-lora-step-1, rstar-lora-step-2)",
                      out["error"]["message"])

    def test_one_step_off_requests_of_two_adapters_in_flight_each_get_their_own(self):
        """Step K+1's turns name adapter K-1 while train-step loads K and step K+2 starts asking for it:
        requests of both are in flight at once, each served by the adapter it names from its prefill to
        its last token, never the other's weights."""
        body = lambda name: {"input_ids": PROMPT, "lora_path": name, "return_logprob": True, "logprob_start_len": 0,
                             "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}

        def logprobs(out):
            meta = out["meta_info"]
            return [x[0] for x in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]]

        names = ["rstar-lora-step-1", "rstar-lora-step-2"]
        self.post("/load_lora_adapter", {"lora_name": names[0], "lora_path": self.adapter("a1", 1)})
        self.post("/load_lora_adapter", {"lora_name": names[1], "lora_path": self.adapter("a2", 2, seed=2)})
        alone = {}
        for name in names:
            code, out = self.post("/generate", body(name))
            self.assertEqual(code, 200, out)
            alone[name] = (out["output_ids"], logprobs(out))
        base = self.score()[0]
        self.assertGreater(max(abs(a - b) for a, b in zip(alone[names[0]][1], alone[names[1]][1])), 1e-3)
        self.assertGreater(max(abs(a - b) for a, b in zip(alone[names[0]][1], base)), 1e-3)
        results, errors = [], []

        def ask(name):
            try:
                results.append((name, *self.post("/generate", body(name))))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=ask, args=(names[i % 2],)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 12)
        for name, code, out in results:
            self.assertEqual(code, 200, out)
            self.assertEqual(out["meta_info"]["weight_version"], name.rsplit("-", 1)[1])
            self.assertEqual(out["output_ids"], alone[name][0], f"{name}: other tokens than alone")
            # batched with others the sums run in another order (~1e-6); the two adapters differ by > 1e-3
            diff = max(abs(a - b) for a, b in zip(logprobs(out), alone[name][1]))
            self.assertLess(diff, 1e-4, f"{name}'s request was computed under other weights")
        # unloading the older one: a request still naming it is refused, the newer one serves on
        self.assertEqual(self.post("/unload_lora_adapter", {"lora_name": names[0]})[0], 200)
        self.assertEqual(self.post("/generate", body(names[0]))[0], 400)
        code, out = self.post("/generate", body(names[1]))
        self.assertEqual(out["output_ids"], alone[names[1]][0])

    def test_an_adapter_whose_folder_was_pruned_after_loading_is_still_served_as_loaded(self):
        # one-step-off LoRA: step 1's folder is pruned (--keep-checkpoints) after step 2 is trained,
        # while requests for step 1 still wait for their turn; they must be served, and by step 1
        import shutil
        one = self.adapter("p1", step=1, seed=1)
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-1", "lora_path": one})
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-2", "lora_path": self.adapter("p2", 2, seed=2)})
        self.score("rstar-lora-step-2")  # step 2 merged, step 1 not applied since it was loaded
        kept = {n: open(os.path.join(one, n), "rb").read() for n in os.listdir(one)}
        shutil.rmtree(one)
        gone, meta = self.score("rstar-lora-step-1")
        self.assertEqual(meta["weight_version"], "1")
        # then rewritten with other weights: the engine still serves what it loaded
        self.adapter("p1", step=1, seed=7)
        again, _ = self.score("rstar-lora-step-1")
        self.assertEqual(again, gone)
        shutil.rmtree(one)
        os.makedirs(one)
        for n, b in kept.items():
            open(os.path.join(one, n), "wb").write(b)
        self.post("/load_lora_adapter", {"lora_name": "rstar-lora-step-1b", "lora_path": one})
        fresh, _ = self.score("rstar-lora-step-1b")
        self.assertEqual(fresh, gone, "what was served after the prune is step 1's adapter as loaded")

    def test_bad_adapter_calls_fail_with_a_clear_400(self):
        code, out = self.post("/load_lora_adapter", {"lora_name": "x", "lora_path": self.path("nowhere")})
        self.assertEqual((code, out["success"]), (400, False))
        self.assertIn("nowhere", out["error_message"])
        folder = self.adapter("a1", 1)
        self.assertEqual(self.post("/load_lora_adapter", {"lora_name": "a", "lora_path": folder})[0], 200)
        code, out = self.post("/load_lora_adapter", {"lora_name": "a", "lora_path": folder})
        self.assertEqual(code, 400)
        self.assertIn("an adapter named a is already loaded", out["error_message"])
        code, out = self.post("/unload_lora_adapter", {"lora_name": "b"})
        self.assertEqual(code, 400)
        self.assertIn("no adapter named b is loaded (loaded: a)", out["error_message"])
        code, out = self.post("/load_lora_adapter", {"lora_path": folder})
        self.assertEqual(code, 400)
        self.assertIn("lora_name", out["error"]["message"])
        os.remove(os.path.join(folder, "adapter_model.safetensors"))
        code, out = self.post("/load_lora_adapter", {"lora_name": "c", "lora_path": folder})
        self.assertEqual(code, 400)
        self.assertIn("adapter_model.safetensors: missing", out["error_message"])
        # a failed load leaves what was loaded as it was, not half an adapter
        self.assertEqual(self.get("/get_weight_version"), {"weight_version": "1"})
        self.assertEqual(self.get("/get_server_info")["loaded_adapters"], {"a": folder})
        # a's weights were read when it was loaded: its folder losing them changes nothing
        self.assertEqual(self.score("a")[1]["weight_version"], "1")
        # an adapter that cannot be applied when its turn comes (here: the merge fails) answers its
        # request with an abort saying why, is dropped, and the engine serves on
        self.post("/load_lora_adapter", {"lora_name": "d", "lora_path": self.adapter("a4", 4)})
        real = E.load_adapter
        def broken(*args):
            raise E.AdapterError("simulated failure")
        E.load_adapter = broken
        try:
            code, out = self.post("/generate", {"input_ids": PROMPT, "lora_path": "d"})
        finally:
            E.load_adapter = real
        self.assertEqual(code, 200, out)
        self.assertEqual(out["meta_info"]["finish_reason"]["type"], "abort")
        self.assertIn("adapter d could not be applied: simulated failure", out["meta_info"]["finish_reason"]["message"])
        self.assertEqual(self.get("/get_server_info")["loaded_adapters"], {"a": folder})
        self.assertEqual(self.score("a")[1]["weight_version"], "1")
        self.post("/unload_lora_adapter", {"lora_name": "a"})
        self.assertEqual(self.score()[1]["weight_version"], "0")


if __name__ == "__main__":
    unittest.main()
