#!/usr/bin/env python3
"""A serving loop over a paged float16 KV cache with the sdpa package (libsdpa 0.5).

    PYTHONPATH=python /usr/bin/python3 examples/python/serving_loop.py

One attention layer (random projections), GQA 8 query / 2 kv heads, head size 64, a float16
block pool with block size 16 in vLLM's [num_blocks, block_size, Hkv, E] layout. Three prompts
of different lengths are prefilled in one packed call (cu_seqlens_q), their K/V scattered into
the cache with sdpa.kv_write; then 8 tokens are decoded for all three at once, one paged call
(block_table + key_lengths) per step on a caller thread pool. Every step is checked against a
float64 recomputation over the same (float16-rounded) keys. Exit status 1 if a number is wrong.
"""
import os
import sys

import numpy as np

try:
    import sdpa
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import sdpa

HQ, HKV, E, D = 8, 2, 64, 128          # query heads, kv heads, head size, model width
BLOCK, NUM_BLOCKS, MAX_BLOCKS = 16, 64, 8
PROMPTS = [37, 5, 20]                   # prompt lengths
STEPS = 8

rng = np.random.default_rng(0)
wq = rng.standard_normal((D, HQ * E)).astype(np.float32) / np.sqrt(D)
wk = rng.standard_normal((D, HKV * E)).astype(np.float32) / np.sqrt(D)
wv = rng.standard_normal((D, HKV * E)).astype(np.float32) / np.sqrt(D)

# The cache: vLLM's layout, passed to the library as the [num_blocks, Hkv, block_size, E] view.
k_cache = np.zeros((NUM_BLOCKS, BLOCK, HKV, E), np.float16)
v_cache = np.zeros((NUM_BLOCKS, BLOCK, HKV, E), np.float16)
k_pool, v_pool = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
# Each sequence owns MAX_BLOCKS blocks at scattered places of the pool.
block_table = rng.permutation(NUM_BLOCKS)[:len(PROMPTS) * MAX_BLOCKS].reshape(len(PROMPTS), MAX_BLOCKS)
block_table = block_table.astype(np.int32)
# Per sequence, for the check: the token inputs and the K/V rows written to the cache so far.
history = [[] for _ in PROMPTS]
written_k = [[] for _ in PROMPTS]
written_v = [[] for _ in PROMPTS]


def slots_of(seq, positions):
    """vLLM slot_mapping: block * BLOCK + offset of each position of sequence seq."""
    return [int(block_table[seq, p // BLOCK]) * BLOCK + p % BLOCK for p in positions]


def reference(x_seq, causal_rows, k_rows, v_rows):
    """float64 attention of the last causal_rows tokens of one sequence over all its tokens,
    on the K/V rows that were written to the cache (k_rows, v_rows: [n, HKV, E] float32),
    rounded to float16 as the cache stores them. The rows are the ones the library was given,
    not recomputed: a BLAS may round x @ wk differently for a different number of rows, and
    one float16 ulp of a value is ~1e-3."""
    q = (x_seq @ wq).reshape(-1, HQ, E).transpose(1, 0, 2).astype(np.float64)
    k = np.asarray(k_rows).astype(np.float16).astype(np.float64).transpose(1, 0, 2)
    v = np.asarray(v_rows).astype(np.float16).astype(np.float64).transpose(1, 0, 2)
    k, v = np.repeat(k, HQ // HKV, axis=0), np.repeat(v, HQ // HKV, axis=0)
    n = x_seq.shape[0]
    s = q[:, n - causal_rows:] @ k.transpose(0, 2, 1) / np.sqrt(E)
    s = np.where(np.arange(n)[None, :] <= np.arange(n - causal_rows, n)[:, None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v   # [HQ, rows, E]


def main():
    ok = True
    with sdpa.ThreadPool(2) as pool:
        # Prefill: the three prompts packed along one axis, one call.
        xs = [rng.standard_normal((n, D)).astype(np.float32) for n in PROMPTS]
        x = np.concatenate(xs)
        cu = np.cumsum([0] + PROMPTS).astype(np.int32)
        q = (x @ wq).reshape(-1, HQ, E)            # FlashAttention's [total_q, Hq, E]
        k = (x @ wk).reshape(-1, HKV, E)
        v = (x @ wv).reshape(-1, HKV, E)
        sdpa.kv_write(k_pool, v_pool, k, v,
                      sum((slots_of(r, range(n)) for r, n in enumerate(PROMPTS)), []))
        out = sdpa.scaled_dot_product_attention(
            q.transpose(1, 0, 2)[None], k_pool, v_pool, cu_seqlens_q=cu, block_table=block_table,
            key_lengths=PROMPTS, causal=True, threadpool=pool)
        worst = 0.0
        for r, n in enumerate(PROMPTS):
            history[r] = list(xs[r])
            written_k[r] = list(k[cu[r]:cu[r + 1]])
            written_v[r] = list(v[cu[r]:cu[r + 1]])
            want = reference(xs[r], n, written_k[r], written_v[r])
            worst = max(worst, float(np.abs(out[0, :, cu[r]:cu[r + 1]] - want).max()))
        ok &= worst < 1e-5  # float32 arithmetic on the same float16 keys: ~1e-6 here
        print(f"prefill {PROMPTS} packed: {sdpa.last_kernel()}, max |err| {worst:.1e}")

        # Decode: one new token per sequence per step, one paged call for the batch.
        lengths = list(PROMPTS)
        for step in range(STEPS):
            x = rng.standard_normal((len(PROMPTS), D)).astype(np.float32)
            q = (x @ wq).reshape(-1, HQ, 1, E)     # [B, Hq, 1, E]
            k = (x @ wk).reshape(-1, HKV, E)
            v = (x @ wv).reshape(-1, HKV, E)
            sdpa.kv_write(k_pool, v_pool, k, v,
                          [slots_of(r, [lengths[r]])[0] for r in range(len(PROMPTS))])
            lengths = [n + 1 for n in lengths]
            out = sdpa.scaled_dot_product_attention(q, k_pool, v_pool, block_table=block_table,
                                                    key_lengths=lengths, causal="bottom_right",
                                                    threadpool=pool)
            worst = 0.0
            for r in range(len(PROMPTS)):
                history[r].append(x[r])
                written_k[r].append(k[r])
                written_v[r].append(v[r])
                want = reference(np.array(history[r]), 1, written_k[r], written_v[r])
                worst = max(worst, float(np.abs(out[r] - want).max()))
            ok &= worst < 1e-5
        print(f"decoded {STEPS} tokens x {len(PROMPTS)} sequences (lengths now {lengths}): "
              f"{sdpa.last_kernel()}, max |err| {worst:.1e}")

    # A block index outside the pool is an error naming it; nothing is written.
    bad = block_table.copy()
    bad[0, 0] = NUM_BLOCKS
    try:
        sdpa.scaled_dot_product_attention(q, k_pool, v_pool, block_table=bad, key_lengths=lengths)
        ok = False
    except sdpa.SdpaError as e:
        print(f"bad block table: {e.name}: {e.message}")
        ok &= e.name == "SDPA_ERR_INDEX"
    print("OK" if ok else "WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
