"""The Numba backend's decode step as one parallel region: a team of threads runs every layer of a
step, meeting at spin barriers between ops, instead of opening a ``prange`` region per product.

A ``prange`` region costs a thread hand-off each time it opens (several microseconds with OpenMP,
more with the work queue), and a decode step of SmolLM2 opens about 240 of them for under 10 ms of
work. Here :func:`_team_layers` opens one region of ``nth`` iterations (numba's static schedule gives
each to its own pool thread) and each member runs :func:`_member` over all layers: the rows of every
weight matrix are split between the members (aligned to 8 rows), the residual stream and the
per-row float ops are repeated in each member (a few thousand floats), the KV heads' writes and the
attention heads are split, and a barrier (an atomic counter, :func:`_barrier`) separates an op's
writes from the next op's reads. Every value is computed by the same kernels in the same order as
:func:`llmedge.backends.numba_cpu.fused._decoder_layers` with fewer than four rows, so the rows are
equal bit for bit to the op-by-op path's.

A barrier that waits far longer than any step (a member that never started) sets a failure flag:
every member returns, nothing of ``x`` is written, and the caller runs the step op by op.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from llmedge.backends.numba_cpu.common import (
    F32,
    TIQ4_NL,
    TQ4_0,
    TQ4_1,
    TQ4_K,
    TQ5_0,
    TQ5_1,
    TQ5_K,
    TQ6_K,
    TQ8_0,
)
from llmedge.backends.numba_cpu.dots import (
    _quant_q8_block,
    _quant_q8_k_block,
    _row_k_fast,
    _row_q4_k_r8,
    _row_q8_0_family,
    _row_q8_1_family,
    _row_q8_k_family,
)
from llmedge.backends.numba_cpu.fused import _p_f32, _p_i8, _p_i32, _p_u8, _p_u16
from llmedge.backends.numba_cpu.intrinsics import (
    FAST_ROWS,
    _f2h,
    _gemv_q8_0,
    _rowdotw4_q4_0,
    _rowdotw4_q4_1,
    _rowdotw4_q5_0,
    _rowdotw4_q5_1,
)
from llmedge.backends.numba_cpu.ops import _attn_row, _glu_range, _rms_norm_rows, _rope_rows

#: spins after which a barrier gives up (a member that never came): seconds, far beyond any real wait
SPIN_LIMIT = 1 << 28

# ---------------------------------------------------------------------------------------------
# atomics on an int64 array element


def _elem_ptr(context, builder, aty, aval, idx):
    arr = context.make_array(aty)(context, builder, aval)
    return cgutils.get_item_pointer(context, builder, aty, arr, [idx], wraparound=False)


@intrinsic
def _atomic_add(typingctx, a, i, v):
    """a[i] += v atomically (sequentially consistent); returns the old value."""
    sig = types.int64(a, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ptr = _elem_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def _atomic_load(typingctx, a, i):
    """a[i], read with acquire ordering (never hoisted out of a spin loop)."""
    sig = types.int64(a, types.intp)

    def codegen(context, builder, signature, args):
        ptr = _elem_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


_MACHINE = platform.machine().lower()


@intrinsic
def _cpu_relax(typingctx):
    """The CPU's spin-wait hint (x86 ``pause``, ARM ``yield``; nothing elsewhere), as LLVM intrinsics:
    numba's JIT has no assembler for inline asm."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _MACHINE in ("x86_64", "amd64"):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        elif _MACHINE in ("aarch64", "arm64"):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(32)]),
                                                "llvm.aarch64.hint")
            builder.call(fn, [ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit
def _barrier(sync, target, limit):
    """Arrive at the barrier whose all-arrived count is ``target``; False when the team failed (a
    member waited ``limit`` spins, or saw another give up)."""
    _atomic_add(sync, 0, 1)
    spins = 0
    while _atomic_load(sync, 0) < target:
        if _atomic_load(sync, 1) != 0:
            return False
        _cpu_relax()
        spins += 1
        if spins > limit:
            _atomic_add(sync, 1, 1)
            return False
    return True


# ---------------------------------------------------------------------------------------------
# activation quantization and row ranges of products (the < 4-row branches of matrix._mm_*)


@njit
def _family(t):
    if t == TQ4_0 or t == TQ5_0 or t == TQ8_0 or t == TIQ4_NL:
        return 0
    if t == TQ4_1 or t == TQ5_1:
        return 1
    return 2


@njit
def _quantize(fam, x, aq, ad, ai, af):
    """x [n, k] as the activation blocks family ``fam`` multiplies (q8_0 / q8_1 / q8_K)."""
    n, k = x.shape
    for i in range(n):
        if fam == 2:
            for b in range(k // 256):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, ai, b * 16)
        else:
            for b in range(k // 32):
                d, s16, s = _quant_q8_block(x, i, b * 32, aq, fam == 1)
                ad[i, b] = d
                ai[i, b] = s
                af[i, b] = s16


@njit
def _rows(t, wu, wi, n, aq, ad, ai, af, out, j0, j1, scb):
    """out[:n, j] = x . W[j] for j in [j0, j1), with the kernel matrix._mm_* picks for n < 4 rows."""
    m = wu.shape[0]
    fam = _family(t)
    if fam == 2:
        nsb = aq.shape[1] // 256
        r8 = t == TQ4_K and m % 8 == 0
        fast = FAST_ROWS and (t == TQ4_K or t == TQ5_K or t == TQ6_K)
        for j in range(j0, j1):
            for i in range(n):
                if r8:
                    out[i, j] = _row_q4_k_r8(wu[j], aq[i], ad[i], ai[i], nsb, scb)
                elif fast:
                    out[i, j] = _row_k_fast(t, wu[j], wi[j], aq[i], ad[i], ai[i], nsb, scb)
                else:
                    out[i, j] = _row_q8_k_family(t, wu[j], wi[j], aq[i], ad[i], ai[i], nsb)
        return
    nb = aq.shape[1] // 32
    if FAST_ROWS and t == TQ8_0:
        for i in range(n):
            _gemv_q8_0(wu, j0, j1, aq[i], ad[i], ad[i], out[i])
        return
    m4 = 4 * (m // 4) if FAST_ROWS and t != TIQ4_NL and t != TQ8_0 and m >= 4 else 0
    j = j0
    while j < j1:
        if j + 4 <= m4:
            for i in range(n):
                if t == TQ4_0:
                    r0, r1, r2, r3 = _rowdotw4_q4_0(wu, j, aq[i], ad[i], ad[i], nb)
                elif t == TQ5_0:
                    r0, r1, r2, r3 = _rowdotw4_q5_0(wu, j, aq[i], ad[i], ad[i], nb)
                elif t == TQ4_1:
                    r0, r1, r2, r3 = _rowdotw4_q4_1(wu, j, aq[i], ad[i], af[i], nb)
                else:
                    r0, r1, r2, r3 = _rowdotw4_q5_1(wu, j, aq[i], ad[i], af[i], nb)
                out[i, j] = r0
                out[i, j + 1] = r1
                out[i, j + 2] = r2
                out[i, j + 3] = r3
            j += 4
        else:
            for i in range(n):
                if fam == 0:
                    out[i, j] = _row_q8_0_family(t, wu[j], wi[j], aq[i], ad[i], ai[i], nb)
                else:
                    out[i, j] = _row_q8_1_family(t, wu[j], aq[i], ad[i], af[i], nb)
            j += 1


@njit
def _share(m, tid, nth):
    """Member ``tid``'s rows [j0, j1) of ``m``, split at multiples of 8."""
    j0 = (m * tid // nth) & ~7
    j1 = m if tid == nth - 1 else (m * (tid + 1) // nth) & ~7
    return j0, j1


@njit
def _product(t, wu, wi, x, qs, done, out, tid, nth, scb):
    """This member's rows of x @ W.T, quantizing x for W's family on first use (``done[fam]``)."""
    fam = _family(t)
    aq, ad, ai, af = qs[fam]
    if not done[fam]:
        _quantize(fam, x, aq, ad, ai, af)
        done[fam] = True
    j0, j1 = _share(wu.shape[0], tid, nth)
    _rows(t, wu, wi, x.shape[0], aq, ad, ai, af, out, j0, j1, scb)


@njit
def _quant_slots(n, k):
    """Activation buffers of each family for n rows of k values (aq int8, ad, per-block int32 / float)."""
    return [(np.empty((n, k), np.int8), np.empty((n, max(k // 32, 1)), np.float32),
             np.empty((n, max(k // 16, 1)), np.int32), np.empty((n, max(k // 32, 1)), np.float32))
            for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# one member's run over every layer


@njit
def _post(hp, xp, nw, has_norm, eps, rs):
    """xp += (post-norm of hp, optionally) * residual scale (fused._post on private copies)."""
    n, d = hp.shape
    if has_norm:
        _rms_norm_rows(hp, nw, True, eps, hp, 0, n)
    if rs != F32(1.0):
        for r in range(n):
            for e in range(d):
                hp[r, e] = hp[r, e] * rs
    for r in range(n):
        for e in range(d):
            xp[r, e] = xp[r, e] + hp[r, e]


@njit
def _member(tid, nth, sync, base, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res, gtab,
            q, k, v, o, h2, g, u):
    n, d = x.shape
    xp = x.copy()
    hp = np.empty((n, d), np.float32)
    scb = np.empty(16, np.int32)
    nbar = base
    for il in range(ip.shape[0]):
        n_head, n_kv, hd, n_ff = ip[il, 0], ip[il, 1], ip[il, 2], ip[il, 3]
        nq, nk = n_head * hd, n_kv * hd
        eps = fp[il, 0]
        b = il * 7
        nb = il * 6
        wu = [carray(_p_u8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        wi = [carray(_p_i8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        norms = [carray(_p_f32(na[nb + j]), (nn[nb + j],)) for j in range(6)]
        qd, kd, vd = q[:n * nq].reshape(n, nq), k[:n * nk].reshape(n, nk), v[:n * nk].reshape(n, nk)
        # Q, K, V: this member's rows of each
        _rms_norm_rows(xp, norms[0], True, eps, hp, 0, n)
        qs = _quant_slots(n, d)
        done = np.zeros(3, np.bool_)
        _product(wt[b], wu[0], wi[0], hp, qs, done, qd, tid, nth, scb)
        _product(wt[b + 1], wu[1], wi[1], hp, qs, done, kd, tid, nth, scb)
        _product(wt[b + 2], wu[2], wi[2], hp, qs, done, vd, tid, nth, scb)
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        # every Q head in a private copy; this member's KV heads normed, rotated and cached
        qp = np.empty((n, n_head, hd), np.float32)
        for r in range(n):
            for e in range(nq):
                qp[r, e // hd, e % hd] = qd[r, e]
        q2 = qp.reshape(n * n_head, hd)
        if ip[il, 8]:
            _rms_norm_rows(q2, norms[1], True, eps, q2, 0, n * n_head)
        n_rot, neox = ip[il, 5], ip[il, 6] != 0
        _rope_rows(qp, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
                   fp[il, 6], qp, 0, n)
        qsc = fp[il, 7]
        if qsc != F32(1.0):
            for r in range(n):
                for hh in range(n_head):
                    for e in range(hd):
                        qp[r, hh, e] = qp[r, hh, e] * qsc
        g0, g1 = n_kv * tid // nth, n_kv * (tid + 1) // nth
        start, first, used = res[il, 0], res[il, 1], res[il, 2]
        cap = kcap[il]
        kl = carray(_p_u16(ka[il]), (cap, n_kv, hd))
        vl = carray(_p_u16(va[il]), (cap, n_kv, hd))
        kp = carray(_p_i32(pa[il]), (cap,))
        if g1 > g0:
            kh = np.empty((n, g1 - g0, hd), np.float32)
            for r in range(n):
                for hh in range(g0, g1):
                    for e in range(hd):
                        kh[r, hh - g0, e] = kd[r, hh * hd + e]
            if ip[il, 8]:
                k2 = kh.reshape(n * (g1 - g0), hd)
                _rms_norm_rows(k2, norms[2], True, eps, k2, 0, n * (g1 - g0))
            _rope_rows(kh, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
                       fp[il, 6], kh, 0, n)
            for r in range(n):
                cell = start + r if r < first else r - first
                for hh in range(g0, g1):
                    for e in range(hd):
                        kl[cell, hh, e] = _f2h(kh[r, hh - g0, e])
                        vl[cell, hh, e] = _f2h(vd[r, hh * hd + e])
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        # attention: this member's (row, head) tasks
        o3 = o[:n * nq].reshape(n, n_head, hd)
        tasks = n * n_head
        w = np.empty(((used + 7) & ~7) + 8, np.float32)
        qc = np.empty(hd, np.float32)
        acc = np.empty(max(32 * hd, 32), np.float32)
        kls, vls, kps = kl[:used], vl[:used], kp[:used]
        group = n_head // n_kv
        for task in range(tasks * tid // nth, tasks * (tid + 1) // nth):
            _attn_row(qp, kls, vls, True, task // n_head, task % n_head, group, pos, kps, fp[il, 8], ip[il, 7],
                      fp[il, 9], n, w, qc, acc, o3)
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        # output projection
        o2 = o[:n * nq].reshape(n, nq)
        qs = _quant_slots(n, nq)
        done[:] = False
        _product(wt[b + 3], wu[3], wi[3], o2, qs, done, h2, tid, nth, scb)
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        hp[:, :] = h2
        _post(hp, xp, norms[3], ip[il, 9] != 0, eps, fp[il, 10])
        # gate and up
        _rms_norm_rows(xp, norms[4], True, eps, hp, 0, n)
        qs = _quant_slots(n, d)
        done[:] = False
        gd, ud = g[:n * n_ff].reshape(n, n_ff), u[:n * n_ff].reshape(n, n_ff)
        _product(wt[b + 4], wu[4], wi[4], hp, qs, done, gd, tid, nth, scb)
        _product(wt[b + 5], wu[5], wi[5], hp, qs, done, ud, tid, nth, scb)
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        # the gated unit over every column (private), then this member's rows of down
        gu = np.empty((n, n_ff), np.float32)
        _glu_range(g[:n * n_ff], u[:n * n_ff], ip[il, 4], gtab, gu.reshape(-1), 0, n * n_ff, (n * n_ff) & ~7)
        qs = _quant_slots(n, n_ff)
        done[:] = False
        _product(wt[b + 6], wu[6], wi[6], gu, qs, done, h2, tid, nth, scb)
        nbar += nth
        if not _barrier(sync, nbar, limit):
            return
        hp[:, :] = h2
        _post(hp, xp, norms[5], ip[il, 9] != 0, eps, fp[il, 10])
    if tid == 0:
        x[:, :] = xp


@njit(parallel=True, cache=True)
def _team_layers(nth, sync, base, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res, gtab,
                 q, k, v, o, h2, g, u):
    for tid in prange(nth):
        _member(tid, nth, sync, base, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res,
                gtab, q, k, v, o, h2, g, u)


#: barriers each member passes per layer
BARRIERS_PER_LAYER = 6
