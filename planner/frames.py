"""The binary frame that carries a residual between stages.

One format for the real transport and the simulator's frame sizes, so that what the
simulator sends through a link is exactly as large as what the runtime sends.

Layout (little endian, 32-byte header, then the payload)::

    offset size field
    0      4    magic  b"SRFM"
    4      1    version            (FRAME_VERSION)
    5      1    kind               (FrameKind)
    6      1    dtype              (DType: 0 float32, 1 float16)
    7      1    flags              (bit 0: the last stage returns this frame to the host;
                                        bits 1-4: the KV cache slot of its question, 0-15)
    8      4    question id        (uint32)
    12     4    lap id             (uint32)
    16     4    first position     (uint32, position of the first token in the sequence)
    20     4    token count        (uint32, rows of the residual)
    24     4    hidden size        (uint32, columns of the residual)
    28     4    payload bytes      (uint32, = tokens * hidden * itemsize)

    payload: the residual, [tokens, hidden] row-major in ``dtype``.

Control frames (kind ROLLBACK, WAKE) carry no payload (token count 0).
"""

from __future__ import annotations

import enum
import struct

from planner.fastdc import frozen

FRAME_MAGIC = b"SRFM"
FRAME_VERSION = 1
_HEADER = struct.Struct("<4sBBBBIIIIII")
HEADER_BYTES = _HEADER.size  # 32
#: Largest payload accepted by decode_header (a 64k-token prefill chunk of a 8192-wide f32 model).
MAX_PAYLOAD_BYTES = 1 << 31
#: KV cache slots a frame can name (flags bits 1-4): the most questions in flight.
MAX_SLOTS = 16


class FrameKind(enum.IntEnum):
    """What a frame is for."""

    PREFILL = 1   # a prompt chunk going forward through the stages
    DECODE = 2    # one decode token or a verify batch of k+1 positions going forward
    RESULT = 3    # the last stage's residual going back to the host
    RETURN = 4    # a result travelling back through the stages (return path via_stages)
    ROLLBACK = 5  # truncate a question's KV cache to `first position`
    WAKE = 6      # a frame is coming: keep the GPU clocked up


class DType(enum.IntEnum):
    """Residual dtype on the wire; value is the code, :func:`itemsize` its size."""

    FLOAT32 = 0
    FLOAT16 = 1


_ITEMSIZE = {DType.FLOAT32: 4, DType.FLOAT16: 2}


def itemsize(dtype: DType) -> int:
    """Bytes per residual value for ``dtype``. Raises KeyError for an unknown code."""
    return _ITEMSIZE[dtype]


class FrameError(ValueError):
    """A frame is malformed: bad magic, version, kind, dtype, or sizes that disagree."""


@frozen
class FrameHeader:
    """The header fields of a frame (see module doc for the layout)."""

    kind: FrameKind
    question_id: int
    lap_id: int
    first_pos: int
    tokens: int
    hidden: int
    dtype: DType = DType.FLOAT32
    returns: bool = False
    slot: int = 0  # the KV cache of its question on every stage (0 .. MAX_SLOTS - 1)

    @property
    def payload_bytes(self) -> int:
        """Payload size: ``tokens * hidden * itemsize(dtype)`` bytes."""
        return self.tokens * self.hidden * itemsize(self.dtype)

    @property
    def frame_bytes(self) -> int:
        """Whole frame on the wire: header plus payload, bytes."""
        return HEADER_BYTES + self.payload_bytes

    def with_kind(self, kind: FrameKind) -> "FrameHeader":
        """The same header with another kind."""
        return FrameHeader(kind, self.question_id, self.lap_id, self.first_pos, self.tokens, self.hidden,
                           self.dtype, self.returns, self.slot)


def frame_bytes(tokens: int, hidden: int, dtype: DType = DType.FLOAT32) -> int:
    """Bytes of a frame carrying a ``[tokens, hidden]`` residual in ``dtype``."""
    return HEADER_BYTES + tokens * hidden * itemsize(dtype)


def encode_header(h: FrameHeader) -> bytes:
    """The 32 header bytes of ``h``. Raises FrameError if a field does not fit uint32."""
    try:
        if not 0 <= h.slot < MAX_SLOTS:
            raise FrameError(f"KV cache slot {h.slot} outside 0-{MAX_SLOTS - 1}")
        return _HEADER.pack(FRAME_MAGIC, FRAME_VERSION, int(h.kind), int(h.dtype), (1 if h.returns else 0) | h.slot << 1,
                            h.question_id, h.lap_id, h.first_pos, h.tokens, h.hidden, h.payload_bytes)
    except struct.error as e:
        raise FrameError(f"header field out of range: {e}") from None


def decode_header(data: bytes | bytearray | memoryview) -> FrameHeader:
    """Parse and check the header at the start of ``data``.

    Raises FrameError when ``data`` is shorter than a header, the magic or version is
    wrong, kind or dtype is unknown, the payload size disagrees with tokens x hidden,
    the payload is larger than MAX_PAYLOAD_BYTES, or ``data`` is not exactly header +
    payload long.
    """
    if len(data) < HEADER_BYTES:
        raise FrameError(f"frame of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, kind, dtype, flags, qid, lap, first, tokens, hidden, payload = _HEADER.unpack_from(data)
    if magic != FRAME_MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if version != FRAME_VERSION:
        raise FrameError(f"frame version {version}, this side speaks {FRAME_VERSION}")
    try:
        kind = FrameKind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    try:
        dtype = DType(dtype)
    except ValueError:
        raise FrameError(f"unknown dtype code {dtype}") from None
    if payload > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload of {payload} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit")
    if payload != tokens * hidden * itemsize(dtype):
        raise FrameError(f"payload {payload} bytes but {tokens} x {hidden} x {itemsize(dtype)} expected")
    if len(data) != HEADER_BYTES + payload:
        raise FrameError(f"frame is {len(data)} bytes, header says {HEADER_BYTES + payload}")
    if flags >> 5:
        raise FrameError(f"unknown flags {flags:#04x}")
    return FrameHeader(kind, qid, lap, first, tokens, hidden, dtype, bool(flags & 1), (flags >> 1) & 0xF)
