"""Residual frames as bytes: the header of planner/frames.py plus a float32 or float16 payload.

Stages compute in float32; the header's ``dtype`` says how the payload travels. Float16
(IEEE binary16, numpy's round-to-nearest-even conversion) halves the bytes per hop; values
beyond +-65504 become inf on the wire, which the receiving side's numerical checks then
report as a fault of the sending device rather than as text.
"""

from __future__ import annotations

import numpy as np

from planner.frames import HEADER_BYTES, DType, FrameError, FrameHeader, decode_header, encode_header

_NUMPY = {DType.FLOAT32: np.float32, DType.FLOAT16: np.float16}


def encode_frame(h: FrameHeader, residual: np.ndarray | None) -> bytes:
    """Header + ``[tokens, hidden]`` payload in the header's dtype (none for control frames).

    Args:
        h: the header; ``h.dtype`` FLOAT32 or FLOAT16 chooses the payload's encoding.
        residual: ``[tokens, hidden]`` float32 (converted to float16 when the header says so).
    Raises:
        FrameError: the residual's shape disagrees with the header.
    """
    if residual is None:
        return encode_header(h)
    x = np.ascontiguousarray(residual, dtype=np.float32)
    if x.shape != (h.tokens, h.hidden):
        raise FrameError(f"residual {x.shape} does not match the header's [{h.tokens}, {h.hidden}]")
    if h.dtype == DType.FLOAT16:
        with np.errstate(over="ignore"):  # out-of-range values become inf: reported downstream
            x = x.astype(np.float16)
    return encode_header(h) + x.tobytes()


def decode_frame(data: bytes) -> tuple[FrameHeader, np.ndarray]:
    """Inverse of :func:`encode_frame`: ``(header, [tokens, hidden] float32 copy)``.

    Raises FrameError when the frame is malformed (see :func:`planner.frames.decode_header`).
    """
    h = decode_header(data)
    x = np.frombuffer(data, dtype=_NUMPY[h.dtype], offset=HEADER_BYTES).reshape(h.tokens, h.hidden)
    return h, x.astype(np.float32)  # a copy either way
