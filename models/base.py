"""What every decoder-only architecture shares: the batch, weight lookup by GGUF name, the cache
layout and the attention and feed-forward blocks. Architectures compose these in their forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmedge.backends.base import Backend, GluKind
from llmedge.errors import ModelError
from llmedge.gguf import GGUFFile
from llmedge.kvcache import KV_TYPES, Arena, LayerCache, Scratch, SequenceCache, plan_sequence_cache


@dataclass
class Batch:
    """Token rows of one sequence to evaluate: ids, their positions and the cache they extend.

    ``output_rows`` selects the rows whose logits are returned (``None``: all rows).
    """

    tokens: np.ndarray
    positions: np.ndarray
    cache: SequenceCache
    output_rows: np.ndarray | None = None


class Weights:
    """Weights looked up by GGUF tensor name and prepared once by the backend."""

    def __init__(self, gguf: GGUFFile, backend: Backend) -> None:
        self.gguf = gguf
        self.backend = backend

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def get(self, name: str) -> Any:
        if name not in self.gguf.tensors:
            raise ModelError(f"{self.gguf.path}: tensor '{name}' is missing")
        return self.backend.prepare(self.gguf.tensors[name])

    def layer(self, i: int, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        out = {n: self.get(f"blk.{i}.{n}.weight") for n in names}
        out.update({n: self.get(f"blk.{i}.{n}.weight") for n in optional if self.has(f"blk.{i}.{n}.weight")})
        return out

    def output(self) -> Any:
        """``output.weight``, falling back to ``token_embd.weight`` when the embeddings are tied."""
        return self.get("output.weight" if self.has("output.weight") else "token_embd.weight")


@dataclass
class AttentionSpec:
    """How one layer's attention behaves (set per layer by the architecture)."""

    n_head: int
    n_kv_head: int
    head_dim: int
    n_rot: int
    rope_base: float
    rope_scale: float
    neox: bool
    scale: float
    eps: float
    window: int | None = None
    softcap: float | None = None
    q_scale: float = 1.0  # multiplies Q after RoPE, before the cache-typed product (Gemma's query scaling)


def make_sequence_cache(n_layer: int, n_ctx: int, n_kv_head: int, head_dim: int, kv_type: str,
                        windows: list[int | None], max_batch: int) -> SequenceCache:
    """Full caches of ``n_ctx`` cells, sliding-window layers a ring of window + max_batch cells
    (a plain buffer when that is not smaller than ``n_ctx``); all of them in one arena."""
    if kv_type not in KV_TYPES:
        raise ModelError(f"unsupported KV cache type '{kv_type}' (supported: {', '.join(KV_TYPES)})")
    geometry = []
    for il in range(n_layer):
        w = windows[il]
        ring = w is not None and w + max_batch < n_ctx
        geometry.append((w + max_batch if ring else n_ctx, w, ring))
    arena = Arena(plan_sequence_cache([(cap, n_kv_head, head_dim, head_dim, kv_type) for cap, _, _ in geometry]))
    scratch = Scratch() if kv_type == "q8_0" else None
    layers = [LayerCache(cap, n_kv_head, head_dim, head_dim, kv_type, window=w, ring=ring, alloc=arena.alloc,
                         scratch=scratch) for cap, w, ring in geometry]
    return SequenceCache(layers, arena=arena, scratch=scratch)


def attention_block(be: Backend, w: dict[str, Any], h: np.ndarray, batch: Batch, layer: LayerCache,
                    spec: AttentionSpec) -> np.ndarray:
    """Q/K/V projections, optional per-head Q/K norms, RoPE, cached attention, output projection."""
    n = h.shape[0]
    q = be.matmul(h, w["attn_q"]).reshape(n, spec.n_head, spec.head_dim)
    k = be.matmul(h, w["attn_k"]).reshape(n, spec.n_kv_head, spec.head_dim)
    v = be.matmul(h, w["attn_v"]).reshape(n, spec.n_kv_head, spec.head_dim)
    if "attn_q_norm" in w:
        q = be.rms_norm(q, w["attn_q_norm"], spec.eps)
        k = be.rms_norm(k, w["attn_k_norm"], spec.eps)
    q = be.rope(q, batch.positions, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    if spec.q_scale != 1.0:
        q = q * np.float32(spec.q_scale)
    k = be.rope(k, batch.positions, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    if layer.rope is None:  # what a context shift needs to re-rotate this layer's keys
        layer.rope = (spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    k_all, v_all, k_pos = layer.update_and_fetch(k, v, batch.positions)
    o = be.attention(q, k_all, v_all, batch.positions, k_pos, spec.scale, spec.window, spec.softcap)
    return be.matmul(o.reshape(n, spec.n_head * spec.head_dim), w["attn_output"])


def ffn_block(be: Backend, w: dict[str, Any], h: np.ndarray, kind: GluKind) -> np.ndarray:
    """Gated feed-forward: down(act(gate(h)) * up(h))."""
    return be.matmul(be.glu(be.matmul(h, w["ffn_gate"]), be.matmul(h, w["ffn_up"]), kind), w["ffn_down"])


def rope_scale_from(gguf: GGUFFile, arch: str) -> float:
    """Linear RoPE scaling as llama.cpp reads it: freq_scale = 1 / factor."""
    kind = gguf.get(f"{arch}.rope.scaling.type", "none")
    factor = gguf.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0
    if kind not in ("none", "linear") :
        raise ModelError(f"RoPE scaling '{kind}' is not supported yet")
    return 1.0 / factor if kind == "linear" and factor > 0 else 1.0
