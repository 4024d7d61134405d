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
