"""Framing: our wire format inside each data-channel message (pure; no IO).

::

    whole message:  0x00, then the message bytes                       (1 byte header)
    piece:          0x01, msg_id u32, index u32, total u32, then bytes  (13 byte header)

A message whose wire size would exceed the peer's maximum message size is split into
pieces, numbered from 0, reassembled in order per (peer, channel) and delivered once
whole (:class:`Reassembler`); a malformed piece or one announcing more than the cap is
a :class:`ChunkError`.
"""

from __future__ import annotations

import struct
from typing import Optional

#: Channel names, in data-channel id order (id = index).
CHANNELS: tuple[str, ...] = ("residual", "reply", "weights")
#: Default cap on one reassembled incoming message, bytes.
DEFAULT_MAX_MESSAGE_BYTES_IN = 64 * 1024 * 1024
#: What aiortc advertises (a=max-message-size), bytes; used by the LoopbackHub.
AIORTC_MAX_MESSAGE_SIZE = 262144
#: RFC 8841 section 6: assume this when the remote SDP has no max-message-size, bytes.
DEFAULT_REMOTE_MAX_MESSAGE_SIZE = 65536

_WHOLE = 0
_PIECE = 1
_PIECE_HDR = struct.Struct("<BIII")  # kind, msg_id, index, total
PIECE_HEADER_BYTES = _PIECE_HDR.size  # 13


class ChunkError(ValueError):
    """A received piece is malformed or announces a message over the cap."""


def encode_message(msg_id: int, data: bytes, max_wire_bytes: int) -> list[bytes]:
    """The wire messages carrying ``data``: one whole message (1-byte header) when it
    fits in ``max_wire_bytes``, otherwise pieces of at most ``max_wire_bytes`` bytes
    (13-byte header each). ``msg_id`` is taken modulo 2**32. Raises ValueError if
    ``max_wire_bytes`` leaves no room for data or ``data`` is 4 GiB or more.
    """
    n = len(data)
    if max_wire_bytes <= PIECE_HEADER_BYTES:
        raise ValueError(f"max_wire_bytes {max_wire_bytes} leaves no room for data")
    if n + 1 <= max_wire_bytes:
        return [b"\x00" + bytes(data)]
    if n >= 1 << 32:
        raise ValueError(f"message of {n} bytes is too large (4 GiB limit)")
    step = max_wire_bytes - PIECE_HEADER_BYTES
    mid = msg_id & 0xFFFFFFFF
    view = memoryview(data)
    return [_PIECE_HDR.pack(_PIECE, mid, i, n) + view[off:off + step] for i, off in enumerate(range(0, n, step))]


class Reassembler:
    """In-order reassembly of one (peer, channel) stream of wire messages.

    ``feed(wire) -> bytes | None``: the whole message when ``wire`` completes one,
    else None. Raises ChunkError (after discarding the partial message) for a
    malformed piece or a message announcing more than ``max_bytes`` bytes; later
    pieces of an over-cap message are then dropped silently (counted in ``dropped``).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES_IN):
        self.max_bytes = max_bytes
        self._mid: Optional[int] = None
        self._next = 0
        self._total = 0
        self._got = 0
        self._parts: list[bytes] = []
        self._skip: Optional[int] = None
        self.dropped = 0  # wire messages dropped

    def _reset(self) -> None:
        self._mid, self._next, self._total, self._got, self._parts = None, 0, 0, 0, []

    def _fail(self, why: str) -> ChunkError:
        self.dropped += 1
        self._reset()
        return ChunkError(why)

    def feed(self, wire: bytes) -> Optional[bytes]:
        if not wire:
            raise self._fail("empty wire message")
        kind = wire[0]
        if kind == _WHOLE:
            if self._mid is not None:
                raise self._fail(f"whole message while message {self._mid} was {self._got}/{self._total} bytes in")
            if len(wire) - 1 > self.max_bytes:
                raise self._fail(f"message of {len(wire) - 1} bytes over the {self.max_bytes}-byte cap")
            return bytes(wire[1:])
        if kind != _PIECE:
            raise self._fail(f"unknown wire kind {kind}")
        if len(wire) <= PIECE_HEADER_BYTES:
            raise self._fail(f"piece of {len(wire)} bytes has no data after its {PIECE_HEADER_BYTES}-byte header")
        _, mid, index, total = _PIECE_HDR.unpack_from(wire)
        body = wire[PIECE_HEADER_BYTES:]
        if self._skip is not None:
            if mid == self._skip and index > 0:
                self.dropped += 1
                return None
            self._skip = None
        if index == 0:
            if self._mid is not None:
                raise self._fail(f"message {mid} began while message {self._mid} was {self._got}/{self._total} bytes in")
            if total > self.max_bytes:
                self._skip = mid
                raise self._fail(f"message of {total} bytes over the {self.max_bytes}-byte cap")
            self._mid, self._total = mid, total
        elif self._mid != mid or index != self._next:
            raise self._fail(f"piece {index} of message {mid}, expected piece {self._next} of message {self._mid}")
        elif total != self._total:
            raise self._fail(f"piece {index} of message {mid} says {total} bytes, piece 0 said {self._total}")
        if self._got + len(body) > self._total:
            raise self._fail(f"message {mid} has more bytes than the {self._total} announced")
        self._parts.append(bytes(body))
        self._got += len(body)
        self._next = index + 1
        if self._got == self._total:
            out = b"".join(self._parts)
            self._reset()
            return out
        return None

