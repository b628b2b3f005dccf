"""The weights channel's messages: ``kind u8 | header_len u32 | header JSON | payload``
(little endian; the requests and replies are in :mod:`runtime.weights_share`)."""

from __future__ import annotations

import json
import struct

CHANNEL = "weights"
#: Largest tensor slice one request may ask for, bytes.
MAX_PART_BYTES = 4 << 20

_REQ = ord("Q")
_REP = ord("R")
_HDR = struct.Struct("<BI")


def encode(kind: int, header: dict, payload: bytes | memoryview = b"") -> bytes:
    """One weights-channel message: kind, header length, JSON header, payload."""
    h = json.dumps(header, separators=(",", ":")).encode()
    return _HDR.pack(kind, len(h)) + h + bytes(payload)


#: Largest JSON header of a weights message, bytes.
MAX_HEADER_BYTES = 64 * 1024


def _req_int(req: dict, key: str) -> int:
    """``req[key]`` if it is an integer (not a bool, a float, Infinity or text); else ValueError."""
    v = req[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{key} must be an integer, got {str(v)[:20]}")
    return v


def decode(data: bytes) -> tuple[int, dict, memoryview]:
    """Inverse of :func:`encode`. Raises ValueError when malformed."""
    if len(data) < _HDR.size:
        raise ValueError("message shorter than its header")
    kind, n = _HDR.unpack_from(data, 0)
    if kind not in (_REQ, _REP) or _HDR.size + n > len(data) or n > MAX_HEADER_BYTES:
        raise ValueError("bad kind or header length")
    try:
        header = json.loads(bytes(data[_HDR.size:_HDR.size + n]))
    except RecursionError:
        raise ValueError("header nested too deep") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return kind, header, memoryview(data)[_HDR.size + n:]
