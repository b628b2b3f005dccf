"""Pacing of the bulk channels (reply, weights) so a residual never queues behind them.

aiortc keeps one FIFO for all the channels of a connection and moves the next message
into SCTP only when the previous one has been fully transmitted
(``RTCSctpTransport._data_channel_flush``), so a 256 KiB weights message handed over
whole would hold a residual back for the whole transfer. Here reply and weights
messages go through a per-peer paced sender that hands them to aiortc in pieces of
``BULK_PIECE_BYTES``, one at a time: after each piece it waits for the channel's
``bufferedamountlow`` event (aiortc's public ``bufferedAmountLowThreshold``, set to 0:
the piece has left the data-channel queue for SCTP), then, while more than
``bulk_inflight_bytes`` are sent and not yet acknowledged, for the acknowledgements.

No public aiortc mechanism says what is acknowledged: aiortc (1.16) lowers a channel's
``bufferedAmount`` as soon as ``_data_channel_flush`` has handed the message to SCTP's
outbound queue, before it is transmitted, and ``RTCSctpTransport`` exposes neither its
congestion window nor its bytes in flight, nor an event per SACK. So the in-flight bound
reads the private ``_flight_size`` (polled every millisecond) and falls back to the
public ``bufferedAmount`` if the private names move (docs/transport.md, "Why the pacer
still reads aiortc's private _flight_size"). Replies go before weights.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional

from .framing import DEFAULT_REMOTE_MAX_MESSAGE_SIZE

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
        self.delay = None  # webrtc._DelayedSend when emulate_delay applies

    def sctp_busy(self) -> bool:
        """Whether aiortc still holds data of this connection not yet transmitted, or
        more than BULK_INFLIGHT_BYTES sent and not yet acknowledged."""
        try:
            sctp = self.pc.sctp  # RTCSctpTransport
            return (bool(sctp._data_channel_queue) or bool(sctp._outbound_queue)
                    or sctp._flight_size > self.bulk_inflight_bytes)
        except AttributeError:  # private names moved: fall back to the public counter
            return any(ch.bufferedAmount for ch in self.channels.values())

    async def wait_sendable(self, ch) -> None:
        """Return when the next bulk piece may go to ``ch`` (an RTCDataChannel): the
        last piece has left the channel's queue (its ``bufferedamountlow`` event, with
        ``bufferedAmountLowThreshold`` 0) and aiortc is idle with at most
        ``bulk_inflight_bytes`` unacknowledged (:meth:`sctp_busy`, polled). Returns at
        once when the connection has failed (the caller raises)."""
        loop = asyncio.get_running_loop()
        while ch.bufferedAmount > ch.bufferedAmountLowThreshold and not self.failed:
            fut = loop.create_future()

            def low(fut=fut) -> None:
                if not fut.done():
                    fut.set_result(None)
            ch.on("bufferedamountlow", low)
            try:
                await asyncio.wait_for(fut, 0.5)  # re-check now and then: a failed link sends no event
            except asyncio.TimeoutError:
                pass
            finally:
                ch.remove_listener("bufferedamountlow", low)
        while self.sctp_busy() and not self.failed:
            await asyncio.sleep(_BULK_POLL_S)
