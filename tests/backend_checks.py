"""Checks every backend's ops share: the same cases against the NumPy reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmedge.backends.numpy_ref import NumpyBackend


def assert_attention_matches_reference(be: Any, kv_dtype: Any, f16_prob_ulps: float) -> None:
    """Masks (empty cells, sliding window), grouped-query heads and soft-capping against the
    reference. Over an F16 cache the output may move by ``f16_prob_ulps`` F16 ulps of each
    probability times the largest value (the rounding ggml applies to probabilities); a query that
    sees no key gives zeros."""
    rng = np.random.default_rng(3)
    t, n_kv, d = 40, 2, 64
    k = rng.standard_normal((t, n_kv, d)).astype(kv_dtype)
    v = rng.standard_normal((t, n_kv, d)).astype(kv_dtype)
    k_pos = np.arange(t, dtype=np.int32)
    k_pos[5] = -1  # an empty cell
    ref_be = NumpyBackend()
    f16 = np.dtype(kv_dtype) == np.float16
    for n, window, softcap in ((1, None, None), (6, None, None), (6, 9, None), (1, 7, 50.0), (4, None, 30.0)):
        q = rng.standard_normal((n, 6, d)).astype(np.float32)
        q_pos = np.arange(t - n, t, dtype=np.int32)
        out = be.attention(q, k, v, q_pos, k_pos, 0.125, window, softcap)
        ref = ref_be.attention(q, k, v, q_pos, k_pos, 0.125, window, softcap)
        bound = 2e-5 + (f16_prob_ulps * 2.0**-10 * np.abs(v.astype(np.float32)).max() if f16 else 0)
        assert np.all(np.abs(out - ref) <= bound), (n, window, softcap)
    empty = be.attention(q, k, v, np.full(4, -5, np.int32), k_pos, 0.125)
    assert np.array_equal(empty, np.zeros_like(empty))
