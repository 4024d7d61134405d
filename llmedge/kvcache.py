"""The KV cache: per sequence and layer, the keys and values attention reads.

A layer cache holds ``capacity`` cells of K and V (f16 by default, f32 on request) and the position
of each cell (-1 when empty). Full-attention layers have ``n_ctx`` cells and append; sliding-window
layers keep a ring of ``window + max_batch`` cells, so their memory does not grow with ``n_ctx``.
Attention masks by the stored positions, which is what lets a ring and a linear buffer share one
attention op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KV_DTYPES = {"f16": np.float16, "f32": np.float32}


class LayerCache:
    """K/V cells of one layer of one sequence; ``window`` set means a sliding-window ring."""

    def __init__(self, capacity: int, n_kv_head: int, head_dim_k: int, head_dim_v: int,
                 dtype: np.dtype, window: int | None = None) -> None:
        self.capacity = capacity
        self.window = window
        self.k = np.zeros((capacity, n_kv_head, head_dim_k), dtype=dtype)
        self.v = np.zeros((capacity, n_kv_head, head_dim_v), dtype=dtype)
        self.pos = np.full(capacity, -1, dtype=np.int64)
        self.offset = 0  # tokens written so far (the next position for an append-only sequence)
        self.used = 0  # cells of the buffer that may hold data (all of it once a ring wraps)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store k, v [n, n_kv_head, d] at ``positions``; return the K, V and positions to attend to."""
        n = len(positions)
        if self.window is None:
            if self.offset + n > self.capacity:
                raise ValueError(f"KV cache full: {self.offset} + {n} tokens > {self.capacity} cells")
            idx = np.arange(self.offset, self.offset + n)
        else:
            if n > self.capacity - self.window + 1:
                raise ValueError(f"batch of {n} rows exceeds the sliding-window ring of {self.capacity}")
            idx = np.arange(self.offset, self.offset + n) % self.capacity
        self.k[idx] = k
        self.v[idx] = v
        self.pos[idx] = positions
        self.offset += n
        self.used = min(self.capacity, max(self.used, int(idx.max()) + 1))
        u = self.used
        return self.k[:u], self.v[:u], self.pos[:u]

    def can_trim_to(self, n: int) -> bool:
        """Whether the first ``n`` tokens can be kept with everything their successors need."""
        if n > self.offset:
            return False
        if self.window is None or self.offset <= self.capacity:
            return True
        oldest_kept = self.offset - self.capacity
        return oldest_kept <= max(0, n - self.window + 1)

    def trim_to(self, n: int) -> None:
        """Forget every token at position >= n (positions are token indices here)."""
        self.pos[self.pos >= n] = -1
        self.offset = n
        if self.window is None:
            self.used = min(self.used, n)


@dataclass
class SequenceCache:
    """All layer caches of one sequence plus the token ids they hold."""

    layers: list[LayerCache]
    tokens: list[int] = field(default_factory=list)

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def trim_to(self, n: int) -> bool:
        """Keep the first ``n`` tokens; return False (and clear) when a ring lost what they need."""
        if all(layer.can_trim_to(n) for layer in self.layers):
            for layer in self.layers:
                layer.trim_to(n)
            del self.tokens[n:]
            return True
        self.clear()
        return False

    def clear(self) -> None:
        for layer in self.layers:
            layer.pos[:] = -1
            layer.offset = 0
            layer.used = 0
        self.tokens.clear()
