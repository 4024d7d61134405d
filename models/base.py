"""What every decoder-only architecture shares: the batch (one sequence) and the step (the rows of
one or more sequences evaluated in one forward: continuous batching), weight lookup by GGUF name,
the cache layout, the attention and feed-forward blocks and the decoder forward itself.

Architectures declare themselves (a :class:`llmedge.models.spec.Family`: the features their
layers use) and :class:`Decoder` builds the rest from that declaration. A backend that offers
``decoder_layers`` (the native one) runs every layer of a step in one call; any other backend runs
the blocks op by op."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmedge.backends.base import Backend
from llmedge.errors import ModelError
from llmedge.gguf import GGUFFile
from llmedge.kvcache import (
    KV_TYPES,
    Arena,
    LayerCache,
    Scratch,
    SequenceCache,
    plan_sequence_cache,
    ring_capacity,
)
from llmedge.models.spec import Family, HParams, LayerSpec, TensorDecl, layer_specs, layer_tensors


@dataclass
class Batch:
    """Token rows of one sequence to evaluate: ids, their positions and the cache they extend.

    ``output_rows`` selects the rows whose logits are returned (``None``: all rows). ``row_exact``
    asks for every row's numbers exactly as if it were evaluated alone (decoded one token at a time):
    speculative verification needs that, because the kernels for several rows sum in other orders.
    A backend without a row-exact multi-row path (:func:`row_exact_rows`) evaluates the rows one by one.
    """

    tokens: np.ndarray
    positions: np.ndarray
    cache: SequenceCache
    output_rows: np.ndarray | None = None
    row_exact: bool = False


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

    @property
    def row_exact(self) -> bool:
        """True when any batch asks for row-exact numbers (then every row of the step is)."""
        return any(b.row_exact for b in self.batches)

    @classmethod
    def of(cls, batch: Batch | Step) -> Step:
        return batch if isinstance(batch, Step) else cls([batch])

    @property
    def n_rows(self) -> int:
        return self.bounds[-1][1]

    def output_rows(self) -> np.ndarray | None:
        """Rows (of the whole step) whose logits are returned; None: all of them."""
        if self.n_rows == len(self.batches) and all(
                b.output_rows is None or (len(b.output_rows) == 1 and int(b.output_rows[0]) in (0, -1))
                for b in self.batches):
            return None  # decode rows: one row per batch, each its batch's output row (no gather, no copy)
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

    def layer(self, i: int, decls: Sequence[TensorDecl]) -> dict[str, Any]:
        """Layer ``i``'s tensors as declared (keyed by :attr:`TensorDecl.key`); optional ones when present."""
        return {d.key: self.get(f"blk.{i}.{d.name}") for d in decls if d.required or self.has(f"blk.{i}.{d.name}")}

    def check_declared(self, decls: Sequence[TensorDecl], arch: str, extra: Sequence[str] = ()) -> None:
        """Refuse a file with a layer tensor the family does not declare: it would be silently ignored."""
        known = {d.name for d in decls}
        for name in self.gguf.tensors:
            if name.startswith("blk."):
                short = name.split(".", 2)[2]
                if short not in known:
                    raise ModelError(f"{arch}: tensor '{name}' is not supported by llmedge's {arch} architecture")
            elif name not in ("token_embd.weight", "output_norm.weight", "output.weight", *extra):
                raise ModelError(f"{arch}: tensor '{name}' is not supported by llmedge's {arch} architecture")

    def output(self) -> Any:
        """``output.weight``, falling back to ``token_embd.weight`` when the embeddings are tied."""
        return self.get("output.weight" if self.has("output.weight") else "token_embd.weight")


def make_sequence_cache(n_layer: int, n_ctx: int, n_kv_head: int, head_dim: int, kv_type: str,
                        windows: list[int | None], max_batch: int) -> SequenceCache:
    """Full caches of ``n_ctx`` cells, sliding-window layers a ring of :func:`ring_capacity` cells
    (about window + max_batch; a plain buffer when that is not smaller than ``n_ctx``); all of them
    in one arena."""
    if kv_type not in KV_TYPES:
        raise ModelError(f"unsupported KV cache type '{kv_type}' (supported: {', '.join(KV_TYPES)})")
    geometry = []
    for il in range(n_layer):
        w = windows[il]
        ring = w is not None and ring_capacity(w, max_batch) < n_ctx
        geometry.append((ring_capacity(w, max_batch) if ring else n_ctx, w, ring))
    arena = Arena(plan_sequence_cache([(cap, n_kv_head, head_dim, head_dim, kv_type) for cap, _, _ in geometry]))
    scratch = Scratch() if kv_type == "q8_0" else None
    layers = [LayerCache(cap, n_kv_head, head_dim, head_dim, kv_type, window=w, ring=ring, alloc=arena.alloc,
                         scratch=scratch) for cap, w, ring in geometry]
    return SequenceCache(layers, arena=arena, scratch=scratch)


def _rope(be: Backend, x: np.ndarray, pos: np.ndarray, spec: LayerSpec, ff: np.ndarray | None) -> np.ndarray:
    if spec.rope_ext_factor != 0.0:  # YaRN: ggml_rope_ext's ramp between extrapolated and interpolated angles
        return be.rope(x, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox, freq_factors=ff,
                       attn_factor=spec.rope_attn_factor, ext_factor=spec.rope_ext_factor,
                       corr_dims=spec.rope_corr_dims)
    if ff is None and spec.rope_attn_factor == 1.0:  # the plain call every backend offers
        return be.rope(x, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
    return be.rope(x, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox, freq_factors=ff,
                   attn_factor=spec.rope_attn_factor)


def qkv_projections(be: Backend, w: dict[str, Any], h: np.ndarray,
                    spec: LayerSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K and V rows ([n, heads, head_dim]) from separate or fused (``attn_qkv``) weights, plus biases."""
    n, nq, nk = h.shape[0], spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim
    if spec.fused_qkv:
        qkv = be.matmul(h, w["attn_qkv"])
        q, k, v = qkv[:, :nq], qkv[:, nq : nq + nk], qkv[:, nq + nk :]
    else:
        q, k, v = be.matmul(h, w["attn_q"]), be.matmul(h, w["attn_k"]), be.matmul(h, w["attn_v"])
    if spec.qkv_bias:
        q, k, v = q + w["attn_q.bias"], k + w["attn_k.bias"], v + w["attn_v.bias"]
    return (np.ascontiguousarray(q).reshape(n, spec.n_head, spec.head_dim),
            np.ascontiguousarray(k).reshape(n, spec.n_kv_head, spec.head_dim),
            np.ascontiguousarray(v).reshape(n, spec.n_kv_head, spec.head_dim))


def attention_block(be: Backend, w: dict[str, Any], h: np.ndarray, step: Batch | Step, il: int,
                    spec: LayerSpec, rope_ff: np.ndarray | None = None) -> np.ndarray:
    """Q/K/V projections (and biases), optional per-head Q/K norms, RoPE, cached attention (each
    sequence over its own layer ``il`` cache), output projection (and bias)."""
    step = Step.of(step)
    n = h.shape[0]
    q, k, v = qkv_projections(be, w, h, spec)
    if spec.qk_norm:
        q = be.rms_norm(q, w["attn_q_norm"], spec.eps)
        k = be.rms_norm(k, w["attn_k_norm"], spec.eps)
    pos = step.positions
    q = _rope(be, q, pos, spec, rope_ff)
    if spec.q_scale != 1.0:
        q = q * np.float32(spec.q_scale)
    k = _rope(be, k, pos, spec, rope_ff)
    parts = []
    for (s, e), b in zip(step.bounds, step.batches):
        layer = b.cache.layers[il]
        if layer.rope is None:  # what a context shift needs to re-rotate this layer's keys
            layer.rope = cache_rope(spec, rope_ff)
        k_all, v_all, k_pos = layer.update_and_fetch(k[s:e], v[s:e], pos[s:e])
        parts.append(be.attention(q[s:e], k_all, v_all, pos[s:e], k_pos, spec.scale, spec.window, spec.softcap))
    o = parts[0] if len(parts) == 1 else np.concatenate(parts)
    out = be.matmul(o.reshape(n, spec.n_head * spec.head_dim), w["attn_output"])
    return out + w["attn_output.bias"] if spec.o_bias else out


def cache_rope(spec: LayerSpec, rope_ff: np.ndarray | None) -> tuple[Any, ...]:
    """The layer cache's RoPE record, what a context shift rotates keys with: (n_rot, base, scale,
    neox[, freq_factors or None[, (ext_factor, corr_lo, corr_hi)]]) (the last for YaRN layers)."""
    if spec.yarn is not None:
        return (*spec.rope, rope_ff, spec.yarn)
    return spec.rope if rope_ff is None else (*spec.rope, rope_ff)


def ffn_block(be: Backend, w: dict[str, Any], h: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """Gated feed-forward: down(act(gate(h)) * up(h)); with a fused ``ffn_up``, gate rows come first."""
    if spec.fused_gate_up:
        gu = be.matmul(h, w["ffn_up"])
        gate, up = np.ascontiguousarray(gu[:, : spec.n_ff]), np.ascontiguousarray(gu[:, spec.n_ff :])
    else:
        gate, up = be.matmul(h, w["ffn_gate"]), be.matmul(h, w["ffn_up"])
    return be.matmul(be.glu(gate, up, spec.glu), w["ffn_down"])


def softcap_logits(x: np.ndarray, cap: float) -> np.ndarray:
    """ggml's final soft-capping: scale by 1/cap, tanh, scale by cap (float32 throughout)."""
    return (np.tanh(x * (np.float32(1.0) / np.float32(cap))) * np.float32(cap)).astype(np.float32)


class Decoder:
    """A decoder-only transformer built from its :class:`Family` declaration (the class attribute
    ``family`` of each ``models/<arch>.py``): hyper-parameters from the shared reader, the declared
    tensors per layer, one :class:`LayerSpec` per layer. ``layers`` holds per layer a dict of
    weights keyed by :attr:`TensorDecl.key`; ``specs`` the specs every backend reads."""

    family: Family

    def __init__(self, gguf: GGUFFile, backend: Backend) -> None:
        f = self.family
        self.params = hp = HParams.read(gguf, f)
        self.backend = backend
        wt = Weights(gguf, backend)
        decls = layer_tensors(f)
        globals_ = (("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
                    if f.rope_factors != "none" else ())
        wt.check_declared(decls, hp.arch, globals_)
        self.specs = layer_specs(f, hp, wt.has)
        self.layers = [wt.layer(il, decls) for il in range(hp.n_layer)]
        self.token_embd = wt.get("token_embd.weight")
        self.output_norm = wt.get("output_norm.weight")
        self.output = wt.output()
        self.tied_output = not wt.has("output.weight")
        self.glu_kind = f.glu
        embd_scale = math.sqrt(hp.n_embd) if f.embd_scale else hp.embedding_scale
        self.embd_scale = np.float32(embd_scale) if embd_scale else None
        self.final_softcap = hp.final_softcap
        self.logit_scale = hp.logit_scale or None
        self.rope_tables = {n.split(".")[0]: _f32(wt.get(n)) for n in globals_ if wt.has(n)}
        self.rope_ff = self._pick_rope_factors(hp.n_ctx_train)

    def _pick_rope_factors(self, n_ctx: int) -> np.ndarray | None:
        """llama.cpp's get_rope_factors: rope_freqs, else LongRoPE's long factors beyond the original
        context (``n_ctx > n_ctx_orig``), else its short ones."""
        t = self.rope_tables
        if "rope_freqs" in t:
            return t["rope_freqs"]
        if "rope_factors_long" in t:
            return t["rope_factors_long" if n_ctx > self.params.n_ctx_orig else "rope_factors_short"]
        return None

    def forward(self, batch: Batch | Step, hidden: bool = False) -> np.ndarray:
        """Logits of the step's output rows (float32 [rows, n_vocab]); with ``hidden``, the final
        normalized hidden states instead ([rows, n_embd], what embeddings pool)."""
        be, eps = self.backend, self.params.eps
        step = Step.of(batch)
        x = be.get_rows(self.token_embd, step.tokens)
        if self.embd_scale is not None:
            x = x * self.embd_scale
        for b in step.batches:  # rings move their cells before any backend claims new ones
            b.cache.make_room(len(b.tokens), int(b.positions[0]))
        fused = getattr(be, "decoder_layers", None)
        if fused is None or not fused(self, x, step):
            for il in range(len(self.layers)):
                x = self.layer_forward(x, step, il)
        rows = step.output_rows()
        if rows is not None:
            x = x[rows]
        x = be.rms_norm(x, self.output_norm, eps)
        if hidden:
            return x
        rows_mm = getattr(be, "matmul_rows", None) if step.row_exact else None
        logits = be.matmul(x, self.output) if rows_mm is None else rows_mm(x, self.output)
        if self.logit_scale is not None:  # Granite: ggml_scale by 1 / logit_scale
            logits = logits * (np.float32(1.0) / np.float32(self.logit_scale))
        return logits if self.final_softcap is None else softcap_logits(logits, self.final_softcap)

    def layer_forward(self, x: np.ndarray, step: Step, il: int) -> np.ndarray:
        """One layer, op by op: attention block and gated FFN, each with its residual."""
        be, w, spec = self.backend, self.layers[il], self.specs[il]
        h = attention_block(be, w, be.rms_norm(x, w["attn_norm"], spec.eps), step, il, spec, self.rope_ff)
        if spec.post_norms:
            h = be.rms_norm(h, w["post_attention_norm"], spec.eps)
        if spec.residual_scale != 1.0:
            h = h * np.float32(spec.residual_scale)
        x = x + h
        h = ffn_block(be, w, be.rms_norm(x, w["ffn_norm"], spec.eps), spec)
        if spec.post_norms:
            h = be.rms_norm(h, w["post_ffw_norm"], spec.eps)
        if spec.residual_scale != 1.0:
            h = h * np.float32(spec.residual_scale)
        return x + h

    def forward_many(self, batches: Sequence[Batch]) -> list[np.ndarray]:
        """One forward over several sequences' batches; per batch, the logits of its output rows."""
        step = Step(batches)
        return step.split(self.forward(step))

    @property
    def row_exact_batches(self) -> bool:
        """True when a multi-row ``row_exact`` step runs in one forward with every row's numbers as
        alone (the native fused stack); else :func:`forward_rows` runs such rows one by one."""
        known = self.__dict__.get("_row_exact")
        if known is None:
            be = self.backend
            known = self._row_exact = (getattr(be, "matmul_rows", None) is not None
                                       and getattr(be, "decoder_layers", None) is not None
                                       and getattr(be, "stack_supported", lambda m: False)(self))
        return known

    def make_cache(self, n_ctx: int, kv_type: str = "f16", max_batch: int = 512) -> SequenceCache:
        """Full caches, rings for sliding-window layers, each with its RoPE record; also picks LongRoPE's
        factors for ``n_ctx``."""
        ff = self._pick_rope_factors(n_ctx)
        if ff is not self.rope_ff:
            self.rope_ff = ff
            self._native_stack = None  # the fused stack's plan points at the factors
        p = self.params
        cache = make_sequence_cache(p.n_layer, n_ctx, p.n_kv_head, p.head_dim, kv_type,
                                    [s.window for s in self.specs], max_batch)
        for layer, spec in zip(cache.layers, self.specs):  # the full record (factors, YaRN) a shift needs
            layer.rope = cache_rope(spec, self.rope_ff)
        return cache

    def describe(self) -> str:
        """One line: the family and the features its layers use."""
        used = sorted({f for s in self.specs for f in s.used_features()})
        extra = [n for n, on in (("embd_scale", self.embd_scale is not None),
                                 ("final_softcap", self.final_softcap is not None),
                                 ("logit_scale", self.logit_scale is not None),
                                 ("tied_output", self.tied_output)) if on]
        return f"{self.family.name} ({', '.join(used + extra) or 'plain'})"


def _f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32).reshape(-1))
