"""The PyTorch golden fixtures of tests/golden/ (format libsdpa-golden-1, see its README):
scaled_dot_product_attention and MultiheadAttention against what torch computed, at the
manifest's tolerance (rtol 1e-4, atol 1e-5). The fixtures are part of the repository: a missing
index, case or file fails the test, it is never skipped."""
import os
import unittest

import reference as ref

import sdpa


def run_sdpa(params, arrays, entries):
    mask = arrays.get("attn_mask")
    if mask is not None:
        polarity = entries["attn_mask"].get("polarity")
        if polarity == "allow":
            mask = mask.astype(bool)
        elif polarity == "ignore":
            mask = sdpa.allow_from_ignore(mask)
        elif polarity != "additive":
            raise ValueError(f"unknown polarity {polarity!r}")
    if params.get("layout", "BHLD") != "BHLD":
        raise ValueError(f"unknown layout {params['layout']!r}")
    if params.get("dropout_p", 0.0) != 0.0:
        raise ValueError("golden SDPA cases use dropout_p = 0")
    out, weights = sdpa.scaled_dot_product_attention(
        arrays["query"], arrays["key"], arrays["value"], attn_mask=mask,
        causal=bool(params.get("is_causal")), scale=params.get("scale"), need_weights=True)
    return out, weights


def run_mha(params, arrays, entries):
    sd = {k: v for k, v in arrays.items() if entries[k]["role"] == "param"}
    layer = sdpa.MultiheadAttention(
        params["embed_dim"], params["num_heads"], dropout=params.get("dropout", 0.0),
        bias=params.get("bias", True), add_bias_kv=params.get("add_bias_kv", False),
        add_zero_attn=params.get("add_zero_attn", False), kdim=params.get("kdim"),
        vdim=params.get("vdim"), batch_first=params.get("batch_first", False))
    layer.load_state_dict(sd)
    layer.train(bool(params.get("training", False)))
    query = arrays["query"]
    if params.get("self_attention"):
        key = value = query
    else:
        key, value = arrays["key"], arrays["value"]
    masks = {}
    for name in ("key_padding_mask", "attn_mask"):
        if name in arrays:
            polarity = entries[name].get("polarity")
            m = arrays[name]
            if polarity == "ignore":
                masks[name] = m.astype(bool)       # PyTorch MHA polarity, passed as is
            elif polarity == "additive":
                masks[name] = m
            elif polarity == "allow":
                masks[name] = ~m.astype(bool)
            else:
                raise ValueError(f"unknown polarity {polarity!r}")
    return layer(query, key, value, need_weights=bool(params.get("need_weights", True)),
                 average_attn_weights=bool(params.get("average_attn_weights", True)),
                 is_causal=bool(params.get("is_causal", False)), **masks)


class GoldenTest(unittest.TestCase):
    def test_index_present(self):
        self.assertTrue(os.path.isfile(os.path.join(ref.GOLDEN, "index.json")),
                        f"{ref.GOLDEN}/index.json is missing: the golden fixtures are part of "
                        "the repository")
        cases = ref.golden_cases()
        self.assertTrue(any(c.startswith("sdpa") for c in cases))
        self.assertTrue(any(c.startswith("mha") for c in cases))

    def test_cases(self):
        cases = ref.golden_cases()
        ran = {"sdpa": 0, "mha": 0}
        for name in cases:
            with self.subTest(case=name):
                manifest, arrays, entries = ref.load_golden(name)
                self.assertEqual(manifest["name"], name)
                tol = manifest["tolerance"]
                params = manifest["params"]
                op = manifest["op"]
                if op == "sdpa":
                    out, weights = run_sdpa(params, arrays, entries)
                elif op == "mha":
                    out, weights = run_mha(params, arrays, entries)
                else:
                    self.fail(f"{name}: unknown op {op!r}")
                for what, got in (("out", out), ("attn_weights", weights)):
                    if what in arrays:
                        problem = ref.within(got, arrays[what], tol["rtol"], tol["atol"])
                        self.assertEqual(problem, "", f"{name}: {what} {problem}")
                ran[op] += 1
        self.assertEqual(sum(ran.values()), len(cases))


if __name__ == "__main__":
    unittest.main()
