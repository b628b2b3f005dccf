"""Residual frames as bytes: the header of planner/frames.py plus a float32 payload."""

from __future__ import annotations

import numpy as np

from planner.frames import HEADER_BYTES, DType, FrameError, FrameHeader, decode_header, encode_header


def encode_frame(h: FrameHeader, residual: np.ndarray | None) -> bytes:
    """Header + ``[tokens, hidden]`` float32 payload (none for control frames).

    Raises FrameError when the residual's shape disagrees with the header.
    """
    if residual is None:
        return encode_header(h)
    x = np.ascontiguousarray(residual, dtype=np.float32)
    if x.shape != (h.tokens, h.hidden):
        raise FrameError(f"residual {x.shape} does not match the header's [{h.tokens}, {h.hidden}]")
    return encode_header(h) + x.tobytes()


def decode_frame(data: bytes) -> tuple[FrameHeader, np.ndarray]:
    """Inverse of :func:`encode_frame`: ``(header, [tokens, hidden] float32 copy)``.

    Raises FrameError when the frame is malformed or its dtype is not float32.
    """
    h = decode_header(data)
    if h.dtype != DType.FLOAT32:
        raise FrameError("only float32 residuals are spoken here")
    x = np.frombuffer(data, dtype=np.float32, offset=HEADER_BYTES).reshape(h.tokens, h.hidden).copy()
    return h, x
