"""Products of a few float32 activation rows with GGUF block rows, unpacked in registers.

``block_product(x, data, out, fmt)`` computes ``out[n, o] = x[n] . W[o]`` for ``x`` float32
``[n, in]`` and ``W`` held as stored (``data`` uint8 ``[out, row bytes]``, the layouts of
runtime.gguf_blocks), for the formats ``q8_0``, ``q4_0``, ``q4_1``, ``q4_k`` and ``q6_k``.
No row is widened into memory: each 32-weight unit of a row is loaded once, its codes are
turned into four 8-lane float32 vectors in registers and multiplied into 8-lane accumulators.

Why explicit vectors: the same loops written with scalars (a block loop around a loop over
the 16-32 weights of a block) were vectorized by LLVM across *blocks* (strided byte gathers)
or not at all, 10-20x slower than the int8 per-row kernel on the same matrix. Here the vector
shapes are fixed in the generated LLVM IR (``<8 x float>``; 16- or 32-byte loads of codes,
shifted and masked as bytes, then ``sitofp``), so the machine code is the same whatever LLVM's
cost model prefers; LLVM lowers them to AVX2 on this machine and to pairs of SSE registers where
there is no AVX. Float16 scales are converted by the F16C instruction where the CPU has it
(:data:`HALF_IN_HARDWARE`), else by exact integer steps (:func:`_h2f`); both give the same value.

Arithmetic, per activation row ``x`` and weight row ``w`` (``u`` a 32-weight unit, ``c`` its
codes as float32, ``da``/``db`` the scales of its first/second 16 weights, ``mu`` its offset)::

    w[32u + i] = (da if i < 16 else db) * c[i] + mu
    x . w = sum_u (da * sum_{i<16} x c + db * sum_{i>=16} x c) + sum_u mu * sum_i x[32u + i]

Where ``da = db`` (every format but ``q6_k``) the unit's 32 products are summed first and then
scaled once: ``sum_u d * sum_i x c``.

``q8_0``: ``c`` = int8 codes, ``da = db = d``, ``mu = 0``; ``q4_0``: 4-bit codes minus 8, ``d``,
``mu = 0``; ``q4_1``: ``d``, ``mu = m``; ``q4_k``: ``da = db = d * sc``, ``mu = -dmin * mn``
(the unit's 6-bit scale and min); ``q6_k``: 6-bit codes minus 32, ``da, db = d * scale`` of its
two 16-weight groups, ``mu = 0``. The sums run in a fixed order (no reassociation flags; a
multiply-add is ``llvm.fmuladd``, fused where the machine has FMA), and every activation row
goes through the same sequence of operations whether it is alone or one of four rows sharing
the unpacked codes: a row's result does not depend on how many rows are in the product.
Results differ from a float64 product of the dequantized values by float32 rounding
(tests/unit/test_gguf_blocks.py checks them against gguf-py's ``gguf.quants.dequantize``).

Threads: ``parallel=True`` over tasks of 16 output rows, like runtime.backends.kernels; the
count follows the process's BLAS setting (runtime.backends.numba_threads).
"""

from __future__ import annotations

from . import numba_threads  # noqa: F401  (first: numba's thread count, before numba loads)

import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import intrinsic, models, register_model  # noqa: E402

from ..gguf_blocks import row_bytes  # noqa: E402  (the byte layout's one source)

F32 = np.float32
LANES = 8  # float32 lanes of one vector: an AVX2 register
UNIT = 32  # weights of one unit: a Q8_0/Q4_0/Q4_1 block, an eighth of a Q4_K/Q6_K block
_ROWS_PER_TASK = 16


class _F32x8(types.Type):
    """Eight float32 lanes held in one LLVM vector value (never boxed: compiled code only)."""

    def __init__(self) -> None:
        super().__init__(name="f32x8")


f32x8 = _F32x8()
_I32 = ir.IntType(32)
_VF = ir.VectorType(ir.FloatType(), LANES)
_VI32 = ir.VectorType(_I32, LANES)
_VI8 = ir.VectorType(ir.IntType(8), LANES)


@register_model(_F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:
        super().__init__(dmm, fe_type, _VF)


def _elem_ptr(context, builder, aty, aval, idx):
    """Pointer to element ``idx`` of a C-contiguous 1-D array (no bounds check: callers stay inside)."""
    a = context.make_array(aty)(context, builder, aval)
    return builder.gep(a.data, [idx])


def _load8(context, builder, aty, aval, idx, vty, align):
    p = _elem_ptr(context, builder, aty, aval, idx)
    return builder.load(builder.bitcast(p, vty.as_pointer()), align=align)


def _splat(builder, val, vty):
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(_VI32, [0] * LANES))


def _fmuladd(builder, a, b, c):
    name = f"llvm.fmuladd.v{LANES}f32"
    fn = builder.module.globals.get(name)
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), name=name)
    return builder.call(fn, [a, b, c])


@intrinsic
def _vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)
    return f32x8(), codegen


@intrinsic
def _vload(typingctx, arr, idx):
    """``arr[idx:idx + 8]`` of a float32 array."""
    def codegen(context, builder, sig, args):
        return _load8(context, builder, sig.args[0], args[0], args[1], _VF, 4)
    return f32x8(arr, types.intp), codegen


_VI8x32 = ir.VectorType(ir.IntType(8), 32)
_CODES4 = types.UniTuple(f32x8, 4)


def _bsplat(n, v):
    return ir.Constant(ir.VectorType(ir.IntType(8), n), [v] * n)


def _four(context, builder, sig, b32, signed):
    """32 byte codes ``<32 x i8>`` -> four float32 vectors (codes 0-7, 8-15, 16-23, 24-31)."""
    und = ir.Constant(_VI8x32, ir.Undefined)
    out = []
    for q in range(4):
        part = builder.shuffle_vector(b32, und, ir.Constant(_VI32, list(range(8 * q, 8 * q + 8))))
        wide = builder.sext(part, _VI32) if signed else builder.zext(part, _VI32)
        out.append(builder.sitofp(wide, _VF))
    return context.make_tuple(builder, sig.return_type, out)


def _lshr_bytes(builder, v, shift, n):
    """``v >> shift`` lane by lane for a ``<n x i8>`` ``v`` and an integer ``shift`` < 8."""
    sh = builder.trunc(shift, ir.IntType(8))
    shv = builder.insert_element(ir.Constant(v.type, ir.Undefined), sh, ir.Constant(_I32, 0))
    shv = builder.shuffle_vector(shv, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), [0] * n))
    return builder.lshr(v, shv)


@intrinsic
def _vi8x4(typingctx, arr, idx):
    """``float32(int8(arr[idx + l]))``, ``l < 32``, as four vectors (Q8_0's codes): each 8 bytes
    sign-extended to 32-bit lanes as they are loaded (one ``vpmovsxbd`` from memory)."""
    def codegen(context, builder, sig, args):
        out = []
        for q in range(4):
            idx = builder.add(args[1], ir.Constant(args[1].type, 8 * q))
            b = _load8(context, builder, sig.args[0], args[0], idx, _VI8, 1)
            out.append(builder.sitofp(builder.sext(b, _VI32), _VF))
        return context.make_tuple(builder, sig.return_type, out)
    return _CODES4(arr, types.intp), codegen


@intrinsic
def _vnib8x4(typingctx, arr, idx, bias):
    """The 32 4-bit codes of the 16 bytes at ``arr[idx]`` minus ``bias`` (0..8), as four float32
    vectors, codes 0-7, 8-15, 16-23, 24-31 (byte ``l``: code ``l`` in its low nibble, code
    ``l + 16`` in its high; Q4_0/Q4_1). Each 8 bytes are zero-extended to 32-bit lanes as they
    are loaded (one ``vpmovzxbd`` from memory), then split into nibbles lane by lane: no byte
    shuffles."""
    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        bias = builder.trunc(args[2], _I32)
        bias = _splat(builder, bias, _VI32)
        m15 = ir.Constant(_VI32, [15] * LANES)
        four = ir.Constant(_VI32, [4] * LANES)
        lo, hi = [], []
        for h in range(2):
            idx = builder.add(args[1], ir.Constant(args[1].type, 8 * h))
            b = builder.zext(_load8(context, builder, aty, args[0], idx, _VI8, 1), _VI32)
            lo.append(builder.sitofp(builder.sub(builder.and_(b, m15), bias), _VF))
            hi.append(builder.sitofp(builder.sub(builder.lshr(b, four), bias), _VF))
        return context.make_tuple(builder, sig.return_type, [lo[0], lo[1], hi[0], hi[1]])
    return _CODES4(arr, types.intp, types.intp), codegen


@intrinsic
def _vnib32x4(typingctx, arr, idx, shift):
    """``(arr[idx + l] >> shift) & 15``, ``l < 32`` (``shift`` 0 or 4; Q4_K), as four float32 vectors."""
    def codegen(context, builder, sig, args):
        b = _load8(context, builder, sig.args[0], args[0], args[1], _VI8x32, 1)
        return _four(context, builder, sig, builder.and_(_lshr_bytes(builder, b, args[2], 32), _bsplat(32, 15)), False)
    return _CODES4(arr, types.intp, types.intp), codegen


@intrinsic
def _vq6x4(typingctx, arr, lo_idx, lo_shift, hi_idx, hi_shift):
    """Q6_K codes minus 32, ``((lo >> lo_shift) & 15 | ((hi >> hi_shift) & 3) << 4) - 32`` for
    ``lo = arr[lo_idx + l]``, ``hi = arr[hi_idx + l]``, ``l < 32``, as four float32 vectors."""
    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        lo = _load8(context, builder, aty, args[0], args[1], _VI8x32, 1)
        hi = _load8(context, builder, aty, args[0], args[3], _VI8x32, 1)
        lo = builder.and_(_lshr_bytes(builder, lo, args[2], 32), _bsplat(32, 15))
        hi = builder.shl(builder.and_(_lshr_bytes(builder, hi, args[4], 32), _bsplat(32, 3)), _bsplat(32, 4))
        code = builder.sub(builder.or_(lo, hi), _bsplat(32, 32))  # -32..31 as int8
        return _four(context, builder, sig, code, True)
    return _CODES4(arr, types.intp, types.intp, types.intp, types.intp), codegen


@intrinsic
def _vmul(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def _vadd(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def _vfma(typingctx, a, b, c):
    """``a * b + c`` lane by lane (``llvm.fmuladd``)."""
    def codegen(context, builder, sig, args):
        return _fmuladd(builder, args[0], args[1], args[2])
    return f32x8(f32x8, f32x8, f32x8), codegen


@intrinsic
def _vsfma(typingctx, s, a, c):
    """``s * a + c`` with the float32 ``s`` in every lane."""
    def codegen(context, builder, sig, args):
        return _fmuladd(builder, _splat(builder, args[0], _VF), args[1], args[2])
    return f32x8(types.float32, f32x8, f32x8), codegen


@intrinsic
def _vsum(typingctx, a):
    """The lanes' sum in a fixed order: ``((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))``."""
    def codegen(context, builder, sig, args):
        v = args[0]
        u8 = ir.Constant(_VF, ir.Undefined)
        v4 = ir.VectorType(ir.FloatType(), 4)
        u4 = ir.Constant(v4, ir.Undefined)
        h = builder.fadd(builder.shuffle_vector(v, u8, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3])),
                         builder.shuffle_vector(v, u8, ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7])))
        q = builder.fadd(builder.shuffle_vector(h, u4, ir.Constant(ir.VectorType(_I32, 2), [0, 1])),
                         builder.shuffle_vector(h, u4, ir.Constant(ir.VectorType(_I32, 2), [2, 3])))
        return builder.fadd(builder.extract_element(q, ir.Constant(_I32, 0)),
                            builder.extract_element(q, ir.Constant(_I32, 1)))
    return types.float32(f32x8), codegen


@intrinsic
def _f32_of_bits(typingctx, u):
    """The float32 whose IEEE bits are the uint32 ``u``."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(cache=True, nogil=True, inline="always")
def _h2f(lo, hi):  # pragma: no cover - compiled
    """The float16 of little-endian bytes ``lo, hi`` as float32, exactly (finite values:
    scales are checked finite on load, runtime.gguf_blocks.check_blocks). A normal half's sign,
    exponent and significand move into float32's fields (exponent bias 15 -> 127: add
    ``112 << 23``); a subnormal half is its 10-bit significand times ``+-2**-24``, an exact
    integer-to-float conversion (no float32 subnormal is formed, so a flush-to-zero mode cannot
    change it). The sign goes in as a bit, not a branch: with branches on the sign (random in
    the tests' scales) and a table of powers of two, decoding cost 1.7-2x the whole Q8_0 product."""
    h = np.uint32(lo) | (np.uint32(hi) << np.uint32(8))
    a = h & np.uint32(0x7FFF)
    sgn = (h & np.uint32(0x8000)) << np.uint32(16)
    normal = _f32_of_bits(((a << np.uint32(13)) + np.uint32(0x38000000)) | sgn)
    sub = np.float32(a) * _f32_of_bits(np.uint32(0x33800000) | sgn)  # +-2**-24
    return normal if a >= np.uint32(0x400) else sub


def _half_in_hardware() -> bool:
    """Whether compiled code here converts float16 with one instruction (x86 F16C), so that
    LLVM's ``fpext half`` is that instruction and not a call into a library numba may not
    link: numba compiles for this machine's CPU (``NUMBA_CPU_NAME`` unset) and it has F16C.
    ``SPLITROOM_F16C=0`` forces the integer decoding (tests compare the two)."""
    import os

    from numba import config

    if os.environ.get("SPLITROOM_F16C", "") == "0" or config.CPU_NAME not in (None, "host"):
        return False
    from llvmlite import binding

    try:
        return bool(binding.get_host_cpu_features().get("f16c", False))
    except RuntimeError:  # no feature list on this host
        return False


#: float16 scales converted by the CPU's F16C instruction (else :func:`_h2f`'s integer steps)
HALF_IN_HARDWARE = _half_in_hardware()


@intrinsic
def _half_hw(typingctx, arr, idx):
    """The float16 at bytes ``arr[idx:idx + 2]`` (little-endian) as float32: ``fpext half``."""
    def codegen(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1)
        return builder.fpext(h, ir.FloatType())
    return types.float32(arr, types.intp), codegen


@njit(cache=True, nogil=True, inline="always")
def _half_int(arr, idx):  # pragma: no cover - compiled
    return _h2f(arr[idx], arr[idx + 1])


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` for float32 scalars, rounded once where the machine has FMA (``llvm.fmuladd``)."""
    def codegen(context, builder, sig, args):
        fn = builder.module.globals.get("llvm.fmuladd.f32")
        if fn is None:
            f = ir.FloatType()
            fn = ir.Function(builder.module, ir.FunctionType(f, [f, f, f]), name="llvm.fmuladd.f32")
        return builder.call(fn, list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _half2v_hw(typingctx, arr, idx):
    """The two float16 at bytes ``arr[idx:idx + 4]`` as lanes 0 and 1 of an 8-lane vector (the
    other lanes 0): one 32-bit load, one ``vcvtph2ps``."""
    def codegen(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1)
        f = builder.fpext(h, ir.VectorType(ir.FloatType(), 2))
        return builder.shuffle_vector(f, ir.Constant(f.type, [0.0, 0.0]), ir.Constant(_VI32, [0, 1] + [2] * 6))
    return f32x8(arr, types.intp), codegen


@intrinsic
def _half_of32_hw(typingctx, arr, idx):
    """The float16 at bytes ``arr[idx:idx + 2]`` as float32, read as the low half of a 32-bit load
    (the caller's block has two more bytes after it): a plain load into a register, where a
    16-bit load goes into a lane of one (a shuffle on the vector pipes: Q8_0, Q4_0)."""
    def codegen(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1)
        f = builder.fpext(h, ir.VectorType(ir.FloatType(), 2))
        return builder.extract_element(f, ir.Constant(_I32, 0))
    return types.float32(arr, types.intp), codegen


@intrinsic
def _vpair(typingctx, a, b):
    """``[a, b, 0, 0, 0, 0, 0, 0]`` of two float32 scalars."""
    def codegen(context, builder, sig, args):
        v = ir.Constant(_VF, [0.0] * LANES)
        v = builder.insert_element(v, args[0], ir.Constant(_I32, 0))
        return builder.insert_element(v, args[1], ir.Constant(_I32, 1))
    return f32x8(types.float32, types.float32), codegen


@intrinsic
def _lane(typingctx, v, i):
    """Lane ``i`` (a constant 0..7) of an 8-lane vector."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], builder.trunc(args[1], _I32))
    return types.float32(f32x8, types.intp), codegen


@njit(cache=True, nogil=True, inline="always")
def _half2v_int(arr, idx):  # pragma: no cover - compiled
    return _vpair(_h2f(arr[idx], arr[idx + 1]), _h2f(arr[idx + 2], arr[idx + 3]))


#: ``_half(arr, idx)``: the float16 at bytes ``arr[idx:idx + 2]`` as float32, exactly
_half = _half_hw if HALF_IN_HARDWARE else _half_int
#: ``_half2v(arr, idx)``: the two float16 at bytes ``arr[idx:idx + 4]`` as lanes 0 and 1 of an 8-lane vector, exactly
_half2v = _half2v_hw if HALF_IN_HARDWARE else _half2v_int
#: ``_half_of32(arr, idx)``: ``_half(arr, idx)`` where ``arr[idx + 2:idx + 4]`` may be read too
_half_of32 = _half_of32_hw if HALF_IN_HARDWARE else _half_int


# Each unit reader ``unit(r, u, s)`` returns unit ``u`` of row ``r``: its codes as four 8-lane
# vectors (weights 0-7, 8-15, 16-23, 24-31 of the unit), the scales of its first and second 16
# weights, and its offset mu. ``prep(r, s)`` runs once per row before its units: the K formats
# decode the row's packed scales there into ``s`` (float32 ``[3 * units]``: da, db, mu per unit),
# once per 256 weights instead of once per unit (per unit, the decoding cost 3.6x the products).
# The 32-weight formats read their float16 scales in the unit reader and leave ``s`` alone.

@njit(cache=True, nogil=True, inline="always")
def _prep_none(r, s):  # pragma: no cover - compiled
    pass


@njit(cache=True, nogil=True, inline="always")
def _unit_q8_0(r, u, s):  # pragma: no cover - compiled
    o = 34 * u
    d = _half_of32(r, o)
    c0, c1, c2, c3 = _vi8x4(r, o + 2)
    return c0, c1, c2, c3, d, d, np.float32(0.0)


@njit(cache=True, nogil=True, inline="always")
def _unit_q4_0(r, u, s):  # pragma: no cover - compiled
    o = 18 * u
    d = _half_of32(r, o)
    c0, c1, c2, c3 = _vnib8x4(r, o + 2, 8)  # code - 8 in integers: no offset term to cancel
    return c0, c1, c2, c3, d, d, np.float32(0.0)


@njit(cache=True, nogil=True, inline="always")
def _unit_q4_1(r, u, s):  # pragma: no cover - compiled
    o = 20 * u
    dm = _half2v(r, o)  # the block's d and m, side by side: one load, one conversion
    d = _lane(dm, 0)
    c0, c1, c2, c3 = _vnib8x4(r, o + 4, 0)
    return c0, c1, c2, c3, d, d, dm  # mu: m in lane 1 of dm (_mu_lane1_term)


@njit(cache=True, nogil=True, inline="always")
def _prep_q4_k(r, s):  # pragma: no cover - compiled
    for g in range(r.size // 144):
        o = 144 * g
        d = _half(r, o)
        dmin = _half(r, o + 2)
        for j in range(4):  # scale/min pairs j and j + 4 (ggml-quants.c get_scale_min_k4)
            a = r[o + 4 + j]
            b = r[o + 8 + j]
            c = r[o + 12 + j]
            u = 3 * (8 * g + j)
            dd = d * np.float32(a & np.uint8(63))
            s[u] = dd
            s[u + 1] = dd
            s[u + 2] = -(dmin * np.float32(b & np.uint8(63)))
            dd = d * np.float32((c & np.uint8(15)) | ((a >> np.uint8(6)) << np.uint8(4)))
            s[u + 12] = dd
            s[u + 13] = dd
            s[u + 14] = -(dmin * np.float32((c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))))


@njit(cache=True, nogil=True, inline="always")
def _unit_q4_k(r, u, s):  # pragma: no cover - compiled
    j = u & 7  # sub-block of its 256-weight block: low nibbles of chunk j // 2 for even j, high for odd
    q0 = 144 * (u >> 3) + 16 + 32 * (j >> 1)
    sh = 4 * (j & 1)
    c0, c1, c2, c3 = _vnib32x4(r, q0, sh)
    return c0, c1, c2, c3, s[3 * u], s[3 * u + 1], s[3 * u + 2]


@njit(cache=True, nogil=True, inline="always")
def _prep_q6_k(r, s):  # pragma: no cover - compiled
    for g in range(r.size // 210):
        o = 210 * g
        d = _half(r, o + 208)
        for i in range(8):  # unit 8g + i: 16-weight scales 2i and 2i + 1 of the block
            u = 3 * (8 * g + i)
            s[u] = d * np.float32(np.int8(r[o + 192 + 2 * i]))
            s[u + 1] = d * np.float32(np.int8(r[o + 193 + 2 * i]))
            s[u + 2] = np.float32(0.0)


@njit(cache=True, nogil=True, inline="always")
def _unit_q6_k(r, u, s):  # pragma: no cover - compiled
    v = u & 7
    half = v >> 2
    qq = v & 3  # quarter of a 128-weight half
    o = 210 * (u >> 3)
    lo = o + 64 * half + 32 * (qq & 1)
    lsh = 4 * (qq >> 1)
    hi = o + 128 + 32 * half
    hsh = 2 * qq
    c0, c1, c2, c3 = _vq6x4(r, lo, lsh, hi, hsh)
    return c0, c1, c2, c3, s[3 * u], s[3 * u + 1], np.float32(0.0)


@njit(cache=True, nogil=True)
def _unit_sums(x):  # pragma: no cover - compiled
    """``xs[n, u] = sum of x[n, 32u : 32u + 32]`` in a fixed order (Q4_K's offsets)."""
    xs = np.empty((x.shape[0], x.shape[1] // UNIT), np.float32)
    for n in range(x.shape[0]):
        xr = x[n]
        for u in range(xs.shape[1]):
            b = UNIT * u
            xs[n, u] = _vsum(_vadd(_vadd(_vload(xr, b), _vload(xr, b + 8)),
                                   _vadd(_vload(xr, b + 16), _vload(xr, b + 24))))
    return xs


@njit(cache=True, nogil=True)
def _unit_sums_lane1(x):  # pragma: no cover - compiled
    """:func:`_unit_sums` one place on, ``xs[n, 1 + u]``, with 7 places after the last: an
    8-lane load at ``xs[n, u]`` has unit ``u``'s sum in lane 1 (:func:`_mu_lane1_term`)."""
    nu = x.shape[1] // UNIT
    xs = np.zeros((x.shape[0], nu + LANES), np.float32)
    xs[:, 1:nu + 1] = _unit_sums(x)
    return xs


@njit(cache=True, nogil=True, inline="always")
def _unit_dot(xr, b, c0, c1, c2, c3, da, db, acc):  # pragma: no cover - compiled
    """``acc + da * (x c)[0:16] + db * (x c)[16:32]`` (lane-wise partial sums) for the unit at
    ``xr[b]``: a unit whose two halves have their own scales (Q6_K)."""
    sa = _vfma(_vload(xr, b + 8), c1, _vmul(_vload(xr, b), c0))
    sb = _vfma(_vload(xr, b + 24), c3, _vmul(_vload(xr, b + 16), c2))
    return _vsfma(db, sb, _vsfma(da, sa, acc))


@njit(cache=True, nogil=True, inline="always")
def _unit_dot1(xr, b, c0, c1, c2, c3, da, db, acc):  # pragma: no cover - compiled
    """``acc + da * (x c)`` (lane-wise partial sums) for the unit at ``xr[b]``, one scale for its
    32 weights (``db`` unused: Q8_0, Q4_0, Q4_1, Q4_K). One multiply-add per unit on the
    accumulator, not two: the accumulator's chain of dependent multiply-adds sets the pace of
    a one-row product (measured: 1.6x faster than the two-scale form on SmolLM2's Q4_1 rows)."""
    t = _vfma(_vload(xr, b + 8), c1, _vmul(_vload(xr, b), c0))
    t = _vfma(_vload(xr, b + 16), c2, t)
    t = _vfma(_vload(xr, b + 24), c3, t)
    return _vsfma(da, t, acc)


@njit(cache=True, nogil=True, inline="always")
def _mu_term(mm, mu, xs, n, u):  # pragma: no cover - compiled
    """``mu * xs[n, u] + mm``: the offset's part of a unit (Q4_1, Q4_K), one multiply-add."""
    return _fma(mu, xs[n, u], mm)


@njit(cache=True, nogil=True, inline="always")
def _mu_lane1_term(mm, dm, xs, n, u):  # pragma: no cover - compiled
    """The same multiply-add as :func:`_mu_term` in lane 1 of a vector: ``dm`` holds the unit's
    ``m`` in lane 1 and ``xs[n, u:u + 8]`` its sum in lane 1 (:func:`_unit_sums_lane1`), so the
    offset costs one multiply-add with its load folded in, no move of ``m`` into a lane of its
    own (Q4_1). The other lanes are computed and never read."""
    return _vfma(dm, _vload(xs[n], u), mm)


@njit(cache=True, nogil=True, inline="always")
def _scalar_zero():  # pragma: no cover - compiled
    return np.float32(0.0)


@njit(cache=True, nogil=True, inline="always")
def _scalar_out(mm):  # pragma: no cover - compiled
    return mm


@njit(cache=True, nogil=True, inline="always")
def _lane1_out(mm):  # pragma: no cover - compiled
    return _lane(mm, 1)


@njit(cache=True, nogil=True, inline="always")
def _no_mu_term(mm, mu, xs, n, u):  # pragma: no cover - compiled
    """``mm``: formats without an offset (Q8_0, Q4_0, Q6_K) skip the term; ``0 * xs`` would
    still be computed (no fast-math flags let LLVM drop it) and ``xs`` is not filled for them."""
    return mm


@njit(cache=True, nogil=True, inline="always")
def _no_unit_sums(x):  # pragma: no cover - compiled
    return np.empty((1, 1), np.float32)


@njit(cache=True, nogil=True, inline="always")
def _mm_units(x, xs, data, out, prep, unit, dot, term, mzero, mout):  # pragma: no cover - compiled
    nx = x.shape[0]
    nu = x.shape[1] // UNIT
    m = data.shape[0]
    for t in prange((m + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        sc = np.empty(3 * nu, np.float32)
        for o in range(t * _ROWS_PER_TASK, min(m, (t + 1) * _ROWS_PER_TASK)):
            r = data[o]
            prep(r, sc)
            n = 0
            while n + 4 <= nx:  # four activation rows share each unpacked unit
                x0, x1, x2, x3 = x[n], x[n + 1], x[n + 2], x[n + 3]
                a0 = _vzero()
                a1 = _vzero()
                a2 = _vzero()
                a3 = _vzero()
                m0 = mzero()
                m1 = mzero()
                m2 = mzero()
                m3 = mzero()
                for u in range(nu):
                    c0, c1, c2, c3, da, db, mu = unit(r, u, sc)
                    b = UNIT * u
                    a0 = dot(x0, b, c0, c1, c2, c3, da, db, a0)
                    a1 = dot(x1, b, c0, c1, c2, c3, da, db, a1)
                    a2 = dot(x2, b, c0, c1, c2, c3, da, db, a2)
                    a3 = dot(x3, b, c0, c1, c2, c3, da, db, a3)
                    m0 = term(m0, mu, xs, n, u)
                    m1 = term(m1, mu, xs, n + 1, u)
                    m2 = term(m2, mu, xs, n + 2, u)
                    m3 = term(m3, mu, xs, n + 3, u)
                out[n, o] = _vsum(a0) + mout(m0)
                out[n + 1, o] = _vsum(a1) + mout(m1)
                out[n + 2, o] = _vsum(a2) + mout(m2)
                out[n + 3, o] = _vsum(a3) + mout(m3)
                n += 4
            while n < nx:
                xr = x[n]
                a = _vzero()
                mm = mzero()
                for u in range(nu):
                    c0, c1, c2, c3, da, db, mu = unit(r, u, sc)
                    a = dot(xr, UNIT * u, c0, c1, c2, c3, da, db, a)
                    mm = term(mm, mu, xs, n, u)
                out[n, o] = _vsum(a) + mout(mm)
                n += 1


# One compiled entry point per format, taking only arrays: a call that passes the unit readers
# as arguments makes numba type those function objects on every call (measured here: 26 us a
# call on a 16 x 32 matrix against 3 us for the int8 kernel; a SmolLM2 token makes 211 calls).
# Here the readers are globals, fixed when the entry point compiles.

@njit(cache=True, nogil=True, inline="always")
def _product(x, data, out, prep, unit, dot, sums, term, mzero=_scalar_zero, mout=_scalar_out):  # pragma: no cover
    _mm_units(x, sums(x), data, out, prep, unit, dot, term, mzero, mout)


@njit(parallel=True, cache=True, nogil=True)
def _mm_q8_0(x, data, out):  # pragma: no cover - compiled
    _product(x, data, out, _prep_none, _unit_q8_0, _unit_dot1, _no_unit_sums, _no_mu_term)


@njit(parallel=True, cache=True, nogil=True)
def _mm_q4_0(x, data, out):  # pragma: no cover - compiled
    _product(x, data, out, _prep_none, _unit_q4_0, _unit_dot1, _no_unit_sums, _no_mu_term)


@njit(parallel=True, cache=True, nogil=True)
def _mm_q4_1(x, data, out):  # pragma: no cover - compiled
    _product(x, data, out, _prep_none, _unit_q4_1, _unit_dot1, _unit_sums_lane1, _mu_lane1_term, _vzero, _lane1_out)


@njit(parallel=True, cache=True, nogil=True)
def _mm_q4_k(x, data, out):  # pragma: no cover - compiled
    _product(x, data, out, _prep_q4_k, _unit_q4_k, _unit_dot1, _unit_sums, _mu_term)


@njit(parallel=True, cache=True, nogil=True)
def _mm_q6_k(x, data, out):  # pragma: no cover - compiled
    _product(x, data, out, _prep_q6_k, _unit_q6_k, _unit_dot, _no_unit_sums, _no_mu_term)


_PRODUCTS = {"q8_0": _mm_q8_0, "q4_0": _mm_q4_0, "q4_1": _mm_q4_1, "q4_k": _mm_q4_k, "q6_k": _mm_q6_k}
#: formats :func:`block_product` reads
FORMATS = tuple(_PRODUCTS)


def block_product(x: np.ndarray, data: np.ndarray, out: np.ndarray, fmt: str) -> np.ndarray:
    """``out[n, o] = x[n] . W[o]``, ``W`` the GGUF rows ``data`` in ``fmt``, unpacked in registers.

    Args:
        x: float32 ``[n, in]``, C-contiguous (any ``n``; meant for a few rows: each weight
            row is unpacked once per four activation rows).
        data: uint8 ``[out, row bytes]``, C-contiguous, rows as runtime.gguf_blocks stores them
            (checked there: whole blocks, finite scales).
        out: float32 ``[n, out]``, written.
        fmt: one of :data:`FORMATS`.
    Returns:
        ``out``.
    Raises:
        ValueError: unknown ``fmt``, or shapes/dtypes that do not fit (the compiled loops read
            without bounds checks, so every size is checked here).
    """
    if fmt not in _PRODUCTS:
        raise ValueError(f"unknown block format {fmt!r}; read: {', '.join(FORMATS)}")
    n, k = x.shape
    if x.dtype != F32 or out.dtype != F32 or data.dtype != np.uint8:
        raise ValueError("block_product takes float32 x and out, uint8 data")
    if not (x.flags.c_contiguous and data.flags.c_contiguous):
        raise ValueError("block_product needs C-contiguous x and data")
    if data.ndim != 2 or data.shape[1] != row_bytes(fmt, k) or out.shape != (n, data.shape[0]):
        raise ValueError(f"block_product: x {x.shape}, data {data.shape}, out {out.shape} do not fit {fmt}")
    _PRODUCTS[fmt](x, data, out)
    return out
