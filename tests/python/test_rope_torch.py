"""sdpa.rope (libsdpa 0.6, issue 31) against torch 1.13 evaluations of HF transformers'
apply_rotary_pos_emb (rotate_half, partial rotary as GPT-NeoX / Phi) and FlashAttention's
apply_rotary_emb_torch (both interleaved settings), each written here from the published
formula. With cos/sin tables the results are the same bits (float32 products, then one add);
theta is compared with HF's float32 recipe run by torch (bounded: torch's float32 pow / cos /
sin are not correctly rounded). tests/python/test_rope.py has the numpy versions.

Registered with test_torch.py, only where torch imports (tests/python/meson.build): it never
skips."""
import unittest

import numpy as np
import torch

import sdpa


def hf_rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb (q [B, H, L, D], cos/sin [B, L, D])."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (hf_rotate_half(q) * sin)


def hf_rope_cache(inv_freq, position_ids):
    """HF LlamaRotaryEmbedding.forward: freqs = inv_freq @ positions, emb = cat(freqs, freqs)."""
    inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    p = position_ids[:, None, :].float()
    freqs = (inv.float() @ p.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin(), freqs


def fa_rotate_half(x, interleaved=False):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)  # rearrange "... d two -> ... (d two)"


def fa_apply_rotary_emb_torch(x, cos, sin, interleaved=False):
    """flash_attn.layers.rotary.apply_rotary_emb_torch: x [B, L, H, D], cos/sin [L, rd/2]."""
    ro_dim = cos.shape[-1] * 2
    if interleaved:  # repeat "... d -> ... 1 (d 2)"
        cos = cos.repeat_interleave(2, dim=-1)[..., None, :]
        sin = sin.repeat_interleave(2, dim=-1)[..., None, :]
    else:  # repeat "... d -> ... 1 (2 d)"
        cos = torch.cat((cos, cos), dim=-1)[..., None, :]
        sin = torch.cat((sin, sin), dim=-1)[..., None, :]
    return torch.cat([x[..., :ro_dim] * cos + fa_rotate_half(x[..., :ro_dim], interleaved) * sin,
                      x[..., ro_dim:]], dim=-1)


def hf_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


class TorchRopeTest(unittest.TestCase):
    def setUp(self):
        self.g = torch.Generator().manual_seed(31)

    def test_hf_tables_bit_exact(self):
        """HF's own float32 cos/sin (one entry per pair) as the tables; query [B, L, H, D]."""
        B, L, H, D = 2, 7, 4, 64
        pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46]])
        cos, sin, freqs = hf_rope_cache(hf_inv_freq(10000.0, D), torch.arange(64)[None, :])
        tc, ts = freqs[0].cos(), freqs[0].sin()  # [max_pos, D/2], torch's float32 cos / sin
        self.assertTrue(torch.equal(torch.cat((tc, tc), -1), cos[0]))
        q = torch.randn(B, L, H, D, generator=self.g)
        want = hf_apply_rotary_pos_emb(q.transpose(1, 2), cos[0][pos], sin[0][pos]).transpose(1, 2)
        got = sdpa.rope(q.reshape(B * L, H, D), pos.reshape(-1).numpy(), cos=tc, sin=ts)
        self.assertTrue(torch.equal(got.reshape(B, L, H, D), want))

    def test_hf_partial_rotary_bit_exact(self):
        """GPT-NeoX / Phi: rotate q[..., :rd], pass the rest."""
        T, H, D, rd = 5, 3, 80, 32
        _, _, freqs = hf_rope_cache(hf_inv_freq(10000.0, rd), torch.arange(50)[None, :])
        tc, ts = freqs[0].cos(), freqs[0].sin()
        pos = torch.tensor([0, 3, 9, 27, 49])
        x = torch.randn(T, H, D, generator=self.g)
        c, s = torch.cat((tc, tc), -1)[pos], torch.cat((ts, ts), -1)[pos]
        rot = hf_apply_rotary_pos_emb(x[..., :rd].transpose(0, 1)[None], c[None], s[None])[0].transpose(0, 1)
        want = torch.cat((rot, x[..., rd:]), dim=-1)
        got = sdpa.rope(x, pos.numpy(), cos=tc, sin=ts, rotary_dim=rd)
        self.assertTrue(torch.equal(got, want))

    def test_flash_attention_both_conventions_bit_exact(self):
        T, H, D = 6, 4, 64
        for interleaved in (False, True):
            for rd in (64, 48):
                inv = 1.0 / (10000.0 ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
                ang = torch.arange(100, dtype=torch.float64)[:, None] * inv[None, :]
                tc, ts = ang.cos().float(), ang.sin().float()
                pos = torch.tensor([0, 5, 17, 63, 98, 99])
                x = torch.randn(T, H, D, generator=self.g)
                want = fa_apply_rotary_emb_torch(x[None], tc[pos], ts[pos], interleaved)[0]
                got = sdpa.rope(x, pos.numpy(), cos=tc, sin=ts, rotary_dim=rd, interleaved=interleaved)
                self.assertTrue(torch.equal(got, want), (interleaved, rd))
                # a strided input (a [T, D, H] tensor transposed) and in place
                xt = x.transpose(1, 2).contiguous().transpose(1, 2)
                r = sdpa.rope(xt, pos.numpy(), cos=tc, sin=ts, rotary_dim=rd, interleaved=interleaved, out=xt)
                self.assertIs(r, xt)
                self.assertTrue(torch.equal(xt, want))

    def test_reduced_dtypes_round_the_float32_result_once(self):
        """f16 / bf16 rows: torch's float32 formula on the widened rows, rounded once."""
        T, H, D = 4, 2, 64
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        ang = torch.arange(32, dtype=torch.float64)[:, None] * inv[None, :]
        tc, ts = ang.cos().float(), ang.sin().float()
        pos = torch.tensor([1, 7, 20, 31])
        for dt in (torch.float16, torch.bfloat16):
            x = torch.randn(T, H, D, generator=self.g).to(dt)
            want32 = fa_apply_rotary_emb_torch(x.float()[None], tc[pos], ts[pos])[0]
            got = sdpa.rope(x, pos.numpy(), cos=tc, sin=ts)
            self.assertEqual(got.dtype, dt)
            self.assertTrue(torch.equal(got, want32.to(dt)), dt)
            # HF evaluates in the model dtype (cos.to(dtype), each op rounded): not the same
            # bits, within a few ulps of the dtype (measured: bf16 <= 2^-7, f16 <= 2^-10 relative)
            hf = (x * torch.cat((tc, tc), -1)[pos][:, None].to(dt)) + \
                 (hf_rotate_half(x) * torch.cat((ts, ts), -1)[pos][:, None].to(dt))
            bound = 2.0 ** -7 if dt == torch.bfloat16 else 2.0 ** -10
            err = ((got.float() - hf.float()).abs() / x.float().abs().amax()).max().item()
            self.assertLessEqual(err, bound * 2, dt)

    def test_theta_against_hf_float32_recipe(self):
        """theta: HF's float32 inv_freq / angle / cos / sin run by torch. Where torch's float32
        pow gives the correctly rounded inv_freq (base 1e4, dim 128: every entry) the library's
        cos / sin are those of torch's float32 angles correctly rounded, bit for bit; against
        torch's own float32 cos / sin (SLEEF, 1 ulp) they differ by at most 1 ulp (<= 6e-8)."""
        D, P = 128, 4096
        half = D // 2
        pos = np.arange(P)
        x = np.zeros((P, half, D), np.float32)  # row (p, i): 1 at pair i's first element
        for i in range(half):
            x[:, i, i] = 1.0
        for base in (10000.0, 1e6):
            out = sdpa.rope(x, pos, theta=base)
            lc = np.stack([out[:, i, i] for i in range(half)], 1)
            ls = np.stack([out[:, i, i + half] for i in range(half)], 1)
            _, _, freqs = hf_rope_cache(hf_inv_freq(base, D), torch.arange(P)[None, :])
            f = freqs[0]
            if base == 10000.0:
                a64 = f.double().numpy()
                np.testing.assert_array_equal(lc, np.cos(a64).astype(np.float32))
                np.testing.assert_array_equal(ls, np.sin(a64).astype(np.float32))
                self.assertLessEqual(max(np.abs(lc - f.cos().numpy()).max(), np.abs(ls - f.sin().numpy()).max()),
                                     6e-8)
            else:  # torch's float32 pow is 1 ulp off on an inv_freq entry: the angle drifts with p
                self.assertLessEqual(max(np.abs(lc - f.cos().numpy()).max(), np.abs(ls - f.sin().numpy()).max()),
                                     1e-6)


if __name__ == "__main__":
    unittest.main()
