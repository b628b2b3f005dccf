"""WebRTC data channels (aiortc) and the relay signalling: :func:`connect_room`.

``connect_room(relay_url, room, device, peers)`` joins the signalling relay
(runtime/relay.py), builds one ``RTCPeerConnection`` per peer (full mesh; the
lexicographically smaller device id makes the offer), with the STUN/TURN servers it is
given and none by default (``RTCConfiguration(iceServers=[])``; ``None`` would add a
public STUN server; runtime/transport/ice.py), and returns a :class:`RtcTransport` once
every data channel to every peer is open. The relay sees only SDP; every message goes
peer to peer. Each connection logs the candidate pair ICE chose (``host``, ``srflx``
through a NAT found by STUN, ``relay`` through TURN); when ICE finds none the error says
why in one line (:func:`~runtime.transport.ice.no_path_hint`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import replace
from typing import Optional, Sequence

from ..signalling import (AskNonce, Forwarded, IceServers, Nonce, Peers, RelayHello, Sdp, Signal, SignalError, encode,
                          parse_client, parse_relay)

from .base import Transport, TransportError
from runtime.testbed.delay import DelayLine, DelayStats
from .framing import (AIORTC_MAX_MESSAGE_SIZE, CHANNELS, DEFAULT_MAX_MESSAGE_BYTES_IN, DEFAULT_REMOTE_MAX_MESSAGE_SIZE,
                      Reassembler)
from .ice import (CredentialKey, IceServer, check_ice_servers, chosen_pair, merge_ice_servers, no_path_hint,
                  servers_from_relay, to_rtc_ice_servers)
from .pacing import BULK_INFLIGHT_BYTES, BULK_PIECE_BYTES, _Link
from .patches import _host_addresses, install_candidate_patch, tune_sctp

log = logging.getLogger("splitroom.transport")

def emulate_delay(transport: "Transport", one_way_s: float) -> None:
    """Delay every packet this side sends by ``one_way_s`` seconds, in process, on every
    peer connection of a WebRTC transport made by connect_room (and on those
    :meth:`RtcTransport.reconnect` makes later). Apply it on both sides for a round trip
    of 2 x ``one_way_s``: on a machine without netem this is how a room gets its
    network's delay (``splitroom run --real --in-process-delay``).

    It wraps the ICE transport's send, below DTLS and SCTP, so SCTP's windows, timers and
    acknowledgements see the delay; packets leave in the order sent
    (runtime/testbed/delay.py says what this delay is and is not). How late packets
    really left is in :meth:`RtcTransport.delay_stats`. ``one_way_s`` 0 removes the delay
    (what is held is sent at once, in order).

    Raises:
        TypeError: a transport without WebRTC connections.
        ValueError: ``one_way_s`` negative or not finite.
    """
    if not isinstance(transport, RtcTransport):
        raise TypeError("emulate_delay needs a transport from connect_room")
    if not (isinstance(one_way_s, (int, float)) and 0 <= one_way_s < float("inf")):
        raise ValueError(f"one_way_s must be 0 or a positive number of seconds, not {one_way_s!r}")
    transport._one_way_s = float(one_way_s)
    for link in transport._links.values():
        if link.pc is not None:
            transport._delay_link(link)


class _DelayedSend:
    """One connection's in-process delay: its ICE transport's send replaced by a
    :class:`~runtime.testbed.delay.DelayLine` whose due packets one task sends in order."""

    def __init__(self, ice, stats: DelayStats):
        self.loop = asyncio.get_running_loop()
        self.ice = ice
        self.send = ice._send  # the ICE transport's own send (a coroutine function)
        self.stats = stats
        self.due: asyncio.Queue = asyncio.Queue()
        self.line: Optional[DelayLine] = None
        self.task = self.loop.create_task(self._sender())

    def set(self, one_way_s: float) -> None:
        if self.line is not None:
            self.line.flush()  # held packets go now, ahead of anything sent later
        if one_way_s > 0:
            self.line = DelayLine(one_way_s, lambda p, due: self.due.put_nowait((p, due)), self.loop.time,
                                  self.loop.call_at, stats=self.stats)
            self.ice._send = self._delayed
        else:
            self.line = None
            self.ice._send = self.send

    async def _delayed(self, data: bytes) -> None:
        line = self.line
        if line is not None:
            line.push(data)
        else:  # pragma: no cover - set(0) restores the send first
            await self.send(data)

    async def _sender(self) -> None:
        while True:
            data, due = await self.due.get()
            self.stats.record(self.loop.time() - due)
            try:
                await self.send(data)
            except ConnectionError:  # closed while the packet was "in the air": lost
                pass

    def stop(self) -> None:
        if self.line is not None:
            self.line.close()
        self.ice._send = self.send
        self.task.cancel()


_MAX_MSG_RE = re.compile(r"^a=max-message-size:(\d+)\s*$", re.M)
_FINGERPRINT_RE = re.compile(r"^a=fingerprint:(sha-256) ([0-9A-Fa-f:]+)\s*$", re.M)


def remote_max_message_size(sdp: str) -> int:
    """The peer's largest accepted message from its SDP, bytes (RFC 8841 section 6:
    64 KiB when absent; 0, "any size", becomes aiortc's 256 KiB here)."""
    m = _MAX_MSG_RE.search(sdp)
    if not m:
        return DEFAULT_REMOTE_MAX_MESSAGE_SIZE
    v = int(m.group(1))
    return v if v > 0 else AIORTC_MAX_MESSAGE_SIZE



def _why(e: BaseException) -> str:
    """A connection error in words: the operating system's reason (``Connection
    refused``, ``Name or service not known``) or the exception's own message, never
    aiohttp's repr of its connection key."""
    import aiohttp
    if isinstance(e, aiohttp.ClientConnectorError):
        os_err = e.os_error
        import os
        why = os.strerror(os_err.errno) if isinstance(getattr(os_err, "errno", None), int) and os_err.errno > 0 else ""
        return why or getattr(os_err, "strerror", None) or str(os_err) or type(os_err).__name__
    if isinstance(e, aiohttp.WSServerHandshakeError):
        return f"the relay answered HTTP {e.status} ({e.message})"
    return str(e).strip() or type(e).__name__

class RtcTransport(Transport):
    """A Transport over aiortc data channels; made by :func:`connect_room`."""

    def __init__(self, device: str, peers: Sequence[str], max_message_bytes_in: int):
        super().__init__(device, peers, max_message_bytes_in)
        self._links: dict[str, _Link] = {p: _Link(p) for p in peers}
        self._relay: tuple = ("", "", None, None)  # (relay URL, room, host addresses, room key) for reconnect()
        self._ice: tuple[tuple[IceServer, ...], bool] = ((), False)  # (servers, relay only) of new connections
        self._ice_given: tuple[tuple[IceServer, ...], bool] = ((), False)  # (own servers, ask the relay)
        self._one_way_s = 0.0  # emulate_delay's delay of what this side sends, seconds
        self._delay_stats = DelayStats()

    def _delay_link(self, lk: _Link) -> None:
        """Give ``lk``'s connection this transport's in-process delay (emulate_delay)."""
        if lk.delay is None:
            if self._one_way_s <= 0:
                return
            lk.delay = _DelayedSend(lk.pc.sctp.transport.transport, self._delay_stats)  # SCTP -> DTLS -> ICE
        lk.delay.set(self._one_way_s)

    def delay_stats(self) -> dict | None:
        """What emulate_delay did, over every connection: ``one_way_s``, ``packets`` sent,
        ``dropped``, ``lateness_p50_s``/``lateness_p99_s``/``lateness_max_s`` (how long after
        its due time a packet left, seconds; runtime.testbed.delay.DelayStats); None when
        no delay was ever set."""
        if self._one_way_s <= 0 and not self._delay_stats.packets:
            return None
        return {"one_way_s": self._one_way_s, **self._delay_stats.summary()}

    @property
    def max_message_bytes(self) -> int:
        return min((lk.max_message_bytes for lk in self._links.values()), default=AIORTC_MAX_MESSAGE_SIZE)

    def _wire_limit(self, dst: str, channel: str) -> int:
        lim = self._links[dst].max_message_bytes
        return lim if channel == "residual" else min(lim, BULK_PIECE_BYTES)

    def fingerprints(self, peer: str) -> tuple[str | None, str | None]:
        """``(local, remote)`` DTLS certificate fingerprints of the connection to
        ``peer`` as its SDPs state them (``"sha-256 AB:..."``; None when unknown). aiortc's
        DTLS checks the peer's certificate against the remote one, so a message that
        arrives on this connection comes from the holder of that certificate."""
        lk = self._links.get(peer)
        pc = lk.pc if lk is not None else None

        def fp(desc) -> str | None:
            m = _FINGERPRINT_RE.search(desc.sdp) if desc is not None else None
            return f"{m.group(1).lower()} {m.group(2).upper()}" if m else None
        if pc is None:
            return None, None
        return fp(pc.localDescription), fp(pc.remoteDescription)

    @property
    def ice_servers(self) -> tuple[IceServer, ...]:
        """The STUN/TURN servers of this transport's connections (its own and the relay's)."""
        return self._ice[0]

    def ice_pair(self, peer: str) -> tuple[str, str, str, str] | None:
        """The candidate pair ICE chose for the connection to ``peer``: ``(local type,
        local ADDRESS:PORT, remote type, remote ADDRESS:PORT)``, types ``host``,
        ``srflx``, ``prflx`` or ``relay`` (None when unknown)."""
        lk = self._links.get(peer)
        return chosen_pair(lk.pc) if lk is not None and lk.pc is not None else None

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
                    ch = lk.channels[channel]
                    for w in wires:
                        await lk.wait_sendable(ch)
                        if lk.failed:
                            raise TransportError(f"connection to {lk.peer!r} is down: {lk.failed}")
                        ch.send(bytes(w))
                except Exception as e:
                    if not fut.done():
                        fut.set_exception(e if isinstance(e, TransportError) else TransportError(
                            f"{self.device}: send to {lk.peer!r} on {channel} failed: {e!r}"))
                    continue
                if not fut.done():
                    fut.set_result(None)

    async def _end_link(self, lk: _Link) -> None:
        """Stop ``lk``'s paced sender (its waiting sends raise TransportError) and its
        delay (what it holds is lost), and close its connection."""
        if lk.delay is not None:
            lk.delay.stop()
        if lk.bulk_task is not None:
            lk.bulk_task.cancel()
            try:
                await lk.bulk_task
            except (asyncio.CancelledError, Exception):
                pass
        for _, _, fut in lk.bulk:
            if not fut.done():
                fut.set_exception(TransportError(f"{self.device}: connection to {lk.peer!r} closed"))
        lk.bulk.clear()
        if lk.pc is not None:
            try:
                await lk.pc.close()
            except Exception as e:  # pragma: no cover - best effort
                log.info("%s: closing connection to %s: %r", self.device, lk.peer, e)

    async def reconnect(self, peer: str, timeout_s: float, offer: Optional[bool] = None) -> None:
        """Replace the connection to ``peer`` by a new one made through the relay this
        transport was made with (a model host that restarted: its old connection is dead,
        the new process calls :func:`connect_room` again). The old connection is closed
        without a loss report; messages half received from it are dropped; ``peer`` may
        be reported lost again afterwards. Waits at most ``timeout_s`` seconds, for the
        peer to reach the relay included. ``offer``: whether this side makes the offer
        (True) or waits for ``peer``'s (False); None: the smaller id offers, as in
        :func:`connect_room`. Both sides must agree.

        Raises TransportError when the relay cannot be reached, the transport is closed,
        or the channels do not open in time; ValueError for a peer not in :attr:`peers`."""
        if peer not in self._links:
            raise ValueError(f"{peer!r} is not a peer of {self.device}")
        if self._closed:
            raise TransportError(f"{self.device}: transport is closed")
        relay_url, room, addrs, room_key = self._relay
        old = self._links[peer]
        fresh = _Link(peer)
        fresh.bulk_inflight_bytes = old.bulk_inflight_bytes
        self._links[peer] = fresh  # the old connection's events are ignored from here on
        await self._end_link(old)
        for c in CHANNELS:
            self._reasm[(peer, c)] = Reassembler(self.max_message_bytes_in)
        token = _host_addresses.set(addrs)
        sig = _Signalling(self.device, [peer], room_key)
        try:
            await sig.open(relay_url, room, ice=self._ice_given[1])
            await _use_ice(self, sig)
            await _open_link(self, sig, peer, timeout_s, offer)
            self._delay_link(fresh)
        except BaseException:
            fresh.failed = fresh.failed or "reconnect failed"
            await self._end_link(fresh)
            raise
        finally:
            _host_addresses.reset(token)
            await sig.close()
        self._lost_peers.discard(peer)
        log.info("%s: reconnected to %s", self.device, peer)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lk in self._links.values():
            await self._end_link(lk)


class _Signalling:
    """The relay websocket of one connect_room call."""

    def __init__(self, device: str, peers: Sequence[str], room_key: Optional[str] = None):
        self.device = device
        self.room_key = room_key
        self.present: set[str] = set()
        self.changed = asyncio.Event()
        self.inbox: dict[str, asyncio.Queue] = {p: asyncio.Queue() for p in peers}
        self.closed_reason: Optional[str] = None
        self.session = None
        self.ws = None
        self.reader: Optional[asyncio.Task] = None
        self.ice_key: Optional[CredentialKey] = None
        self.ice_message: Optional[dict] = None
        self.ice_arrived = asyncio.Event()

    async def open(self, relay_url: str, room: str, ice: bool = False) -> None:
        """Connect and say hello; ``ice``: ask the relay for its ICE servers too (the
        answer lands in :attr:`ice_message`)."""
        import aiohttp

        self.session = aiohttp.ClientSession()
        url = f"{relay_url.rstrip('/')}/room/{room}"
        try:
            self.ws = await self.session.ws_connect(url, max_msg_size=64 * 1024, heartbeat=None)
        except Exception as e:
            await self.session.close()
            raise TransportError(f"{self.device}: cannot reach the relay at {url}: {_why(e)}") from e
        hello = RelayHello(self.device)
        if self.room_key is not None:  # the relay seats this device in the room of the key's tag
            from ..relay import relay_hello
            await self.ws.send_str(encode(AskNonce()))
            try:
                msg = await self.ws.receive(timeout=10.0)
                said = parse_relay(msg.data) if msg.type == aiohttp.WSMsgType.TEXT else None
            except (asyncio.TimeoutError, SignalError):
                said = None
            if not isinstance(said, Nonce):
                await self.close()
                raise TransportError(f"{self.device}: the relay at {url} gave no nonce for a room with a key")
            hello = parse_client(relay_hello(self.room_key, room, self.device, said.nonce))
        if ice:
            self.ice_key = CredentialKey()
            hello = replace(hello, asks_ice=True, ice_key=self.ice_key.public)
        await self.ws.send_str(encode(hello))
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        import aiohttp

        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            try:
                said = parse_relay(msg.data)
            except SignalError as e:
                log.warning("%s: %s; ignored", self.device, e)
                continue
            if isinstance(said, Peers):
                self.present = set(said.devices)
                self.changed.set()
            elif isinstance(said, IceServers) and self.ice_key is not None and self.ice_message is None:
                self.ice_message = said.wire()
                self.ice_arrived.set()
            elif isinstance(said, Forwarded) and said.sender in self.inbox:
                self.inbox[said.sender].put_nowait(said.data)
            else:
                log.info("%s: relay message %r ignored", self.device, said.wire()["type"])
        self.closed_reason = f"relay closed the connection ({self.ws.close_code})"
        self.changed.set()
        self.ice_arrived.set()
        for q in self.inbox.values():
            q.put_nowait(None)

    async def wait_present(self, peer: str) -> None:
        while peer not in self.present:
            if self.closed_reason:
                raise TransportError(f"{self.device}: waiting for {peer!r}: {self.closed_reason}")
            self.changed.clear()
            await self.changed.wait()

    async def signal(self, peer: str, desc) -> None:
        await self.ws.send_str(encode(Signal(peer, Sdp(desc.type, desc.sdp).wire())))

    async def receive(self, peer: str, kind: str):
        from aiortc import RTCSessionDescription

        data = await self.inbox[peer].get()
        if data is None:
            raise TransportError(f"{self.device}: waiting for {kind} from {peer!r}: {self.closed_reason}")
        sdp = Sdp.parse(data, kind)
        if sdp is None:
            raise TransportError(f"{self.device}: expected an SDP {kind} from {peer!r}")
        return RTCSessionDescription(sdp=sdp.sdp, type=kind)

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



#: seconds the relay has to answer a hello that asked for ICE servers
RELAY_ICE_TIMEOUT_S = 10.0


async def _use_ice(transport: "RtcTransport", sig: "_Signalling") -> None:
    """Set the ICE servers of ``transport``'s next connections: its own, plus the relay's
    (opened from ``sig``'s ``ice`` answer) when it asked. Raises TransportError when the
    relay does not answer, answers nonsense, or gives no TURN server to a relay-only peer."""
    given, from_relay = transport._ice_given
    relay_only = transport._ice[1]
    servers = tuple(given)
    if from_relay:
        try:
            await asyncio.wait_for(sig.ice_arrived.wait(), RELAY_ICE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise TransportError(f"{transport.device}: the relay sent no ICE servers within "
                                 f"{RELAY_ICE_TIMEOUT_S:g} s (a relay without --turn-url?)") from None
        if sig.ice_message is None:
            raise TransportError(f"{transport.device}: waiting for the relay's ICE servers: {sig.closed_reason}")
        try:
            issued = servers_from_relay(sig.ice_message, sig.ice_key)
        except ValueError as e:
            raise TransportError(f"{transport.device}: the relay's ICE servers: {e}") from None
        servers = merge_ice_servers(servers, issued)
        log.info("%s: ICE servers from the relay: %s", transport.device, ", ".join(s.redacted() for s in issued))
    if relay_only and not any(s.kind == "turn" for s in servers):
        raise TransportError(f"{transport.device}: relay candidates only, but no TURN server was given "
                             "(nor by the relay)")
    transport._ice = (servers, relay_only)


async def _open_link(transport: "RtcTransport", sig: "_Signalling", peer: str, open_timeout_s: float,
                     offer: Optional[bool] = None) -> None:
    """Build ``transport``'s connection to ``peer`` through the relay ``sig`` (this side
    offers when ``offer``; None: the smaller id offers) and start its paced bulk sender
    once the three channels are open.
    Raises TransportError naming the stage it was in when ``open_timeout_s`` ran out."""
    device = transport.device
    loop = asyncio.get_running_loop()
    lk = transport._links[peer]
    stage = ["creating the connection"]

    servers, relay_only = transport._ice
    ice_failed = loop.create_future()

    async def build() -> None:
        from aiortc import RTCConfiguration, RTCIceTransportPolicy, RTCPeerConnection
        policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
        pc = RTCPeerConnection(RTCConfiguration(iceServers=to_rtc_ice_servers(servers), iceTransportPolicy=policy))
        lk.pc = pc

        @pc.on("iceconnectionstatechange")
        def _ice_state() -> None:
            if pc.iceConnectionState == "failed" and not ice_failed.done():
                ice_failed.set_result(None)
        opened = []
        for i, name in enumerate(CHANNELS):
            ch = pc.createDataChannel(name, ordered=True, negotiated=True, id=i)
            ch.bufferedAmountLowThreshold = 0  # the paced sender waits for "bufferedamountlow"
            fut = loop.create_future()
            ch.on("open", lambda f=fut: f.done() or f.set_result(None))
            ch.on("message", lambda data, n=name: transport._on_wire(peer, n, data)
                  if transport._links.get(peer) is lk else None)
            lk.channels[name] = ch
            opened.append(fut)

        @pc.on("connectionstatechange")
        def _state() -> None:
            if transport._links.get(peer) is not lk:
                return  # a connection replaced by reconnect(): its end is not a loss
            if pc.connectionState in ("failed", "closed") and not transport._closed:
                lk.failed = f"connection {pc.connectionState}"
                log.log(logging.WARNING if pc.connectionState == "failed" else logging.INFO,
                        "%s: connection to %s %s", device, peer, pc.connectionState)
                transport._peer_lost(peer, lk.failed)

        if (device < peer) if offer is None else offer:
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
        channels = asyncio.gather(*opened)
        try:
            await asyncio.wait([channels, ice_failed], return_when=asyncio.FIRST_COMPLETED)
            if not channels.done():
                raise _IceFailed()
        finally:
            if not channels.done():
                channels.cancel()
                channels.add_done_callback(_consume)
        await channels

    def no_path() -> str:
        pc = lk.pc
        local = pc.localDescription.sdp if pc is not None and pc.localDescription is not None else ""
        remote = pc.remoteDescription.sdp if pc is not None and pc.remoteDescription is not None else ""
        return no_path_hint(local, remote, servers)

    try:
        await asyncio.wait_for(build(), open_timeout_s)
    except _IceFailed:
        raise TransportError(f"{device}: ICE to peer {peer!r} failed: {no_path()}") from None
    except asyncio.TimeoutError:
        if stage[0].startswith("opening") and lk.pc is not None and lk.pc.iceConnectionState != "completed":
            raise TransportError(f"{device}: ICE to peer {peer!r} found no path within {open_timeout_s:g} s: "
                                 f"{no_path()}") from None
        raise TransportError(f"{device}: channels to peer {peer!r} did not open within "
                             f"{open_timeout_s:g} s ({stage[0]})") from None
    pair = chosen_pair(lk.pc)
    if pair is not None:
        log.info("%s: connected to %s through ICE pair %s %s -> %s %s", device, peer, *pair)
    lk.bulk_task = asyncio.ensure_future(transport._bulk_sender(lk))


def _consume(fut: asyncio.Future) -> None:
    """Retrieve a cancelled gather's outcome (asyncio logs one never retrieved)."""
    try:
        fut.exception()
    except BaseException:
        pass


class _IceFailed(Exception):
    """ICE gave up on every candidate pair (``iceConnectionState == "failed"``)."""


async def connect_room(relay_url: str, room: str, device: str, peers: Sequence[str], *,
                       open_timeout_s: float = 20.0,
                       max_message_bytes_in: int = DEFAULT_MAX_MESSAGE_BYTES_IN,
                       host_addresses: Optional[Sequence[str]] = None,
                       sctp_tuning: bool = True,
                       bulk_inflight_bytes: int = BULK_INFLIGHT_BYTES,
                       ice_servers: Sequence[IceServer] = (),
                       relay_only: bool = False,
                       ice_from_relay: bool = False,
                       room_key: Optional[str] = None) -> Transport:
    """Join ``room`` on the relay at ``relay_url`` (``ws://host:port``) as ``device``,
    open data channels to every device in ``peers`` and return the Transport.

    Full mesh: one RTCPeerConnection per peer; the smaller id
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
    ``ice_servers``: at most one STUN and one TURN server (runtime/transport/ice.py);
    none by default, when only host candidates are offered and no server is contacted.
    ``relay_only``: offer and accept only TURN relay candidates (needs a TURN server).
    ``ice_from_relay``: also ask the relay for its STUN/TURN servers (runtime/relay.py;
    time-limited TURN credentials sealed to this connection's key); each kind the
    caller gives itself wins over the relay's.
    The candidate pair chosen per peer is logged (logger ``splitroom.transport``).
    ``room_key``: the room's key; the relay then seats this device in the room of the
    key's tag (:func:`runtime.relay.relay_hello`: the key itself never reaches it).

    The relay websocket is closed once every channel is open: the relay sees the SDP
    exchange and nothing after it.

    Raises TransportError when the relay cannot be reached or closes the connection,
    or a peer's channels do not open in time (the message names the peer; when ICE found
    no candidate pair it says why in one line, NAT without STUN/TURN the usual cause);
    ValueError for a peer list that contains ``device`` or duplicates, more than one
    STUN or TURN server, or ``relay_only`` without a TURN server.
    """
    peers = tuple(peers)
    if device in peers or len(set(peers)) != len(peers):
        raise ValueError(f"peers {peers!r} must be distinct and must not contain {device!r}")
    ice_servers = tuple(ice_servers)
    check_ice_servers(ice_servers)
    if relay_only and not ice_from_relay and not any(s.kind == "turn" for s in ice_servers):
        raise ValueError("relay_only needs a TURN server (turn:USER:PASS@HOST:PORT)")
    install_candidate_patch()
    if sctp_tuning:
        tune_sctp()
    token = _host_addresses.set(tuple(host_addresses) if host_addresses is not None else None)
    transport = RtcTransport(device, peers, max_message_bytes_in)
    transport._relay = (relay_url, room, tuple(host_addresses) if host_addresses is not None else None, room_key)
    transport._bulk_inflight = bulk_inflight_bytes
    transport._ice = (ice_servers, bool(relay_only))
    transport._ice_given = (ice_servers, bool(ice_from_relay))
    for lk in transport._links.values():
        lk.bulk_inflight_bytes = bulk_inflight_bytes
    sig = _Signalling(device, peers, room_key)
    try:
        await sig.open(relay_url, room, ice=ice_from_relay)
        await _use_ice(transport, sig)
        results = await asyncio.gather(*(_open_link(transport, sig, p, open_timeout_s) for p in peers), return_exceptions=True)
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
