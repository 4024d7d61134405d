"""The Numba backend: the whole op set as ``@njit(parallel=True, cache=True)`` kernels, the portable
fast path where the C kernels (``llmedge._native``) are not built.

What it owns: quantized matrix products the llama.cpp way (activations quantized on the fly to the
weight type's partner Q8_0 / Q8_1 / Q8_K with ggml's x86 rounding, exactly as :mod:`llmedge.quant`
does it, then integer dot products per block, scaled in float32), row gather (embeddings) equal
to the NumPy dequantizers bit for bit, RMS norm, RoPE, attention over an F16/F32 cache, SiLU/GELU
gated products, softmax, add, scale and soft-cap. Weights stay in their GGUF blocks (a read-only
view into the model's memory map); the kernels decode the blocks themselves.

The block dot products are small LLVM vector intrinsics written with
``numba.extending.intrinsic`` (LLVM fully unrolls Numba's 32-iteration block loops into scalar
code, so the inner work is emitted as vector IR directly). For Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
Q5_K and Q6_K they follow ggml's AVX2 ``vec_dot`` kernels: integer products summed in 8 lanes of
four values (``pmaddubsw``/``pmaddwd`` on x86 with AVX2, plain vector IR elsewhere), one fused
multiply-add per lane and block, llama.cpp's final horizontal sums, so on an AVX2 CPU the decode
products equal llama.cpp's bit for bit (prompts too, except where llama.cpp switches Q5_K and Q6_K
to its tiled kernels from 8 rows). Q4_K products take llama.cpp's kernel choice and order per
product, as the native backend does: with a multiple of 8 weight rows its repacked GEMV order, and
for prompts of more than 3 rows its repacked GEMM order (and that kernel's Q8_K sign rule) on the
first n - n % 4 rows; else from 8 rows its tiled order. Q2_K, Q3_K, IQ4_NL and IQ4_XS are
summed per block in ggml's generic order (a few float32 ulps from llama.cpp's SIMD kernels); F32,
F16 and BF16 weights in double. Float ops follow llama.cpp's CPU arithmetic on an AVX2 machine as
the native backend does, bit for bit: ggml's vectorized ``expf`` (SiLU, softmax), the fused
multiply-adds of its RoPE and GELU table, double sums in RMS norm and softmax, and the summation
orders of its attention without flash attention (ggml's ``vec_dot`` order for one query row,
llamafile's for several).

Compiled kernels are cached on disk: in ``$NUMBA_CACHE_DIR`` when set, else in
``<user cache>/llmedge/numba``. :meth:`NumbaBackend.warmup` compiles (or loads) every kernel once
and :attr:`NumbaBackend.compile_seconds` says how long that took.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import ClassVar

import numpy as np


def _cache_dir() -> str:
    try:
        import platformdirs

        root = platformdirs.user_cache_dir("llmedge")
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        root = os.path.join(os.path.expanduser("~"), ".cache", "llmedge")
    return os.path.join(root, "numba")


if not os.environ.get("NUMBA_CACHE_DIR"):
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir()

import numba  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic, overload  # noqa: E402

if not numba.config.CACHE_DIR:  # numba was imported before this module set the variable
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

from llmedge.backends.base import GluKind  # noqa: E402
from llmedge.backends.base import as_f32c as _f32c  # noqa: E402
from llmedge.backends.base import out_array as _out  # noqa: E402
from llmedge.backends.cpu import physical_cores  # noqa: E402
from llmedge.errors import LlmedgeError  # noqa: E402
from llmedge.gguf import TensorInfo  # noqa: E402
from llmedge.quant import GGMLQuantizationType as T  # noqa: E402
from llmedge.quant import row_nbytes  # noqa: E402

F32 = np.float32
I32 = np.int32

# GGML type ids as plain ints (numba compares them as constants)
TF32, TF16, TQ4_0, TQ4_1, TQ5_0, TQ5_1, TQ8_0 = 0, 1, 2, 3, 6, 7, 8
TQ2_K, TQ3_K, TQ4_K, TQ5_K, TQ6_K, TIQ4_NL, TIQ4_XS, TBF16 = 10, 11, 12, 13, 14, 20, 23, 30

#: every weight type the backend multiplies and gathers
SUPPORTED = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
                       T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS})
_Q8_0_FAMILY = (TQ4_0, TQ5_0, TQ8_0, TIQ4_NL)
_Q8_1_FAMILY = (TQ4_1, TQ5_1)
_Q8_K_FAMILY = (TQ2_K, TQ3_K, TQ4_K, TQ5_K, TQ6_K, TIQ4_XS)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)

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


def _vt(t, n):
    return ir.VectorType(t, n)


def _shuf(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(_vt(_I32, len(idx)), list(idx)))


def _quad_sums(builder, x8, y8, n, signed=True, scales16=None):
    """<n x i8> x, y -> <n/4 x i32>: lane l = sum of x[e] * y[e] for e in 4l..4l+3 (times the i16
    ``scales16`` of the pairs when given). On x86 with AVX2 this is ggml's own instruction sequence
    (psign, pmaddubsw, pmaddwd); elsewhere plain vector IR. ``signed``: x may be negative."""
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


def _make_rowdot32(t):
    bsz, qo, has_min, five, sub = _BLOCK32[t]

    @intrinsic
    def rowdot(typingctx, w, a, ad, asm, nb):
        sig = types.float32(w, a, ad, asm, types.intp)

        def codegen(context, builder, signature, args):
            wp = context.make_array(signature.args[0])(context, builder, args[0]).data
            ap = context.make_array(signature.args[1])(context, builder, args[1]).data
            adp = context.make_array(signature.args[2])(context, builder, args[2]).data
            asp = context.make_array(signature.args[3])(context, builder, args[3]).data
            v8f = _vt(_FLT, 8)
            acc_p = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
            sm_p = cgutils.alloca_once_value(builder, ir.Constant(_FLT, 0.0))
            with cgutils.for_range(builder, args[4]) as loop:
                b = loop.index
                wb = builder.gep(wp, [builder.mul(b, ir.Constant(b.type, bsz))])
                if t == TQ8_0:
                    qx = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, qo)]), 32)
                else:
                    qx = _ir_nibbles32(builder, builder.gep(wb, [ir.Constant(_I32, qo)]))
                    if five:
                        qx = builder.or_(qx, _ir_hbits32(builder, builder.gep(wb, [ir.Constant(_I32, qo - 4)])))
                    if sub:
                        qx = builder.sub(qx, ir.Constant(_vt(_I8, 32), [sub] * 32))
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

        return sig, codegen

    return rowdot


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
                if t == TQ8_0:
                    qx = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, qo)]), 32)
                else:
                    qx = _ir_nibbles32(builder, builder.gep(wb, [ir.Constant(_I32, qo)]))
                    if five:
                        qx = builder.or_(qx, _ir_hbits32(builder, builder.gep(wb, [ir.Constant(_I32, qo - 4)])))
                    if sub:
                        qx = builder.sub(qx, ir.Constant(_vt(_I8, 32), [sub] * 32))
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
                    if t == TQ8_0:
                        qx = _load_bytes(builder, builder.gep(wb, [ir.Constant(_I32, qo)]), 32)
                    else:
                        qx = _ir_nibbles32(builder, builder.gep(wb, [ir.Constant(_I32, qo)]))
                        if five:
                            qx = builder.or_(qx, _ir_hbits32(builder, builder.gep(wb, [ir.Constant(_I32, qo - 4)])))
                        if sub:
                            qx = builder.sub(qx, ir.Constant(_vt(_I8, 32), [sub] * 32))
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


_rowdot_w4 = {t: _make_rowdot32_w4(t) for t in _BLOCK32}
_rowdotw4_q8_0, _rowdotw4_q4_0, _rowdotw4_q5_0 = _rowdot_w4[TQ8_0], _rowdot_w4[TQ4_0], _rowdot_w4[TQ5_0]
_rowdotw4_q4_1, _rowdotw4_q5_1 = _rowdot_w4[TQ4_1], _rowdot_w4[TQ5_1]
_rowdot4 = {t: _make_rowdot32_x4(t) for t in _BLOCK32}
_rowdot4_q8_0, _rowdot4_q4_0, _rowdot4_q5_0 = _rowdot4[TQ8_0], _rowdot4[TQ4_0], _rowdot4[TQ5_0]
_rowdot4_q4_1, _rowdot4_q5_1 = _rowdot4[TQ4_1], _rowdot4[TQ5_1]
_rowdot_q8_0 = _make_rowdot32(TQ8_0)
_rowdot_q4_0 = _make_rowdot32(TQ4_0)
_rowdot_q5_0 = _make_rowdot32(TQ5_0)
_rowdot_q4_1 = _make_rowdot32(TQ4_1)
_rowdot_q5_1 = _make_rowdot32(TQ5_1)


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
                """<16 x i16>: scale i0 for the first 8 pairs (values 0-15), i1 for the rest."""
                s0 = builder.trunc(builder.load(builder.gep(scp, [ir.Constant(_I32, i0)])), _I16)
                s1 = builder.trunc(builder.load(builder.gep(scp, [ir.Constant(_I32, i1)])), _I16)
                v = ir.Constant(_vt(_I16, 16), ir.Undefined)
                for ll in range(16):
                    v = builder.insert_element(v, s0 if ll < 8 else s1, ir.Constant(_I32, ll))
                return v

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
def _h2f(h):
    """IEEE half (an integer 0..65535) to float32."""
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


@njit
def _hb(b, o):
    """The half stored little-endian at bytes ``o``, ``o + 1`` of uint8 array ``b``, as float32."""
    return _h2f(np.uint32(b[o]) | (np.uint32(b[o + 1]) << np.uint32(8)))


@njit
def _f2h(f):
    """float32 to IEEE half bits, round to nearest even (ggml's GGML_FP32_TO_FP16); NaN -> 0x7E00."""
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
# activation quantizers (llmedge.quant's x86 variant: id = 127/amax, round half to even)


@njit
def _quant_q8_block(x, i, o, aq, with_sum):
    """Quantize x[i, o:o+32] into aq[i, o:o+32]; return (d as stored f16 -> f32, s as stored f16 -> f32, int sum)."""
    amax = F32(0.0)
    for e in range(32):
        v = abs(x[i, o + e])
        if v > amax:
            amax = v
    d = amax / F32(127.0)
    inv = F32(127.0) / amax if amax != F32(0.0) else F32(0.0)
    s = 0
    for e in range(32):
        q = np.rint(x[i, o + e] * inv)
        qi = int(q)
        aq[i, o + e] = qi
        s += qi
    s16 = _round_h(F32(s) * d) if with_sum else F32(0.0)
    return _round_h(d), s16, s


@njit
def _quant_q8_k_block(x, i, o, aq, bs, bo, r8=False):
    """Quantize x[i, o:o+256] to Q8_K: returns d; 16 block sums into bs[i, bo:bo+16]. ``r8``: the
    scale's sign as llama.cpp's repacked Q4_K GEMM picks it (ggml_quantize_mat_q8_K_4x8: positive
    when +amax occurs in the block, else negative) instead of the first value of largest magnitude."""
    amax = F32(0.0)
    mx = F32(0.0)
    for e in range(256):
        v = abs(x[i, o + e])
        if v > amax:
            amax = v
            mx = x[i, o + e]
    if r8:
        mx = -amax
        for e in range(256):
            if x[i, o + e] == amax:
                mx = amax
                break
    if amax == F32(0.0):
        for e in range(256):
            aq[i, o + e] = 0
        for g in range(16):
            bs[i, bo + g] = 0
        return F32(0.0)
    iscale = F32(-127.0) / mx
    for g in range(16):
        s = 0
        for e in range(16):
            q = int(np.rint(x[i, o + g * 16 + e] * iscale))
            if q > 127:
                q = 127
            aq[i, o + g * 16 + e] = q
            s += q
        bs[i, bo + g] = s
    return F32(1.0) / iscale


@njit(cache=True)
def _quantize_q8_0(x, aq, ad, asum):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 32):
            d, _, s = _quant_q8_block(x, i, b * 32, aq, False)
            ad[i, b] = d
            asum[i, b] = s


@njit(cache=True)
def _quantize_q8_1(x, aq, ad, asm):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 32):
            d, s16, _ = _quant_q8_block(x, i, b * 32, aq, True)
            ad[i, b] = d
            asm[i, b] = s16


@njit(cache=True)
def _quantize_q8_k(x, aq, ad, bs):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 256):
            ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16)


# ---------------------------------------------------------------------------------------------
# block dot products: one weight row (uint8 / int8 views of its bytes) times one activation row


@njit
def _u(b, o):
    """Byte ``o`` of uint8 array ``b`` as int64 (numba types uint8-with-int64 arithmetic as float64)."""
    return np.int64(b[o])


@njit
def _row_q8_0_family(t, wu, wi, aq, ad, asum, nb):
    if FAST_ROWS:
        if t == TQ8_0:
            return _rowdot_q8_0(wu, aq, ad, ad, nb)
        if t == TQ4_0:
            return _rowdot_q4_0(wu, aq, ad, ad, nb)
        if t == TQ5_0:
            return _rowdot_q5_0(wu, aq, ad, ad, nb)
    sumf = F32(0.0)
    if t == TQ8_0:
        for b in range(nb):
            o = b * 34
            isum = _dot_ss32(wi, o + 2, aq, b * 32)
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    elif t == TQ4_0:
        for b in range(nb):
            o = b * 18
            isum = _dot_nib32(wu, o + 2, aq, b * 32) - 8 * asum[b]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    elif t == TQ5_0:
        for b in range(nb):
            o = b * 22
            isum = _dot_q5_32(wu, o + 2, o + 6, aq, b * 32) - 16 * asum[b]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    else:  # IQ4_NL
        for b in range(nb):
            o = b * 18
            isum = 0
            for e in range(16):
                q = _u(wu, o + 2 + e)
                isum += KVALUES_IQ4NL[q & 15] * aq[b * 32 + e] + KVALUES_IQ4NL[q >> 4] * aq[b * 32 + 16 + e]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    return sumf


@njit
def _row_q8_1_family(t, wu, aq, ad, asm, nb):
    if FAST_ROWS:
        if t == TQ4_1:
            return _rowdot_q4_1(wu, aq, ad, asm, nb)
        return _rowdot_q5_1(wu, aq, ad, asm, nb)
    sumf = F32(0.0)
    if t == TQ4_1:
        for b in range(nb):
            o = b * 20
            isum = _dot_nib32(wu, o + 4, aq, b * 32)
            sumf += (_hb(wu, o) * ad[b]) * F32(isum) + _hb(wu, o + 2) * asm[b]
    else:  # Q5_1
        for b in range(nb):
            o = b * 24
            isum = _dot_q5_32(wu, o + 4, o + 8, aq, b * 32)
            sumf += (_hb(wu, o) * ad[b]) * F32(isum) + _hb(wu, o + 2) * asm[b]
    return sumf


@njit
def _k_scale_min(wu, so, sb):
    """6-bit scale and min of sub-block ``sb`` of a Q4_K/Q5_K block whose scales start at ``so``."""
    if sb < 4:
        return _u(wu, so + sb) & 63, _u(wu, so + 4 + sb) & 63
    s = sb - 4
    sc = (_u(wu, so + 8 + s) & 15) | ((_u(wu, so + s) >> 6) << 4)
    mn = (_u(wu, so + 8 + s) >> 4) | ((_u(wu, so + 4 + s) >> 6) << 4)
    return sc, mn


@njit
def _q3_k_scale(wu, so, i):
    lo = (_u(wu, so + i) & 15) if i < 8 else (_u(wu, so + i - 8) >> 4)
    hi = (_u(wu, so + 8 + (i & 3)) >> (2 * (i >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit
def _row_q8_k_family(t, wu, wi, aq, ad, bs, nsb):
    sumf = F32(0.0)
    for b in range(nsb):
        ab = b * 256
        bb = b * 16
        if t == TQ4_K:
            o = b * 144
            isum = 0
            summ = 0
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                isub = _dot_f1_32(wu, o + 16 + (sb >> 1) * 32, (sb & 1) * 4, 15, 0, 0, 0, 0, aq, ab + sb * 32)
                isum += sc * isub
                summ += mn * (bs[bb + 2 * sb] + bs[bb + 2 * sb + 1])
            da = ad[b]
            sumf += (_hb(wu, o) * da) * F32(isum) - (_hb(wu, o + 2) * da) * F32(summ)
        elif t == TQ6_K:
            o = b * 210
            isum = 0
            for h in range(2):
                for g in range(4):
                    for half in range(2):
                        sidx = h * 8 + g * 2 + half
                        lo = o + h * 64 + (32 if (g & 1) else 0) + half * 16
                        ho = o + 128 + h * 32 + half * 16
                        isub = _dot_f2_16(wu, lo, 4 * (g >> 1), 15, ho, 2 * g, 3, 4, aq, ab + sidx * 16)
                        isum += wi[o + 192 + sidx] * (isub - 32 * bs[bb + sidx])
            sumf += (_hb(wu, o + 208) * ad[b]) * F32(isum)
        elif t == TQ5_K:
            o = b * 176
            isum = 0
            summ = 0
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                isub = _dot_f2_32(wu, o + 48 + (sb >> 1) * 32, (sb & 1) * 4, 15, o + 16, sb, 1, 4, aq, ab + sb * 32)
                isum += sc * isub
                summ += mn * (bs[bb + 2 * sb] + bs[bb + 2 * sb + 1])
            da = ad[b]
            sumf += (_hb(wu, o) * da) * F32(isum) - (_hb(wu, o + 2) * da) * F32(summ)
        elif t == TQ2_K:
            o = b * 84
            isum = 0
            summ = 0
            for i in range(16):
                sc = _u(wu, o + i)
                qo = o + 16 + (i >> 3) * 32 + (i & 1) * 16
                isub = _dot_f1_16(wu, qo, 2 * ((i & 7) >> 1), 3, 0, 0, 0, 0, aq, ab + i * 16)
                isum += (sc & 15) * isub
                summ += (sc >> 4) * bs[bb + i]
            da = ad[b]
            sumf += (_hb(wu, o + 80) * da) * F32(isum) - (_hb(wu, o + 82) * da) * F32(summ)
        elif t == TQ3_K:
            o = b * 110
            isum = 0
            for i in range(16):
                qo = o + 32 + (i >> 3) * 32 + (i & 1) * 16
                isub = _dot_f2_16(wu, qo, 2 * ((i & 7) >> 1), 3, o + (i & 1) * 16, i >> 1, 1, 2, aq, ab + i * 16)
                isum += _q3_k_scale(wu, o + 96, i) * (isub - 4 * bs[bb + i])
            sumf += (_hb(wu, o + 108) * ad[b]) * F32(isum)
        else:  # IQ4_XS
            o = b * 136
            sh = np.int64(_u(wu, o + 2)) | (np.int64(_u(wu, o + 3)) << 8)
            isum = 0
            for sb in range(8):
                ls = ((_u(wu, o + 4 + (sb >> 1)) >> (4 * (sb & 1))) & 15) | (((sh >> (2 * sb)) & 3) << 4)
                qo = o + 8 + sb * 16
                ao = ab + sb * 32
                isub = 0
                for e in range(16):
                    q = _u(wu, qo + e)
                    isub += KVALUES_IQ4NL[q & 15] * aq[ao + e] + KVALUES_IQ4NL[q >> 4] * aq[ao + 16 + e]
                isum += (ls - 32) * isub
            sumf += (_hb(wu, o) * ad[b]) * F32(isum)
    return sumf


@njit
def _row_k_fast(t, wu, wi, aq, ad, bs, nsb, scb):
    """Q4_K / Q5_K / Q6_K times Q8_K in ggml's AVX2 order (8 float lanes, llama.cpp's final sums)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = F32(0.0)
    m0 = m1 = m2 = m3 = F32(0.0)
    summs = F32(0.0)
    for b in range(nsb):
        ab = b * 256
        bb = b * 16
        if t == TQ6_K:
            o = b * 210
            for i in range(16):
                scb[i] = wi[o + 192 + i]
            l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q6_k(wu, o, aq, ab, scb, 0)
            d = ad[b] * _hb(wu, o + 208)
            a0 = _fma(d, F32(l0 - 32 * (bs[bb + 0] * scb[0] + bs[bb + 1] * scb[1])), a0)
            a1 = _fma(d, F32(l1 - 32 * (bs[bb + 2] * scb[2] + bs[bb + 3] * scb[3])), a1)
            a2 = _fma(d, F32(l2 - 32 * (bs[bb + 4] * scb[4] + bs[bb + 5] * scb[5])), a2)
            a3 = _fma(d, F32(l3 - 32 * (bs[bb + 6] * scb[6] + bs[bb + 7] * scb[7])), a3)
            a4 = _fma(d, F32(l4 - 32 * (bs[bb + 8] * scb[8] + bs[bb + 9] * scb[9])), a4)
            a5 = _fma(d, F32(l5 - 32 * (bs[bb + 10] * scb[10] + bs[bb + 11] * scb[11])), a5)
            a6 = _fma(d, F32(l6 - 32 * (bs[bb + 12] * scb[12] + bs[bb + 13] * scb[13])), a6)
            a7 = _fma(d, F32(l7 - 32 * (bs[bb + 14] * scb[14] + bs[bb + 15] * scb[15])), a7)
        else:
            o = b * (144 if t == TQ4_K else 176)
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                scb[sb] = sc
                scb[8 + sb] = mn
            if t == TQ4_K:
                l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q4_k(wu, o, aq, ab, scb, 0)
            else:
                l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q5_k(wu, o, aq, ab, scb, 0)
            d = ad[b] * _hb(wu, o)
            dmin = (-ad[b]) * _hb(wu, o + 2)
            a0 = _fma(d, F32(l0), a0)
            a1 = _fma(d, F32(l1), a1)
            a2 = _fma(d, F32(l2), a2)
            a3 = _fma(d, F32(l3), a3)
            a4 = _fma(d, F32(l4), a4)
            a5 = _fma(d, F32(l5), a5)
            a6 = _fma(d, F32(l6), a6)
            a7 = _fma(d, F32(l7), a7)
            p0 = scb[8] * (bs[bb] + bs[bb + 1]) + scb[9] * (bs[bb + 2] + bs[bb + 3])
            p1 = scb[10] * (bs[bb + 4] + bs[bb + 5]) + scb[11] * (bs[bb + 6] + bs[bb + 7])
            p2 = scb[12] * (bs[bb + 8] + bs[bb + 9]) + scb[13] * (bs[bb + 10] + bs[bb + 11])
            p3 = scb[14] * (bs[bb + 12] + bs[bb + 13]) + scb[15] * (bs[bb + 14] + bs[bb + 15])
            if t == TQ4_K:
                m0 = _fma(dmin, F32(p0), m0)
                m1 = _fma(dmin, F32(p1), m1)
                m2 = _fma(dmin, F32(p2), m2)
                m3 = _fma(dmin, F32(p3), m3)
            else:
                summs = _fma(dmin, F32(p0 + p1 + p2 + p3), summs)
    r = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))
    if t == TQ4_K:
        return r + ((m0 + m2) + (m1 + m3))
    if t == TQ5_K:
        return r + summs
    return r


@njit
def _q4_k_ints(wu, o, aq, ab, bs, bb, scb):
    """Exact integer totals of one Q4_K block times Q8_K: (scale * q.a, min * bsums); scales and
    mins left in ``scb[0:8]`` and ``scb[8:16]``."""
    for sb in range(8):
        sc, mn = _k_scale_min(wu, o + 4, sb)
        scb[sb] = sc
        scb[8 + sb] = mn
    l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q4_k(wu, o, aq, ab, scb, 0)
    s1 = np.int64(l0) + l1 + l2 + l3 + l4 + l5 + l6 + l7
    s2 = np.int64(0)
    for sb in range(8):
        s2 += scb[8 + sb] * (np.int64(bs[bb + 2 * sb]) + bs[bb + 2 * sb + 1])
    return s1, s2


@njit
def _row_q4_k_r8(wu, aq, ad, bs, nsb, scb):
    """Q4_K in the order of llama.cpp's repacked (q4_K_8x8) GEMV: per block
    acc += s1 * (d * d8), accm += s2 * (dmin * d8), fused; result acc - accm."""
    acc = F32(0.0)
    accm = F32(0.0)
    for b in range(nsb):
        o = b * 144
        s1, s2 = _q4_k_ints(wu, o, aq, b * 256, bs, b * 16, scb)
        acc = _fma(F32(s1), _hb(wu, o) * ad[b], acc)
        accm = _fma(F32(s2), _hb(wu, o + 2) * ad[b], accm)
    return acc - accm


@njit
def _row_q4_k_r8_gemm(wu, aq, ad, bs, nsb, scb):
    """Q4_K in the order of llama.cpp's repacked GEMM (activation rows in groups of 4): the
    fused multiply-adds of :func:`_row_q4_k_r8` once per 64-value quarter of each block."""
    acc = F32(0.0)
    accm = F32(0.0)
    for b in range(nsb):
        o = b * 144
        ab = b * 256
        bb = b * 16
        for sb in range(8):
            sc, mn = _k_scale_min(wu, o + 4, sb)
            scb[sb] = sc
            scb[8 + sb] = mn
        dd = _hb(wu, o) * ad[b]
        dm = _hb(wu, o + 2) * ad[b]
        for j in range(4):
            lo = _dot_f1_32(wu, o + 16 + j * 32, 0, 15, 0, 0, 0, 0, aq, ab + 64 * j)
            hi = _dot_f1_32(wu, o + 16 + j * 32, 4, 15, 0, 0, 0, 0, aq, ab + 64 * j + 32)
            s1 = scb[2 * j] * np.int64(lo) + scb[2 * j + 1] * np.int64(hi)
            s2 = (scb[8 + 2 * j] * (np.int64(bs[bb + 4 * j]) + bs[bb + 4 * j + 1])
                  + scb[9 + 2 * j] * (np.int64(bs[bb + 4 * j + 2]) + bs[bb + 4 * j + 3]))
            acc = _fma(F32(s1), dd, acc)
            accm = _fma(F32(s2), dm, accm)
    return acc - accm


@njit
def _row_q4_k_tiled(wu, aq, ad, bs, nsb, scb):
    """Q4_K in the order of llama.cpp's tiled K-quant GEMM (8 or more rows, weights not repacked):
    r = d * s1 - dmin * s2 (fused), buf += r * d8 (fused)."""
    buf = F32(0.0)
    for b in range(nsb):
        o = b * 144
        s1, s2 = _q4_k_ints(wu, o, aq, b * 256, bs, b * 16, scb)
        r = _fma(-_hb(wu, o + 2), F32(s2), _hb(wu, o) * F32(s1))
        buf = _fma(r, ad[b], buf)
    return buf


# ---------------------------------------------------------------------------------------------
# matrix products: x [n, k] float32 times weight rows [m, row bytes] -> out [n, m]


@njit(parallel=True, cache=True)
def _mm_q8_0(x, wu, wi, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nb = k // 32
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nb), np.float32)
    asum = np.empty((n, nb), np.int32)
    if n >= 8:
        for i in prange(n):
            for b in range(nb):
                d, _, s = _quant_q8_block(x, i, b * 32, aq, False)
                ad[i, b] = d
                asum[i, b] = s
    else:
        _quantize_q8_0(x, aq, ad, asum)
    n4 = n - n % 4 if FAST_ROWS and t != TIQ4_NL else 0
    if n < 4 and FAST_ROWS and t != TIQ4_NL and m >= 4:
        # decode: four weight rows per step (the same per-row sums as the one-row kernel)
        m4 = m // 4
        for j4 in prange(m4):
            j = 4 * j4
            for i in range(n):
                if t == TQ8_0:
                    r0, r1, r2, r3 = _rowdotw4_q8_0(wu, j, aq[i], ad[i], ad[i], nb)
                elif t == TQ4_0:
                    r0, r1, r2, r3 = _rowdotw4_q4_0(wu, j, aq[i], ad[i], ad[i], nb)
                else:
                    r0, r1, r2, r3 = _rowdotw4_q5_0(wu, j, aq[i], ad[i], ad[i], nb)
                out[i, j] = r0
                out[i, j + 1] = r1
                out[i, j + 2] = r2
                out[i, j + 3] = r3
        for j in range(4 * m4, m):
            for i in range(n):
                out[i, j] = _row_q8_0_family(t, wu[j], wi[j], aq[i], ad[i], asum[i], nb)
        return
    for j in prange(m):
        wr = wu[j]
        wir = wi[j]
        for i in range(0, n4, 4):
            if t == TQ8_0:
                r0, r1, r2, r3 = _rowdot4_q8_0(wr, aq, ad, ad, i, nb)
            elif t == TQ4_0:
                r0, r1, r2, r3 = _rowdot4_q4_0(wr, aq, ad, ad, i, nb)
            else:
                r0, r1, r2, r3 = _rowdot4_q5_0(wr, aq, ad, ad, i, nb)
            out[i, j] = r0
            out[i + 1, j] = r1
            out[i + 2, j] = r2
            out[i + 3, j] = r3
        for i in range(n4, n):
            out[i, j] = _row_q8_0_family(t, wr, wir, aq[i], ad[i], asum[i], nb)


@njit(parallel=True, cache=True)
def _mm_q8_1(x, wu, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nb = k // 32
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nb), np.float32)
    asm = np.empty((n, nb), np.float32)
    if n >= 8:
        for i in prange(n):
            for b in range(nb):
                d, s16, _ = _quant_q8_block(x, i, b * 32, aq, True)
                ad[i, b] = d
                asm[i, b] = s16
    else:
        _quantize_q8_1(x, aq, ad, asm)
    n4 = n - n % 4 if FAST_ROWS else 0
    if n < 4 and FAST_ROWS and m >= 4:
        # decode: four weight rows per step (the same per-row sums as the one-row kernel)
        m4 = m // 4
        for j4 in prange(m4):
            j = 4 * j4
            for i in range(n):
                if t == TQ4_1:
                    r0, r1, r2, r3 = _rowdotw4_q4_1(wu, j, aq[i], ad[i], asm[i], nb)
                else:
                    r0, r1, r2, r3 = _rowdotw4_q5_1(wu, j, aq[i], ad[i], asm[i], nb)
                out[i, j] = r0
                out[i, j + 1] = r1
                out[i, j + 2] = r2
                out[i, j + 3] = r3
        for j in range(4 * m4, m):
            for i in range(n):
                out[i, j] = _row_q8_1_family(t, wu[j], aq[i], ad[i], asm[i], nb)
        return
    for j in prange(m):
        wr = wu[j]
        for i in range(0, n4, 4):
            if t == TQ4_1:
                r0, r1, r2, r3 = _rowdot4_q4_1(wr, aq, ad, asm, i, nb)
            else:
                r0, r1, r2, r3 = _rowdot4_q5_1(wr, aq, ad, asm, i, nb)
            out[i, j] = r0
            out[i + 1, j] = r1
            out[i + 2, j] = r2
            out[i + 3, j] = r3
        for i in range(n4, n):
            out[i, j] = _row_q8_1_family(t, wr, aq[i], ad[i], asm[i], nb)


@njit(parallel=True, cache=True)
def _mm_q8_k(x, wu, wi, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nsb = k // 256
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nsb), np.float32)
    bs = np.empty((n, k // 16), np.int32)
    if n >= 8:
        for i in prange(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16)
    else:
        _quantize_q8_k(x, aq, ad, bs)
    nc = min(m, 128)
    fast = FAST_ROWS and (t == TQ4_K or t == TQ5_K or t == TQ6_K)
    for c in prange(nc):
        scb = np.empty(16, np.int32)
        for j in range(c * m // nc, (c + 1) * m // nc):
            wr = wu[j]
            wir = wi[j]
            for i in range(n):
                if fast:
                    out[i, j] = _row_k_fast(t, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                else:
                    out[i, j] = _row_q8_k_family(t, wr, wir, aq[i], ad[i], bs[i], nsb)


@njit(parallel=True, cache=True)
def _mm_q4_k(x, wu, wi, out):
    """Q4_K with llama.cpp's choice of kernel per product (as ``lle_matmul_impl`` makes it): with a
    multiple of 8 weight rows the repacked order, its GEMM (and its activation quantizer) for the
    first n - n % 4 rows when n > 3 and its GEMV for the rest; else from 8 rows the tiled order;
    else ggml's AVX2 vec_dot."""
    n, k = x.shape
    m = wu.shape[0]
    nsb = k // 256
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nsb), np.float32)
    bs = np.empty((n, k // 16), np.int32)
    r8 = m % 8 == 0
    n_head = n - n % 4 if r8 and n > 3 else 0
    mode = 1 if r8 else (2 if n >= 8 else 0)
    if n >= 8:
        for i in prange(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16, i < n_head)
    else:
        for i in range(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16, i < n_head)
    nc = min(m, 128)
    for c in prange(nc):
        scb = np.empty(16, np.int32)
        for j in range(c * m // nc, (c + 1) * m // nc):
            wr = wu[j]
            wir = wi[j]
            for i in range(n):
                if mode == 1:
                    if i < n_head:
                        out[i, j] = _row_q4_k_r8_gemm(wr, aq[i], ad[i], bs[i], nsb, scb)
                    else:
                        out[i, j] = _row_q4_k_r8(wr, aq[i], ad[i], bs[i], nsb, scb)
                elif mode == 2:
                    out[i, j] = _row_q4_k_tiled(wr, aq[i], ad[i], bs[i], nsb, scb)
                elif FAST_ROWS:
                    out[i, j] = _row_k_fast(TQ4_K, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                else:
                    out[i, j] = _row_q8_k_family(TQ4_K, wr, wir, aq[i], ad[i], bs[i], nsb)


@njit(parallel=True, cache=True)
def _mm_f32(x, w, out):
    """F32 weights: float32 products summed in double (ggml's generic F32 dot)."""
    n, k = x.shape
    m = w.shape[0]
    for j in prange(m):
        for i in range(n):
            s = 0.0
            for e in range(k):
                s += np.float64(x[i, e] * w[j, e])
            out[i, j] = F32(s)


@njit(parallel=True, cache=True)
def _mm_half(x, w, bf16, out):
    """F16 / BF16 weights (uint16 bits): activations rounded to the weight type, products summed in double."""
    n, k = x.shape
    m = w.shape[0]
    xr = np.empty((n, k), np.float32)
    for i in range(n):
        for e in range(k):
            xr[i, e] = _round_bf16(x[i, e]) if bf16 else _round_h(x[i, e])
    for j in prange(m):
        for i in range(n):
            s = 0.0
            for e in range(k):
                wv = _u32_as_f32(np.uint32(w[j, e]) << np.uint32(16)) if bf16 else _h2f(w[j, e])
                s += np.float64(wv * xr[i, e])
            out[i, j] = F32(s)


# ---------------------------------------------------------------------------------------------
# dequantization of whole rows (get_rows), bit-exact with llmedge.quant.dequantize


@njit
def _dequant_row(t, wu, wi, y):
    k = y.shape[0]
    if t == TQ8_0:
        for b in range(k // 32):
            o = b * 34
            d = _hb(wu, o)
            for e in range(32):
                y[b * 32 + e] = d * F32(wi[o + 2 + e])
    elif t == TQ4_0 or t == TIQ4_NL:
        for b in range(k // 32):
            o = b * 18
            d = _hb(wu, o)
            for e in range(16):
                q = _u(wu, o + 2 + e)
                if t == TQ4_0:
                    y[b * 32 + e] = d * F32(np.int32(q & 15) - 8)
                    y[b * 32 + 16 + e] = d * F32(np.int32(q >> 4) - 8)
                else:
                    y[b * 32 + e] = d * F32(KVALUES_IQ4NL[q & 15])
                    y[b * 32 + 16 + e] = d * F32(KVALUES_IQ4NL[q >> 4])
    elif t == TQ4_1:
        for b in range(k // 32):
            o = b * 20
            d = _hb(wu, o)
            mn = _hb(wu, o + 2)
            for e in range(16):
                q = _u(wu, o + 4 + e)
                y[b * 32 + e] = d * F32(q & 15) + mn
                y[b * 32 + 16 + e] = d * F32(q >> 4) + mn
    elif t == TQ5_0 or t == TQ5_1:
        bsz = 22 if t == TQ5_0 else 24
        ho = 2 if t == TQ5_0 else 4
        for b in range(k // 32):
            o = b * bsz
            d = _hb(wu, o)
            mn = _hb(wu, o + 2) if t == TQ5_1 else F32(0.0)
            qh = np.uint32(_u(wu, o + ho)) | (np.uint32(_u(wu, o + ho + 1)) << 8) | (np.uint32(_u(wu, o + ho + 2)) << 16) | \
                (np.uint32(_u(wu, o + ho + 3)) << 24)
            for e in range(32):
                q = _u(wu, o + ho + 4 + (e & 15))
                v = np.int32((q & 15) if e < 16 else (q >> 4)) | np.int32(((qh >> np.uint32(e)) & np.uint32(1)) << 4)
                if t == TQ5_0:
                    y[b * 32 + e] = d * F32(v - 16)
                else:
                    y[b * 32 + e] = d * F32(v) + mn
    elif t == TQ2_K:
        for b in range(k // 256):
            o = b * 84
            d = _hb(wu, o + 80)
            dmin = _hb(wu, o + 82)
            for i in range(16):
                sc = _u(wu, o + i)
                dl = d * F32(sc & 15)
                ml = dmin * F32(sc >> 4)
                qo = o + 16 + (i >> 3) * 32 + (i & 1) * 16
                sh = 2 * ((i & 7) >> 1)
                for e in range(16):
                    y[b * 256 + i * 16 + e] = dl * F32((_u(wu, qo + e) >> sh) & 3) - ml
    elif t == TQ3_K:
        for b in range(k // 256):
            o = b * 110
            d = _hb(wu, o + 108)
            for i in range(16):
                dl = d * F32(_q3_k_scale(wu, o + 96, i))
                qo = o + 32 + (i >> 3) * 32 + (i & 1) * 16
                sh = 2 * ((i & 7) >> 1)
                hb = i >> 1
                for e in range(16):
                    q = np.int32((_u(wu, qo + e) >> sh) & 3) + 4 * np.int32((_u(wu, o + (i & 1) * 16 + e) >> hb) & 1) - 4
                    y[b * 256 + i * 16 + e] = dl * F32(q)
    elif t == TQ4_K or t == TQ5_K:
        bsz = 144 if t == TQ4_K else 176
        qs = 16 if t == TQ4_K else 48
        for b in range(k // 256):
            o = b * bsz
            d = _hb(wu, o)
            dmin = _hb(wu, o + 2)
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                d1 = d * F32(sc)
                m1 = dmin * F32(mn)
                qo = o + qs + (sb >> 1) * 32
                sh = (sb & 1) * 4
                for e in range(32):
                    q = np.int32((_u(wu, qo + e) >> sh) & 15)
                    if t == TQ5_K:
                        q |= np.int32((_u(wu, o + 16 + e) >> sb) & 1) << 4
                    y[b * 256 + sb * 32 + e] = d1 * F32(q) - m1
    elif t == TQ6_K:
        for b in range(k // 256):
            o = b * 210
            d = _hb(wu, o + 208)
            for h in range(2):
                for g in range(4):
                    for half in range(2):
                        sidx = h * 8 + g * 2 + half
                        dl = d * F32(wi[o + 192 + sidx])
                        lo = o + h * 64 + (32 if (g & 1) else 0) + half * 16
                        ho = o + 128 + h * 32 + half * 16
                        ls = 4 * (g >> 1)
                        for e in range(16):
                            q = np.int32((_u(wu, lo + e) >> ls) & 15) | (np.int32((_u(wu, ho + e) >> (2 * g)) & 3) << 4)
                            y[b * 256 + sidx * 16 + e] = dl * F32(q - 32)
    elif t == TIQ4_XS:
        for b in range(k // 256):
            o = b * 136
            d = _hb(wu, o)
            sh = np.int64(_u(wu, o + 2)) | (np.int64(_u(wu, o + 3)) << 8)
            for sb in range(8):
                ls = ((_u(wu, o + 4 + (sb >> 1)) >> (4 * (sb & 1))) & 15) | (((sh >> (2 * sb)) & 3) << 4)
                dl = d * F32(ls - 32)
                for e in range(16):
                    q = _u(wu, o + 8 + sb * 16 + e)
                    y[b * 256 + sb * 32 + e] = dl * F32(KVALUES_IQ4NL[q & 15])
                    y[b * 256 + sb * 32 + 16 + e] = dl * F32(KVALUES_IQ4NL[q >> 4])
    elif t == TF16:
        for e in range(k):
            y[e] = _h2f(np.uint32(_u(wu, 2 * e)) | (np.uint32(_u(wu, 2 * e + 1)) << 8))
    elif t == TBF16:
        for e in range(k):
            y[e] = _u32_as_f32((np.uint32(_u(wu, 2 * e)) << 16) | (np.uint32(_u(wu, 2 * e + 1)) << 24))
    else:  # F32
        for e in range(k):
            y[e] = _u32_as_f32(np.uint32(_u(wu, 4 * e)) | (np.uint32(_u(wu, 4 * e + 1)) << 8) |
                               (np.uint32(_u(wu, 4 * e + 2)) << 16) | (np.uint32(_u(wu, 4 * e + 3)) << 24))


@njit(parallel=True, cache=True)
def _get_rows(wu, wi, t, ids, out):
    for r in prange(ids.shape[0]):
        _dequant_row(t, wu[ids[r]], wi[ids[r]], out[r])


# ---------------------------------------------------------------------------------------------
# float ops


@njit(cache=True)
def _rms_norm_rows(x, w, has_w, eps, out, r0, r1):
    d = x.shape[1]
    for r in range(r0, r1):
        s = 0.0
        for e in range(d):
            s += np.float64(x[r, e] * x[r, e])
        mean = F32(s / d)
        scale = F32(1.0) / np.sqrt(mean + eps)
        if has_w:
            for e in range(d):
                out[r, e] = (x[r, e] * scale) * w[e]
        else:
            for e in range(d):
                out[r, e] = x[r, e] * scale


@njit(parallel=True, cache=True)
def _rms_norm_par(x, w, has_w, eps, out):
    n = x.shape[0]
    nc = min(n, 64)
    for c in prange(nc):
        _rms_norm_rows(x, w, has_w, eps, out, c * n // nc, (c + 1) * n // nc)


@njit
def _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out, r0, r1):
    n_head, hd = x.shape[1], x.shape[2]
    half = n_rot // 2
    cache = np.empty(n_rot, np.float32)
    for r in range(r0, r1):
        theta = F32(pos[r])
        for i0 in range(0, n_rot, 2):
            f = ff[i0 // 2] if has_ff else F32(1.0)
            extrap = theta / f
            th = freq_scale * extrap
            if ext != F32(0.0):  # YaRN (ggml's rope_yarn): ramp between interpolated and extrapolated
                y = (F32(i0 // 2) - lo) / max(F32(0.001), hi - lo)
                mix = (F32(1.0) - min(F32(1.0), max(F32(0.0), y))) * ext
                th = th * (F32(1.0) - mix) + extrap * mix
            cache[i0] = F32(math.cos(th)) * mscale
            cache[i0 + 1] = F32(math.sin(th)) * mscale
            theta = theta * theta_scale
        for h in range(n_head):
            for i0 in range(0, n_rot, 2):
                a = i0 // 2 if neox else i0
                b = i0 // 2 + half if neox else i0 + 1
                x0 = x[r, h, a]
                x1 = x[r, h, b]
                c = cache[i0]
                s = cache[i0 + 1]
                out[r, h, a] = _fma(x0, c, -(x1 * s))
                out[r, h, b] = _fma(x0, s, x1 * c)
            for e in range(n_rot, hd):
                out[r, h, e] = x[r, h, e]


@njit(cache=True)
def _rope_ser(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out):
    _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out, 0, x.shape[0])


@njit(parallel=True, cache=True)
def _rope_par(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out):
    n = x.shape[0]
    nc = min(n, 64)
    for c in prange(nc):
        _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out,
                   c * n // nc, (c + 1) * n // nc)


_GELU_A = F32(0.044715)
_SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


@njit(cache=True)
def _build_gelu_table():
    """ggml's GELU lookup table: float32 values of the F16 results for every F16 input."""
    tab = np.empty(65536, np.float32)
    for i in range(65536):
        f = _h2f(i)
        inner = _fma(_GELU_A * f, f, F32(1.0))
        g = F32(0.5) * f * (F32(1.0) + math.tanh(_SQRT_2_OVER_PI * f * inner))
        tab[i] = _round_h(g)
    return tab


@njit
def _glu_range(g, u, kind, tab, out, i0, i1, n8):
    for i in range(i0, i1):
        x = g[i]
        if kind == 0:
            if i < n8:
                y = x / (F32(1.0) + _v_expf(F32(0.0) - x))
            else:
                y = x / (F32(1.0) + F32(math.exp(-x)))
            out[i] = y * u[i]
        elif x <= F32(-10.0):
            out[i] = F32(0.0)
        elif x >= F32(10.0):
            out[i] = x * u[i]
        else:
            out[i] = tab[_f2h(x)] * u[i]


@njit(cache=True)
def _glu_ser(g, u, kind, tab, out):
    n = g.shape[0]
    _glu_range(g, u, kind, tab, out, 0, n, n & ~7)


@njit(parallel=True, cache=True)
def _glu_par(g, u, kind, tab, out):
    n = g.shape[0]
    nc = (n + 4095) // 4096
    for c in prange(nc):
        _glu_range(g, u, kind, tab, out, c * 4096, min(n, (c + 1) * 4096), n & ~7)


@njit
def _hsum8(v, o):
    """llama.cpp's hsum of 8 lanes v[o:o+8]: ((4+0) + (6+2)) + ((5+1) + (7+3))."""
    r0 = v[o + 4] + v[o]
    r1 = v[o + 5] + v[o + 1]
    r2 = v[o + 6] + v[o + 2]
    r3 = v[o + 7] + v[o + 3]
    return (r0 + r2) + (r1 + r3)


@njit
def _reduce_ggml4(acc):
    """ggml's reduction of 4 accumulators of 8 lanes acc[0:32]: ((s0+s2)+(s1+s3)), lanes l+(l+4), two hadds."""
    t0 = F32(0.0)
    t1 = F32(0.0)
    t2 = F32(0.0)
    t3 = F32(0.0)
    for ll in range(4):
        xl = (acc[ll] + acc[16 + ll]) + (acc[8 + ll] + acc[24 + ll])
        xh = (acc[ll + 4] + acc[20 + ll]) + (acc[12 + ll] + acc[28 + ll])
        v = xl + xh
        if ll == 0:
            t0 = v
        elif ll == 1:
            t1 = v
        elif ll == 2:
            t2 = v
        else:
            t3 = v
    return (t0 + t1) + (t2 + t3)


def _kv(a, j, g, e):  # pragma: no cover - replaced by the overload below inside kernels
    raise NotImplementedError


@overload(_kv)
def _kv_impl(a, j, g, e):
    if a.dtype == types.uint16:
        return lambda a, j, g, e: _h2f(a[j, g, e])
    return lambda a, j, g, e: a[j, g, e]


@njit
def _attn_row(q, k, v, f16, i, h, group, qpos, kpos, scale, window, softcap, n, w, qc, acc, out):
    """One query row and head, llama.cpp's attention without flash-attention on AVX2 (see native)."""
    d = q.shape[2]
    t = k.shape[0]
    g = h // group
    tb_kq = n >= 2 and d % 8 == 0
    tb_kqv = n >= 2 and d % 4 == 0
    for e in range(d):
        qc[e] = _round_h(q[i, h, e]) if f16 else q[i, h, e]
    qp = qpos[i]
    inv_cap = F32(1.0) / softcap if softcap > F32(0.0) else F32(0.0)
    mx = -np.inf
    jlo = t
    jhi = -1
    lanes = acc[:32]
    for j in range(t):
        kp = kpos[j]
        if kp < 0 or kp > qp or (window > 0 and qp - kp >= window):
            w[j] = -np.inf
            continue
        if j < jlo:
            jlo = j
        jhi = j
        if tb_kq:
            for ll in range(8):
                lanes[ll] = F32(0.0)
            for e in range(d):
                lanes[e & 7] = _fma(_kv(k, j, g, e), qc[e], lanes[e & 7])
            s = _hsum8(lanes, 0)
        else:
            for ll in range(32):
                lanes[ll] = F32(0.0)
            np_ = d & ~31
            for e in range(np_):
                lanes[e & 31] = _fma(_kv(k, j, g, e), qc[e], lanes[e & 31])
            s = _reduce_ggml4(lanes)
            if np_ < d:
                if f16:
                    sd = np.float64(s)
                    for e in range(np_, d):
                        sd += np.float64(_kv(k, j, g, e) * qc[e])
                    s = F32(sd)
                else:
                    for e in range(np_, d):
                        s = _fma(_kv(k, j, g, e), qc[e], s)
        if softcap > F32(0.0):
            s = F32(math.tanh(s * inv_cap)) * softcap
        s = s * scale
        w[j] = s
        if s > mx:
            mx = s
    if jhi < 0:
        for e in range(d):
            out[i, h, e] = F32(0.0)
        return
    t8 = (t + 7) & ~7
    for j in range(t, t8):
        w[j] = -np.inf
    c0 = jlo & ~7
    c1 = (jhi + 8) & ~7
    mxf = F32(mx)
    total = 0.0
    for c in range(c0, c1, 8):
        for ll in range(8):
            w[c + ll] = _v_expf(w[c + ll] - mxf)
        total += np.float64(_hsum8(w, c))
    inv = F32(1.0 / total)
    for j in range(jlo, jhi + 1):
        p = w[j] * inv
        w[j] = _round_h(p) if f16 else p
    nl = 8 if tb_kqv else 32
    for ll in range(nl * d):
        acc[ll] = F32(0.0)
    for j in range(jlo, jhi + 1):
        p = w[j]
        if p == F32(0.0):
            continue
        base = (j % nl) * d
        for e in range(d):
            acc[base + e] = _fma(_kv(v, j, g, e), p, acc[base + e])
    for e in range(d):
        if nl == 8:
            r = ((acc[4 * d + e] + acc[e]) + (acc[6 * d + e] + acc[2 * d + e])) + \
                ((acc[5 * d + e] + acc[d + e]) + (acc[7 * d + e] + acc[3 * d + e]))
        else:
            t0 = F32(0.0)
            t1 = F32(0.0)
            t2 = F32(0.0)
            t3 = F32(0.0)
            for ll in range(4):
                xl = (acc[ll * d + e] + acc[(16 + ll) * d + e]) + (acc[(8 + ll) * d + e] + acc[(24 + ll) * d + e])
                xh = (acc[(ll + 4) * d + e] + acc[(20 + ll) * d + e]) + \
                    (acc[(12 + ll) * d + e] + acc[(28 + ll) * d + e])
                vv = xl + xh
                if ll == 0:
                    t0 = vv
                elif ll == 1:
                    t1 = vv
                elif ll == 2:
                    t2 = vv
                else:
                    t3 = vv
            r = (t0 + t1) + (t2 + t3)
        out[i, h, e] = r


@njit(parallel=True, cache=True)
def _attention(q, k, v, f16, qpos, kpos, scale, window, softcap, out):
    n, n_head, d = q.shape
    t = k.shape[0]
    group = n_head // k.shape[1]
    tasks = n * n_head
    nc = min(tasks, 256)
    for c in prange(nc):
        w = np.empty(((t + 7) & ~7) + 8, np.float32)
        qc = np.empty(d, np.float32)
        acc = np.empty(max(32 * d, 32), np.float32)
        for task in range(c * tasks // nc, (c + 1) * tasks // nc):
            _attn_row(q, k, v, f16, task // n_head, task % n_head, group, qpos, kpos, scale, window, softcap, n,
                      w, qc, acc, out)


@njit(cache=True)
def _softmax_rows(x, scale, out):
    n, d = x.shape
    for r in range(n):
        mx = -np.inf
        for e in range(d):
            out[r, e] = x[r, e] * scale
            if out[r, e] > mx:
                mx = out[r, e]
        mxf = F32(mx)
        total = 0.0
        d8 = d & ~7
        for c in range(0, d8, 8):
            for ll in range(8):
                out[r, c + ll] = _v_expf(out[r, c + ll] - mxf)
            total += np.float64(_hsum8(out[r], c))
        for e in range(d8, d):
            val = F32(math.exp(out[r, e] - mxf))
            total += np.float64(val)
            out[r, e] = val
        inv = F32(1.0 / total)
        for e in range(d):
            out[r, e] = out[r, e] * inv


@njit(cache=True)
def _softcap(x, cap, out):
    inv = F32(1.0) / cap
    for i in range(x.shape[0]):
        out[i] = F32(math.tanh(x[i] * inv)) * cap


# ---------------------------------------------------------------------------------------------
# the backend


class NumbaWeight:
    """A 2-D weight: read-only uint8 and int8 views of its GGUF rows, and its geometry."""

    __slots__ = ("name", "ggml_type", "m", "k", "shape", "u8", "i8", "f32", "u16")

    def __init__(self, tensor: TensorInfo) -> None:
        t = T(int(tensor.ggml_type))
        if t not in SUPPORTED:
            raise LlmedgeError(f"the numba backend has no kernels for {t.name} weights ({tensor.name})")
        self.name = tensor.name
        self.ggml_type = int(t)
        self.k = int(tensor.dims[0])
        self.m = tensor.n_elements // self.k if self.k else 0
        self.shape = (self.m, self.k)
        rb = row_nbytes(t, self.k)
        data = tensor.data
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        u8 = data.reshape(self.m, rb).view()
        u8.flags.writeable = False
        self.u8 = u8
        self.i8 = u8.view(np.int8)
        self.f32 = u8.view(np.float32) if t == T.F32 else None
        self.u16 = u8.view(np.uint16) if t in (T.F16, T.BF16) else None

    def __repr__(self) -> str:
        return f"NumbaWeight({self.name!r}, type={T(self.ggml_type).name}, shape={self.shape})"


_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_tls = threading.local()
_GELU_TABLE: np.ndarray | None = None
_EMPTY_F32 = np.zeros(1, np.float32)


def _gelu_table() -> np.ndarray:
    global _GELU_TABLE
    if _GELU_TABLE is None:
        _GELU_TABLE = _build_gelu_table()
    return _GELU_TABLE


class NumbaBackend:
    """:class:`llmedge.backends.base.Backend` on Numba kernels."""

    name = "numba"
    #: seconds spent compiling (or loading from the disk cache) kernels, summed over the process
    compile_seconds_total: ClassVar[float] = 0.0
    _warm: ClassVar[bool] = False

    def __init__(self, n_threads: int | None = None) -> None:
        n = int(n_threads) if n_threads else physical_cores()
        if n < 1:
            raise ValueError("n_threads must be at least 1")
        self.n_threads = min(n, numba.config.NUMBA_NUM_THREADS)
        self.compile_seconds = 0.0
        self.isa = _llvm_cpu()
        self._set_threads()

    # ------------------------------------------------------------------ setup

    def _set_threads(self) -> None:
        if getattr(_tls, "n", None) != self.n_threads:
            numba.set_num_threads(self.n_threads)
            _tls.n = self.n_threads

    def warmup(self) -> float:
        """Compile (or load from the disk cache) every kernel once; returns the seconds it took and
        records them in :attr:`compile_seconds`. Later calls in the same process cost nothing."""
        if NumbaBackend._warm:
            return self.compile_seconds
        t0 = time.perf_counter()
        self._set_threads()
        _gelu_table()
        rng = np.random.default_rng(0)
        for n in (1, 8):
            x = rng.standard_normal((n, 256), dtype=np.float32)
            for t in SUPPORTED:
                w = _random_weight(t, 33, 256, rng)
                self.matmul(x, w)
                self.get_rows(w, np.array([0, 32], np.int32))
            xn = rng.standard_normal((n, 2, 64), dtype=np.float32)
            self.rms_norm(xn, np.ones(64, np.float32), 1e-6)
            self.rope(xn, np.arange(n, dtype=np.int32), 64, 10000.0, 1.0, n == 1)
            g = rng.standard_normal((n, 64), dtype=np.float32)
            self.glu(g, g, "silu")
            self.glu(g, g, "gelu")
            self.softmax(g)
            for dt in (np.float16, np.float32):
                kv = rng.standard_normal((4, 1, 64)).astype(dt)
                self.attention(xn, kv, kv, np.arange(n, dtype=np.int32) + 3, np.arange(4, dtype=np.int32), 0.125)
                self.attention(xn, kv[:3], kv[:3], np.arange(n, dtype=np.int32) + 3, np.arange(3, dtype=np.int32),
                               0.125, window=2, softcap=30.0)
        self.softcap(g, 30.0)
        NumbaBackend._warm = True
        self.compile_seconds = time.perf_counter() - t0
        NumbaBackend.compile_seconds_total += self.compile_seconds
        return self.compile_seconds

    # ------------------------------------------------------------------ weights

    def prepare(self, tensor: TensorInfo) -> NumbaWeight | np.ndarray:
        if len(tensor.dims) == 1:
            from llmedge.quant import dequantize

            return np.ascontiguousarray(dequantize(tensor.data, tensor.ggml_type, tensor.shape), dtype=np.float32)
        return NumbaWeight(tensor)

    def matmul(self, x: np.ndarray, w: NumbaWeight, out: np.ndarray | None = None) -> np.ndarray:
        """``x`` [..., k] times the transposed weight: float32 [..., m]."""
        k = w.k
        if x.shape[-1] != k:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, {w.name} expects {k}")
        shape = x.shape[:-1] + (w.m,)
        x2 = _f32c(x).reshape(-1, k)
        o = _out(out, shape)
        o2 = o.reshape(-1, w.m)
        if x2.shape[0] == 0 or w.m == 0:
            return o
        self._set_threads()
        t = w.ggml_type
        if t in _Q8_0_FAMILY:
            _mm_q8_0(x2, w.u8, w.i8, t, o2)
        elif t in _Q8_1_FAMILY:
            _mm_q8_1(x2, w.u8, t, o2)
        elif t == TQ4_K:
            _mm_q4_k(x2, w.u8, w.i8, o2)
        elif t in _Q8_K_FAMILY:
            _mm_q8_k(x2, w.u8, w.i8, t, o2)
        elif t == TF32:
            _mm_f32(x2, w.f32, o2)
        else:
            _mm_half(x2, w.u16, t == TBF16, o2)
        return o

    def get_rows(self, w: NumbaWeight, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= w.m):
            raise IndexError(f"get_rows: id out of range for {w.name} with {w.m} rows")
        o = _out(out, (ids.size, w.k))
        if ids.size:
            self._set_threads()
            _get_rows(w.u8, w.i8, w.ggml_type, ids, o)
        return o

    # ------------------------------------------------------------------ float ops

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float,
                 out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        x2, o2 = x.reshape(-1, d), o.reshape(-1, d)
        wv = _EMPTY_F32 if weight is None else _f32c(weight).reshape(-1)
        if weight is not None and wv.size != d:
            raise ValueError(f"rms_norm: weight has {wv.size} values for rows of {d}")
        if x2.shape[0] * d >= 1 << 16:
            self._set_threads()
            _rms_norm_par(x2, wv, weight is not None, F32(eps), o2)
        else:
            _rms_norm_rows(x2, wv, weight is not None, F32(eps), o2, 0, x2.shape[0])
        return o

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool, freq_factors: np.ndarray | None = None,
             out: np.ndarray | None = None, attn_factor: float = 1.0, ext_factor: float = 0.0,
             corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        """Rotate ``x`` [n, heads, head_dim] at ``positions``; ``out`` may be ``x`` itself.
        ``freq_factors`` divide each pair's angle, ``ext_factor``/``corr_dims`` are YaRN's ramp,
        ``attn_factor`` scales cos and sin (ggml's rope_ext; YaRN's mscale folded in by the caller)."""
        x = _f32c(x)
        n = x.shape[0]
        pos = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)
        if pos.size != n:
            raise ValueError(f"rope: {pos.size} positions for {n} rows")
        if n_rot % 2 or n_rot > x.shape[2]:
            raise ValueError(f"rope: n_rot {n_rot} must be even and at most the head size {x.shape[2]}")
        o = _out(out, x.shape)
        theta_scale = F32(F32(freq_base) ** (F32(-2.0) / F32(n_rot)))
        ff = _EMPTY_F32 if freq_factors is None else _f32c(freq_factors).reshape(-1)
        args = (x, pos, int(n_rot), F32(freq_scale), theta_scale, bool(neox), ff, freq_factors is not None,
                F32(attn_factor), F32(ext_factor), F32(corr_dims[0]), F32(corr_dims[1]), o)
        if x.size >= 1 << 15:
            self._set_threads()
            _rope_par(*args)
        else:
            _rope_ser(*args)
        return o

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """See :meth:`llmedge.backends.base.Backend.attention` (llama.cpp's numerics without flash
        attention, as the native backend: Q and the probabilities rounded to F16 with an F16 cache)."""
        q = _f32c(q)
        n, n_head, d = q.shape
        if k.dtype != v.dtype or k.dtype not in (_F16, _F32):
            raise ValueError("attention: k and v must both be float16 or both float32")
        t, n_kv, dk = k.shape
        if v.shape != k.shape or dk != d:
            raise ValueError(f"attention: k {k.shape} / v {v.shape} do not match q head size {d}")
        if n_kv == 0 or n_head % n_kv:
            raise ValueError(f"attention: {n_head} query heads are not a multiple of {n_kv} kv heads")
        qp = np.ascontiguousarray(q_pos, dtype=np.int32).reshape(-1)
        kp = np.ascontiguousarray(k_pos, dtype=np.int32).reshape(-1)
        if qp.size != n or kp.size != t:
            raise ValueError("attention: q_pos / k_pos sizes do not match q / k")
        o = _out(out, (n, n_head, d))
        if t == 0:
            o[...] = 0
            return o
        f16 = k.dtype == _F16
        if f16:
            k, v = k.view(np.uint16), v.view(np.uint16)
        if not k.flags.c_contiguous:
            k = np.ascontiguousarray(k)
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        self._set_threads()
        _attention(q, k, v, f16, qp, kp, F32(scale), int(window or 0), F32(softcap or 0.0), o)
        return o

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind, out: np.ndarray | None = None) -> np.ndarray:
        """``act(gate) * up``: SiLU with ggml's vectorized expf, or GELU through ggml's F16 table."""
        gate, up = _f32c(gate), _f32c(up)
        if gate.shape != up.shape:
            raise ValueError(f"glu: gate {gate.shape} and up {up.shape} differ")
        if kind not in ("silu", "gelu"):
            raise ValueError(f"glu: unknown kind {kind!r}")
        o = _out(out, gate.shape)
        args = (gate.reshape(-1), up.reshape(-1), 0 if kind == "silu" else 1, _gelu_table(), o.reshape(-1))
        if gate.size >= 1 << 16:
            self._set_threads()
            _glu_par(*args)
        else:
            _glu_ser(*args)
        return o

    def softmax(self, x: np.ndarray, scale: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        _softmax_rows(x.reshape(-1, d), F32(scale), o.reshape(-1, d))
        return o

    def add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        a, b = _f32c(a), _f32c(b)
        if a.shape != b.shape:
            raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
        return np.add(a, b, out=_out(out, a.shape))

    def scale(self, x: np.ndarray, s: float, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        return np.multiply(x, F32(s), out=_out(out, x.shape))

    def softcap(self, x: np.ndarray, cap: float, out: np.ndarray | None = None) -> np.ndarray:
        """``tanh(x / cap) * cap`` (logit soft-capping)."""
        x = _f32c(x)
        o = _out(out, x.shape)
        _softcap(x.reshape(-1), F32(cap), o.reshape(-1))
        return o


def _llvm_cpu() -> str:
    """The CPU name LLVM compiles the kernels for (e.g. ``znver3``)."""
    try:
        import llvmlite.binding as llvm

        return str(llvm.get_host_cpu_name())
    except Exception:  # pragma: no cover - llvmlite always has it
        return ""


def _random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> NumbaWeight:
    """A small weight of type ``t`` with random bytes (finite scales), for warm-up compiles."""
    rb = row_nbytes(t, k)
    raw = rng.integers(0, 256, size=(m, rb), dtype=np.uint8)
    if t == T.F32:
        raw = rng.standard_normal((m, k), dtype=np.float32).view(np.uint8)
    elif t in (T.F16, T.BF16):
        raw = (rng.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        if t == T.F16:
            raw = rng.standard_normal((m, k)).astype(np.float16).view(np.uint8)
    info = TensorInfo(name=f"warmup.{t.name}", ggml_type=int(t), dims=(k, m), offset=0, n_bytes=raw.size,
                      _buffer=np.ascontiguousarray(raw).reshape(-1))
    return NumbaWeight(info)
