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


def fused_matches_op_by_op(m: Any, ids: list[int], follow: list[int], plan_attr: str) -> tuple[int, Any]:
    """The prompt ``ids`` in ``n_batch`` chunks, then each token of ``follow`` as a one-token step,
    through a backend's fused stack and through the op-by-op path, each on its own cache; each
    piece's logits compared exactly and dropped (Gemma's 704 rows of 262k logits would be 0.7 GB per
    path). ``plan_attr`` is the model attribute holding the fused stack's plan (None: make one,
    False: declined, so op by op). Returns the rows compared and the fused path's cache."""
    net, eng = m.model, m.engine
    caches = {True: eng.new_cache(), False: eng.new_cache()}
    pieces = [ids[i : i + eng.n_batch] for i in range(0, len(ids), eng.n_batch)] + [[t] for t in follow]
    rows = 0
    try:
        for piece in pieces:
            out = {}
            for fused in (True, False):
                setattr(net, plan_attr, None if fused else False)
                out[fused] = eng.forward(caches[fused], piece, all_logits=len(piece) > 1)
                assert bool(getattr(net, plan_attr)) == fused, "the fused path was not taken as intended"
            np.testing.assert_array_equal(out[True], out[False])
            assert out[True].shape[1] == m.params.n_vocab
            rows += len(out[True])
    finally:
        setattr(net, plan_attr, None)
    return rows, caches[True]
