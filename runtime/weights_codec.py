"""A lossless wire form for float32 weights that came from 4-bit block quantization.

A GGUF checkpoint stores most matrices in blocks of 32 weights, each block a scale
``d``, a minimum ``m`` and 32 four-bit codes ``q`` (Q4_1: ``w = d * q + m``; GGML's
``ggml-quants.c``, ``dequantize_row_q4_1``). The runtime holds them as float32 after
dequantizing (runtime/weights.py), 128 bytes a block where 20-24 carry the
information. When a device copies a layer range from a peer (runtime/weights_share/)
the peer can send each such block as ``d`` and ``m`` (float32) and 16 bytes of codes:
24 bytes for 128, 5.3x fewer over a transport that moves about 2 MB/s
(docs/transport.md). Weights that do not have that form (norms, float16 or 8-bit
checkpoints) go as they are.

The form is exact or not used: :func:`pack` finds ``d``, ``m`` and ``q`` for every block
from the values alone (no access to the GGUF), rebuilds the block the way the receiver
will (float32 ``d * q + m``, as gguf-py's ``dequantize`` computes it) and keeps a block
packed only if every rebuilt value is bit-identical to the value held; the others
travel raw. :func:`unpack` therefore returns exactly the bytes the sender holds, and the
receiver checks them against the sha256 manifest as before.

Layout of a packed tensor (little endian)::

    magic b"SRA4" | u32 version (1) | u64 n_values | u64 n_blocks | u64 n_raw_blocks
    | bitmap of raw blocks, ceil(n_blocks / 8) bytes, bit i (LSB first) set = block i raw
    | d  float32[n_blocks - n_raw]  | m float32[n_blocks - n_raw]
    | codes, two per byte (low nibble first), 16 bytes a packed block
    | raw blocks float32[n_raw_blocks * 32] | tail float32[n_values % 32]

Blocks are 32 consecutive values of the flattened tensor (row-major); a row length that
is a multiple of 32 (every GGUF-quantized matrix) keeps blocks inside rows.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["BLOCK", "MAGIC", "PackError", "pack", "unpack", "packed_values"]

BLOCK = 32
MAGIC = b"SRA4"
_VERSION = 1
_HEAD = struct.Struct("<4sIQQQ")
#: a packed form must save at least this fraction of the raw bytes to be used
MIN_SAVING = 0.25
#: blocks looked at first; a tensor where fewer than half of them pack is sent raw
PROBE_BLOCKS = 256


class PackError(ValueError):
    """A packed tensor that is malformed, or whose value count is not the one expected."""


def _candidates(d: np.ndarray) -> list[np.ndarray]:
    """Scales to try, per block: ``d`` rounded to float16 (as GGUF stores it) and its
    float16 neighbours, then ``d`` as computed in float32."""
    h = d.astype(np.float16)
    return [h.astype(np.float32), np.nextafter(h, np.float16(np.inf)).astype(np.float32),
            np.nextafter(h, np.float16(-np.inf)).astype(np.float32), d]


def pack(values: np.ndarray) -> bytes | None:
    """The packed form of ``values`` (any shape, float32; flattened row-major), or
    None when too few blocks have the 4-bit affine form for it to save
    :data:`MIN_SAVING` of the bytes. Lossless: ``unpack(pack(v), v.size)`` is
    ``v.tobytes()`` bit for bit (checked block by block here). Raises TypeError for
    another dtype."""
    if values.dtype != np.float32:
        raise TypeError(f"pack takes float32 values, got {values.dtype}")
    v = np.ascontiguousarray(values).reshape(-1)
    n = v.size
    nb = n // BLOCK
    if nb == 0:
        return None
    blocks = v[:nb * BLOCK].reshape(nb, BLOCK)
    if nb > 4 * PROBE_BLOCKS and _exact_blocks(blocks[:PROBE_BLOCKS])[0].mean() < 0.5:
        return None  # a look at the first blocks says no: spare the whole pass (3 s on a 113 MB table)
    exact, best_d, best_q, lo = _exact_blocks(blocks)
    n_packed = int(exact.sum())
    size = _HEAD.size + (nb + 7) // 8 + n_packed * (8 + BLOCK // 2) + (nb - n_packed) * BLOCK * 4 \
        + (n - nb * BLOCK) * 4
    if size > (1 - MIN_SAVING) * n * 4:
        return None
    raw = ~exact
    codes = best_q[exact]
    nibbles = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    parts = [_HEAD.pack(MAGIC, _VERSION, n, nb, nb - n_packed), np.packbits(raw, bitorder="little").tobytes(),
             best_d[exact].astype("<f4").tobytes(), lo[exact].astype("<f4").tobytes(), nibbles.tobytes(),
             blocks[raw].astype("<f4").tobytes(), v[nb * BLOCK:].astype("<f4").tobytes()]
    return b"".join(parts)


def _exact_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For ``[n_blocks, 32]`` float32 blocks: which have the exact 4-bit affine form
    (bool ``[n_blocks]``), their scale ``d`` (float32 ``[n_blocks]``), codes (uint8
    ``[n_blocks, 32]``, 0..15) and minimum ``m`` (float32 ``[n_blocks]``)."""
    nb = blocks.shape[0]
    with np.errstate(all="ignore"):
        lo = blocks.min(axis=1)
        hi = blocks.max(axis=1)
        exact = np.zeros(nb, dtype=bool)
        best_d = np.zeros(nb, dtype=np.float32)
        best_q = np.zeros((nb, BLOCK), dtype=np.uint8)
        finite = np.isfinite(lo) & np.isfinite(hi)
        for d in _candidates(((hi - lo) / np.float32(15)).astype(np.float32)):
            todo = ~exact & finite
            if not todo.any():
                break
            dd = d[todo]
            safe = np.where(dd > 0, dd, np.float32(1))
            q = np.clip(np.rint((blocks[todo] - lo[todo, None]) / safe[:, None]), 0, 15)
            q = np.where(dd[:, None] > 0, q, 0).astype(np.uint8)
            rebuilt = dd[:, None] * q.astype(np.float32) + lo[todo, None]
            ok = np.all(rebuilt.view(np.uint32) == blocks[todo].view(np.uint32), axis=1)
            idx = np.flatnonzero(todo)[ok]
            exact[idx] = True
            best_d[idx] = dd[ok]
            best_q[idx] = q[ok]
    return exact, best_d, best_q, lo


def packed_values(data: bytes | bytearray | memoryview) -> int:
    """The number of float32 values a packed tensor holds (from its header).
    Raises PackError when ``data`` does not start with a packed header."""
    if len(data) < _HEAD.size:
        raise PackError("shorter than a packed header")
    magic, version, n, _, _ = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != _VERSION:
        raise PackError("not a packed tensor (magic or version)")
    return n


def unpack(data: bytes | bytearray | memoryview, n_values: int) -> bytes:
    """The float32 bytes (little endian, ``4 * n_values``) of a packed tensor.

    Raises PackError when ``data`` is malformed: another magic or version, another
    value count than ``n_values``, counts that do not add up, or a length that is not
    exactly what the header implies (checked before anything is allocated)."""
    n = packed_values(data)
    _, _, _, nb, n_raw = _HEAD.unpack_from(data, 0)
    if n != n_values or nb != n // BLOCK or n_raw > nb:
        raise PackError(f"header says {n} values in {nb} blocks ({n_raw} raw); expected {n_values}")
    n_packed = nb - n_raw
    bitmap_len = (nb + 7) // 8
    want = _HEAD.size + bitmap_len + n_packed * (8 + BLOCK // 2) + n_raw * BLOCK * 4 + (n - nb * BLOCK) * 4
    if len(data) != want:
        raise PackError(f"{len(data)} bytes where the header implies {want}")
    buf = np.frombuffer(data, dtype=np.uint8)
    o = _HEAD.size
    raw = np.unpackbits(buf[o:o + bitmap_len], bitorder="little")[:nb].astype(bool)
    if int(raw.sum()) != n_raw:
        raise PackError("the raw-block bitmap does not match its count")
    o += bitmap_len
    d = np.frombuffer(data, dtype="<f4", count=n_packed, offset=o)
    o += 4 * n_packed
    m = np.frombuffer(data, dtype="<f4", count=n_packed, offset=o)
    o += 4 * n_packed
    nib = buf[o:o + n_packed * BLOCK // 2].reshape(n_packed, BLOCK // 2)
    o += n_packed * BLOCK // 2
    q = np.empty((n_packed, BLOCK), dtype=np.float32)
    q[:, 0::2] = nib & 0x0F
    q[:, 1::2] = nib >> 4
    out = np.empty((nb, BLOCK), dtype=np.float32)
    with np.errstate(all="ignore"):
        out[~raw] = d.astype(np.float32)[:, None] * q + m.astype(np.float32)[:, None]
    out[raw] = np.frombuffer(data, dtype="<f4", count=n_raw * BLOCK, offset=o).reshape(n_raw, BLOCK)
    o += 4 * n_raw * BLOCK
    tail = np.frombuffer(data, dtype="<f4", count=n - nb * BLOCK, offset=o)
    return out.tobytes() + tail.tobytes()
