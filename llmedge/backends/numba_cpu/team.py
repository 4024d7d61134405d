"""The Numba backend's decode step as one parallel region: a team of threads runs every layer of a
step, instead of opening a ``prange`` region per product.

A ``prange`` region costs a thread hand-off each time it opens (several microseconds with OpenMP,
more with the work queue), and a decode step of SmolLM2 opens about 240 of them for under 10 ms of
work. Here :func:`_team_layers` opens one region of ``nth`` iterations and each member runs
:func:`_member` through the step's phases (ten per layer). A phase is a list of tasks claimed one at
a time from an atomic counter: chunks of a product's rows (about four per member, multiples of 8
rows), KV heads, attention (row, head) pairs, and the small per-row float ops (norms, residual,
quantization of the activations) as one task. A member moves on when every task of the phase is
complete, not when every member has arrived, so a member descheduled by a busy core delays the
step only by the task it holds (no fixed share of every product waits for it), and one that starts
late or never finds the phases it missed done. A member that waits long sleeps between checks,
leaving its core idle so the kernel can move the descheduled one onto it. No member keeps state of
its own: every value is computed once, by the kernels and in the order of
:func:`llmedge.backends.numba_cpu.fused._decoder_layers` with fewer than four rows, so the rows are
equal bit for bit to the op-by-op path's whoever computes them.

A task claimed but unfinished far longer than any step (a member stuck for good) sets a failure
flag: every member returns, nothing of ``x`` is written, and the caller runs the step op by op.
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


#: phases of one layer (see :func:`_member`) and sync slots (int64) per phase: a claim counter and a
#: done counter, on a cache line of their own
PHASES_PER_LAYER = 10
SLOT = 8


def sync_size(n_layer: int) -> int:
    """Length of the ``sync`` array a step of ``n_layer`` layers needs (all zero at the start)."""
    return SLOT * (PHASES_PER_LAYER * n_layer + 2)


def _libc_usleep() -> bool:
    """Make libc's ``usleep`` known to LLVM's JIT (and to kernels loaded from the disk cache)."""
    import ctypes

    import llvmlite.binding as llvm

    try:
        fn = ctypes.CDLL(None).usleep
    except (AttributeError, OSError, TypeError):  # pragma: no cover - no POSIX libc (Windows)
        return False
    llvm.add_symbol("usleep", ctypes.cast(fn, ctypes.c_void_p).value)
    return True


_HAS_SLEEP = _libc_usleep()
#: spins (``pause``, tens of microseconds) a waiting member makes before it sleeps between checks
YIELD_AFTER = 1 << 12
#: microseconds of each such sleep
NAP_US = 20


@intrinsic
def _sched_yield(typingctx):
    """Leave the core idle for a moment (libc's ``usleep(NAP_US)``; a ``pause`` without it): a member
    waiting on a descheduled one lets the kernel move that one here (an idle core pulls a waiting
    thread), where spinning or ``sched_yield`` would keep the core busy."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _HAS_SLEEP:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [ir.IntType(32)]),
                                                "usleep")
            builder.call(fn, [ir.Constant(ir.IntType(32), NAP_US)])
        return context.get_dummy_value()

    return sig, codegen


@njit
def _claim(sync, p):
    """The next task of phase ``p`` (tasks are claimed in order, each by one member)."""
    return _atomic_add(sync, SLOT * (p + 1), 1)


@njit
def _finish(sync, p):
    """One task of phase ``p`` is complete (its writes are visible to whoever sees the count)."""
    _atomic_add(sync, SLOT * (p + 1) + 1, 1)


@njit
def _wait_done(sync, p, ntasks, limit):
    """Wait until all ``ntasks`` tasks of phase ``p`` are complete; False when the team failed (a
    task claimed but unfinished for ``limit`` spins, or another member gave up)."""
    spins = 0
    while _atomic_load(sync, SLOT * (p + 1) + 1) < ntasks:
        if _atomic_load(sync, 1) != 0:
            return False
        if spins < YIELD_AFTER:
            _cpu_relax()
        else:
            _sched_yield()
        spins += 1
        if spins > limit:
            _atomic_add(sync, 1, 1)
            return False
    return True


@njit
def _chunk_rows(m, nth):
    """Rows per task of a product of ``m`` rows: about four tasks per member, multiples of 8."""
    c = (m + 4 * nth - 1) // (4 * nth)
    return max(8, (c + 7) & ~7)


@njit
def _view(buf, n, k):
    return buf[:n * k].reshape(n, k)


@njit
def _slots(fam, n, k, aqs, ads, ais, afs):
    """Family ``fam``'s shared activation buffers for n rows of k values: int8 values, block scales,
    per-16 (Q8_K) or per-block integer sums, and Q8_1's scaled sums."""
    nb32 = max(k // 32, 1)
    return (_view(aqs[fam], n, k), _view(ads[fam], n, nb32), _view(ais[fam], n, max(k // 16, 1)),
            _view(afs[fam], n, nb32))


@njit
def _quantize_for(wt, b0, nw, x, aqs, ads, ais, afs):
    """x quantized once for each family the weights wt[b0:b0 + nw] multiply."""
    n, k = x.shape
    seen = np.zeros(3, np.bool_)
    for j in range(nw):
        fam = _family(wt[b0 + j])
        if not seen[fam]:
            seen[fam] = True
            aq, ad, ai, af = _slots(fam, n, k, aqs, ads, ais, afs)
            _quantize(fam, x, aq, ad, ai, af)


@njit
def _product_tasks(wshape, nth, b0, nw):
    """Tasks of a phase multiplying weights b0 .. b0 + nw - 1 (each split in row chunks)."""
    total = 0
    for j in range(nw):
        m = wshape[b0 + j, 0]
        cr = _chunk_rows(m, nth)
        total += (m + cr - 1) // cr
    return total


@njit
def _product_task(task, wt, wu, wi, wshape, nth, b0, nw, outs, n, k, aqs, ads, ais, afs, scb):
    """Task ``task`` of a product phase: a chunk of rows of one of its weights, with the kernels (and
    the row alignment, multiples of 8) of the op-by-op path."""
    for j in range(nw):
        m = wshape[b0 + j, 0]
        cr = _chunk_rows(m, nth)
        nc = (m + cr - 1) // cr
        if task < nc:
            t = wt[b0 + j]
            aq, ad, ai, af = _slots(_family(t), n, k, aqs, ads, ais, afs)
            j0 = task * cr
            _rows(t, wu[j], wi[j], n, aq, ad, ai, af, outs[j], j0, min(m, j0 + cr), scb)
            return
        task -= nc


# ---------------------------------------------------------------------------------------------
# one member's run over every layer


@njit
def _post(hp, xp, nw, has_norm, eps, rs):
    """xp += (post-norm of hp, optionally) * residual scale (fused._post on the team's buffers)."""
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
def _norms_of(na, nn, il):
    return [carray(_p_f32(na[il * 6 + j]), (nn[il * 6 + j],)) for j in range(6)]


@njit
def _member(tid, nth, sync, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res, gtab,
            q, k, v, o, h2, g, u, xs, hn, qb, gub, aqs, ads, ais, afs):
    """One member's run through every phase of the step. A phase is a list of tasks that members
    claim one at a time from an atomic counter (rows of products in chunks, attention heads, KV
    heads, the small per-row float ops as one task) and a member moves on when every task of the
    phase is complete, not when every member arrives: a member descheduled by a busy core delays
    the step only by the task it holds, and one that starts late (or never) finds the phases it
    missed done. No member keeps state of its own, so every value is computed once, by the same
    kernels and in the same order as the op-by-op path."""
    n, d = x.shape
    scb = np.empty(16, np.int32)
    n_layer = ip.shape[0]
    p = 0
    for il in range(n_layer + 1):
        # phase A: the previous layer's down output into the stream (post-norm, residual), then this
        # layer's attention norm and its activations quantized for Q, K and V; after the last layer
        # the stream goes to x
        if _claim(sync, p) == 0:
            if il == 0:
                xs[:, :] = x
            else:
                pn = _norms_of(na, nn, il - 1)
                hn[:, :] = h2
                _post(hn, xs, pn[5], ip[il - 1, 9] != 0, fp[il - 1, 0], fp[il - 1, 10])
            if il == n_layer:
                x[:, :] = xs
            else:
                norms = _norms_of(na, nn, il)
                _rms_norm_rows(xs, norms[0], True, fp[il, 0], hn, 0, n)
                _quantize_for(wt, il * 7, 3, hn, aqs, ads, ais, afs)
            _finish(sync, p)
        if not _wait_done(sync, p, 1, limit):
            return
        p += 1
        if il == n_layer:
            return
        n_head, n_kv, hd, n_ff = ip[il, 0], ip[il, 1], ip[il, 2], ip[il, 3]
        nq, nk = n_head * hd, n_kv * hd
        eps = fp[il, 0]
        b = il * 7
        wu = [carray(_p_u8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        wi = [carray(_p_i8(wa[b + j]), (wshape[b + j, 0], wshape[b + j, 1])) for j in range(7)]
        norms = _norms_of(na, nn, il)
        qd, kd, vd = _view(q, n, nq), _view(k, n, nk), _view(v, n, nk)
        o2 = _view(o, n, nq)
        gd, ud = _view(g, n, n_ff), _view(u, n, n_ff)
        # phase B: Q, K, V rows
        ntask = _product_tasks(wshape, nth, b, 3)
        outs = [qd, kd, vd]
        while True:
            task = _claim(sync, p)
            if task >= ntask:
                break
            _product_task(task, wt, wu, wi, wshape, nth, b, 3, outs, n, d, aqs, ads, ais, afs, scb)
            _finish(sync, p)
        if not _wait_done(sync, p, ntask, limit):
            return
        p += 1
        # phase C: every Q head (one task), and each KV head normed, rotated and cached (a task each)
        qp = qb[:n * nq].reshape(n, n_head, hd)
        n_rot, neox = ip[il, 5], ip[il, 6] != 0
        start, first, used = res[il, 0], res[il, 1], res[il, 2]
        cap = kcap[il]
        kl = carray(_p_u16(ka[il]), (cap, n_kv, hd))
        vl = carray(_p_u16(va[il]), (cap, n_kv, hd))
        kp = carray(_p_i32(pa[il]), (cap,))
        while True:
            task = _claim(sync, p)
            if task >= 1 + n_kv:
                break
            if task == 0:
                for r in range(n):
                    for e in range(nq):
                        qp[r, e // hd, e % hd] = qd[r, e]
                q2 = qp.reshape(n * n_head, hd)
                if ip[il, 8]:
                    _rms_norm_rows(q2, norms[1], True, eps, q2, 0, n * n_head)
                _rope_rows(qp, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
                           fp[il, 6], qp, 0, n)
                qsc = fp[il, 7]
                if qsc != F32(1.0):
                    for r in range(n):
                        for hh in range(n_head):
                            for e in range(hd):
                                qp[r, hh, e] = qp[r, hh, e] * qsc
            else:
                hh = task - 1
                kh = np.empty((n, 1, hd), np.float32)
                for r in range(n):
                    for e in range(hd):
                        kh[r, 0, e] = kd[r, hh * hd + e]
                if ip[il, 8]:
                    k2 = kh.reshape(n, hd)
                    _rms_norm_rows(k2, norms[2], True, eps, k2, 0, n)
                _rope_rows(kh, pos, n_rot, fp[il, 2], fp[il, 1], neox, ff, has_ff, fp[il, 3], fp[il, 4], fp[il, 5],
                           fp[il, 6], kh, 0, n)
                for r in range(n):
                    cell = start + r if r < first else r - first
                    for e in range(hd):
                        kl[cell, hh, e] = _f2h(kh[r, 0, e])
                        vl[cell, hh, e] = _f2h(vd[r, hh * hd + e])
            _finish(sync, p)
        if not _wait_done(sync, p, 1 + n_kv, limit):
            return
        p += 1
        # phase D: attention, a task per (row, head)
        o3 = o[:n * nq].reshape(n, n_head, hd)
        tasks = n * n_head
        w = np.empty(((used + 7) & ~7) + 8, np.float32)
        qc = np.empty(hd, np.float32)
        acc = np.empty(max(32 * hd, 32), np.float32)
        kls, vls, kps = kl[:used], vl[:used], kp[:used]
        group = n_head // n_kv
        while True:
            task = _claim(sync, p)
            if task >= tasks:
                break
            _attn_row(qp, kls, vls, True, task // n_head, task % n_head, group, pos, kps, fp[il, 8], ip[il, 7],
                      fp[il, 9], n, w, qc, acc, o3)
            _finish(sync, p)
        if not _wait_done(sync, p, tasks, limit):
            return
        p += 1
        # phase E: the attention output quantized for the output projection
        if _claim(sync, p) == 0:
            _quantize_for(wt, b + 3, 1, o2, aqs, ads, ais, afs)
            _finish(sync, p)
        if not _wait_done(sync, p, 1, limit):
            return
        p += 1
        # phase F: output projection rows
        ntask = _product_tasks(wshape, nth, b + 3, 1)
        outs = [h2]
        while True:
            task = _claim(sync, p)
            if task >= ntask:
                break
            _product_task(task, wt, wu[3:4], wi[3:4], wshape, nth, b + 3, 1, outs, n, nq, aqs, ads, ais, afs, scb)
            _finish(sync, p)
        if not _wait_done(sync, p, ntask, limit):
            return
        p += 1
        # phase G: post-norm and residual, the FFN norm, its activations quantized for gate and up
        if _claim(sync, p) == 0:
            hn[:, :] = h2
            _post(hn, xs, norms[3], ip[il, 9] != 0, eps, fp[il, 10])
            _rms_norm_rows(xs, norms[4], True, eps, hn, 0, n)
            _quantize_for(wt, b + 4, 2, hn, aqs, ads, ais, afs)
            _finish(sync, p)
        if not _wait_done(sync, p, 1, limit):
            return
        p += 1
        # phase H: gate and up rows
        ntask = _product_tasks(wshape, nth, b + 4, 2)
        outs = [gd, ud]
        while True:
            task = _claim(sync, p)
            if task >= ntask:
                break
            _product_task(task, wt, wu[4:6], wi[4:6], wshape, nth, b + 4, 2, outs, n, d, aqs, ads, ais, afs, scb)
            _finish(sync, p)
        if not _wait_done(sync, p, ntask, limit):
            return
        p += 1
        # phase I: the gated unit over every column, quantized for down
        gu = _view(gub, n, n_ff)
        if _claim(sync, p) == 0:
            _glu_range(g[:n * n_ff], u[:n * n_ff], ip[il, 4], gtab, gu.reshape(-1), 0, n * n_ff, n_ff)
            _quantize_for(wt, b + 6, 1, gu, aqs, ads, ais, afs)
            _finish(sync, p)
        if not _wait_done(sync, p, 1, limit):
            return
        p += 1
        # phase J: down rows
        ntask = _product_tasks(wshape, nth, b + 6, 1)
        outs = [h2]
        while True:
            task = _claim(sync, p)
            if task >= ntask:
                break
            _product_task(task, wt, wu[6:7], wi[6:7], wshape, nth, b + 6, 1, outs, n, n_ff, aqs, ads, ais, afs, scb)
            _finish(sync, p)
        if not _wait_done(sync, p, ntask, limit):
            return
        p += 1


@njit(parallel=True, cache=True)
def _team_layers(nth, sync, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res, gtab,
                 q, k, v, o, h2, g, u, xs, hn, qb, gub, aqs, ads, ais, afs):
    for tid in prange(nth):
        _member(tid, nth, sync, limit, x, pos, ip, fp, wa, wshape, wt, na, nn, ff, has_ff, ka, va, pa, kcap, res,
                gtab, q, k, v, o, h2, g, u, xs, hn, qb, gub, aqs, ads, ais, afs)
