"""Browser guests: a guest's page talks to the model host over WebRTC (the browser's own
RTCPeerConnection to aiortc), through the room's relay, which passes SDP only.

The host's :class:`GuestDesk` joins the relay room as ``<host>.desk`` (a dot: no device
id of a scenario has one) and stays there. A guest joins as ``guest-<hex>``, sends the
desk an SDP offer with one data channel (``reply``), gets an answer, and once the
channel is open sends chat-completions requests on it as JSON. The host answers each
with the messages an HTTP stream would carry (``data: {chunk}`` ... ``data: [DONE]``;
see :meth:`runtime.serve.server.RoomServer.answer_guest`), so the queue, its limits
(per guest) and readiness are the API's. Nothing runs on the guest's machine but the page.

mDNS host candidates: browsers hide their addresses behind ``<uuid>.local`` names, which
aioice resolves slowly or not at all where no mDNS responder runs. The desk removes
such candidates from the offer before aiortc sees it (``keep_mdns=False``, the default):
the browser's connectivity checks reach the host's own candidates, and aioice learns the
browser's address from them (a peer-reflexive candidate), so the connection needs no
name resolution. A browser started without the hiding offers plain addresses, which are
used as they are.

ICE servers: the desk's connections use the room's STUN/TURN servers (none by default),
and :meth:`GuestDesk.info` hands the same to the page (``ice_servers``, as WebRTC's
``RTCIceServer`` dictionaries, and ``relay_only``), so a guest behind NAT finds the host.
A TURN credential handed to a page is one the guest needs; give the room time-limited
ones (runtime/transport/ice.py, ``turn_rest_credentials``).

Bounds: at most ``max_guests`` connections at once (more offers are ignored), one
question at a time per guest (a second one while the first is answered gets an error),
each connection must open within ``open_timeout_s`` and is closed when its channel or
connection closes, and every request body is at most ``MAX_REQUEST_BYTES``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Optional

from ..signalling import Forwarded, RelayHello, Sdp, Signal, SignalError, encode, parse_relay

log = logging.getLogger("splitroom.guest")

GUEST_ID = re.compile(r"^guest-[a-z0-9]{4,32}$")
MAX_REQUEST_BYTES = 1 << 20
_MDNS_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ \S+\.local \d+ .*$")


def strip_mdns_candidates(sdp: str) -> str:
    """``sdp`` without its ``a=candidate`` lines whose address is an mDNS ``.local`` name."""
    lines = sdp.replace("\r\n", "\n").split("\n")
    kept = [ln for ln in lines if not _MDNS_CANDIDATE.match(ln)]
    return "\r\n".join(kept)


class GuestDesk:
    """The host's side of browser guests (module doc).

    Args:
        server: the :class:`runtime.serve.server.RoomServer` that answers.
        relay_url: ``ws://ADDR:PORT`` of the room's relay; ``room``: the room's name.
        desk_id: this desk's id on the relay.
        keep_mdns: give aiortc the browser's ``.local`` candidates (False: remove them).
        max_guests: connections at once.
        open_timeout_s: seconds a guest's connection has to open its channel.
        ice_servers: STUN/TURN servers (runtime.transport.ice.IceServer), at most one of each.
        relay_only: use only TURN relay candidates.
    """

    def __init__(self, server, relay_url: str, room: str, desk_id: str, keep_mdns: bool = False,
                 max_guests: int = 32, open_timeout_s: float = 30.0, ice_servers=(), relay_only: bool = False):
        self.server = server
        self.relay_url = relay_url
        self.room = room
        self.desk_id = desk_id
        self.keep_mdns = keep_mdns
        self.max_guests = max_guests
        self.open_timeout_s = open_timeout_s
        self.ice_servers = tuple(ice_servers)
        self.relay_only = bool(relay_only)
        self.pcs: dict[str, object] = {}
        self.busy: set[str] = set()
        self.asking: dict[str, asyncio.Task] = {}  # guest -> its question being answered
        self._session = None
        self._ws = None
        self._reader: Optional[asyncio.Task] = None
        self._tasks: set[asyncio.Task] = set()

    def info(self) -> dict:
        """What a guest's page needs to connect: relay URL, room, desk id, ICE servers
        (``RTCIceServer`` dictionaries) and whether only relay candidates may be used."""
        return {"relay": self.relay_url, "room": self.room, "desk": self.desk_id,
                "ice_servers": [s.for_webrtc() for s in self.ice_servers], "relay_only": self.relay_only}

    async def start(self) -> None:
        """Join the relay room. Raises OSError/aiohttp errors when the relay is unreachable."""
        import aiohttp
        self._session = aiohttp.ClientSession()
        try:
            self._ws = await self._session.ws_connect(f"{self.relay_url}/room/{self.room}", max_msg_size=64 * 1024,
                                                      heartbeat=None, timeout=aiohttp.ClientWSTimeout(ws_close=5.0))
            await self._ws.send_str(encode(RelayHello(self.desk_id)))
        except Exception:
            await self._session.close()
            raise
        self._reader = asyncio.ensure_future(self._read())

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _read(self) -> None:
        import aiohttp
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            try:
                said = parse_relay(msg.data)
            except SignalError:
                continue
            offer = Sdp.parse(said.data, "offer") if isinstance(said, Forwarded) else None
            if offer is not None and GUEST_ID.match(said.sender):
                if said.sender in self.pcs or len(self.pcs) >= self.max_guests:
                    log.warning("guest %s ignored: %s", said.sender,
                                "already connected" if said.sender in self.pcs else "desk full")
                    continue
                self._spawn(self._accept(said.sender, offer.sdp))
        log.warning("guest desk: the relay closed the connection; no new guests can join")

    async def _accept(self, guest: str, sdp: str) -> None:
        from aiortc import RTCConfiguration, RTCIceTransportPolicy, RTCPeerConnection, RTCSessionDescription

        from ..transport.ice import to_rtc_ice_servers
        policy = RTCIceTransportPolicy.RELAY if self.relay_only else RTCIceTransportPolicy.ALL
        pc = RTCPeerConnection(RTCConfiguration(iceServers=to_rtc_ice_servers(self.ice_servers),
                                                iceTransportPolicy=policy))
        self.pcs[guest] = pc
        opened = asyncio.get_running_loop().create_future()

        @pc.on("datachannel")
        def _channel(ch) -> None:
            if not opened.done():
                opened.set_result(ch)
            ch.on("message", lambda m: self._spawn(self._on_request(guest, ch, m)))
            ch.on("close", lambda: self._spawn(self._drop(guest)))

        @pc.on("connectionstatechange")
        def _state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._spawn(self._drop(guest))

        try:
            offer = sdp if self.keep_mdns else strip_mdns_candidates(sdp)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            await self._ws.send_str(encode(Signal(guest, Sdp("answer", pc.localDescription.sdp).wire())))
            await asyncio.wait_for(opened, self.open_timeout_s)
            from ..transport.ice import chosen_pair
            pair = chosen_pair(pc)
            log.warning("guest %s connected%s", guest,
                        f" through ICE candidate pair {pair[0]} {pair[1]} -> {pair[2]} {pair[3]}" if pair else "")
        except Exception as e:  # a bad offer, a relay refusal, no channel in time: this guest only
            log.warning("guest %s could not connect: %s: %s", guest, type(e).__name__, e)
            await self._drop(guest)

    async def _on_request(self, guest: str, ch, message) -> None:
        def send(data: bytes):
            if ch.readyState == "open":
                ch.send(data.decode())
            return asyncio.sleep(0)

        if not isinstance(message, str) or len(message) > MAX_REQUEST_BYTES:
            await send(b'data: {"error":{"message":"send one JSON chat request as text","status":400}}\n\n')
            return
        if guest in self.busy:
            await send(b'data: {"error":{"message":"one question at a time","status":429}}\n\n')
            return
        try:
            body = json.loads(message)
        except ValueError:
            await send(b'data: {"error":{"message":"the request is not valid JSON","status":400}}\n\n')
            return
        self.busy.add(guest)
        self.asking[guest] = asyncio.current_task()
        try:
            await self.server.answer_guest(body, f"guest:{guest}", send)
        finally:
            self.busy.discard(guest)
            self.asking.pop(guest, None)

    async def _drop(self, guest: str) -> None:
        task = self.asking.pop(guest, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # the guest left: its question is withdrawn, its place freed
        pc = self.pcs.pop(guest, None)
        if pc is not None:
            try:
                await pc.close()
            except Exception as e:  # pragma: no cover - best effort
                log.info("closing guest %s: %r", guest, e)

    async def close(self) -> None:
        """Close every guest connection and leave the relay."""
        for g in list(self.pcs):
            await self._drop(g)
        for t in list(self._tasks):
            t.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
        if self._session is not None:
            await self._session.close()
