"""What every decoder-only architecture shares: the batch (one sequence) and the step (the rows of
one or more sequences evaluated in one forward: continuous batching), weight lookup by GGUF name,
the cache layout, the attention and feed-forward blocks and the decoder forward itself.

Architectures describe themselves (weights per layer, an :class:`AttentionSpec` per layer, the GLU
kind, an embedding scale, post-norms) and inherit :meth:`Decoder.forward`. A backend that offers
``decoder_layers`` (the native one) runs every layer of a step in one call; any other backend runs
the blocks op by op."""

from __future__ import annotations

from collections.abc import Sequence
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


class Step:
    """The rows of one or more sequences' batches, evaluated together in one forward.

    Matrix products run over all rows at once (each weight is read once for every sequence); the
    attention of each sequence's rows reads only that sequence's cache. ``bounds[i]`` is the row
    range of ``batches[i]``.
    """

    def __init__(self, batches: Sequence[Batch]) -> None:
        if not batches:
            raise ValueError("a step needs at least one batch")
        self.batches = list(batches)
        if len(self.batches) == 1:
            b = self.batches[0]
            self.tokens, self.positions = np.asarray(b.tokens), np.asarray(b.positions)
        else:
            self.tokens = np.concatenate([np.asarray(b.tokens) for b in self.batches])
            self.positions = np.concatenate([np.asarray(b.positions) for b in self.batches])
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for b in self.batches:
            if len(b.tokens) != len(b.positions) or len(b.tokens) == 0:
                raise ValueError("each batch needs as many positions as tokens, and at least one")
            self.bounds.append((start, start + len(b.tokens)))
            start += len(b.tokens)

    @classmethod
    def of(cls, batch: Batch | Step) -> Step:
        return batch if isinstance(batch, Step) else cls([batch])

    @property
    def n_rows(self) -> int:
        return self.bounds[-1][1]

    def output_rows(self) -> np.ndarray | None:
        """Rows (of the whole step) whose logits are returned; None: all of them."""
        if len(self.batches) == 1:
            return self.batches[0].output_rows
        rows = []
        for (s, e), b in zip(self.bounds, self.batches):
            rows.append(np.arange(s, e) if b.output_rows is None else np.asarray(b.output_rows) + s)
        return np.concatenate(rows)

    def split(self, out: np.ndarray) -> list[np.ndarray]:
        """Per batch, its part of the output rows ``out`` (as :meth:`output_rows` ordered them)."""
        parts, start = [], 0
        for (s, e), b in zip(self.bounds, self.batches):
            n = e - s if b.output_rows is None else len(b.output_rows)
            parts.append(out[start : start + n])
            start += n
        return parts


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


def attention_block(be: Backend, w: dict[str, Any], h: np.ndarray, step: Batch | Step, il: int,
                    spec: AttentionSpec) -> np.ndarray:
    """Q/K/V projections, optional per-head Q/K norms, RoPE, cached attention (each sequence over its
    own layer ``il`` cache), output projection."""
    step = Step.of(step)
    n = h.shape[0]
    q = be.matmul(h, w["attn_q"]).reshape(n, spec.n_head, spec.head_dim)
    k = be.matmul(h, w["attn_k"]).reshape(n, spec.n_kv_head, spec.head_dim)
    v = be.matmul(h, w["attn_v"]).reshape(n, spec.n_kv_head, spec.head_dim)
    if "attn_q_norm" in w:
        q = be.rms_norm(q, w["attn_q_norm"], spec.eps)
        k = be.rms_norm(k, w["attn_k_norm"], spec.eps)
    pos = step.positions
    q = be.rope(q, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    if spec.q_scale != 1.0:
        q = q * np.float32(spec.q_scale)
    k = be.rope(k, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    parts = []
    for (s, e), b in zip(step.bounds, step.batches):
        layer = b.cache.layers[il]
        if layer.rope is None:  # what a context shift needs to re-rotate this layer's keys
            layer.rope = (spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
        k_all, v_all, k_pos = layer.update_and_fetch(k[s:e], v[s:e], pos[s:e])
        parts.append(be.attention(q[s:e], k_all, v_all, pos[s:e], k_pos, spec.scale, spec.window, spec.softcap))
    o = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return be.matmul(o.reshape(n, spec.n_head * spec.head_dim), w["attn_output"])


def ffn_block(be: Backend, w: dict[str, Any], h: np.ndarray, kind: GluKind) -> np.ndarray:
    """Gated feed-forward: down(act(gate(h)) * up(h))."""
    return be.matmul(be.glu(be.matmul(h, w["ffn_gate"]), be.matmul(h, w["ffn_up"]), kind), w["ffn_down"])


class Decoder:
    """A decoder-only transformer described by its parts; subclasses set them in ``__init__``:
    ``params`` (n_vocab, n_embd, n_layer, eps, ...), ``backend``, ``token_embd``, ``layers`` (per
    layer a dict of weights by GGUF short name; ``post_attention_norm``/``post_ffw_norm`` when the
    architecture normalizes block outputs), ``specs`` (per layer an :class:`AttentionSpec`),
    ``glu_kind``, ``embd_scale`` (None: none), ``output_norm`` and ``output``."""

    params: Any
    backend: Backend
    token_embd: Any
    layers: list[dict[str, Any]]
    specs: list[AttentionSpec]
    glu_kind: GluKind
    embd_scale: np.float32 | None = None
    output_norm: Any
    output: Any

    def forward(self, batch: Batch | Step, hidden: bool = False) -> np.ndarray:
        """Logits of the step's output rows (float32 [rows, n_vocab]); with ``hidden``, the final
        normalized hidden states instead ([rows, n_embd], what embeddings pool)."""
        be, eps = self.backend, self.params.eps
        step = Step.of(batch)
        x = be.get_rows(self.token_embd, step.tokens)
        if self.embd_scale is not None:
            x = x * self.embd_scale
        fused = getattr(be, "decoder_layers", None)
        if fused is None or not fused(self, x, step):
            for il in range(len(self.layers)):
                x = self.layer_forward(x, step, il)
        rows = step.output_rows()
        if rows is not None:
            x = x[rows]
        x = be.rms_norm(x, self.output_norm, eps)
        return x if hidden else be.matmul(x, self.output)

    def layer_forward(self, x: np.ndarray, step: Step, il: int) -> np.ndarray:
        """One layer, op by op: attention block and gated FFN, each with its residual."""
        be, eps, w = self.backend, self.params.eps, self.layers[il]
        h = attention_block(be, w, be.rms_norm(x, w["attn_norm"], eps), step, il, self.specs[il])
        if "post_attention_norm" in w:
            h = be.rms_norm(h, w["post_attention_norm"], eps)
        x = x + h
        h = ffn_block(be, w, be.rms_norm(x, w["ffn_norm"], eps), self.glu_kind)
        if "post_ffw_norm" in w:
            h = be.rms_norm(h, w["post_ffw_norm"], eps)
        return x + h

    def forward_many(self, batches: Sequence[Batch]) -> list[np.ndarray]:
        """One forward over several sequences' batches; per batch, the logits of its output rows."""
        step = Step(batches)
        return step.split(self.forward(step))


def rope_scale_from(gguf: GGUFFile, arch: str) -> float:
    """Linear RoPE scaling as llama.cpp reads it: freq_scale = 1 / factor."""
    kind = gguf.get(f"{arch}.rope.scaling.type", "none")
    factor = gguf.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0
    if kind not in ("none", "linear") :
        raise ModelError(f"RoPE scaling '{kind}' is not supported yet")
    return 1.0 / factor if kind == "linear" and factor > 0 else 1.0
