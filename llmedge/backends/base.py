"""The Backend protocol: the small op set every compute backend implements.

Models call only these ops. All activations are float32, C-contiguous NumPy arrays; weights are
opaque handles returned by ``prepare`` (the backend keeps the GGUF blocks or repacks them once).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import numpy as np

from llmedge.gguf import TensorInfo

GluKind = Literal["silu", "gelu"]
F32 = np.dtype(np.float32)


def as_f32c(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous float32 array (no copy when it already is one)."""
    if a.dtype == F32 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.float32)


def out_array(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``shape``, or ``out`` after checking it can receive it."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.dtype != F32 or not out.flags.c_contiguous or out.shape != shape:
        raise ValueError(f"out= must be a C-contiguous float32 array of shape {shape}")
    return out


class Backend(Protocol):
    name: str

    def prepare(self, tensor: TensorInfo) -> Any:
        """Return a weight handle for ``tensor`` (2-D: rows of ``tensor.dims[0]`` values, or 1-D)."""

    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        """``x`` float32 [n, k] times the transposed weight [m, k]: float32 [n, m]."""

    def get_rows(self, w: Any, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of a 2-D weight (embeddings), dequantized: float32 [len(ids), k]."""

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """RMS-normalize the last axis of ``x`` and multiply by ``weight`` (float32 [d])."""

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool) -> np.ndarray:
        """Rotate ``x`` [n, heads, head_dim] at ``positions`` [n]; NeoX pairs (i, i+n_rot/2), else (2i, 2i+1).

        Backends that run families with RoPE factors or YaRN also take the keywords ``freq_factors``,
        ``attn_factor`` (the final cos/sin multiplier), ``ext_factor`` and ``corr_dims`` (YaRN's ramp)."""

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None) -> np.ndarray:
        """Causal attention of q [n, n_head, d] over k, v [t, n_kv_head, d] (f16 or f32).

        Key j is visible to query i when ``k_pos[j] <= q_pos[i]`` and, with a sliding ``window``,
        ``q_pos[i] - k_pos[j] < window``; ``k_pos`` < 0 marks an empty cell. Grouped-query heads:
        query head h reads kv head ``h // (n_head // n_kv_head)``. Returns float32 [n, n_head, d].
        """

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind) -> np.ndarray:
        """``act(gate) * up`` with act SiLU or GELU (tanh approximation, as ggml)."""


# ---------------------------------------------------------------------------------------------
# argument checks every backend makes the same way (one clear ValueError / IndexError each)


def check_matmul(x: np.ndarray, k: int, name: str) -> None:
    """``x``'s last axis must hold the weight ``name``'s ``k`` columns."""
    if x.shape[-1] != k:
        raise ValueError(f"matmul: x has {x.shape[-1]} columns, {name} expects {k}")


def check_row_ids(ids: np.ndarray, m: int, name: str) -> None:
    """Every id in ``ids`` (1-D) must name one of the weight ``name``'s ``m`` rows."""
    if not ids.size:
        return
    if ids.size <= 64:  # a decode step's few ids: Python's min and max of the list cost less than two reductions
        vals = ids.tolist()
        lo, hi = min(vals), max(vals)
    else:
        lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= m:
        raise IndexError(f"get_rows: id out of range for {name} with {m} rows")


def check_norm_weight(weight: np.ndarray, d: int) -> None:
    """An RMS-norm weight must have one value per element of a row of ``d``."""
    if weight.size != d:
        raise ValueError(f"rms_norm: weight has {weight.size} values for rows of {d}")


def check_rope(pos: np.ndarray, n: int, freq_factors: np.ndarray | None, n_rot: int) -> None:
    """One position per row; ``freq_factors``, when given, must cover the ``n_rot/2`` pairs."""
    if pos.size != n:
        raise ValueError(f"rope: {pos.size} positions for {n} rows")
    if freq_factors is not None and freq_factors.size < n_rot // 2:
        raise ValueError("rope: freq_factors needs n_rot/2 values")


def check_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> None:
    """q [n, n_head, d] against k, v [t, n_kv_head, d], both float16 or both float32, ``n_head`` a
    multiple of ``n_kv_head``, one position per query row and per cell."""
    n, n_head, d = q.shape
    if k.dtype != v.dtype or k.dtype not in (np.dtype(np.float16), F32):
        raise ValueError("attention: k and v must both be float16 or both float32")
    t, n_kv, dk = k.shape
    if v.shape != k.shape or dk != d:
        raise ValueError(f"attention: k {k.shape} / v {v.shape} do not match q head size {d}")
    if n_kv == 0 or n_head % n_kv:
        raise ValueError(f"attention: {n_head} query heads are not a multiple of {n_kv} kv heads")
    if q_pos.size != n or k_pos.size != t:
        raise ValueError("attention: q_pos / k_pos sizes do not match q / k")


def check_same_shape(op: str, a: np.ndarray, b: np.ndarray, names: tuple[str, str] = ("", "")) -> None:
    """The two operands of an elementwise op must have one shape."""
    if a.shape != b.shape:
        if names[0]:
            raise ValueError(f"{op}: {names[0]} {a.shape} and {names[1]} {b.shape} differ")
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} differ")


def unencoded_feature(model: Any, encoded: frozenset[str], stack: str) -> str | None:
    """Why a fused stack that encodes the spec features ``encoded`` cannot run ``model`` (the first
    layer using a feature outside them), or None; ``stack`` names it in the reason."""
    specs = getattr(model, "specs", None)
    if not specs:
        return "the model declares no layer specs"
    for il, spec in enumerate(specs):
        missing = [f for f in spec.used_features() if f not in encoded]
        if missing:
            return f"layer {il} uses {', '.join(missing)}, which {stack} does not encode"
    return None
