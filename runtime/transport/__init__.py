"""Peer-to-peer transport for the room: WebRTC data channels (aiortc), one asyncio API.

A package, one concern per module: ``framing`` (the wire format, pure), ``base`` (the
Transport API), ``loopback`` (in-process room for tests), ``patches`` (aioice loopback
candidates, SCTP burst and initial window), ``pacing`` (the bulk channels' paced
sender, on aiortc's ``bufferedamountlow`` event), ``delay`` (a link's one-way delay applied
in the sending process, for machines without netem: ``emulate_delay``), ``webrtc`` (aiortc connections and
the relay signalling: connect_room), ``bench`` (``python -m runtime.transport bench``).
Every public name is importable from ``runtime.transport``.

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

Receiving: :meth:`Transport.subscribe` gives one channel's messages, or those of it that
a test accepts, to a subscriber (the weights server takes the requests on ``weights``, a
copy in flight the replies from its peer); a channel's subscriptions are asked in the
order they were made, and a message none takes goes to the one handler
(:meth:`Transport.set_handler`: the room's Node).

The residual is never queued behind the others. aiortc keeps one FIFO for all the
channels of a connection and moves the next message into SCTP only when the
previous one has been fully transmitted (``RTCSctpTransport._data_channel_flush``),
so a 256 KiB weights message handed over whole would hold a residual back for the
whole transfer. Here reply and weights messages go through a per-peer paced sender
that hands them to aiortc in pieces of ``BULK_PIECE_BYTES`` and only when aiortc's
queues are empty (runtime/transport/pacing.py); a residual therefore waits for at most
one such piece.

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
replaces that function (``install_candidate_patch``, run by connect_room) with one
that appends 127.0.0.1 to the list, and honours a per-connection override
(``connect_room(..., host_addresses=[...])``, carried by a context variable) so tests
and namespace runs can pin the exact addresses they use.

SCTP burst: see :func:`tune_sctp` and docs/transport.md.

The in-process :class:`LoopbackHub` gives the same :class:`Transport` API without
WebRTC (delivery through ``loop.call_soon``, same chunking code), for room tests.
"""

from __future__ import annotations

from runtime.testbed.delay import DelayLine, DelayStats

from .base import Handler, Subscription, Transport, TransportError
from .framing import (AIORTC_MAX_MESSAGE_SIZE, CHANNELS, DEFAULT_MAX_MESSAGE_BYTES_IN,
                      DEFAULT_REMOTE_MAX_MESSAGE_SIZE, PIECE_HEADER_BYTES, ChunkError, Reassembler, encode_message)
from .loopback import LoopbackHub, LoopbackTransport
from .pacing import BULK_INFLIGHT_BYTES, BULK_PIECE_BYTES
from .patches import (AIORTC_BURST_CHUNKS, AIORTC_INITIAL_CWND_CHUNKS, DEFAULT_INITIAL_CWND_CHUNKS,
                      DEFAULT_MAX_BURST_CHUNKS, INITIAL_WINDOW_BYTES, SCTP_CHUNK_BYTES, install_candidate_patch,
                      tune_sctp)
from .webrtc import RtcTransport, connect_room, emulate_delay, remote_max_message_size

__all__ = ["AIORTC_BURST_CHUNKS", "AIORTC_INITIAL_CWND_CHUNKS", "AIORTC_MAX_MESSAGE_SIZE", "BULK_INFLIGHT_BYTES",
           "BULK_PIECE_BYTES", "CHANNELS", "DEFAULT_INITIAL_CWND_CHUNKS", "DelayLine", "DelayStats", "DEFAULT_MAX_BURST_CHUNKS",
           "DEFAULT_MAX_MESSAGE_BYTES_IN", "DEFAULT_REMOTE_MAX_MESSAGE_SIZE", "INITIAL_WINDOW_BYTES", "PIECE_HEADER_BYTES", "SCTP_CHUNK_BYTES", "ChunkError",
           "Handler", "LoopbackHub", "LoopbackTransport", "Reassembler", "RtcTransport", "Subscription", "Transport",
           "TransportError", "connect_room", "emulate_delay", "encode_message", "install_candidate_patch",
           "remote_max_message_size", "tune_sctp"]
