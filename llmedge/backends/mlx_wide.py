"""Wide steps (prompts) on MLX's CPU device: the products and attention in float32 through NumPy's BLAS.

MLX's CPU build multiplies slowly: its wheel bundles netlib's reference BLAS and its quantized
product loops over rows (1-2 GFLOP/s here, against OpenBLAS's ~40 per core), so a 512-token prompt
of gemma3:270m took minutes and perplexity runs were out of reach. A step of at least
:data:`WIDE_ROWS` rows on the CPU device therefore multiplies each weight, a slice of its rows at a
time, as ``x @ w.T`` in float32 through NumPy's BLAS, the slice dequantized from the weight's MLX
form on the fly (:func:`llmedge.backends.mlx_quant.dequantize_affine`: the very values
``mx.quantized_matmul`` multiplies by), and runs attention as NumPy products per kv head. Norms,
RoPE and the GLU stay MLX's. So only summation orders differ from the MLX path (and a float f16
weight's product is float32 here, where MLX returns f16), and the two agree to float32 rounding.

Slices dequantized per call, not a float32 copy of each weight: the copy would take 4 bytes per
value (1.1 GB for gemma3:270m, whose 262144 x 640 tied embedding alone is 671 MB), while
dequantizing costs 2-5 ns per value against the 20 ns per value of a 512-row product. Measured on
smollm2:135m with single-threaded BLAS, the NumPy path equals MLX's at 2 rows and is 2.2x, 3.8x and
11x faster at 4, 8 and 32 rows; a 512-token chunk takes 6.5 s of CPU (gemma3:270m, both within 0.5%
of llama.cpp's perplexity). Decode steps (the compiled whole-step function) and steps under
:data:`WIDE_ROWS` stay on MLX, and so does every step on the GPU, where MLX's kernels are the fast path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from llmedge.backends.mlx_quant import dequantize_affine

WIDE_ROWS = 8  # steps of at least this many rows multiply through NumPy on MLX's CPU device
_SLICE_VALUES = 1 << 21  # weight values dequantized per slice (an 8 MB float32 temporary)


def matmul(x: np.ndarray, w: Any) -> np.ndarray:
    """``x @ w.T`` (float32 [n, m]) for float32 rows ``x`` [n, k] and an
    :class:`llmedge.backends.mlx.MlxWeight`, a slice of the weight's rows at a time. A float weight
    multiplies ``x`` rounded to its type, as the MLX path does."""
    m, k = w.shape
    if w.scales is None:
        if w.w.dtype != mx.float32:
            x = np.array(mx.array(x).astype(w.w.dtype).astype(mx.float32))
        rows = lambda s, e: np.array(w.w[s:e].astype(mx.float32))  # noqa: E731
    else:  # NumPy views of the MLX arrays (no copy)
        codes, scales, biases = np.asarray(w.w), np.asarray(w.scales), np.asarray(w.biases)
        mins = None if w.mins is None else np.asarray(w.mins)
        rows = lambda s, e: dequantize_affine(codes[s:e], scales[s:e], biases[s:e], w.bits,  # noqa: E731
                                              None if mins is None else mins[s:e])
    out = np.empty((x.shape[0], m), dtype=np.float32)
    step = max(1, _SLICE_VALUES // k)
    for s in range(0, m, step):
        out[:, s : s + step] = x @ rows(s, s + step).T
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
              softcap: float | None) -> np.ndarray:
    """q [n, H, d] over k, v [t, Hkv, d] (any float type) with a boolean mask [n, t]: float32
    [n, H, dv], the MLX path's :func:`llmedge.backends.mlx.attention` (an f16 cache multiplies the
    query rounded to f16; query head h reads kv head h // (H / Hkv); a query that sees no key reads
    zeros). One kv head's query group at a time, as one [n * group, t] product (its rows in
    position-major order, each position's ``group`` heads together)."""
    n, n_head, _ = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    if k.dtype == np.float16:
        q = q.astype(np.float16)
    q = q.astype(np.float32)
    out = np.empty((n, n_head, v.shape[2]), dtype=np.float32)
    hidden = ~mask[:, None, :]
    blind = ~mask.any(axis=-1)  # queries that see no key
    for j in range(n_kv):
        heads = slice(j * group, (j + 1) * group)
        s = np.ascontiguousarray(q[:, heads]).reshape(n * group, -1) @ k[:, j].astype(np.float32).T
        if softcap:
            s = np.tanh(s / np.float32(softcap)) * np.float32(softcap * scale)
        else:
            s *= np.float32(scale)
        by_query = s.reshape(n, group, -1)
        np.copyto(by_query, -np.inf, where=hidden)
        by_query[blind] = 0.0  # no NaN from an all-hidden row (its output is zeroed below)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        out[:, heads] = (s @ v[:, j].astype(np.float32)).reshape(n, group, -1)
    out[blind] = 0.0
    return out
