"""The transport API every room transport offers (WebRTC, loopback): ``send``,
``subscribe`` (one channel's messages, or those of it a test accepts), ``set_handler``
(every message no subscription takes), ``set_lost_handler``, ``close``; chunking and
reassembly underneath."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable, Optional, Sequence

from .framing import CHANNELS, ChunkError, Reassembler, encode_message

log = logging.getLogger("splitroom.transport")

Handler = Callable[[str, str, bytes], None]
#: a subscriber: ``fn(src, data)``; its test: ``accepts(src, data) -> bool``
Receiver = Callable[[str, bytes], None]
Accepts = Callable[[str, bytes], bool]


class TransportError(RuntimeError):
    """The transport cannot do what was asked: a channel did not open in time (the
    message names the peer), an unknown peer, a closed transport, a failed connection."""


def _new_stats() -> dict[str, dict[str, int]]:
    return {c: {"sent_messages": 0, "sent_bytes": 0, "recv_messages": 0, "recv_bytes": 0, "dropped": 0}
            for c in CHANNELS}


class Subscription:
    """One subscriber of one channel of a :class:`Transport` (:meth:`Transport.subscribe`):
    ``fn(src, data)`` gets the channel's messages that ``accepts(src, data)`` (all of them
    when ``accepts`` is None). :meth:`cancel` ends it."""

    def __init__(self, subs: list, channel: str, fn: Receiver, accepts: Optional[Accepts]):
        self._subs = subs
        self.channel, self.fn, self.accepts = channel, fn, accepts

    @property
    def active(self) -> bool:
        """Whether it still gets messages (not cancelled)."""
        return any(s is self for s in self._subs)

    def cancel(self) -> None:
        """Stop delivering to it; idempotent. The other subscriptions of the channel are
        asked as before."""
        self._subs[:] = [s for s in self._subs if s is not self]


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
        self._subs: dict[str, list[Subscription]] = {c: [] for c in CHANNELS}
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

    def revive(self, peer: str) -> None:
        """``peer``, reported lost, is back (it said hello again on its connection): a
        later failure of its connection is reported again."""
        self._lost_peers.discard(peer)

    def subscribe(self, channel: str, fn: Receiver, accepts: Optional[Accepts] = None) -> Subscription:
        """Deliver each whole incoming message on ``channel`` that ``accepts(src, data)``
        (every one when ``accepts`` is None) as ``fn(src, data)``, a plain callback run on
        the event loop, in place of the handler.

        A channel's subscriptions are asked in the order they were made; the first that
        accepts a message takes it, and a message none takes goes to the handler
        (:meth:`set_handler`). An exception raised by ``accepts`` or ``fn`` is logged and
        the message is dropped. Returns the :class:`Subscription`; ``cancel()`` it to stop.
        Raises ValueError for an unknown channel."""
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)}")
        sub = Subscription(self._subs[channel], channel, fn, accepts)
        self._subs[channel].append(sub)
        return sub

    def set_handler(self, fn: Optional[Handler]) -> None:
        """Deliver each whole incoming message that no subscription takes
        (:meth:`subscribe`) as ``fn(src, channel, data)``, a plain callback run on the
        event loop. Messages that arrived before a handler was set are delivered (in
        order) on the next loop iteration."""
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
        self._deliver(src, channel, msg)

    def _deliver(self, src: str, channel: str, msg: bytes) -> None:
        """To the first subscription of ``channel`` that accepts it, else to the handler,
        else kept until a handler is set."""
        for sub in tuple(self._subs[channel]):
            try:
                if sub.accepts is not None and not sub.accepts(src, msg):
                    continue
                sub.fn(src, msg)
            except Exception:  # a subscriber's bug must not kill the transport
                log.exception("%s: subscriber raised on a message from %s on %s", self.device, src, channel)
            return
        if self._handler is None:
            self._pending.append((src, channel, msg))
            return
        try:
            self._handler(src, channel, msg)
        except Exception:  # a handler bug must not kill the transport
            log.exception("%s: handler raised on a message from %s on %s", self.device, src, channel)

    def _flush_pending(self) -> None:
        while self._pending and self._handler is not None:
            self._deliver(*self._pending.popleft())

