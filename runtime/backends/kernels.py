"""Matrix products of a few activation rows with a weight matrix that is read once.

Why: a verify lap (k+1 <= 9 positions) and the output head over several rows multiply a
small ``[n, in]`` block of activations by a large ``[out, in]`` weight matrix. OpenBLAS'
``sgemm`` packs the weight panel for such skinny products and, measured here, ran 2-3x
slower for ``n = 2..9`` than its one-row ``sgemv`` (a 5-position verify cost
2-3x a one-token step). The kernels below stream each weight row once and take its dot
product with all ``n`` activation rows while the row is in L1, so the cost of ``n`` rows
stays close to the cost of one: memory bound, like ``sgemv``.

Four activation rows share each load of a weight (four accumulators, ``_dot_rows``), so a
multiply-add costs one load, not two: measured 1.4-1.5x faster at 5-9 rows than one row at a
time (docs/benchmarks.md). The same loop serves quantized weights: each row is first widened into a float32 buffer
(int8, or float16 bits converted exactly), then dotted with the ``n`` rows (an int8 row's dot
products are multiplied by its scale), so only 1 (int8) or 2 (float16) bytes per weight are
read from memory.

Compiled with numba (LLVM), ``parallel=True`` over output rows, ``fastmath`` so the dot
products vectorize (sums are reassociated: results differ from BLAS in the last bits,
well inside float32 rounding; tests check them against float64 references).

Formats:

* ``q8``: int8 with one scale per output row, ``scale = max|row| / 127`` (symmetric: the
  absmax rule of llama.cpp's Q8_0, ``d = max|x| / 127``, over a whole row instead of blocks of
  32). :func:`quantize_q8` returns it in Q8_0's block layout (``scale [out, in / 32]``, every
  block of a row holding the row's scale), which the wgpu backend reads as is (9 bits per
  weight there); the numpy :class:`Linear` keeps one float32 per row (8 + 32/in bits).
  Per-block scales (a scale per 32) were tried first: widening with a scale per 32 weights did
  not vectorize under numba (about 7x slower per row than widening alone, measured), which
  made int8 decode slower than float32. On SmolLM2 per-row scales leave 0.9% relative RMS
  error in the weights (per-32-block: 0.5%); docs/precision.md gives what that does to logits
  and greedy answers.
* ``f16``: IEEE binary16 stored as ``uint16`` bits (numba has no CPU float16 type), widened
  with the exact bit trick (shift the exponent/mantissa into binary32 position and multiply by
  2^112, which also turns subnormals right; Giesen, "Half to float done quick", 2013).
"""

from __future__ import annotations

from . import numba_threads  # noqa: F401  (first: numba's thread count, before numba loads)

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from . import block_kernels  # noqa: E402  (products of a few rows with GGUF blocks, unpacked in registers)
from .block_kernels import _h2f  # noqa: E402

F32 = np.float32
#: Block length of :func:`quantize_q8`'s layout (weights per stored scale), as llama.cpp's Q8_0.
Q8_BLOCK = 32
#: Rows at or below which the streaming kernel beats OpenBLAS sgemm here (measured; see
#: docs/benchmarks.md). Larger blocks (prefill chunks) go to BLAS, which is compute-efficient there.
STREAM_MAX_ROWS = 12
_ROWS_PER_TASK = 16  # output rows one parallel task widens with one buffer


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _dot_rows(x, wrow, out, o, d):  # pragma: no cover - compiled
    """``out[r, o] = d * (x[r] . wrow)`` for every row r: four rows share each load of ``wrow``
    (four accumulators), so a weight is loaded once per four multiply-adds, not once per one.
    ``wrow`` is float32, or int8 widened to float32 as it is loaded (no buffer pass)."""
    n, k = x.shape
    r = 0
    while r + 4 <= n:
        x0, x1, x2, x3 = x[r], x[r + 1], x[r + 2], x[r + 3]
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for i in range(k):
            wi = np.float32(wrow[i])
            a0 += x0[i] * wi
            a1 += x1[i] * wi
            a2 += x2[i] * wi
            a3 += x3[i] * wi
        out[r, o] = a0 * d
        out[r + 1, o] = a1 * d
        out[r + 2, o] = a2 * d
        out[r + 3, o] = a3 * d
        r += 4
    while r < n:
        xr = x[r]
        a = np.float32(0.0)
        for i in range(k):
            a += xr[i] * np.float32(wrow[i])
        out[r, o] = a * d
        r += 1


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _mm_f32(x, w, out):  # pragma: no cover - compiled
    m = w.shape[0]
    for t in prange((m + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        for o in range(t * _ROWS_PER_TASK, min(m, (t + 1) * _ROWS_PER_TASK)):
            _dot_rows(x, w[o], out, o, np.float32(1.0))


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _mm_q8(x, q, s, out):  # pragma: no cover - compiled
    m = q.shape[0]
    for t in prange((m + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        for o in range(t * _ROWS_PER_TASK, min(m, (t + 1) * _ROWS_PER_TASK)):
            # the int8 row is widened as the dot loads it: no buffer written and read back
            # (1.2-1.8x faster than widening first, scripts/kernel_rows.py's shapes, 2026-11-30)
            _dot_rows(x, q[o], out, o, s[o])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _mm_f16(x, h, out):  # pragma: no cover - compiled
    k = x.shape[1]
    m = h.shape[0]
    for t in prange((m + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        bits = np.empty(k, np.uint32)
        buf = bits.view(np.float32)
        for o in range(t * _ROWS_PER_TASK, min(m, (t + 1) * _ROWS_PER_TASK)):
            for i in range(k):
                v = np.uint32(h[o, i])
                bits[i] = ((v & np.uint32(0x7FFF)) << np.uint32(13)) | ((v & np.uint32(0x8000)) << np.uint32(16))
            for i in range(k):
                buf[i] = buf[i] * np.float32(5.192296858534828e33)  # 2**112
            _dot_rows(x, buf, out, o, np.float32(1.0))


# ---------------------------------------------------------------------------- GGUF blocks
# GGUF block rows (runtime.gguf_blocks: uint8, the blocks as stored). Products of up to
# STREAM_MAX_ROWS activation rows unpack them in registers (runtime/backends/block_kernels.py);
# the widening loops below serve prefill chunks (widened a few thousand rows at a time, then
# BLAS), dense() and rows() (the embedding lookup).

@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _widen_q8_0(r, buf):  # pragma: no cover - compiled
    for b in range(buf.size // 32):
        o = b * 34
        d = _h2f(r[o], r[o + 1])
        for j in range(32):
            buf[b * 32 + j] = d * np.float32(np.int8(r[o + 2 + j]))


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _widen_q4_0(r, buf):  # pragma: no cover - compiled
    for b in range(buf.size // 32):
        o = b * 18
        d = _h2f(r[o], r[o + 1])
        for j in range(16):
            q = np.int32(r[o + 2 + j])  # int32, not numba's int64 promotion: its float conversion vectorizes
            buf[b * 32 + j] = d * (np.float32(q & 15) - np.float32(8.0))
            buf[b * 32 + 16 + j] = d * (np.float32(q >> 4) - np.float32(8.0))


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _widen_q4_1(r, buf):  # pragma: no cover - compiled
    for b in range(buf.size // 32):
        o = b * 20
        d = _h2f(r[o], r[o + 1])
        m = _h2f(r[o + 2], r[o + 3])
        for j in range(16):
            q = np.int32(r[o + 4 + j])
            buf[b * 32 + j] = d * np.float32(q & 15) + m
            buf[b * 32 + 16 + j] = d * np.float32(q >> 4) + m


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _widen_q4_k(r, buf):  # pragma: no cover - compiled
    for b in range(buf.size // 256):
        o = b * 144
        d = _h2f(r[o], r[o + 1])
        dmin = _h2f(r[o + 2], r[o + 3])
        for c in range(4):
            for h in range(2):
                j = 2 * c + h  # get_scale_min_k4 (ggml-quants.c)
                if j < 4:
                    sc = r[o + 4 + j] & np.uint8(63)
                    mn = r[o + 8 + j] & np.uint8(63)
                else:
                    sc = (r[o + 8 + j] & np.uint8(15)) | ((r[o + j] >> np.uint8(6)) << np.uint8(4))
                    mn = (r[o + 8 + j] >> np.uint8(4)) | ((r[o + 4 + j] >> np.uint8(6)) << np.uint8(4))
                dd = d * np.float32(sc)
                mm = dmin * np.float32(mn)
                base = b * 256 + 64 * c + 32 * h
                q0 = o + 16 + 32 * c
                sh = np.int32(4 * h)
                for l in range(32):
                    buf[base + l] = dd * np.float32((np.int32(r[q0 + l]) >> sh) & 15) - mm


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _widen_q6_k(r, buf):  # pragma: no cover - compiled
    for b in range(buf.size // 256):
        o = b * 210
        d = _h2f(r[o + 208], r[o + 209])
        for half in range(2):
            ql = o + 64 * half
            qh = o + 128 + 32 * half
            sc = o + 192 + 8 * half
            base = b * 256 + 128 * half
            for qq in range(4):
                lsh = np.uint8(4 * (qq // 2))
                lo_off = ql + 32 * (qq % 2)
                hsh = np.uint8(2 * qq)
                for l in range(32):
                    code = ((r[lo_off + l] >> lsh) & np.uint8(15)) | (((r[qh + l] >> hsh) & np.uint8(3)) << np.uint8(4))
                    s = np.float32(np.int8(r[sc + 2 * qq + l // 16]))
                    buf[base + 32 * qq + l] = d * s * (np.float32(code) - np.float32(32.0))


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _widen_rows(data, w, widen):  # pragma: no cover - compiled
    for o in prange(data.shape[0]):
        widen(data[o], w[o])


_WIDEN = {"q8_0": _widen_q8_0, "q4_0": _widen_q4_0, "q4_1": _widen_q4_1, "q4_k": _widen_q4_k, "q6_k": _widen_q6_k}
#: GGUF block formats :class:`Linear` holds as stored (runtime.gguf_blocks.FORMATS)
BLOCK_KINDS = tuple(_WIDEN)
#: float32 values widened at once when a large block of activations (prefill) goes to BLAS
#: (16 MiB of float32: few parallel regions between the BLAS calls, a bounded transient)
_WIDEN_CHUNK_VALUES = 1 << 22


def quantize_rows_q8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row (the absmax rule of llama.cpp's Q8_0 over whole rows).

    Args:
        w: ``[out, in]`` float32.
    Returns:
        ``(q int8 [out, in], scale float32 [out])`` with ``scale = max|row| / 127`` and
        ``q = round(w / scale)`` (0 for an all-zero row).
    """
    w = np.asarray(w, dtype=F32)
    scale = (np.abs(w).max(axis=1) / F32(127.0)).astype(F32)
    safe = np.where(scale == 0, F32(1.0), scale)
    q = np.clip(np.rint(w / safe[:, None]), -127, 127).astype(np.int8)
    return q, scale


def quantize_q8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_rows_q8` in Q8_0's block layout: ``(q int8 [out, in], scale float32
    [out, in / 32])``, every block of row ``o`` holding ``max|row o| / 127``.

    Raises:
        ValueError: ``in`` is not a multiple of :data:`Q8_BLOCK`.
    """
    w = np.asarray(w, dtype=F32)
    if w.shape[1] % Q8_BLOCK:
        raise ValueError(f"q8 needs the input width to be a multiple of {Q8_BLOCK}, got {w.shape[1]}")
    q, s = quantize_rows_q8(w)
    return q, np.repeat(s[:, None], w.shape[1] // Q8_BLOCK, axis=1)


def dequantize_q8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``q * scale`` as float32 ``[out, in]``; ``scale`` per row ``[out]`` or per block ``[out, in / 32]``."""
    if scale.ndim == 1:
        return q.astype(F32) * scale[:, None]
    out_f, in_f = q.shape
    return (q.reshape(out_f, -1, Q8_BLOCK).astype(F32) * scale[..., None]).reshape(out_f, in_f)


class Linear:
    """A weight matrix ``W [out, in]`` in one storage format, applied as ``x @ W.T``.

    Build with :meth:`of` (``kind`` ``"f32"``, ``"f16"`` or ``"q8"``), or with :meth:`stored`
    from a GGUF tensor as it is stored (a :class:`runtime.gguf_blocks.QTensor` in one of
    :data:`BLOCK_KINDS` or f16, or a float32 array), and :meth:`concat` for row blocks (fused
    QKV, gate/up; parts in different formats stay separate). ``apply(x)`` takes
    ``[n, in]`` float32 and returns ``[n, out]`` float32. ``rows(ids)`` returns the float32
    rows ``W[ids]`` (the embedding lookup when the head is tied). ``nbytes`` is what it holds.
    """

    __slots__ = ("kind", "shape", "w", "q", "scale")

    def __init__(self, kind: str, shape: tuple[int, int], w=None, q=None, scale=None) -> None:
        self.kind, self.shape, self.w, self.q, self.scale = kind, shape, w, q, scale

    @classmethod
    def of(cls, w: np.ndarray, kind: str) -> "Linear":
        """Store ``w`` (``[out, in]`` float32) as ``kind``.

        Raises:
            ValueError: unknown kind.
        """
        w = np.ascontiguousarray(w, dtype=F32)
        if kind == "f32":
            return cls(kind, w.shape, w=w)
        if kind == "f16":
            return cls(kind, w.shape, w=w.astype(np.float16).view(np.uint16))
        if kind == "q8":
            q, s = quantize_rows_q8(w)
            return cls(kind, w.shape, q=q, scale=s)
        raise ValueError(f"unknown weight format {kind!r}; choose f32, f16 or q8")

    @classmethod
    def stored(cls, t) -> "Linear":
        """Hold a GGUF tensor as stored: a float32 ``[out, in]`` array as f32, a QTensor of
        f16 bits as f16, a QTensor of blocks as its block format (``data uint8 [out, row
        bytes]``, unpacked row by row in the products).

        Raises:
            ValueError: a QTensor format not in :data:`BLOCK_KINDS` or f16.
        """
        if isinstance(t, np.ndarray):
            return cls.of(t, "f32")
        if t.fmt == "f16":
            return cls("f16", tuple(t.shape), w=np.ascontiguousarray(t.data).view(np.uint16))
        if t.fmt not in _WIDEN:
            raise ValueError(f"unknown block format {t.fmt!r}; held: {', '.join(BLOCK_KINDS)}, f16")
        return cls(t.fmt, tuple(t.shape), w=np.ascontiguousarray(t.data))

    @classmethod
    def concat(cls, parts: list["Linear"]) -> "Linear":
        """Row blocks stacked: ``[sum out_i, in]``. Parts of one storage format are joined
        into one matrix (rows of blocks concatenate); parts in different formats are kept
        apart (kind ``"parts"``), applied one after the other into one output.

        Raises:
            ValueError: parts of different input widths.
        """
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("row blocks of different input widths")
        out_rows = sum(p.shape[0] for p in parts)
        if len(parts) == 1:
            return parts[0]
        kinds = {p.kind for p in parts}
        if len(kinds) == 1 and parts[0].kind != "q8" and parts[0].kind != "parts":
            return cls(parts[0].kind, (out_rows, parts[0].shape[1]), w=np.concatenate([p.w for p in parts]))
        return cls("parts", (out_rows, parts[0].shape[1]), w=list(parts))

    @property
    def nbytes(self) -> int:
        """Bytes held: 4 per weight (f32), 2 (f16), 1 + 4 per row (q8), the stored bytes (blocks)."""
        if self.kind == "q8":
            return self.q.nbytes + self.scale.nbytes
        if self.kind == "parts":
            return sum(p.nbytes for p in self.w)
        return self.w.nbytes

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T``: ``[n, in]`` float32 -> ``[n, out]`` float32."""
        n = x.shape[0]
        if self.kind == "parts":
            return np.concatenate([p.apply(x) for p in self.w], axis=1)
        if self.kind == "f32" and n > STREAM_MAX_ROWS:
            return x @ self.w.T
        if self.kind in _WIDEN and n > STREAM_MAX_ROWS:  # prefill: widen a few hundred rows at a time, then BLAS
            x = np.ascontiguousarray(x, dtype=F32)
            out = np.empty((n, self.shape[0]), F32)
            step = max(1, _WIDEN_CHUNK_VALUES // self.shape[1])
            for a in range(0, self.shape[0], step):
                b = min(self.shape[0], a + step)
                w = np.empty((b - a, self.shape[1]), F32)
                _widen_rows(self.w[a:b], w, _WIDEN[self.kind])
                out[:, a:b] = x @ w.T
            return out
        if n > STREAM_MAX_ROWS:  # prefill chunk: widen once, then BLAS
            return x @ self.dense().T
        out = np.empty((n, self.shape[0]), F32)
        x = np.ascontiguousarray(x, dtype=F32)
        if self.kind in _WIDEN:
            block_kernels.block_product(x, self.w, out, self.kind)
        elif self.kind == "f32":
            _mm_f32(x, self.w, out)
        elif self.kind == "q8":
            _mm_q8(x, self.q, self.scale, out)
        else:
            _mm_f16(x, self.w, out)
        return out

    def dense(self) -> np.ndarray:
        """The whole matrix as float32 ``[out, in]`` (a view for f32, a new array otherwise)."""
        if self.kind == "f32":
            return self.w
        if self.kind == "f16":
            return self.w.view(np.float16).astype(F32)
        if self.kind == "parts":
            return np.concatenate([p.dense() for p in self.w])
        if self.kind in _WIDEN:
            w = np.empty(self.shape, F32)
            _widen_rows(self.w, w, _WIDEN[self.kind])
            return w
        return dequantize_q8(self.q, self.scale)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Float32 rows ``W[ids]`` ``[len(ids), in]`` (a copy)."""
        if self.kind == "f32":
            return self.w[ids].astype(F32, copy=True)
        if self.kind == "f16":
            return self.w[ids].view(np.float16).astype(F32)
        if self.kind in _WIDEN:
            sel = np.ascontiguousarray(self.w[ids])
            w = np.empty((sel.shape[0], self.shape[1]), F32)
            _widen_rows(sel, w, _WIDEN[self.kind])
            return w
        if self.kind == "parts":
            return self.dense()[ids]
        return dequantize_q8(self.q[ids], self.scale[ids])
