"""GGUF quantized blocks held as stored: formats, checks, a float32 reference, and range reading.

A GGUF matrix ``[out, in]`` is stored row by row; each row is ``in / BS`` blocks of ``BS``
weights, each block a fixed number of bytes (GGML's ``ggml-common.h`` structs; byte sizes
as gguf-py's ``GGML_QUANT_SIZES``). The formats held here, with ``w`` the weight value:

* ``q8_0`` (34 B per 32): float16 ``d``, 32 int8 ``q``; ``w = d * q``.
* ``q4_0`` (18 B per 32): float16 ``d``, 16 bytes of 4-bit codes; byte ``j`` holds weight
  ``j`` (low nibble) and ``j + 16`` (high); ``w = d * (code - 8)``.
* ``q4_1`` (20 B per 32): float16 ``d``, ``m``, then the codes as q4_0; ``w = d * code + m``.
* ``q4_k`` (144 B per 256): float16 ``d``, ``dmin``, 12 bytes packing eight 6-bit (scale,
  min) pairs, 128 bytes of codes; 64-weight chunk ``c`` uses pairs ``2c`` (low nibbles of
  bytes ``32c..32c+31``) and ``2c+1`` (their high nibbles); ``w = d * sc * code - dmin * mn``.
* ``q6_k`` (210 B per 256): 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8
  scales, float16 ``d``; ``w = d * scale[i / 16] * (code - 32)`` (layout: :func:`dequantize`).

A :class:`QTensor` keeps those bytes (``uint8 [out, in / BS * bytes]``): what a stage holds,
copies to a peer and uploads to a GPU. :func:`dequantize` is this module's own float32
reference (tests check it and the kernels against gguf-py's ``gguf.quants.dequantize``).
:func:`read_range` reads one layer range's tensors from a GGUF with ``pread`` (no mapping
left behind, so the process holds only those bytes). :func:`check_blocks` refuses truncated
data and non-finite scales with one line naming the tensor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

F32 = np.float32

#: ``{format: (GGML type id, weights per block, bytes per block)}`` (ggml.h ``ggml_type``).
FORMATS: dict[str, tuple[int, int, int]] = {
    "q8_0": (8, 32, 34),
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "q4_k": (12, 256, 144),
    "q6_k": (14, 256, 210),
}
#: GGML type ids of plain float tensors: F32 (0) and F16 (1).
GGML_F32, GGML_F16 = 0, 1
_BY_ID = {tid: name for name, (tid, _, _) in FORMATS.items()}
#: byte offsets (inside a block) of each format's float16 scales
_SCALE_OFFSETS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q4_k": (0, 2), "q6_k": (208,)}


class BlockError(ValueError):
    """Truncated or malformed quantized data, or a tensor type not held natively (one line)."""


def format_of(ggml_type: int) -> str | None:
    """The format name of a GGML type id (``12`` -> ``"q4_k"``), or ``None`` for another type."""
    return _BY_ID.get(int(ggml_type))


def row_bytes(fmt: str, n_in: int) -> int:
    """Bytes of one stored row of ``n_in`` weights in ``fmt``.

    Raises:
        BlockError: ``n_in`` is not a multiple of the format's block length.
    """
    _, bs, nb = FORMATS[fmt]
    if n_in % bs:
        raise BlockError(f"{fmt} rows hold multiples of {bs} weights, got {n_in}")
    return n_in // bs * nb


@dataclass
class QTensor:
    """A matrix ``[out, in]`` held as GGUF blocks: ``data`` ``uint8 [out, row_bytes(fmt, in)]``.

    ``fmt`` is a key of :data:`FORMATS`, or ``"f16"`` (``data`` then holds IEEE half bits,
    2 bytes per weight). ``nbytes`` is what it holds.
    """

    fmt: str
    shape: tuple[int, int]
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def rows(self, ids) -> "QTensor":
        """The rows ``ids`` (a new QTensor)."""
        return QTensor(self.fmt, (len(ids), self.shape[1]), np.ascontiguousarray(self.data[ids]))


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    """Float16 at byte ``off`` of every block ``b [n, bytes]`` -> float32 ``[n]``."""
    return np.ascontiguousarray(b[:, off:off + 2]).view("<f2")[:, 0].astype(F32)


def check_blocks(q: QTensor, name: str = "tensor") -> None:
    """Refuse data that is not whole rows of blocks, or whose float16 scales are not finite.

    Raises:
        BlockError: e.g. ``blk.3.attn_q.weight: q4_k block 17 has a non-finite scale``.
    """
    out, n_in = q.shape
    if q.fmt == "f16":
        want = n_in * 2
    elif q.fmt in FORMATS:
        want = row_bytes(q.fmt, n_in)
    else:
        raise BlockError(f"{name}: unknown block format {q.fmt!r}")
    if q.data.dtype != np.uint8 or q.data.shape != (out, want):
        raise BlockError(f"{name}: {q.fmt} data of shape {q.data.shape} where [{out}, {want}] bytes are needed")
    if q.fmt == "f16":
        return
    b = q.data.reshape(-1, FORMATS[q.fmt][2])
    for off in _SCALE_OFFSETS[q.fmt]:
        bad = ~np.isfinite(_f16(b, off))
        if bad.any():
            raise BlockError(f"{name}: {q.fmt} block {int(np.flatnonzero(bad)[0])} has a non-finite scale")


def _k4_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 packed bytes ``[n, 12]`` -> 6-bit scales and mins ``[n, 8]`` (ggml-quants.c
    ``get_scale_min_k4``)."""
    sc = sc.astype(np.uint32)
    s = np.empty((sc.shape[0], 8), np.uint32)
    m = np.empty_like(s)
    s[:, :4] = sc[:, 0:4] & 63
    m[:, :4] = sc[:, 4:8] & 63
    s[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return s.astype(F32), m.astype(F32)


def dequantize(q: QTensor) -> np.ndarray:
    """The float32 values ``[out, in]`` of ``q`` (this module's reference of the formats above,
    written from ggml-quants.c's ``dequantize_row_*``)."""
    out, n_in = q.shape
    if q.fmt == "f16":
        return q.data.view("<f2").astype(F32).reshape(out, n_in)
    _, bs, nbytes = FORMATS[q.fmt]
    b = q.data.reshape(-1, nbytes)
    n = b.shape[0]
    if q.fmt == "q8_0":
        w = _f16(b, 0)[:, None] * b[:, 2:].view(np.int8).astype(F32)
    elif q.fmt in ("q4_0", "q4_1"):
        qs = b[:, 2 if q.fmt == "q4_0" else 4:]
        codes = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(F32)
        d = _f16(b, 0)[:, None]
        w = d * (codes - F32(8)) if q.fmt == "q4_0" else d * codes + _f16(b, 2)[:, None]
    elif q.fmt == "q4_k":
        d, dmin = _f16(b, 0)[:, None], _f16(b, 2)[:, None]
        s, m = _k4_scales(b[:, 4:16])
        qs = b[:, 16:].reshape(n, 4, 32)
        codes = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(n, 8, 32).astype(F32)  # sub-block j = 2c + half
        w = ((d * s)[:, :, None] * codes - (dmin * m)[:, :, None]).reshape(n, 256)
    else:  # q6_k
        ql, qh = b[:, :128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
        sc = b[:, 192:208].view(np.int8).astype(F32).reshape(n, 2, 8)
        d = _f16(b, 208).reshape(n, 1, 1, 1, 1)
        lo = np.stack([ql[:, :, :32] & 0xF, ql[:, :, 32:] & 0xF, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
        hi = np.stack([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3], axis=2)
        codes = (lo | (hi << 4)).astype(F32) - F32(32)  # [n, half, quarter, 32]
        scale = sc.reshape(n, 2, 4, 2)  # scale index 8*half + 2*quarter + l // 16
        w = (d * scale[..., :, None] * codes.reshape(n, 2, 4, 2, 16)).reshape(n, 256)
    return np.ascontiguousarray(w, dtype=F32).reshape(out, n_in)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in a GGUF: name, GGML type, shape ``[out, in]`` (or ``[n]``),
    absolute byte offset and byte count."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def tensor_table(reader) -> dict[str, TensorInfo]:
    """``{gguf name: TensorInfo}`` of a ``gguf.GGUFReader`` (shapes outermost first)."""
    out = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed([int(v) for v in t.shape]))
        out[t.name] = TensorInfo(t.name, int(t.tensor_type), shape, int(t.data_offset), int(t.n_bytes))
    return out


def expected_nbytes(info: TensorInfo) -> int:
    """Bytes a tensor of ``info``'s type and shape takes (F32, F16 or a held block format).

    Raises:
        BlockError: another type (it has to be widened: use weights f32, f16 or q8).
    """
    n_in = info.shape[-1]
    rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
    if info.ggml_type == GGML_F32:
        return rows * n_in * 4
    if info.ggml_type == GGML_F16:
        return rows * n_in * 2
    fmt = format_of(info.ggml_type)
    if fmt is None:
        raise BlockError(f"{info.name}: GGML type {info.ggml_type} is not held natively "
                         f"(held: F32, F16, {', '.join(f.upper() for f in FORMATS)}); use weights f32, f16 or q8")
    return rows * row_bytes(fmt, n_in)


def read_tensor(fd: int, info: TensorInfo, file_size: int) -> np.ndarray | QTensor:
    """One tensor's stored bytes, read with ``os.pread``: F32 as a float32 array, F16 1-D
    as float32 (norms), F16 matrices and block formats as a :class:`QTensor` (checked).

    Raises:
        BlockError: the file ends inside the tensor, its size disagrees with its type and
            shape, or its blocks are malformed (:func:`check_blocks`).
    """
    want = expected_nbytes(info)
    if info.nbytes != want:
        raise BlockError(f"{info.name}: {info.nbytes} bytes where its type and shape need {want}")
    if info.offset < 0 or info.offset + want > file_size:
        raise BlockError(f"{info.name}: the file ends inside this tensor (truncated GGUF)")
    buf = np.empty(want, np.uint8)
    got = os.preadv(fd, [memoryview(buf)], info.offset)
    if got != want:
        raise BlockError(f"{info.name}: read {got} of {want} bytes (truncated GGUF)")
    if info.ggml_type == GGML_F32:
        return buf.view("<f4").reshape(info.shape).astype(F32, copy=False)
    if len(info.shape) != 2:
        if info.ggml_type == GGML_F16:
            return buf.view("<f2").astype(F32).reshape(info.shape)
        raise BlockError(f"{info.name}: a {len(info.shape)}-D quantized tensor (only matrices are held in blocks)")
    out_f, n_in = info.shape
    fmt = "f16" if info.ggml_type == GGML_F16 else format_of(info.ggml_type)
    q = QTensor(fmt, (out_f, n_in), buf.reshape(out_f, -1))
    check_blocks(q, info.name)
    return q


def permute_rows(q: np.ndarray | QTensor, perm_fn) -> np.ndarray | QTensor:
    """Apply a row permutation (``perm_fn`` maps an ``[out, ...]`` array to the same rows
    reordered, e.g. :func:`runtime.weights.unpermute_rope_rows`) to a float32 matrix or to a
    QTensor's rows of blocks (a row's blocks move whole, so the values are unchanged)."""
    if isinstance(q, QTensor):
        return QTensor(q.fmt, q.shape, perm_fn(q.data))
    return perm_fn(q)


def stored_sizes(table: dict[str, TensorInfo], n_layers: int) -> tuple[tuple[int, ...], int, int]:
    """Bytes the GGUF stores: ``(per layer [n_layers], token embedding, own output head or 0)``,
    every tensor of a layer (``blk.{i}.*``: matrices in their blocks, norms, biases) counted.
    These are the bytes a stage holding the file's tensors as stored holds."""
    layers = [0] * n_layers
    for name, info in table.items():
        if name.startswith("blk."):
            i = name.split(".", 2)[1]
            if i.isdigit() and int(i) < n_layers:
                layers[int(i)] += info.nbytes
    emb = table["token_embd.weight"].nbytes if "token_embd.weight" in table else 0
    head = table["output.weight"].nbytes if "output.weight" in table else 0
    return tuple(layers), emb, head


def file_size(path: Path | str) -> int:
    """Size in bytes of ``path``."""
    return os.stat(path).st_size
