"""LLVM-level building blocks of the Numba backend: ``numba.extending.intrinsic`` vector block dot
products (ggml's AVX2 ``vec_dot`` order: pmaddubsw/pmaddwd on x86 with AVX2, plain vector IR
elsewhere), host feature probes (:data:`FAST_ROWS`), ggml's half/bfloat16 conversions bit for bit
and its vectorized ``expf``."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llmedge.backends.numba_cpu.common import F32, TQ4_0, TQ4_1, TQ4_K, TQ5_0, TQ5_1, TQ5_K, TQ6_K, TQ8_0

# ---------------------------------------------------------------------------------------------
# LLVM intrinsics: bit casts, fused multiply-add, integer block dot products


@intrinsic
def _u32_as_f32(typingctx, v):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_bits(typingctx, v):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


def _byte_ptr(context, builder, aty, aval, off):
    arr = context.make_array(aty)(context, builder, aval)
    return builder.gep(arr.data, [off])


def _load_bytes(builder, ptr, n):
    vt = ir.VectorType(ir.IntType(8), n)
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=1)


def _splat(builder, value, n, width):
    """A vector of ``n`` lanes of ``width`` bits, all ``value`` (an i64 IR value)."""
    it = ir.IntType(width)
    v = builder.trunc(value, it) if width < 64 else value
    vec = builder.insert_element(ir.Constant(ir.VectorType(it, n), ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vec, ir.Constant(ir.VectorType(it, n), ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


def _reduce_dot(builder, wvals_i32, a_i8, n):
    v32 = ir.VectorType(ir.IntType(32), n)
    prod = builder.mul(wvals_i32, builder.sext(a_i8, v32))
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [v32]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [prod])


def _make_dot_ss(n):
    """sum_l int8 w[wo + l] * int8 a[ao + l] over ``n`` lanes."""

    @intrinsic
    def dot(typingctx, w, wo, a, ao):
        sig = types.int32(w, types.intp, a, types.intp)

        def codegen(context, builder, signature, args):
            wv = _load_bytes(builder, _byte_ptr(context, builder, signature.args[0], args[0], args[1]), n)
            av = _load_bytes(builder, _byte_ptr(context, builder, signature.args[2], args[2], args[3]), n)
            return _reduce_dot(builder, builder.sext(wv, ir.VectorType(ir.IntType(32), n)), av, n)

        return sig, codegen

    return dot


_dot_ss32 = _make_dot_ss(32)


@intrinsic
def _dot_nib32(typingctx, w, wo, a, ao):
    """Legacy 4-bit block: 16 bytes at ``wo``; low nibbles pair with a[ao:ao+16], high with a[ao+16:ao+32]."""
    sig = types.int32(w, types.intp, a, types.intp)

    def codegen(context, builder, signature, args):
        q = _load_bytes(builder, _byte_ptr(context, builder, signature.args[0], args[0], args[1]), 16)
        v8 = ir.VectorType(ir.IntType(8), 16)
        lo = builder.and_(q, ir.Constant(v8, [15] * 16))
        hi = builder.lshr(q, ir.Constant(v8, [4] * 16))
        both = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32))))
        av = _load_bytes(builder, _byte_ptr(context, builder, signature.args[2], args[2], args[3]), 32)
        return _reduce_dot(builder, builder.zext(both, ir.VectorType(ir.IntType(32), 32)), av, 32)

    return sig, codegen


@intrinsic
def _dot_q5_32(typingctx, w, ho, qo, a, ao):
    """Legacy 5-bit block: the 32 high bits (little-endian u32 at ``ho``) over the nibbles at ``qo``."""
    sig = types.int32(w, types.intp, types.intp, a, types.intp)

    def codegen(context, builder, signature, args):
        q = _load_bytes(builder, _byte_ptr(context, builder, signature.args[0], args[0], args[2]), 16)
        v8 = ir.VectorType(ir.IntType(8), 16)
        v32 = ir.VectorType(ir.IntType(32), 32)
        lo = builder.and_(q, ir.Constant(v8, [15] * 16))
        hi = builder.lshr(q, ir.Constant(v8, [4] * 16))
        both = builder.zext(builder.shuffle_vector(lo, hi, ir.Constant(v32, list(range(32)))), v32)
        hp = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                             ir.IntType(32).as_pointer())
        qh = builder.load(hp, align=1)
        qhv = builder.insert_element(ir.Constant(v32, ir.Undefined), qh, ir.Constant(ir.IntType(32), 0))
        qhv = builder.shuffle_vector(qhv, ir.Constant(v32, ir.Undefined), ir.Constant(v32, [0] * 32))
        bits = builder.and_(builder.lshr(qhv, ir.Constant(v32, list(range(32)))), ir.Constant(v32, [1] * 32))
        vals = builder.or_(both, builder.shl(bits, ir.Constant(v32, [4] * 32)))
        av = _load_bytes(builder, _byte_ptr(context, builder, signature.args[3], args[3], args[4]), 32)
        return _reduce_dot(builder, vals, av, 32)

    return sig, codegen


def _make_dot_fields(n, two):
    """sum_l (((w[o1+l] >> s1) & m1) | (((w[o2+l] >> s2) & m2) << sh2)) * a[ao+l] over ``n`` lanes
    (K-quant sub-blocks: low bits, plus high bits from a second byte plane when ``two``)."""

    @intrinsic
    def dot(typingctx, w, o1, s1, m1, o2, s2, m2, sh2, a, ao):
        sig = types.int32(w, types.intp, types.intp, types.intp, types.intp, types.intp, types.intp,
                          types.intp, a, types.intp)

        def codegen(context, builder, signature, args):
            v32 = ir.VectorType(ir.IntType(32), n)
            q = builder.zext(_load_bytes(builder, _byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                                         n), v32)
            vals = builder.and_(builder.lshr(q, _splat(builder, args[2], n, 32)), _splat(builder, args[3], n, 32))
            if two:
                h = builder.zext(_load_bytes(builder, _byte_ptr(context, builder, signature.args[0], args[0],
                                                                args[4]), n), v32)
                h = builder.and_(builder.lshr(h, _splat(builder, args[5], n, 32)), _splat(builder, args[6], n, 32))
                vals = builder.or_(vals, builder.shl(h, _splat(builder, args[7], n, 32)))
            av = _load_bytes(builder, _byte_ptr(context, builder, signature.args[8], args[8], args[9]), n)
            return _reduce_dot(builder, vals, av, n)

        return sig, codegen

    return dot


_dot_f1_16 = _make_dot_fields(16, False)
_dot_f2_16 = _make_dot_fields(16, True)
_dot_f1_32 = _make_dot_fields(32, False)
_dot_f2_32 = _make_dot_fields(32, True)

# Whole-row dot products for the 32-value block types in ggml's AVX2 order: per block, the integer
# products summed in 8 lanes of four consecutive values (maddubs + madd), converted to float and
# accumulated with one fused multiply-add per lane; at the end llama.cpp's hsum of the 8 lanes.
# They read F16 scales with LLVM's ``fpext half`` (one instruction with F16C or on ARM).

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_FLT = ir.FloatType()


def _host_features() -> dict:
    try:
        import llvmlite.binding as llvm

        return dict(llvm.get_host_cpu_features())
    except Exception:  # pragma: no cover
        return {}


#: LLVM's x86 AVX2 byte-product intrinsics (pmaddubsw, pmaddwd, psignb) can be used
_X86_AVX2 = bool(_host_features().get("avx2", False))
#: and AVX-512 VNNI's vpdpbusd on 256-bit vectors (pmaddubsw + pmaddwd by ones in one instruction)
_X86_VNNI = _X86_AVX2 and all(_host_features().get(f, False) for f in ("avx512vnni", "avx512vl"))


def _vt(t, n):
    return ir.VectorType(t, n)


def _shuf(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(_vt(_I32, len(idx)), list(idx)))


def _quad_sums(builder, x8, y8, n, signed=True, scales16=None):
    """<n x i8> x, y -> <n/4 x i32>: lane l = sum of x[e] * y[e] for e in 4l..4l+3 (times the i16
    ``scales16`` of the pairs when given). On x86 with AVX2 this is ggml's own instruction sequence
    (psign, pmaddubsw, pmaddwd), with AVX-512 VNNI native's (psign, vpdpbusd: the same integers, as
    no pair of these blocks' values reaches pmaddubsw's saturation); elsewhere plain vector IR.
    ``signed``: x may be negative."""
    if _X86_AVX2 and n == 32:
        v32i8, v16i16, v8i32 = _vt(_I8, 32), _vt(_I16, 16), _vt(_I32, 8)
        if signed:
            psign = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i8, [v32i8, v32i8]),
                                                   "llvm.x86.avx2.psign.b")
            x8, y8 = builder.call(psign, [x8, x8]), builder.call(psign, [y8, x8])
        maddubs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16i16, [v32i8, v32i8]),
                                                 "llvm.x86.avx2.pmadd.ub.sw")
        madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8i32, [v16i16, v16i16]),
                                              "llvm.x86.avx2.pmadd.wd")
        if _X86_VNNI and scales16 is None:
            dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8i32, [v8i32] * 3),
                                                    "llvm.x86.avx512.vpdpbusd.256")
            return builder.call(dpbusd, [ir.Constant(v8i32, [0] * 8), builder.bitcast(x8, v8i32), builder.bitcast(y8, v8i32)])
        p16 = builder.call(maddubs, [x8, y8])
        return builder.call(madd, [p16, scales16 if scales16 is not None else ir.Constant(v16i16, [1] * 16)])
    ev, od = list(range(0, n, 2)), list(range(1, n, 2))
    v = _vt(_I32, n // 2)
    xe, xo = builder.sext(_shuf(builder, x8, x8, ev), v), builder.sext(_shuf(builder, x8, x8, od), v)
    ye, yo = builder.sext(_shuf(builder, y8, y8, ev), v), builder.sext(_shuf(builder, y8, y8, od), v)
    pairs = builder.add(builder.mul(xe, ye), builder.mul(xo, yo))
    ev2, od2 = list(range(0, n // 2, 2)), list(range(1, n // 2, 2))
    quads = builder.add(_shuf(builder, pairs, pairs, ev2), _shuf(builder, pairs, pairs, od2))
    if scales16 is not None:
        quads = builder.mul(quads, builder.sext(_shuf(builder, scales16, scales16, ev2[: n // 4]), _vt(_I32, n // 4)))
    return quads


def _row_ptr(context, builder, aty, aval, row, col):
    """Byte pointer to element [row, col] of the 2-D array ``aval`` (any strides)."""
    arr = context.make_array(aty)(context, builder, aval)
    rs, cs = cgutils.unpack_tuple(builder, arr.strides, 2)
    off = builder.add(builder.mul(row, rs), builder.mul(col, cs))
    return builder.gep(builder.bitcast(arr.data, ir.IntType(8).as_pointer()), [off])


def _ir_h2f(builder, ptr):
    h = builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(h, ir.HalfType()), _FLT)


def _ir_fma(builder, a, b, c):
    t = a.type
    name = "llvm.fma.f32" if t == _FLT else f"llvm.fma.v{t.count}f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), name)
    return builder.call(fn, [a, b, c])


def _ir_splat_f(builder, x, n):
    v = builder.insert_element(ir.Constant(_vt(_FLT, n), ir.Undefined), x, ir.Constant(_I32, 0))
    return _shuf(builder, v, ir.Constant(_vt(_FLT, n), ir.Undefined), [0] * n)


def _ir_hsum8(builder, acc):
    """llama.cpp's hsum_float_8: ((4+0) + (6+2)) + ((5+1) + (7+3))."""
    r = builder.fadd(_shuf(builder, acc, acc, [4, 5, 6, 7]), _shuf(builder, acc, acc, [0, 1, 2, 3]))
    r = builder.fadd(r, _shuf(builder, r, r, [2, 3, 2, 3]))
    return builder.fadd(builder.extract_element(r, ir.Constant(_I32, 0)), builder.extract_element(r, ir.Constant(_I32, 1)))


def _ir_nibbles32(builder, ptr):
    """16 bytes at ``ptr`` -> <32 x i8>: the low nibbles, then the high nibbles."""
    q = _load_bytes(builder, ptr, 16)
    lo = builder.and_(q, ir.Constant(_vt(_I8, 16), [15] * 16))
    hi = builder.lshr(q, ir.Constant(_vt(_I8, 16), [4] * 16))
    return _shuf(builder, lo, hi, range(32))


def _ir_hbits32(builder, ptr):
    """The little-endian u32 at ``ptr`` -> <32 x i8>: 16 in lane e where bit e is set, else 0
    (ggml's bytes_from_bits_32: a byte broadcast, a bit mask, a compare)."""
    b4 = builder.load(builder.bitcast(ptr, _vt(_I8, 4).as_pointer()), align=1)
    bytes32 = _shuf(builder, b4, b4, [e // 8 for e in range(32)])
    bits = builder.and_(bytes32, ir.Constant(_vt(_I8, 32), [1 << (e % 8) for e in range(32)]))
    set_ = builder.icmp_unsigned("!=", bits, ir.Constant(_vt(_I8, 32), [0] * 32))
    return builder.select(set_, ir.Constant(_vt(_I8, 32), [16] * 32), ir.Constant(_vt(_I8, 32), [0] * 32))


_BLOCK32 = {  # type: (block bytes, offset of the quants, has min (Q8_1 partner), 5-bit, offset subtracted)
    TQ8_0: (34, 2, False, False, 0), TQ4_0: (18, 2, False, False, 8), TQ5_0: (22, 6, False, True, 16),
    TQ4_1: (20, 4, True, False, 0), TQ5_1: (24, 8, True, True, 0),
}


#: bytes ahead of the block being read that the one-row kernels prefetch (native's LLE_PREFETCH)
_PREFETCH_AHEAD = 2048


def _ir_prefetch(builder, ptr):
    """Ask for the cache line at ``ptr`` (read, keep in all levels); never faults. Decode streams
    each weight once per token faster than the hardware prefetcher alone keeps up with: the row
    kernels prefetch the same block of the next group of rows, as native's gemv does."""
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _ir_weights32(builder, t, wb):
    """<32 x i8>: the signed (Q4_0/Q5_0/Q8_0) or unsigned (Q4_1/Q5_1) values of the block at ``wb``,
    as ggml's AVX2 kernels unpack them."""
    _, qo, _, five, sub = _BLOCK32[t]
    if t == TQ8_0:
        qx = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, qo)]), 32)
    else:
        qx = _ir_nibbles32(builder, builder.gep(wb, [ir.Constant(_I32, qo)]))
        if five:
            qx = builder.or_(qx, _ir_hbits32(builder, builder.gep(wb, [ir.Constant(_I32, qo - 4)])))
        if sub:
            qx = builder.sub(qx, ir.Constant(_vt(_I8, 32), [sub] * 32))
    return qx


def _ir_row32(builder, t, wp, ap, adp, asp, nb):
    """One weight row (bytes at ``wp``) of a 32-value block family times one activation row (int8
    at ``ap``, block scales at ``adp``, Q8_1 sums at ``asp``): ggml's AVX2 vec_dot, the block
    read ``_PREFETCH_AHEAD`` bytes ahead; returns the float."""
    bsz, qo, has_min, five, sub = _BLOCK32[t]
    v8f = _vt(_FLT, 8)
    acc_p = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
    sm_p = cgutils.alloca_once_value(builder, ir.Constant(_FLT, 0.0))
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        wb = builder.gep(wp, [builder.mul(b, ir.Constant(b.type, bsz))])
        _ir_prefetch(builder, builder.gep(wb, [ir.Constant(b.type, _PREFETCH_AHEAD)]))
        qx = _ir_weights32(builder, t, wb)
        qy = _load_bytes(builder, builder.gep(ap, [builder.mul(b, ir.Constant(b.type, 32))]), 32)
        lanes = builder.sitofp(_quad_sums(builder, qx, qy, 32, signed=bool(sub) or t == TQ8_0), v8f)
        dd = builder.fmul(_ir_h2f(builder, wb), builder.load(builder.gep(adp, [b])))
        builder.store(_ir_fma(builder, _ir_splat_f(builder, dd, 8), lanes, builder.load(acc_p)), acc_p)
        if has_min:
            mw = _ir_h2f(builder, builder.gep(wb, [ir.Constant(_I32, 2)]))
            builder.store(_ir_fma(builder, mw, builder.load(builder.gep(asp, [b])), builder.load(sm_p)), sm_p)
    res = _ir_hsum8(builder, builder.load(acc_p))
    if has_min:
        res = builder.fadd(res, builder.load(sm_p))
    return res


def _make_rowdot32(t):
    @intrinsic
    def rowdot(typingctx, w, a, ad, asm, nb):
        sig = types.float32(w, a, ad, asm, types.intp)

        def codegen(context, builder, signature, args):
            wp = context.make_array(signature.args[0])(context, builder, args[0]).data
            ap = context.make_array(signature.args[1])(context, builder, args[1]).data
            adp = context.make_array(signature.args[2])(context, builder, args[2]).data
            asp = context.make_array(signature.args[3])(context, builder, args[3]).data
            return _ir_row32(builder, t, wp, ap, adp, asp, args[4])

        return sig, codegen

    return rowdot


def _make_gemv32(t):
    """out[j] = weight row j . a for j in [j0, j1) of the 2-D weight: :func:`_make_rowdot32`'s
    row kernel over a range of rows in one call (no per-row call or array views: Gemma 3's
    262,144-row output matrix is read once per token)."""

    @intrinsic
    def gemv(typingctx, w, j0, j1, a, ad, asm, out):
        sig = types.void(w, types.intp, types.intp, a, ad, asm, out)

        def codegen(context, builder, signature, args):
            wa = context.make_array(signature.args[0])(context, builder, args[0])
            ws = cgutils.unpack_tuple(builder, wa.strides, 2)[0]
            wbase = builder.bitcast(wa.data, ir.IntType(8).as_pointer())
            ap = context.make_array(signature.args[3])(context, builder, args[3]).data
            adp = context.make_array(signature.args[4])(context, builder, args[4]).data
            asp = context.make_array(signature.args[5])(context, builder, args[5]).data
            oa = context.make_array(signature.args[6])(context, builder, args[6])
            os_ = cgutils.unpack_tuple(builder, oa.strides, 1)[0]
            obase = builder.bitcast(oa.data, ir.IntType(8).as_pointer())
            nb = builder.sdiv(cgutils.unpack_tuple(builder, context.make_array(signature.args[3])(
                context, builder, args[3]).shape, 1)[0], ir.Constant(ws.type, 32))
            with cgutils.for_range_slice(builder, args[1], args[2], ir.Constant(args[1].type, 1)) as (j, _):
                r = _ir_row32(builder, t, builder.gep(wbase, [builder.mul(j, ws)]), ap, adp, asp, nb)
                builder.store(r, builder.bitcast(builder.gep(obase, [builder.mul(j, os_)]), _FLT.as_pointer()))
            return context.get_dummy_value()

        return sig, codegen

    return gemv


def _make_rowdot32_x4(t):
    """Four activation rows (``i0`` .. ``i0 + 3`` of the 2-D aq / ad / asm) times one weight row:
    the weight block is decoded once per block; each row is summed exactly as by the one-row kernel."""
    bsz, qo, has_min, five, sub = _BLOCK32[t]

    @intrinsic
    def rowdot4(typingctx, w, aq, ad, asm, i0, nb):
        sig = types.UniTuple(types.float32, 4)(w, aq, ad, asm, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            wp = context.make_array(signature.args[0])(context, builder, args[0]).data
            aqa = context.make_array(signature.args[1])(context, builder, args[1])
            ada = context.make_array(signature.args[2])(context, builder, args[2])
            asa = context.make_array(signature.args[3])(context, builder, args[3])
            k = cgutils.unpack_tuple(builder, aqa.shape, 2)[1]
            nbs = cgutils.unpack_tuple(builder, ada.shape, 2)[1]
            i0, nb = args[4], args[5]
            rows = [builder.add(i0, ir.Constant(i0.type, r)) for r in range(4)]
            aps = [builder.gep(aqa.data, [builder.mul(r, k)]) for r in rows]
            adps = [builder.gep(ada.data, [builder.mul(r, nbs)]) for r in rows]
            asps = [builder.gep(asa.data, [builder.mul(r, nbs)]) for r in rows]
            v8f = _vt(_FLT, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in range(4)]
            sms = [cgutils.alloca_once_value(builder, ir.Constant(_FLT, 0.0)) for _ in range(4)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                wb = builder.gep(wp, [builder.mul(b, ir.Constant(b.type, bsz))])
                _ir_prefetch(builder, builder.gep(wb, [ir.Constant(b.type, _PREFETCH_AHEAD)]))
                qx = _ir_weights32(builder, t, wb)
                dw = _ir_h2f(builder, wb)
                mw = _ir_h2f(builder, builder.gep(wb, [ir.Constant(_I32, 2)])) if has_min else None
                for r in range(4):
                    qy = _load_bytes(builder, builder.gep(aps[r], [builder.mul(b, ir.Constant(b.type, 32))]), 32)
                    lanes = builder.sitofp(_quad_sums(builder, qx, qy, 32, signed=bool(sub) or t == TQ8_0), v8f)
                    dd = builder.fmul(dw, builder.load(builder.gep(adps[r], [b])))
                    builder.store(_ir_fma(builder, _ir_splat_f(builder, dd, 8), lanes, builder.load(accs[r])), accs[r])
                    if has_min:
                        builder.store(_ir_fma(builder, mw, builder.load(builder.gep(asps[r], [b])),
                                              builder.load(sms[r])), sms[r])
            res = []
            for r in range(4):
                v = _ir_hsum8(builder, builder.load(accs[r]))
                res.append(builder.fadd(v, builder.load(sms[r])) if has_min else v)
            return context.make_tuple(builder, signature.return_type, res)

        return sig, codegen

    return rowdot4


def _make_rowdot32_w4(t):
    """One activation row times four weight rows (``j0`` .. ``j0 + 3`` of the 2-D weight): the
    activation block is loaded once per block and the four independent sums overlap; each weight
    row is summed exactly as by the one-row kernel."""
    bsz, qo, has_min, five, sub = _BLOCK32[t]

    @intrinsic
    def rowdot_w4(typingctx, w, j0, a, ad, asm, nb):
        sig = types.UniTuple(types.float32, 4)(w, types.intp, a, ad, asm, types.intp)

        def codegen(context, builder, signature, args):
            wa = context.make_array(signature.args[0])(context, builder, args[0])
            rb = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            j0, nb = args[1], args[5]
            wps = [builder.gep(wa.data, [builder.mul(builder.add(j0, ir.Constant(j0.type, r)), rb)]) for r in range(4)]
            ap = context.make_array(signature.args[2])(context, builder, args[2]).data
            adp = context.make_array(signature.args[3])(context, builder, args[3]).data
            asp = context.make_array(signature.args[4])(context, builder, args[4]).data
            v8f = _vt(_FLT, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in range(4)]
            sms = [cgutils.alloca_once_value(builder, ir.Constant(_FLT, 0.0)) for _ in range(4)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                qy = _load_bytes(builder, builder.gep(ap, [builder.mul(b, ir.Constant(b.type, 32))]), 32)
                da = builder.load(builder.gep(adp, [b]))
                sa = builder.load(builder.gep(asp, [b])) if has_min else None
                for r in range(4):
                    wb = builder.gep(wps[r], [builder.mul(b, ir.Constant(b.type, bsz))])
                    _ir_prefetch(builder, builder.gep(wb, [builder.mul(rb, ir.Constant(rb.type, 4))]))
                    qx = _ir_weights32(builder, t, wb)
                    lanes = builder.sitofp(_quad_sums(builder, qx, qy, 32, signed=bool(sub) or t == TQ8_0), v8f)
                    dd = builder.fmul(_ir_h2f(builder, wb), da)
                    builder.store(_ir_fma(builder, _ir_splat_f(builder, dd, 8), lanes, builder.load(accs[r])), accs[r])
                    if has_min:
                        mw = _ir_h2f(builder, builder.gep(wb, [ir.Constant(_I32, 2)]))
                        builder.store(_ir_fma(builder, mw, sa, builder.load(sms[r])), sms[r])
            res = []
            for r in range(4):
                v = _ir_hsum8(builder, builder.load(accs[r]))
                res.append(builder.fadd(v, builder.load(sms[r])) if has_min else v)
            return context.make_tuple(builder, signature.return_type, res)

        return sig, codegen

    return rowdot_w4


_rowdot_w4 = {t: _make_rowdot32_w4(t) for t in _BLOCK32 if t != TQ8_0}  # Q8_0 decodes row by row
_rowdotw4_q4_0, _rowdotw4_q5_0 = _rowdot_w4[TQ4_0], _rowdot_w4[TQ5_0]
_rowdotw4_q4_1, _rowdotw4_q5_1 = _rowdot_w4[TQ4_1], _rowdot_w4[TQ5_1]
_rowdot4 = {t: _make_rowdot32_x4(t) for t in _BLOCK32}
_rowdot4_q8_0, _rowdot4_q4_0, _rowdot4_q5_0 = _rowdot4[TQ8_0], _rowdot4[TQ4_0], _rowdot4[TQ5_0]
_rowdot4_q4_1, _rowdot4_q5_1 = _rowdot4[TQ4_1], _rowdot4[TQ5_1]
_rowdot_q8_0 = _make_rowdot32(TQ8_0)
_rowdot_q4_0 = _make_rowdot32(TQ4_0)
_rowdot_q5_0 = _make_rowdot32(TQ5_0)
_rowdot_q4_1 = _make_rowdot32(TQ4_1)
_rowdot_q5_1 = _make_rowdot32(TQ5_1)
_gemv_q8_0 = _make_gemv32(TQ8_0)


def _ir_scale_pair(builder, scp, i0, i1):
    """<16 x i16>: the int32 scale scp[i0] for the first 8 pairs (values 0-15), scp[i1] for the rest."""
    s0 = builder.trunc(builder.load(builder.gep(scp, [ir.Constant(_I32, i0)])), _I16)
    s1 = builder.trunc(builder.load(builder.gep(scp, [ir.Constant(_I32, i1)])), _I16)
    v = ir.Constant(_vt(_I16, 16), ir.Undefined)
    for ll in range(16):
        v = builder.insert_element(v, s0 if ll < 8 else s1, ir.Constant(_I32, ll))
    return v


def _make_lanes_k(t):
    """One K-quant super-block: the 8 int32 lanes of ggml's AVX2 ``sumi`` (sub-block scales from
    ``sc[so:]``), as a tuple; Q6_K without its -32 offset term."""

    @intrinsic
    def lanes(typingctx, w, o, a, ao, sc, so):
        sig = types.UniTuple(types.int32, 8)(w, types.intp, a, types.intp, sc, types.intp)

        def codegen(context, builder, signature, args):
            wp = builder.gep(context.make_array(signature.args[0])(context, builder, args[0]).data, [args[1]])
            ap = builder.gep(context.make_array(signature.args[2])(context, builder, args[2]).data, [args[3]])
            scp = builder.gep(context.make_array(signature.args[4])(context, builder, args[4]).data, [args[5]])
            v8, v8i = _vt(_I8, 32), _vt(_I32, 8)

            def c8(x):
                return ir.Constant(v8, [x] * 32)

            def ld(off):
                return _load_bytes(builder, builder.gep(wp, [ir.Constant(_I32, off)]), 32)

            def scale_vec(i0, i1):
                return _ir_scale_pair(builder, scp, i0, i1)

            total = ir.Constant(v8i, [0] * 8)
            chunks = []
            if t in (TQ4_K, TQ5_K):
                qs0 = 16 if t == TQ4_K else 48
                for sb in range(8):
                    q = ld(qs0 + (sb >> 1) * 32)
                    q = builder.and_(builder.lshr(q, c8(4 * (sb & 1))), c8(15))
                    if t == TQ5_K:
                        h = builder.and_(builder.lshr(ld(16), c8(sb)), c8(1))
                        q = builder.or_(q, builder.shl(h, c8(4)))
                    chunks.append((q, sb * 32, sb, sb))
            else:  # Q6_K
                for h in range(2):
                    qh = ld(128 + h * 32)
                    for g in range(4):
                        q = builder.and_(builder.lshr(ld(h * 64 + (32 if g & 1 else 0)), c8(4 * (g >> 1))), c8(15))
                        hb = builder.and_(builder.lshr(qh, c8(2 * g)), c8(3))
                        q = builder.or_(q, builder.shl(hb, c8(4)))
                        sidx = h * 8 + g * 2
                        chunks.append((q, (h * 4 + g) * 32, sidx, sidx + 1))
            for q, aoff, s0, s1 in chunks:
                y = _load_bytes(builder, builder.gep(ap, [ir.Constant(_I32, aoff)]), 32)
                total = builder.add(total, _quad_sums(builder, q, y, 32, signed=False, scales16=scale_vec(s0, s1)))
            vals = [builder.extract_element(total, ir.Constant(_I32, ll)) for ll in range(8)]
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    return lanes


_lanes_q4_k = _make_lanes_k(TQ4_K)
_lanes_q5_k = _make_lanes_k(TQ5_K)
_lanes_q6_k = _make_lanes_k(TQ6_K)


def _has_fast_half() -> bool:
    """Whether LLVM converts F16 in one instruction here (x86 with F16C, or ARM64)."""
    import platform

    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except Exception:  # pragma: no cover
        return False


#: the ggml-AVX2-order kernels above are used when F16 converts natively
FAST_ROWS = _has_fast_half()

# ---------------------------------------------------------------------------------------------
# half precision (ggml's conversions, bit for bit)

_TO_INF = F32(2.0 ** 112)
_TO_ZERO = F32(2.0 ** -110)
_HALF_SUBNORMAL = F32(2.0 ** -24)


@njit
def _h2f_soft(h):
    """IEEE half (an integer 0..65535) to float32, in integer operations."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == 0:
        v = F32(m) * _HALF_SUBNORMAL
        return -v if sign else v
    if e == 31:
        return _u32_as_f32(sign | np.uint32(0x7F800000) | (m << np.uint32(13)))
    return _u32_as_f32(sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13)))


@intrinsic
def _h2f_hw(typingctx, h):
    """Half bits to float32 by LLVM's ``fpext`` (one instruction with F16C or on ARM64)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _f2h_hw(typingctx, f):
    """float32 to half bits by LLVM's ``fptrunc`` (round to nearest even; one instruction with F16C)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@njit
def _h2f(h):
    """IEEE half (an integer 0..65535) to float32: the hardware conversion where it is one
    instruction, except for infinities and NaNs (their payloads kept as :func:`_h2f_soft` keeps them)."""
    if FAST_ROWS and (np.uint32(h) & np.uint32(0x7C00)) != np.uint32(0x7C00):
        return _h2f_hw(np.uint16(h))
    return _h2f_soft(h)


@njit
def _hb(b, o):
    """The half stored little-endian at bytes ``o``, ``o + 1`` of uint8 array ``b``, as float32."""
    return _h2f(np.uint32(b[o]) | (np.uint32(b[o + 1]) << np.uint32(8)))


@njit
def _f2h(f):
    """float32 to IEEE half bits, round to nearest even (ggml's GGML_FP32_TO_FP16); NaN -> sign | 0x7E00:
    the hardware conversion where it is one instruction, :func:`_f2h_soft` for NaN."""
    if FAST_ROWS and (_f32_bits(f) & np.uint32(0x7FFFFFFF)) <= np.uint32(0x7F800000):
        return _f2h_hw(f)
    return _f2h_soft(f)


@njit
def _f2h_soft(f):
    """:func:`_f2h` in float and integer operations (the FP16 library's, as ggml's scalar code)."""
    base = (abs(f) * _TO_INF) * _TO_ZERO
    w = _f32_bits(f)
    shl1_w = (w + w) & np.uint32(0xFFFFFFFF)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    if bias < np.uint32(0x71000000):
        bias = np.uint32(0x71000000)
    base = _u32_as_f32((bias >> np.uint32(1)) + np.uint32(0x07800000)) + base
    bits = _f32_bits(base)
    exp_bits = (bits >> np.uint32(13)) & np.uint32(0x00007C00)
    mantissa_bits = bits & np.uint32(0x00000FFF)
    nonsign = exp_bits + mantissa_bits
    if shl1_w > np.uint32(0xFF000000):
        nonsign = np.uint32(0x7E00)
    return np.uint16((sign >> np.uint32(16)) | nonsign)


@njit
def _round_h(f):
    return _h2f(_f2h(f))


@njit
def _round_bf16(f):
    i = _f32_bits(f)
    if (i & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return _u32_as_f32(((i >> np.uint32(16)) | np.uint32(64)) << np.uint32(16))
    r = ((i + (np.uint32(0x7FFF) + ((i >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)) << np.uint32(16)
    return _u32_as_f32(r & np.uint32(0xFFFFFFFF))


# ---------------------------------------------------------------------------------------------
# ggml's vectorized expf (ARM optimized-routines), one lane at a time

_E_R = F32(float.fromhex("0x1.8p23"))
_E_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_E_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_E_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_E_C1 = F32(float.fromhex("0x1.0e4020p-7"))
_E_C2 = F32(float.fromhex("0x1.573e2ep-5"))
_E_C3 = F32(float.fromhex("0x1.555e66p-3"))
_E_C4 = F32(float.fromhex("0x1.fffdb6p-2"))
_E_C5 = F32(float.fromhex("0x1.ffffecp-1"))
_ONE_BITS = np.uint32(0x3F800000)


@njit
def _v_expf(x):
    z = _fma(x, _E_LOG2E, _E_R)
    n = z - _E_R
    b = _fma(-n, _E_LN2_LO, _fma(-n, _E_LN2_HI, x))
    e = (_f32_bits(z) << np.uint32(23)) & np.uint32(0xFFFFFFFF)
    k = _u32_as_f32((e + _ONE_BITS) & np.uint32(0xFFFFFFFF))
    u = b * b
    j = _fma(_fma(_fma(_E_C1, b, _E_C2), u, _fma(_E_C3, b, _E_C4)), u, _E_C5 * b)
    an = abs(n)
    if not an > F32(126.0):
        return _fma(j, k, k)
    g = np.uint32(0x82000000) if n <= F32(0.0) else np.uint32(0)
    s1 = _u32_as_f32((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF))
    s2 = _u32_as_f32((e - g) & np.uint32(0xFFFFFFFF))
    if an > F32(192.0):
        return s1 * s1
    return _fma(s2, j, s2) * s1


# ---------------------------------------------------------------------------------------------
# attention inner loops over a KV row (F16 bits or float32), as vectors: the same lanes, the same
# fused multiply-adds in the same order as the scalar loops they replace (F16 widened by fpext)


def _load_row_f(builder, ptr, is_half, n):
    """<n x float> from ``ptr`` (i16 F16 bits or float)."""
    if is_half:
        h = builder.load(builder.bitcast(ptr, _vt(ir.HalfType(), n).as_pointer()), align=2)
        return builder.fpext(h, _vt(_FLT, n))
    return builder.load(builder.bitcast(ptr, _vt(_FLT, n).as_pointer()), align=4)


def _make_lanes_fma(nl):
    """lanes[l] = sum over chunks c of src[off + c*nl + l] * q[c*nl + l], one fused multiply-add per
    chunk and lane from zero (the scalar ``lanes[e % nl] = fma(src[off + e], q[e], lanes[e % nl])``
    over e < n, n a multiple of nl)."""

    @intrinsic
    def lanes_fma(typingctx, src, off, q, n, lanes):
        sig = types.void(src, types.intp, q, types.intp, lanes)
        is_half = src.dtype == types.uint16

        def codegen(context, builder, signature, args):
            sp = context.make_array(signature.args[0])(context, builder, args[0]).data
            qp = context.make_array(signature.args[2])(context, builder, args[2]).data
            lp = context.make_array(signature.args[4])(context, builder, args[4]).data
            vt = _vt(_FLT, nl)
            acc_p = cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * nl))
            step = ir.Constant(args[1].type, nl)
            with cgutils.for_range(builder, builder.sdiv(args[3], step)) as loop:
                e = builder.mul(loop.index, step)
                kv = _load_row_f(builder, builder.gep(sp, [builder.add(args[1], e)]), is_half, nl)
                qv = builder.load(builder.bitcast(builder.gep(qp, [e]), vt.as_pointer()), align=4)
                builder.store(_ir_fma(builder, kv, qv, builder.load(acc_p)), acc_p)
            builder.store(builder.load(acc_p), builder.bitcast(lp, vt.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_fma


_lanes_fma8 = _make_lanes_fma(8)
_lanes_fma32 = _make_lanes_fma(32)


@intrinsic
def _axpy_row(typingctx, src, off, p, acc, aoff, n):
    """acc[aoff + e] = fma(src[off + e], p, acc[aoff + e]) for e < n (src F16 bits or float32)."""
    sig = types.void(src, types.intp, types.float32, acc, types.intp, types.intp)
    is_half = src.dtype == types.uint16

    def codegen(context, builder, signature, args):
        sp = context.make_array(signature.args[0])(context, builder, args[0]).data
        ap = context.make_array(signature.args[3])(context, builder, args[3]).data
        vt = _vt(_FLT, 8)
        pv = _ir_splat_f(builder, args[2], 8)
        eight = ir.Constant(args[1].type, 8)
        n8 = builder.sdiv(args[5], eight)
        with cgutils.for_range(builder, n8) as loop:
            e = builder.mul(loop.index, eight)
            vv = _load_row_f(builder, builder.gep(sp, [builder.add(args[1], e)]), is_half, 8)
            aptr = builder.bitcast(builder.gep(ap, [builder.add(args[4], e)]), vt.as_pointer())
            builder.store(_ir_fma(builder, vv, pv, builder.load(aptr, align=4)), aptr, align=4)
        with cgutils.for_range(builder, builder.sub(args[5], builder.mul(n8, eight))) as loop:
            e = builder.add(builder.mul(n8, eight), loop.index)
            vv = _load_row_f(builder, builder.gep(sp, [builder.add(args[1], e)]), is_half, 1)
            aptr = builder.bitcast(builder.gep(ap, [builder.add(args[4], e)]), _vt(_FLT, 1).as_pointer())
            builder.store(_ir_fma(builder, vv, _ir_splat_f(builder, args[2], 1), builder.load(aptr, align=4)), aptr,
                          align=4)
        return context.get_dummy_value()

    return sig, codegen


def _ir_sum8x8(builder, vs):
    """Eight <8 x i32> -> one <8 x i32> of their lane totals (pairwise adds of even and odd lanes:
    phaddd's pattern; exact integers, so any order)."""
    def pair(a, b):
        ev = _shuf(builder, a, b, [0, 2, 4, 6, 8, 10, 12, 14])
        od = _shuf(builder, a, b, [1, 3, 5, 7, 9, 11, 13, 15])
        return builder.add(ev, od)

    # pair(v0, v1) = [v0's 4 pair sums, v1's]; the next round gives halves, the last totals in lane order
    p = [pair(vs[0], vs[1]), pair(vs[2], vs[3]), pair(vs[4], vs[5]), pair(vs[6], vs[7])]
    q = [pair(p[0], p[1]), pair(p[2], p[3])]
    return pair(q[0], q[1])


@intrinsic
def _lanes_fma8_x4(typingctx, src, off, stride, q, n, lanes):
    """:data:`_lanes_fma8` for four rows of ``src`` at once (at off + r * stride, r < 4) into
    lanes[8r:8r + 8]: four independent chains of fused multiply-adds overlap instead of waiting on
    one (each row's lanes exactly as alone)."""
    sig = types.void(src, types.intp, types.intp, q, types.intp, lanes)
    is_half = src.dtype == types.uint16

    def codegen(context, builder, signature, args):
        sp = context.make_array(signature.args[0])(context, builder, args[0]).data
        qp = context.make_array(signature.args[3])(context, builder, args[3]).data
        lp = context.make_array(signature.args[5])(context, builder, args[5]).data
        vt = _vt(_FLT, 8)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * 8)) for _ in range(4)]
        offs = [builder.add(args[1], builder.mul(args[2], ir.Constant(args[2].type, r))) for r in range(4)]
        step = ir.Constant(args[1].type, 8)
        with cgutils.for_range(builder, builder.sdiv(args[4], step)) as loop:
            e = builder.mul(loop.index, step)
            qv = builder.load(builder.bitcast(builder.gep(qp, [e]), vt.as_pointer()), align=4)
            for r in range(4):
                kv = _load_row_f(builder, builder.gep(sp, [builder.add(offs[r], e)]), is_half, 8)
                builder.store(_ir_fma(builder, kv, qv, builder.load(accs[r])), accs[r])
        for r in range(4):
            dst = builder.bitcast(builder.gep(lp, [ir.Constant(_I32, 8 * r)]), vt.as_pointer())
            builder.store(builder.load(accs[r]), dst, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _lanes_q6_k_dec(typingctx, qd, qo, a, ao, sc, so):
    """:data:`_lanes_q6_k` from a block already decoded to its 256 six-bit values (bytes at qd[qo:],
    in activation order): the same integer lanes without the bit unpacking."""
    sig = types.UniTuple(types.int32, 8)(qd, types.intp, a, types.intp, sc, types.intp)

    def codegen(context, builder, signature, args):
        qp = builder.gep(context.make_array(signature.args[0])(context, builder, args[0]).data, [args[1]])
        ap = builder.gep(context.make_array(signature.args[2])(context, builder, args[2]).data, [args[3]])
        scp = builder.gep(context.make_array(signature.args[4])(context, builder, args[4]).data, [args[5]])
        v8i = _vt(_I32, 8)

        total = ir.Constant(v8i, [0] * 8)
        for c in range(8):
            q = _load_bytes(builder, builder.gep(qp, [ir.Constant(_I32, 32 * c)]), 32)
            y = _load_bytes(builder, builder.gep(ap, [ir.Constant(_I32, 32 * c)]), 32)
            total = builder.add(total, _quad_sums(builder, q, y, 32, signed=False, scales16=_ir_scale_pair(builder, scp, 2 * c, 2 * c + 1)))
        vals = [builder.extract_element(total, ir.Constant(_I32, ll)) for ll in range(8)]
        return context.make_tuple(builder, signature.return_type, vals)

    return sig, codegen


@intrinsic
def _q6_k_rows4(typingctx, qd, w, a, ad, bs, i0, nsb):
    """A Q6_K row (decoded six-bit values ``qd`` from :func:`_decode_q6_k_row`, its raw bytes ``w``
    for the scales) times activation rows i0 .. i0 + 3 of the 2-D Q8_K ``a`` / ``ad`` / ``bs``, as a
    tuple of four floats in the order of llama.cpp's tiled K-quant GEMM (8 or more rows; native's
    tile_q6_K_tiled): per block the exact integer total s1, then buf += (d * s1) * d8, fused, the
    four rows as the four lanes of one vector step; each block's values and scales loaded once."""
    sig = types.UniTuple(types.float32, 4)(qd, w, a, ad, bs, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        qp = context.make_array(signature.args[0])(context, builder, args[0]).data
        wp = context.make_array(signature.args[1])(context, builder, args[1]).data
        i0, nsb = args[5], args[6]
        it = i0.type
        v4f, v4i, v8i, v16s, v16i = _vt(_FLT, 4), _vt(_I32, 4), _vt(_I32, 8), _vt(_I16, 16), _vt(_I32, 16)
        rows = [builder.add(i0, ir.Constant(it, r)) for r in range(4)]
        acc = cgutils.alloca_once_value(builder, ir.Constant(v4f, [0.0] * 4))
        thirty2 = ir.Constant(v8i, [32] * 8)
        with cgutils.for_range(builder, nsb) as loop:
            b = loop.index
            qb = builder.gep(qp, [builder.mul(b, ir.Constant(it, 256))])
            wb = builder.gep(wp, [builder.mul(b, ir.Constant(it, 210))])
            sc8 = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, 192)]), 16)
            sc16 = builder.sext(sc8, v16s)
            sc32 = builder.sext(sc8, v16i)
            scales = [_shuf(builder, sc16, sc16, [2 * c] * 8 + [2 * c + 1] * 8) for c in range(8)]
            qs = [_load_bytes(builder, builder.gep(qb, [ir.Constant(_I32, 32 * c)]), 32) for c in range(8)]
            dh = _ir_h2f(builder, builder.gep(wb, [ir.Constant(_I32, 208)]))
            s1 = ir.Constant(v4i, ir.Undefined)
            d8 = ir.Constant(v4f, ir.Undefined)
            for r in range(4):
                ap = _row_ptr(context, builder, signature.args[2], args[2], rows[r], builder.mul(b, ir.Constant(it, 256)))
                total = ir.Constant(v8i, [0] * 8)
                for c in range(8):
                    y = _load_bytes(builder, builder.gep(ap, [ir.Constant(_I32, 32 * c)]), 32)
                    total = builder.add(total, _quad_sums(builder, qs[c], y, 32, signed=False, scales16=scales[c]))
                bp = _row_ptr(context, builder, signature.args[4], args[4], rows[r], builder.mul(b, ir.Constant(it, 16)))
                prod = builder.mul(builder.load(builder.bitcast(bp, v16i.as_pointer()), align=4), sc32)
                corr = builder.add(_shuf(builder, prod, prod, list(range(0, 16, 2))),
                                   _shuf(builder, prod, prod, list(range(1, 16, 2))))
                lanes = builder.sub(total, builder.mul(thirty2, corr))
                tot = builder.extract_element(lanes, ir.Constant(_I32, 0))
                for ll in range(1, 8):  # an exact integer total: any order
                    tot = builder.add(tot, builder.extract_element(lanes, ir.Constant(_I32, ll)))
                s1 = builder.insert_element(s1, tot, ir.Constant(_I32, r))
                dp = _row_ptr(context, builder, signature.args[3], args[3], rows[r], b)
                d8 = builder.insert_element(d8, builder.load(builder.bitcast(dp, _FLT.as_pointer()), align=4),
                                            ir.Constant(_I32, r))
            res = builder.fmul(_ir_splat_f(builder, dh, 4), builder.sitofp(s1, v4f))
            builder.store(_ir_fma(builder, res, d8, builder.load(acc)), acc)
        out = builder.load(acc)
        vals = [builder.extract_element(out, ir.Constant(_I32, r)) for r in range(4)]
        return context.make_tuple(builder, signature.return_type, vals)

    return sig, codegen


@intrinsic
def _q4_k_rows4(typingctx, w, sm, hdm, a, ad, bs, i0, nsb):
    """A Q4_K row (raw bytes ``w``; its scales and mins ``sm`` [nsb, 16] and F16 scale and min
    ``hdm`` [nsb, 2] from :func:`_q4_k_row_scales`) times activation rows i0 .. i0 + 3 of the 2-D
    Q8_K ``a`` / ``ad`` / ``bs``: four floats in the order of llama.cpp's repacked Q4_K GEMM (per
    block and 64-value quarter j: acc += s1_j * (d * d8), accm += s2_j * (dmin * d8), fused; result
    acc - accm), each row summed exactly as alone; the four rows' float steps are one vector step
    and each block's nibbles are unpacked once for them."""
    sig = types.UniTuple(types.float32, 4)(w, sm, hdm, a, ad, bs, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        wp = context.make_array(signature.args[0])(context, builder, args[0]).data
        smp = context.make_array(signature.args[1])(context, builder, args[1]).data
        hdp = context.make_array(signature.args[2])(context, builder, args[2]).data
        i0, nsb = args[6], args[7]
        it = i0.type
        v8, v8i, v4f, v16i = _vt(_I8, 32), _vt(_I32, 8), _vt(_FLT, 4), _vt(_I32, 16)
        rows = [builder.add(i0, ir.Constant(it, r)) for r in range(4)]
        acc_p = cgutils.alloca_once_value(builder, ir.Constant(v4f, [0.0] * 4))
        accm_p = cgutils.alloca_once_value(builder, ir.Constant(v4f, [0.0] * 4))
        with cgutils.for_range(builder, nsb) as loop:
            b = loop.index
            wb = builder.gep(wp, [builder.mul(b, ir.Constant(it, 144))])
            scp = builder.gep(smp, [builder.mul(b, ir.Constant(it, 16))])
            nibs = []
            for j in range(4):
                q = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, 16 + 32 * j)]), 32)
                for half in range(2):
                    nibs.append(builder.and_(builder.lshr(q, ir.Constant(v8, [4 * half] * 32)), ir.Constant(v8, [15] * 32)))
            sc = [_ir_scale_pair(builder, scp, s, s) for s in range(8)]
            mins = builder.load(builder.bitcast(builder.gep(scp, [ir.Constant(_I32, 8)]), v8i.as_pointer()), align=4)
            quarters, minsums = [], []
            for r in range(4):
                ap = _row_ptr(context, builder, signature.args[3], args[3], rows[r], builder.mul(b, ir.Constant(it, 256)))
                m = [_quad_sums(builder, nibs[s], _load_bytes(builder, builder.gep(ap, [ir.Constant(_I32, 32 * s)]), 32),
                                32, signed=False, scales16=sc[s]) for s in range(8)]
                quarters += [builder.add(m[2 * j], m[2 * j + 1]) for j in range(4)]
                bp = _row_ptr(context, builder, signature.args[5], args[5], rows[r], builder.mul(b, ir.Constant(it, 16)))
                b16 = builder.load(builder.bitcast(bp, v16i.as_pointer()), align=4)
                bpair = builder.add(_shuf(builder, b16, b16, list(range(0, 16, 2))), _shuf(builder, b16, b16, list(range(1, 16, 2))))
                pm = builder.mul(bpair, mins)
                minsums.append(builder.add(_shuf(builder, pm, pm, [0, 2, 4, 6]), _shuf(builder, pm, pm, [1, 3, 5, 7])))
            t01 = _ir_sum8x8(builder, quarters[:8])  # lanes: row 0's quarters 0-3, row 1's
            t23 = _ir_sum8x8(builder, quarters[8:])
            u01 = _shuf(builder, minsums[0], minsums[1], range(8))
            u23 = _shuf(builder, minsums[2], minsums[3], range(8))
            d8 = ir.Constant(v4f, ir.Undefined)
            for r in range(4):
                dp = _row_ptr(context, builder, signature.args[4], args[4], rows[r], b)
                d8 = builder.insert_element(d8, builder.load(builder.bitcast(dp, _FLT.as_pointer()), align=4),
                                            ir.Constant(_I32, r))
            hb = builder.gep(hdp, [builder.mul(b, ir.Constant(it, 2))])
            dd = builder.fmul(_ir_splat_f(builder, builder.load(hb), 4), d8)
            dm = builder.fmul(_ir_splat_f(builder, builder.load(builder.gep(hb, [ir.Constant(_I32, 1)])), 4), d8)
            acc, accm = builder.load(acc_p), builder.load(accm_p)
            for j in range(4):
                s1 = builder.sitofp(_shuf(builder, t01, t23, [j, 4 + j, 8 + j, 12 + j]), v4f)
                s2 = builder.sitofp(_shuf(builder, u01, u23, [j, 4 + j, 8 + j, 12 + j]), v4f)
                acc = _ir_fma(builder, s1, dd, acc)
                accm = _ir_fma(builder, s2, dm, accm)
            builder.store(acc, acc_p)
            builder.store(accm, accm_p)
        res = builder.fsub(builder.load(acc_p), builder.load(accm_p))
        vals = [builder.extract_element(res, ir.Constant(_I32, r)) for r in range(4)]
        return context.make_tuple(builder, signature.return_type, vals)

    return sig, codegen
