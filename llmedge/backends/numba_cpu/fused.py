"""The fused decoder stack of the Numba backend: every layer of a step in one ``@njit`` call.

:func:`decoder_layers` runs what :meth:`llmedge.models.base.Decoder.layer_forward` runs op by op
(RMS norms, Q/K/V projections, per-head Q/K norms, RoPE, the F16 KV-cache write, attention, output
projection, post-norms, residual scaling, gated FFN), calling the same kernels in the same order
without returning to Python between ops, so its rows equal the op-by-op path's bit for bit. A
:class:`StackPlan` (built once per model) holds the addresses of the layers' weights and norms and
their hyper-parameters as arrays. Features outside :data:`StackPlan.ENCODED`, quantized weight types without
a family kernel here (F32/F16/BF16 weights), non-F16 caches and steps over several sequences make
it decline, and the model runs op by op instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from llmedge.backends.base import unencoded_feature
from llmedge.backends.numba_cpu.common import (
    _Q8_0_FAMILY,
    _Q8_1_FAMILY,
    _Q8_K_FAMILY,
    F32,
    TIQ4_NL,
    TQ4_0,
    TQ4_1,
    TQ4_K,
    TQ5_0,
    TQ5_1,
    TQ8_0,
)
from llmedge.backends.numba_cpu.intrinsics import _f2h
from llmedge.backends.numba_cpu.matrix import _mm_q4_k, _mm_q8_0, _mm_q8_1, _mm_q8_k
from llmedge.backends.numba_cpu.ops import (
    _attention,
    _glu_par,
    _glu_ser,
    _rms_norm_par,
    _rms_norm_rows,
    _rope_par,
    _rope_ser,
)

TEAM_MAX_ROWS = 3  # steps of at most this many rows run as one team region (team.py)

_WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
_EMPTY = np.zeros(1, np.float32)


def _make_ptr(nbty: Any) -> Any:
    """An intrinsic turning an int64 address into a ``nbty`` pointer (for ``numba.carray``)."""

    @intrinsic
    def ptr(typingctx, addr):
        sig = types.CPointer(nbty)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(nbty)))

        return sig, codegen

    return ptr


# arrays reach the compiled stack as addresses: typed lists would JIT their own methods (seconds,
# not disk-cached) in every new process
_p_u8, _p_i8, _p_u16 = _make_ptr(types.uint8), _make_ptr(types.int8), _make_ptr(types.uint16)
_p_f32, _p_i32 = _make_ptr(types.float32), _make_ptr(types.int32)


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])
# ip columns: n_head, n_kv_head, head_dim, n_ff, glu (0 silu, 1 gelu), n_rot, neox, window, qk_norm, post_norms
# fp columns: eps, theta_scale, freq_scale, attn_factor, ext_factor, corr_lo, corr_hi, q_scale, scale, softcap,
#             residual_scale


@njit
def _matmul(x, wu, wi, t, out):
    if t == TQ4_0 or t == TQ5_0 or t == TQ8_0 or t == TIQ4_NL:
        _mm_q8_0(x, wu, wi, t, out)
    elif t == TQ4_1 or t == TQ5_1:
        _mm_q8_1(x, wu, t, out)
    elif t == TQ4_K:
        _mm_q4_k(x, wu, wi, out)
    else:
        _mm_q8_k(x, wu, wi, t, out)



@njit
def _norm(x, w, eps, out):
    """RMS norm of every row: a parallel region when there is enough work for one (prompts)."""
    if x.shape[0] * x.shape[1] >= 1 << 16:
        _rms_norm_par(x, w, True, eps, out)
    else:
        _rms_norm_rows(x, w, True, eps, out, 0, x.shape[0])


@njit
def _rope(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi):
    if x.shape[0] >= 8:
        _rope_par(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, x)
    else:
        _rope_ser(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, x)


@njit
def _glu(g, u, kind, tab, d):
    if g.shape[0] >= 1 << 16:
        _glu_par(g, u, kind, tab, g, d)
    else:
        _glu_ser(g, u, kind, tab, g, d)

@njit
def _post(h, x, nw, has_norm, eps, rs):
    """x += (post-norm of h, optionally) * residual scale, as layer_forward does."""
    n, d = h.shape
    if has_norm:
        _norm(h, nw, eps, h)
    if rs != F32(1.0):
        for r in range(n):
            for e in range(d):
                h[r, e] = h[r, e] * rs
    for r in range(n):
        for e in range(d):
            x[r, e] = x[r, e] + h[r, e]


@njit(cache=True)
def _decoder_layers(x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res, gtab):
    n, d = x.shape
    h = np.empty((n, d), np.float32)
    h2 = np.empty((n, d), np.float32)
    for il in range(ip.shape[0]):
        n_head, n_kv, hd, n_ff = ip[il, 0], ip[il, 1], ip[il, 2], ip[il, 3]
        nq, nk = n_head * hd, n_kv * hd
        eps = fp[il, 0]
        b = il * 7
        nb = il * 6
        wu = [carray(_p_u8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        wi = [carray(_p_i8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        norms = [carray(_p_f32(na[nb + j]), (nn[nb + j],)) for j in range(6)]
        # attention block
        _norm(x, norms[0], eps, h)
        q = np.empty((n, nq), np.float32)
        k = np.empty((n, nk), np.float32)
        v = np.empty((n, nk), np.float32)
        _matmul(h, wu[0], wi[0], wt[b], q)
        _matmul(h, wu[1], wi[1], wt[b + 1], k)
        _matmul(h, wu[2], wi[2], wt[b + 2], v)
        if ip[il, 8]:
            q2 = q.reshape(n * n_head, hd)
            k2 = k.reshape(n * n_kv, hd)
            _norm(q2, norms[1], eps, q2)
            _norm(k2, norms[2], eps, k2)
        q3 = q.reshape(n, n_head, hd)
        k3 = k.reshape(n, n_kv, hd)
        n_rot, neox = ip[il, 5], ip[il, 6] != 0
        _rope(q3, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
              fp[il, 6])
        qs = fp[il, 7]
        if qs != F32(1.0):
            for r in range(n):
                for e in range(nq):
                    q[r, e] = q[r, e] * qs
        _rope(k3, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
              fp[il, 6])
        start, first, used = res[il, 0], res[il, 1], res[il, 2]
        cap = kcap[il]
        kl = carray(_p_u16(ka[il]), (cap, n_kv, hd))
        vl = carray(_p_u16(va[il]), (cap, n_kv, hd))
        kp = carray(_p_i32(pa[il]), (cap,))
        for r in range(n):
            cell = start + r if r < first else r - first
            for hh in range(n_kv):
                for e in range(hd):
                    kl[cell, hh, e] = _f2h(k3[r, hh, e])
                    vl[cell, hh, e] = _f2h(v[r, hh * hd + e])
        o = np.empty((n, n_head, hd), np.float32)
        _attention(q3, kl[:used], vl[:used], True, pos, kp[:used], fp[il, 8], ip[il, 7], fp[il, 9], o)
        _matmul(o.reshape(n, nq), wu[3], wi[3], wt[b + 3], h2)
        _post(h2, x, norms[3], ip[il, 9] != 0, eps, fp[il, 10])
        # feed-forward block
        _norm(x, norms[4], eps, h)
        g = np.empty((n, n_ff), np.float32)
        u = np.empty((n, n_ff), np.float32)
        _matmul(h, wu[4], wi[4], wt[b + 4], g)
        _matmul(h, wu[5], wi[5], wt[b + 5], u)
        _glu(g.reshape(-1), u.reshape(-1), ip[il, 4], gtab, n_ff)
        _matmul(g, wu[6], wi[6], wt[b + 6], h2)
        _post(h2, x, norms[5], ip[il, 9] != 0, eps, fp[il, 10])


_QUANTIZED = frozenset(_Q8_0_FAMILY + _Q8_1_FAMILY + _Q8_K_FAMILY)


class StackPlan:
    """A model's layers as the address and parameter arrays :func:`_decoder_layers` reads (built once;
    keeps the arrays it points to alive)."""

    ENCODED = frozenset({"qk_norm", "post_norms", "sliding_window", "attn_softcap", "q_scale", "rope_freqs",
                         "rope_longrope", "rope_attn_factor", "rope_linear", "rope_yarn", "residual_scale"})

    def __init__(self, model: Any) -> None:
        layers, specs = model.layers, model.specs
        self.n_layer = len(layers)
        self.keep: list[np.ndarray] = []
        wa, wshape, wt, na, nn = [], [], [], [], []
        ip = np.zeros((self.n_layer, 10), np.int64)
        fp = np.zeros((self.n_layer, 11), np.float32)
        for il, (w, spec) in enumerate(zip(layers, specs)):
            for name in _WEIGHTS:
                u8 = w[name].u8
                self.keep.append(u8)
                wa.append(_addr(u8))
                wshape.append(u8.shape)
                wt.append(w[name].ggml_type)
            for name in _NORMS:
                a = w.get(name)
                a = _EMPTY if a is None else np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
                self.keep.append(a)
                na.append(_addr(a))
                nn.append(a.size)
            ip[il] = (spec.n_head, spec.n_kv_head, spec.head_dim, spec.n_ff, 0 if spec.glu == "silu" else 1,
                      spec.n_rot, int(spec.neox), int(spec.window or 0), int(spec.qk_norm), int(spec.post_norms))
            theta_scale = F32(F32(spec.rope_base) ** (F32(-2.0) / F32(spec.n_rot)))
            lo, hi = spec.rope_corr_dims if spec.rope_ext_factor != 0.0 else (0.0, 0.0)
            fp[il] = (spec.eps, theta_scale, spec.rope_scale, spec.rope_attn_factor, spec.rope_ext_factor, lo, hi,
                      spec.q_scale, spec.scale, float(spec.softcap or 0.0), spec.residual_scale)
        self.wt = np.array(wt, np.int64)
        self.wa, self.wshape = np.array(wa, np.int64), np.array(wshape, np.int64).reshape(-1, 2)
        self.na, self.nn = np.array(na, np.int64), np.array(nn, np.int64)
        self.ip, self.fp = ip, fp

    @classmethod
    def decline_reason(cls, model: Any) -> str | None:
        """None when the fused stack encodes every feature and weight of ``model``; else why not."""
        from llmedge.backends.numba_cpu.backend import NumbaWeight

        reason = unencoded_feature(model, cls.ENCODED, "the fused numba stack")
        if reason is not None:
            return reason
        for il, spec in enumerate(model.specs):
            if spec.n_rot % 2 or spec.n_rot > spec.head_dim:
                return f"layer {il} rotates {spec.n_rot} of {spec.head_dim} values"
        for il, w in enumerate(model.layers):
            for name in _WEIGHTS:
                nw = w.get(name)
                if not isinstance(nw, NumbaWeight) or nw.ggml_type not in _QUANTIZED:
                    return f"layer {il} {name} is not a quantized weight the fused numba stack multiplies"
        return None


def decoder_layers(be: Any, model: Any, x: np.ndarray, step: Any) -> bool:
    """Run every layer of ``model`` over the rows ``x`` of ``step`` in place in one compiled call;
    False (nothing done) when the op-by-op path must run instead."""
    plan = getattr(model, "_numba_stack", None)
    if plan is None:
        plan = model._numba_stack = StackPlan(model) if StackPlan.decline_reason(model) is None else False
    if plan is False or x.dtype != np.float32 or not x.flags.c_contiguous or len(step.batches) != 1:
        return False
    batch = step.batches[0]
    cache = batch.cache
    if cache.kv_type != "f16" or len(cache.layers) != plan.n_layer:
        return False
    from llmedge.models.base import cache_rope

    kv = _kv_lists(cache)
    positions = np.asarray(batch.positions)
    res = np.empty((plan.n_layer, 3), np.int64)
    for il, layer in enumerate(cache.layers):
        if layer.rope is None:
            layer.rope = cache_rope(model.specs[il], model.rope_ff)
        res[il] = layer.reserve(positions)
    ff = model.rope_ff
    ffa = _EMPTY if ff is None else np.ascontiguousarray(ff, dtype=np.float32).reshape(-1)
    pos = np.ascontiguousarray(step.positions, dtype=np.int32).reshape(-1)
    from llmedge.backends.numba_cpu.backend import _gelu_table

    be._set_threads()
    n = x.shape[0]
    if n <= TEAM_MAX_ROWS and not _team_failed and _run_team(be.n_threads, plan, x, pos, ffa, ff is not None, kv, res):
        return True
    # (a failed team wrote nothing of x; the cache cells reserved above are written again, the same)
    _decoder_layers(x, pos, plan.ip, plan.fp, plan.wa, plan.wshape, plan.wt, plan.na, plan.nn, ffa, ff is not None,
                    kv[1], kv[2], kv[3], kv[4], res, _gelu_table())
    return True


_team_failed = False


def _run_team(nth: int, plan: StackPlan, x: np.ndarray, pos: np.ndarray, ffa: np.ndarray, has_ff: bool,
              kv: Any, res: np.ndarray) -> bool:
    """The step's layers as one team region (team.py); False, and no team again in this process, when
    a member was stuck (the caller then runs the step with a region per op, on the same reservations)."""
    global _team_failed
    from llmedge.backends.numba_cpu.backend import _gelu_table
    from llmedge.backends.numba_cpu.team import SPIN_LIMIT, _team_layers, sync_size

    n, d = x.shape
    ip = plan.ip
    nq, nk, nff = int((ip[:, 0] * ip[:, 2]).max()), int((ip[:, 1] * ip[:, 2]).max()), int(ip[:, 3].max())
    kmax = max(d, nq, nff)
    sync = np.zeros(sync_size(plan.n_layer), np.int64)
    f = np.empty
    _team_layers(nth, sync, SPIN_LIMIT, x, pos, ip, plan.fp, plan.wa, plan.wshape, plan.wt, plan.na, plan.nn, ffa, has_ff,
                 kv[1], kv[2], kv[3], kv[4], res, _gelu_table(), f(n * nq, np.float32), f(n * nk, np.float32),
                 f(n * nk, np.float32), f(n * nq, np.float32), f((n, d), np.float32), f(n * nff, np.float32),
                 f(n * nff, np.float32), f((n, d), np.float32), f((n, d), np.float32), f(n * nq, np.float32),
                 f(n * nff, np.float32), f((3, n * kmax), np.int8), f((3, n * max(kmax // 32, 1)), np.float32),
                 f((3, n * max(kmax // 16, 1)), np.int32), f((3, n * max(kmax // 32, 1)), np.float32))
    if sync[1]:
        import warnings

        _team_failed = True
        warnings.warn("numba: a decode team's task never finished; decoding with a region per op",
                      RuntimeWarning, stacklevel=2)
        return False
    return True


def _kv_lists(cache: Any) -> tuple[Any, ...]:
    """Addresses of a sequence cache's K cells, V cells and cell positions per layer, and the layers'
    cell counts, cached on the cache while its arrays stay the same objects."""
    arrays = tuple((layer.k.arrays[0], layer.v.arrays[0], layer.pos) for layer in cache.layers)
    cached = getattr(cache, "_numba_kv", None)
    if cached is not None and len(cached[0]) == len(arrays) and all(
            a[0] is b[0] and a[1] is b[1] and a[2] is b[2] for a, b in zip(cached[0], arrays)):
        return cached
    for k, v, p in arrays:
        if not (k.flags.c_contiguous and v.flags.c_contiguous and p.flags.c_contiguous and p.dtype == np.int32
                and k.shape == v.shape and len(p) == k.shape[0]):
            raise ValueError("fused numba stack: unexpected KV cache layout")
    cached = (arrays, np.array([_addr(a[0]) for a in arrays], np.int64),
              np.array([_addr(a[1]) for a in arrays], np.int64), np.array([_addr(a[2]) for a in arrays], np.int64),
              np.array([a[0].shape[0] for a in arrays], np.int64))
    cache._numba_kv = cached
    return cached
