"""Peer-to-peer transport for the room: WebRTC data channels (aiortc), one asyncio API.

``connect_room(relay_url, room, device, peers)`` joins the signalling relay
(runtime/relay.py), builds one ``RTCPeerConnection`` per peer (full mesh; the
lexicographically smaller device id makes the offer), with no STUN/TURN server
(``RTCConfiguration(iceServers=[])``; ``None`` would add a public STUN server), and
returns a :class:`Transport` once every data channel to every peer is open. The relay
sees only SDP; every message goes peer to peer.

Channels, per pair, ordered and reliable, negotiated up front (``negotiated=True``):

=========  ==  ==================================================================
name       id  carries
=========  ==  ==================================================================
residual   0   residual hand-offs (planner/frames.py frames); handed to SCTP at once
reply      1   answers streamed to guests
weights    2   cached weights copied between devices
=========  ==  ==================================================================

The residual is never queued behind the others. aiortc keeps one FIFO for all the
channels of a connection and moves the next message into SCTP only when the
previous one has been fully transmitted (``RTCSctpTransport._data_channel_flush``),
so a 256 KiB weights message handed over whole would hold a residual back for the
whole transfer. Here reply and weights messages go through a per-peer paced sender
that hands them to aiortc in pieces of ``BULK_PIECE_BYTES`` and only when aiortc's
queues are empty; a residual therefore waits for at most one such piece.

Wire format (ours, inside each data-channel message; little endian)::

    whole message:  0x00, then the message bytes                       (1 byte header)
    piece:          0x01, msg_id u32, index u32, total u32, then bytes  (13 byte header)

A message whose wire size would exceed the peer's maximum message size (from the
remote SDP's ``a=max-message-size``; aiortc advertises 256 KiB, RFC 8841 says 64 KiB
when absent, 0 means no limit) is split into pieces, numbered from 0, reassembled in
order per (peer, channel) and delivered once whole. A malformed piece (unknown kind,
short header, wrong message id or index, more bytes than announced) or a message
announcing more than ``max_message_bytes_in`` (default 64 MiB) is dropped with one
logged line; the partial message is discarded and the connection stays up.

Loopback candidates. aioice (``aioice.ice.get_host_addresses``) leaves 127.0.0.1 out
of its host candidates, so two peers that only have loopback (a fresh network
namespace, a sandbox) gather no candidates and ICE hangs silently. This module
replaces that function (``_install_candidate_patch``, run by connect_room) with one
that appends 127.0.0.1 to the list, and honours a per-connection override
(``connect_room(..., host_addresses=[...])``, carried by a context variable) so tests
and namespace runs can pin the exact addresses they use.

SCTP burst: see :func:`tune_sctp` and docs/transport.md.

The in-process :class:`LoopbackHub` gives the same :class:`Transport` API without
WebRTC (delivery through ``loop.call_soon``, same chunking code), for room tests.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import re
import struct
import time
from collections import deque
from typing import Callable, Optional, Sequence

log = logging.getLogger("splitroom.transport")

#: Channel names, in data-channel id order (id = index).
CHANNELS: tuple[str, ...] = ("residual", "reply", "weights")
#: Default cap on one reassembled incoming message, bytes.
DEFAULT_MAX_MESSAGE_BYTES_IN = 64 * 1024 * 1024
#: What aiortc advertises (a=max-message-size), bytes; used by the LoopbackHub.
AIORTC_MAX_MESSAGE_SIZE = 262144
#: RFC 8841 section 6: assume this when the remote SDP has no max-message-size, bytes.
DEFAULT_REMOTE_MAX_MESSAGE_SIZE = 65536
#: Piece size for the paced (reply, weights) channels, bytes on the wire.
BULK_PIECE_BYTES = 16 * 1024
#: The paced sender hands over the next piece only while at most this many bytes
#: are in flight (sent, not acknowledged). Without it SCTP's window grows to the
#: peer's 1 MiB receive window during a bulk transfer and a residual queues behind
#: up to a megabyte in the network (measured: p50 26 ms, max 226 ms on loopback).
#: 32 KiB: a residual sent during an 8 MiB weights copy waits p50 +2.8 ms at 20 ms RTT
#: (weights at 1.6 MB/s); 64 KiB: same residual wait, weights 2.7 MB/s but twice the
#: wait on loopback (docs/transport.md). Per connection: connect_room(bulk_inflight_bytes=).
BULK_INFLIGHT_BYTES = 32 * 1024
#: Poll interval of the paced sender while aiortc still has data queued, seconds.
_BULK_POLL_S = 0.001

_WHOLE = 0
_PIECE = 1
_PIECE_HDR = struct.Struct("<BIII")  # kind, msg_id, index, total
PIECE_HEADER_BYTES = _PIECE_HDR.size  # 13

Handler = Callable[[str, str, bytes], None]


class TransportError(RuntimeError):
    """The transport cannot do what was asked: a channel did not open in time (the
    message names the peer), an unknown peer, a closed transport, a failed connection."""


class ChunkError(ValueError):
    """A received piece is malformed or announces a message over the cap."""


# --------------------------------------------------------------------------- chunking

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


# --------------------------------------------------------------------------- base API

def _new_stats() -> dict[str, dict[str, int]]:
    return {c: {"sent_messages": 0, "sent_bytes": 0, "recv_messages": 0, "recv_bytes": 0, "dropped": 0}
            for c in CHANNELS}


class Transport:
    """One device's connections to its peers (same API for WebRTC and loopback).

    Attributes: ``device`` (this device's id), ``peers`` (tuple of peer ids),
    ``max_message_bytes`` (largest residual message sent without splitting, bytes on
    the wire, the smallest over the peers), ``stats`` (per channel: sent/recv
    messages and bytes of whole messages, dropped wire messages).
    """

    def __init__(self, device: str, peers: Sequence[str], max_message_bytes_in: int):
        self.device = device
        self.peers: tuple[str, ...] = tuple(peers)
        self.max_message_bytes_in = max_message_bytes_in
        self.stats = _new_stats()
        self._handler: Optional[Handler] = None
        self._lost_handler: Optional[Callable[[str, str], None]] = None
        self._lost_peers: set[str] = set()
        self._pending: deque[tuple[str, str, bytes]] = deque()
        self._reasm = {(p, c): Reassembler(max_message_bytes_in) for p in self.peers for c in CHANNELS}
        self._msg_id = 0
        self._closed = False

    # -- public
    @property
    def max_message_bytes(self) -> int:
        raise NotImplementedError

    def set_lost_handler(self, fn: Optional[Callable[[str, str], None]]) -> None:
        """Call ``fn(peer, reason)`` once when the connection to ``peer`` fails or closes
        while this transport is open (a plain callback on the event loop)."""
        self._lost_handler = fn

    def _peer_lost(self, peer: str, reason: str) -> None:
        if self._lost_handler is not None and peer not in self._lost_peers and not self._closed:
            self._lost_peers.add(peer)
            self._lost_handler(peer, reason)

    @property
    def handler(self) -> Optional[Handler]:
        """The handler installed now (None before one is set); a layer that wants some
        messages can wrap it and pass the others on."""
        return self._handler

    def set_handler(self, fn: Optional[Handler]) -> None:
        """Deliver each whole incoming message as ``fn(src, channel, data)``, a plain
        callback run on the event loop. Messages that arrived before a handler was
        set are delivered (in order) on the next loop iteration."""
        self._handler = fn
        if fn is not None and self._pending:
            asyncio.get_running_loop().call_soon(self._flush_pending)

    async def send(self, dst: str, channel: str, data: bytes) -> None:
        """Send ``data`` to peer ``dst`` on ``channel`` (one of CHANNELS).

        Returns when the message is handed to the connection (residual: at once;
        reply/weights: once every piece has been handed to SCTP, which paces bulk
        senders). Raises TransportError (unknown peer, closed transport or
        connection) or ValueError (unknown channel, data not bytes-like).
        """
        if self._closed:
            raise TransportError(f"{self.device}: transport is closed")
        if dst not in self.peers:
            raise TransportError(f"{self.device}: {dst!r} is not a peer (peers: {', '.join(self.peers)})")
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data must be bytes, not {type(data).__name__}")
        self._msg_id += 1
        wires = encode_message(self._msg_id, data, self._wire_limit(dst, channel))
        st = self.stats[channel]
        st["sent_messages"] += 1
        st["sent_bytes"] += len(data)
        await self._send_wires(dst, channel, wires)

    async def close(self) -> None:
        """Close every connection; idempotent. Later sends raise TransportError."""
        self._closed = True

    # -- for implementations
    def _wire_limit(self, dst: str, channel: str) -> int:
        raise NotImplementedError

    async def _send_wires(self, dst: str, channel: str, wires: list[bytes]) -> None:
        raise NotImplementedError

    async def _send_raw(self, dst: str, channel: str, wire: bytes) -> None:
        """Send one wire message as is (tests: malformed pieces)."""
        await self._send_wires(dst, channel, [wire])

    def _on_wire(self, src: str, channel: str, wire: bytes | str) -> None:
        if self._closed:
            return
        st = self.stats[channel]
        if not isinstance(wire, (bytes, bytearray)):
            st["dropped"] += 1
            log.warning("%s: dropped a text message from %s on %s (binary only)", self.device, src, channel)
            return
        r = self._reasm[(src, channel)]
        try:
            msg = r.feed(wire)
        except ChunkError as e:
            st["dropped"] += 1
            log.warning("%s: dropped a piece from %s on %s: %s", self.device, src, channel, e)
            return
        if msg is None:
            return
        st["recv_messages"] += 1
        st["recv_bytes"] += len(msg)
        if self._handler is None:
            self._pending.append((src, channel, msg))
            return
        self._deliver(src, channel, msg)

    def _deliver(self, src: str, channel: str, msg: bytes) -> None:
        try:
            self._handler(src, channel, msg)  # type: ignore[misc]
        except Exception:  # a handler bug must not kill the transport
            log.exception("%s: handler raised on a message from %s on %s", self.device, src, channel)

    def _flush_pending(self) -> None:
        while self._pending and self._handler is not None:
            self._deliver(*self._pending.popleft())


# --------------------------------------------------------------------------- loopback

class LoopbackHub:
    """In-process room: ``hub.transport(device)`` gives a Transport that reaches every
    other device of the hub; messages are delivered with ``loop.call_soon`` (in order,
    never re-entrantly), through the same chunking code as WebRTC with pieces of
    ``max_message_bytes`` (default: aiortc's 256 KiB)."""

    def __init__(self, max_message_bytes: int = AIORTC_MAX_MESSAGE_SIZE,
                 max_message_bytes_in: int = DEFAULT_MAX_MESSAGE_BYTES_IN):
        self.max_message_bytes = max_message_bytes
        self.max_message_bytes_in = max_message_bytes_in
        self._members: dict[str, "LoopbackTransport"] = {}

    def transport(self, device: str, peers: Optional[Sequence[str]] = None) -> "LoopbackTransport":
        """A transport for ``device``; ``peers`` defaults to every device id ever asked
        of this hub (dynamic: later devices become peers too). Raises ValueError for a
        device id already in the hub."""
        if device in self._members:
            raise ValueError(f"device {device!r} already has a transport in this hub")
        t = LoopbackTransport(self, device, peers)
        self._members[device] = t
        return t


class LoopbackTransport(Transport):
    """A Transport inside a LoopbackHub (see there)."""

    def __init__(self, hub: LoopbackHub, device: str, peers: Optional[Sequence[str]]):
        self._hub = hub
        self._fixed_peers = peers is not None
        super().__init__(device, peers or (), hub.max_message_bytes_in)

    @property
    def peers(self) -> tuple[str, ...]:  # type: ignore[override]
        if self._fixed_peers:
            return self._peers
        return tuple(d for d in self._hub._members if d != self.device)

    @peers.setter
    def peers(self, value: tuple[str, ...]) -> None:
        self._peers = tuple(value)

    @property
    def max_message_bytes(self) -> int:
        return self._hub.max_message_bytes

    def _wire_limit(self, dst: str, channel: str) -> int:
        return self._hub.max_message_bytes

    def _on_wire(self, src: str, channel: str, wire: bytes | str) -> None:
        if (src, channel) not in self._reasm:
            self._reasm[(src, channel)] = Reassembler(self.max_message_bytes_in)
        super()._on_wire(src, channel, wire)

    async def _send_wires(self, dst: str, channel: str, wires: list[bytes]) -> None:
        peer = self._hub._members.get(dst)
        if peer is None or peer._closed:
            raise TransportError(f"{self.device}: peer {dst!r} is not connected")
        loop = asyncio.get_running_loop()
        for w in wires:
            loop.call_soon(peer._on_wire, self.device, channel, bytes(w))

    async def close(self) -> None:
        self._closed = True
        if self._hub._members.get(self.device) is self:
            del self._hub._members[self.device]


# --------------------------------------------------------------------------- ICE host candidates

_host_addresses: contextvars.ContextVar[Optional[tuple[str, ...]]] = contextvars.ContextVar(
    "splitroom_host_addresses", default=None)


def _install_candidate_patch() -> None:
    """Replace ``aioice.ice.get_host_addresses`` (see module doc). Idempotent."""
    import aioice.ice as ice

    if getattr(ice.get_host_addresses, "_splitroom", False):
        return
    original = ice.get_host_addresses

    def _patched_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        pinned = _host_addresses.get()
        if pinned is not None:
            return [a for a in pinned if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]
        addrs = original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        if use_ipv4 and "127.0.0.1" not in addrs:
            addrs.append("127.0.0.1")  # loopback last: real interfaces are preferred
        return addrs

    _patched_host_addresses._splitroom = True  # type: ignore[attr-defined]
    _patched_host_addresses._original = original  # type: ignore[attr-defined]
    ice.get_host_addresses = _patched_host_addresses


# --------------------------------------------------------------------------- SCTP burst

#: aiortc's hard-coded burst: ``RTCSctpTransport._transmit`` sends at most
#: ``4 * USERDATA_MAX_LENGTH`` beyond the bytes in flight per call (aiortc 1.16
#: rtcsctptransport.py, "limit burst size"; the module constant SCTP_MAX_BURST = 4 is
#: not what it reads), and the congestion window starts at ``3 * USERDATA_MAX_LENGTH``.
AIORTC_BURST_CHUNKS = 4
AIORTC_INITIAL_CWND_CHUNKS = 3
#: Defaults applied by connect_room (measured in docs/transport.md).
DEFAULT_MAX_BURST_CHUNKS = 32  # a 16-token prefill chunk (36.9 KB, 32 chunks) in one burst
DEFAULT_INITIAL_CWND_CHUNKS = 10  # ~11.6 KB, like TCP's IW10 (RFC 6928)
_sctp_tuning: dict[str, int] = {"max_burst": AIORTC_BURST_CHUNKS, "initial_cwnd": AIORTC_INITIAL_CWND_CHUNKS}


def tune_sctp(max_burst: Optional[int] = DEFAULT_MAX_BURST_CHUNKS,
              initial_cwnd: Optional[int] = DEFAULT_INITIAL_CWND_CHUNKS) -> dict[str, int]:
    """Opt-in fix for aiortc's SCTP sender (process-wide; applies to associations made
    afterwards for ``initial_cwnd``, to every association for ``max_burst``).

    ``max_burst``: most DATA chunks (1160 bytes of user data each) sent in one burst
    (aiortc: 4). Implemented by calling aiortc's own ``_transmit`` again while it
    made progress, the congestion window allows more and no fast recovery is under
    way, so the burst grows in steps of 4 chunks and congestion control, fast
    recovery and retransmission are aiortc's unchanged. ``initial_cwnd``: the
    congestion window of a new association in chunks (aiortc: 3; RFC 6928's IW10 is
    the TCP analogue); losses still shrink it as aiortc does. ``None`` restores
    aiortc's value. Returns the settings now in force. Raises ValueError for values
    below 1.

    Why: a decode frame (2336 bytes + 1) is 3 chunks; a 10 KB frame is 9 chunks, which
    with a 3-chunk window and 4-chunk bursts needs several round trips on a delayed
    link (issue 5). Sources: aiortc/rtcsctptransport.py ``_transmit``,
    ``_receive_sack_chunk``; RFC 4960 section 6.1 and 7.2.
    """
    from aiortc import rtcsctptransport as m

    cls = m.RTCSctpTransport
    if not hasattr(cls, "_splitroom_orig_transmit"):
        cls._splitroom_orig_transmit = cls._transmit
        cls._splitroom_orig_init = cls.__init__

        async def _transmit(self) -> None:  # type: ignore[no-untyped-def]
            orig = cls._splitroom_orig_transmit
            await orig(self)
            extra = math.ceil(_sctp_tuning["max_burst"] / AIORTC_BURST_CHUNKS) - 1
            for _ in range(max(0, extra)):
                if (self._fast_recovery_exit is not None or not self._outbound_queue
                        or self._flight_size >= self._cwnd):
                    break
                before = self._flight_size
                await orig(self)
                if self._flight_size <= before:
                    break

        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            cls._splitroom_orig_init(self, *args, **kwargs)
            self._cwnd = _sctp_tuning["initial_cwnd"] * m.USERDATA_MAX_LENGTH

        cls._transmit = _transmit
        cls.__init__ = __init__
    for name, v, default in (("max_burst", max_burst, AIORTC_BURST_CHUNKS),
                             ("initial_cwnd", initial_cwnd, AIORTC_INITIAL_CWND_CHUNKS)):
        v = default if v is None else int(v)
        if v < 1:
            raise ValueError(f"{name} must be at least 1 chunk, got {v}")
        _sctp_tuning[name] = v
    return dict(_sctp_tuning)


def emulate_delay(transport: "Transport", one_way_s: float) -> None:
    """Measurement aid: delay every packet this side sends by ``one_way_s`` seconds
    (in process, order kept), on every peer connection of a WebRTC transport made by
    connect_room. Apply it on both sides for an RTT of 2 x one_way_s. It wraps the ICE
    transport's send, below DTLS and SCTP, so SCTP's windows and bursts see the delay.
    Raises TypeError for a transport without WebRTC connections."""
    if not isinstance(transport, RtcTransport):
        raise TypeError("emulate_delay needs a transport from connect_room")
    loop = asyncio.get_running_loop()
    for link in transport._links.values():
        ice = link.pc.sctp.transport.transport  # pc.sctp (SCTP) -> .transport (DTLS) -> .transport (ICE)
        send = getattr(ice, "_splitroom_send", None) or ice._send
        ice._splitroom_send = send
        if one_way_s <= 0:
            ice._send = send
            continue

        async def _late(data: bytes, _send=send) -> None:
            try:
                await _send(data)
            except ConnectionError:  # closed while the packet was "in the air": lost
                pass

        async def delayed(data: bytes, _late=_late) -> None:
            loop.call_later(one_way_s, lambda: asyncio.ensure_future(_late(data)))

        ice._send = delayed


# --------------------------------------------------------------------------- WebRTC

_MAX_MSG_RE = re.compile(r"^a=max-message-size:(\d+)\s*$", re.M)


def remote_max_message_size(sdp: str) -> int:
    """The peer's largest accepted message from its SDP, bytes (RFC 8841 section 6:
    64 KiB when absent; 0, "any size", becomes aiortc's 256 KiB here)."""
    m = _MAX_MSG_RE.search(sdp)
    if not m:
        return DEFAULT_REMOTE_MAX_MESSAGE_SIZE
    v = int(m.group(1))
    return v if v > 0 else AIORTC_MAX_MESSAGE_SIZE


class _Link:
    """One peer: its RTCPeerConnection, data channels and paced bulk sender."""

    def __init__(self, peer: str):
        self.peer = peer
        self.pc = None  # RTCPeerConnection
        self.channels: dict = {}
        self.max_message_bytes = DEFAULT_REMOTE_MAX_MESSAGE_SIZE
        self.bulk: deque = deque()  # (channel, wires, future)
        self.bulk_wake = asyncio.Event()
        self.bulk_task: Optional[asyncio.Task] = None
        self.failed: Optional[str] = None
        self.bulk_inflight_bytes = BULK_INFLIGHT_BYTES

    def sctp_busy(self) -> bool:
        """Whether aiortc still holds data of this connection not yet transmitted, or
        more than BULK_INFLIGHT_BYTES sent and not yet acknowledged."""
        try:
            sctp = self.pc.sctp  # RTCSctpTransport
            return (bool(sctp._data_channel_queue) or bool(sctp._outbound_queue)
                    or sctp._flight_size > self.bulk_inflight_bytes)
        except AttributeError:  # private names moved: fall back to the public counter
            return any(ch.bufferedAmount for ch in self.channels.values())


class RtcTransport(Transport):
    """A Transport over aiortc data channels; made by :func:`connect_room`."""

    def __init__(self, device: str, peers: Sequence[str], max_message_bytes_in: int):
        super().__init__(device, peers, max_message_bytes_in)
        self._links: dict[str, _Link] = {p: _Link(p) for p in peers}

    @property
    def max_message_bytes(self) -> int:
        return min((lk.max_message_bytes for lk in self._links.values()), default=AIORTC_MAX_MESSAGE_SIZE)

    def _wire_limit(self, dst: str, channel: str) -> int:
        lim = self._links[dst].max_message_bytes
        return lim if channel == "residual" else min(lim, BULK_PIECE_BYTES)

    def _link(self, dst: str) -> _Link:
        lk = self._links[dst]
        if lk.failed:
            raise TransportError(f"{self.device}: connection to {dst!r} is down: {lk.failed}")
        return lk

    async def _send_wires(self, dst: str, channel: str, wires: list[bytes]) -> None:
        lk = self._link(dst)
        ch = lk.channels[channel]
        if channel == "residual":
            try:
                for w in wires:
                    ch.send(bytes(w))
            except Exception as e:  # InvalidStateError, ConnectionError
                raise TransportError(f"{self.device}: send to {dst!r} on {channel} failed: {e!r}") from e
            return
        fut = asyncio.get_running_loop().create_future()
        lk.bulk.append((channel, wires, fut))
        lk.bulk_wake.set()
        await fut

    async def _bulk_sender(self, lk: _Link) -> None:
        """Hand reply/weights pieces to aiortc one at a time, only when it is idle;
        replies go before weights."""
        while True:
            await lk.bulk_wake.wait()
            lk.bulk_wake.clear()
            while lk.bulk:
                # replies first: take the first reply item if any, else the head
                idx = next((i for i, it in enumerate(lk.bulk) if it[0] == "reply"), 0)
                channel, wires, fut = lk.bulk[idx]
                del lk.bulk[idx]
                try:
                    for w in wires:
                        while lk.sctp_busy():
                            await asyncio.sleep(_BULK_POLL_S)
                        if lk.failed:
                            raise TransportError(f"connection to {lk.peer!r} is down: {lk.failed}")
                        lk.channels[channel].send(bytes(w))
                except Exception as e:
                    if not fut.done():
                        fut.set_exception(e if isinstance(e, TransportError) else TransportError(
                            f"{self.device}: send to {lk.peer!r} on {channel} failed: {e!r}"))
                    continue
                if not fut.done():
                    fut.set_result(None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lk in self._links.values():
            if lk.bulk_task is not None:
                lk.bulk_task.cancel()
                try:
                    await lk.bulk_task
                except (asyncio.CancelledError, Exception):
                    pass
            for _, _, fut in lk.bulk:
                if not fut.done():
                    fut.set_exception(TransportError(f"{self.device}: transport closed"))
            lk.bulk.clear()
            if lk.pc is not None:
                try:
                    await lk.pc.close()
                except Exception as e:  # pragma: no cover - best effort
                    log.info("%s: closing connection to %s: %r", self.device, lk.peer, e)


class _Signalling:
    """The relay websocket of one connect_room call."""

    def __init__(self, device: str, peers: Sequence[str]):
        self.device = device
        self.present: set[str] = set()
        self.changed = asyncio.Event()
        self.inbox: dict[str, asyncio.Queue] = {p: asyncio.Queue() for p in peers}
        self.closed_reason: Optional[str] = None
        self.session = None
        self.ws = None
        self.reader: Optional[asyncio.Task] = None

    async def open(self, relay_url: str, room: str) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession()
        url = f"{relay_url.rstrip('/')}/room/{room}"
        try:
            self.ws = await self.session.ws_connect(url, max_msg_size=64 * 1024, heartbeat=None)
        except Exception as e:
            await self.session.close()
            raise TransportError(f"{self.device}: cannot reach the relay at {url}: {e!r}") from e
        await self.ws.send_str(json.dumps({"type": "hello", "device": self.device}))
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        import aiohttp

        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            try:
                obj = json.loads(msg.data)
            except ValueError:
                log.warning("%s: relay sent a non-JSON message; ignored", self.device)
                continue
            if obj.get("type") == "peers":
                self.present = set(obj.get("devices", []))
                self.changed.set()
            elif obj.get("type") == "signal" and obj.get("from") in self.inbox:
                self.inbox[obj["from"]].put_nowait(obj.get("data"))
            else:
                log.info("%s: relay message %r ignored", self.device, str(obj.get("type"))[:20])
        self.closed_reason = f"relay closed the connection ({self.ws.close_code})"
        self.changed.set()
        for q in self.inbox.values():
            q.put_nowait(None)

    async def wait_present(self, peer: str) -> None:
        while peer not in self.present:
            if self.closed_reason:
                raise TransportError(f"{self.device}: waiting for {peer!r}: {self.closed_reason}")
            self.changed.clear()
            await self.changed.wait()

    async def signal(self, peer: str, desc) -> None:
        await self.ws.send_str(json.dumps({"type": "signal", "to": peer,
                                           "data": {"type": desc.type, "sdp": desc.sdp}}))

    async def receive(self, peer: str, kind: str):
        from aiortc import RTCSessionDescription

        data = await self.inbox[peer].get()
        if data is None:
            raise TransportError(f"{self.device}: waiting for {kind} from {peer!r}: {self.closed_reason}")
        if not isinstance(data, dict) or data.get("type") != kind or not isinstance(data.get("sdp"), str):
            raise TransportError(f"{self.device}: expected an SDP {kind} from {peer!r}")
        return RTCSessionDescription(sdp=data["sdp"], type=kind)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 2.0)
            except (asyncio.TimeoutError, Exception):
                self.reader.cancel()
        if self.session is not None:
            await self.session.close()


async def connect_room(relay_url: str, room: str, device: str, peers: Sequence[str], *,
                       open_timeout_s: float = 20.0,
                       max_message_bytes_in: int = DEFAULT_MAX_MESSAGE_BYTES_IN,
                       host_addresses: Optional[Sequence[str]] = None,
                       sctp_tuning: bool = True,
                       bulk_inflight_bytes: int = BULK_INFLIGHT_BYTES) -> Transport:
    """Join ``room`` on the relay at ``relay_url`` (``ws://host:port``) as ``device``,
    open data channels to every device in ``peers`` and return the Transport.

    Full mesh: one RTCPeerConnection per peer, no STUN/TURN servers; the smaller id
    (string order) offers once the relay reports the other present. Each peer's
    connection must have its three channels open within ``open_timeout_s`` seconds
    (waiting for the peer to join, the SDP exchange, ICE, DTLS and SCTP included).
    ``host_addresses``: the only addresses to offer as ICE host candidates (e.g.
    ``["127.0.0.1"]`` or a namespace's veth address); default: every interface plus
    127.0.0.1. ``max_message_bytes_in``: cap on one reassembled incoming message,
    bytes. ``sctp_tuning``: apply :func:`tune_sctp` with its defaults (process-wide)
    before connecting; False leaves aiortc's SCTP as it is set now.
    ``bulk_inflight_bytes``: reply/weights pieces are handed to SCTP only while at
    most this many bytes are unacknowledged (residual latency vs bulk throughput).

    The relay websocket is closed once every channel is open: the relay sees the SDP
    exchange and nothing after it.

    Raises TransportError when the relay cannot be reached or closes the connection,
    or a peer's channels do not open in time (the message names the peer); ValueError
    for a peer list that contains ``device`` or duplicates.
    """
    from aiortc import RTCConfiguration, RTCPeerConnection

    peers = tuple(peers)
    if device in peers or len(set(peers)) != len(peers):
        raise ValueError(f"peers {peers!r} must be distinct and must not contain {device!r}")
    _install_candidate_patch()
    if sctp_tuning:
        tune_sctp()
    token = _host_addresses.set(tuple(host_addresses) if host_addresses is not None else None)
    transport = RtcTransport(device, peers, max_message_bytes_in)
    for lk in transport._links.values():
        lk.bulk_inflight_bytes = bulk_inflight_bytes
    sig = _Signalling(device, peers)
    try:
        await sig.open(relay_url, room)
        loop = asyncio.get_running_loop()

        async def link(peer: str) -> None:
            lk = transport._links[peer]
            stage = ["creating the connection"]

            async def build() -> None:
                pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
                lk.pc = pc
                opened = []
                for i, name in enumerate(CHANNELS):
                    ch = pc.createDataChannel(name, ordered=True, negotiated=True, id=i)
                    fut = loop.create_future()
                    ch.on("open", lambda f=fut: f.done() or f.set_result(None))
                    ch.on("message", lambda data, n=name: transport._on_wire(peer, n, data))
                    lk.channels[name] = ch
                    opened.append(fut)

                @pc.on("connectionstatechange")
                def _state() -> None:
                    if pc.connectionState in ("failed", "closed") and not transport._closed:
                        lk.failed = f"connection {pc.connectionState}"
                        log.log(logging.WARNING if pc.connectionState == "failed" else logging.INFO,
                                "%s: connection to %s %s", device, peer, pc.connectionState)
                        transport._peer_lost(peer, lk.failed)

                if device < peer:
                    stage[0] = "waiting for the peer to join the relay"
                    await sig.wait_present(peer)
                    stage[0] = "making the offer"
                    await pc.setLocalDescription(await pc.createOffer())
                    await sig.signal(peer, pc.localDescription)
                    stage[0] = "waiting for the answer"
                    await pc.setRemoteDescription(await sig.receive(peer, "answer"))
                else:
                    stage[0] = "waiting for the offer"
                    await pc.setRemoteDescription(await sig.receive(peer, "offer"))
                    stage[0] = "making the answer"
                    await pc.setLocalDescription(await pc.createAnswer())
                    await sig.signal(peer, pc.localDescription)
                lk.max_message_bytes = remote_max_message_size(pc.remoteDescription.sdp)
                stage[0] = "opening the data channels (ICE, DTLS, SCTP)"
                await asyncio.gather(*opened)

            try:
                await asyncio.wait_for(build(), open_timeout_s)
            except asyncio.TimeoutError:
                raise TransportError(f"{device}: channels to peer {peer!r} did not open within "
                                     f"{open_timeout_s:g} s ({stage[0]})") from None
            lk.bulk_task = asyncio.ensure_future(transport._bulk_sender(lk))

        results = await asyncio.gather(*(link(p) for p in peers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
    except BaseException:
        await transport.close()
        raise
    finally:
        _host_addresses.reset(token)
        await sig.close()
    log.info("%s: connected to %s", device, ", ".join(peers) or "(no peers)")
    return transport


# --------------------------------------------------------------------------- measurement
# python -m runtime.transport bench   (numbers in docs/transport.md)

async def _bench_pair(n: int, sizes: Sequence[int], one_way_s: float, tuned: bool) -> dict:
    """Two peers in this process through a local relay: ping-pong ``n`` messages of
    each size on the residual channel; returns one-way times (RTT/2) in ms."""
    from runtime.relay import run_relay

    if tuned:
        tune_sctp()
    else:
        tune_sctp(None, None)
    runner, url = await run_relay("127.0.0.1", 0)
    try:
        a, b = await asyncio.gather(
            connect_room(url, "bench", "a", ["b"], host_addresses=["127.0.0.1"], sctp_tuning=False),
            connect_room(url, "bench", "b", ["a"], host_addresses=["127.0.0.1"], sctp_tuning=False))
        try:
            emulate_delay(a, one_way_s)
            emulate_delay(b, one_way_s)
            b.set_handler(lambda src, ch, d: asyncio.ensure_future(b.send(src, ch, d)))
            q: asyncio.Queue = asyncio.Queue()
            a.set_handler(lambda src, ch, d: q.put_nowait(time.perf_counter()))
            out = {}
            for size in sizes:
                payload = bytes(size)
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await a.send("b", "residual", payload)
                    t1 = await asyncio.wait_for(q.get(), 30)
                    samples.append((t1 - t0) / 2 * 1e3)
                out[size] = samples
            return out
        finally:
            await a.close()
            await b.close()
    finally:
        await runner.cleanup()


def _pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def _bench_echo(url: str, n_expected: int) -> None:
    """The far side of the two-process benchmark: echo every residual back."""
    t = await connect_room(url, "bench2", "b", ["a"], host_addresses=["127.0.0.1"])
    done = asyncio.Event()
    count = [0]
    cpu0 = time.process_time()

    def on(src: str, ch: str, d: bytes) -> None:
        asyncio.ensure_future(t.send(src, ch, d))
        count[0] += 1
        if count[0] >= n_expected:
            done.set()

    t.set_handler(on)
    await asyncio.wait_for(done.wait(), 120)
    cpu = time.process_time() - cpu0
    await asyncio.sleep(0.2)
    print(json.dumps({"echo_cpu_ms_per_frame": cpu / n_expected * 1e3}), flush=True)
    await t.close()


async def _bench_two_process(n: int, size: int, warmup: int) -> dict:
    """Host side of the two-process ping-pong: this process and a child echo peer."""
    import sys

    from runtime.relay import run_relay

    runner, url = await run_relay("127.0.0.1", 0)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "runtime.transport", "echo", url,
                                                str(n + warmup), stdout=asyncio.subprocess.PIPE)
    try:
        a = await connect_room(url, "bench2", "a", ["b"], host_addresses=["127.0.0.1"])
        q: asyncio.Queue = asyncio.Queue()
        a.set_handler(lambda src, ch, d: q.put_nowait(time.perf_counter()))
        payload = bytes(size)
        samples = []
        cpu0 = 0.0
        for i in range(n + warmup):
            if i == warmup:
                cpu0 = time.process_time()
            t0 = time.perf_counter()
            await a.send("b", "residual", payload)
            t1 = await asyncio.wait_for(q.get(), 30)
            if i >= warmup:
                samples.append((t1 - t0) / 2 * 1e3)
        cpu = time.process_time() - cpu0
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        await a.close()
        await asyncio.wait_for(proc.wait(), 30)
        echo = json.loads(line) if line.strip() else {}
        return {"one_way_ms": samples, "host_cpu_ms_per_frame": cpu / n * 1e3, **echo}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()


def _bench_main(argv: Sequence[str]) -> None:  # pragma: no cover - manual measurement
    """``python -m runtime.transport bench``: the numbers of docs/transport.md."""
    import sys

    if argv and argv[0] == "echo":
        asyncio.run(_bench_echo(argv[1], int(argv[2])))
        return
    logging.basicConfig(level=logging.ERROR)
    decode = 32 + 576 * 4  # one decode frame of SmolLM2-135M (hidden 576, float32)
    for size in (decode, 10_000):
        r = asyncio.run(_bench_two_process(200, size, 20))
        ow = r["one_way_ms"]
        print(f"two processes, {size} B frames, N=200: one-way ms p50 {_pct(ow, 50):.3f} p90 {_pct(ow, 90):.3f} "
              f"p99 {_pct(ow, 99):.3f} max {max(ow):.3f} mean {sum(ow) / len(ow):.3f}; Python CPU ms per "
              f"ping-pong (one frame sent + one received) host {r['host_cpu_ms_per_frame']:.3f} "
              f"echo {r.get('echo_cpu_ms_per_frame', float('nan')):.3f}", flush=True)
    sizes = [1000, decode, 10_000, 100_000]
    for one_way in (0.0, 0.010):
        for tuned in (False, True):
            res = asyncio.run(_bench_pair(30, sizes, one_way, tuned))
            cells = ", ".join(f"{s} B p50 {_pct(v, 50):.2f}" for s, v in res.items())
            print(f"one process, one-way delay {one_way * 1e3:g} ms, "
                  f"{'tuned' if tuned else 'aiortc'}: one-way ms {cells}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":  # pragma: no cover
    import sys

    _bench_main(sys.argv[1:])
