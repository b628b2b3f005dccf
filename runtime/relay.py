"""The signalling relay: passes connection details (SDP offers and answers) and
nothing else.

Product page (shared/seeds/002): "the relay only passes connection details, and
prompts and tokens never touch it". Peers find each other here, exchange one SDP
offer/answer per pair, then talk directly over WebRTC (runtime/transport.py); the
relay never sees a residual, a prompt or a token.

Protocol (JSON text messages over a websocket at ``ws://HOST:PORT/room/{room}``)::

    client -> relay  {"type": "hello", "device": ID}                 first, once
    client -> relay  {"type": "signal", "to": ID, "data": SDP}       any number
    relay -> client  {"type": "peers", "devices": [ID, ...]}         on every join/leave
    relay -> client  {"type": "signal", "from": ID, "data": SDP}     forwarded

where ``SDP`` is ``{"type": "offer" | "answer", "sdp": "v=0\\r\\n..."}``: only SDP
lines (``x=...``), only the session/media/attribute lines WebRTC data channels use
(see ``_SDP_ATTRIBUTES``), at most ``MAX_MESSAGE_BYTES``.

Everything else is rejected: the relay closes that client's websocket with code
1008 (policy violation) or 1009 (too big) and a reason, and logs one line. A
message type other than hello/signal, a signal whose data is not an SDP offer or
answer, a binary message, a message over 64 KiB, a second hello or a signal before
hello: all close the connection. A signal to a device that is not in the room is
dropped with one logged line (the sender's connection stays up).

Every message the relay receives (hello) or sends (peers, forwarded signals) is kept
in an in-memory audit log (:attr:`Relay.audit`), so tests can show what crossed it.

Run it with ``splitroom relay --host 0.0.0.0 --port 8765`` or ``run_relay``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

log = logging.getLogger("splitroom.relay")

#: Largest message accepted from a client, bytes (text frame payload).
MAX_MESSAGE_BYTES = 64 * 1024
#: Longest device or room id, characters.
MAX_ID_CHARS = 64
_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: SDP line types allowed (RFC 8866 section 5): version, origin, session name, info,
#: connection, bandwidth, timing, attribute, media.
_SDP_LINE_RE = re.compile(r"^[vosicbtam]=[\x20-\x7e]*$")
#: Attribute names allowed in ``a=`` lines: what aiortc and browsers put into a
#: data-channel-only offer/answer (JSEP, RFC 8829; SCTP over DTLS, RFC 8841; ICE,
#: RFC 8839). Anything else (a free-form attribute could carry text) is rejected.
_SDP_ATTRIBUTES = frozenset({
    "group", "msid-semantic", "mid", "sctp-port", "max-message-size", "sctpmap",
    "candidate", "end-of-candidates", "ice-ufrag", "ice-pwd", "ice-options",
    "ice-lite", "fingerprint", "setup", "tls-id", "extmap-allow-mixed",
    "sendrecv", "sendonly", "recvonly", "inactive",
})

#: aiohttp application key under which the :class:`Relay` is stored.
RELAY_KEY: web.AppKey["Relay"] = web.AppKey("splitroom_relay", object)  # type: ignore[arg-type]


class RelayReject(Exception):
    """A client message broke the relay protocol; ``code`` is the websocket close code."""

    def __init__(self, reason: str, code: int = WSCloseCode.POLICY_VIOLATION):
        super().__init__(reason)
        self.reason = reason
        self.code = code


def check_sdp(data: Any) -> dict:
    """Return ``data`` if it is an SDP offer/answer the relay may forward.

    Raises RelayReject naming the first problem: not a dict of exactly
    ``{"type", "sdp"}``, a type other than offer/answer, an SDP that does not start
    with ``v=0``, a line that is not an SDP line, or an attribute not in
    ``_SDP_ATTRIBUTES``.
    """
    if not isinstance(data, dict) or set(data) != {"type", "sdp"}:
        raise RelayReject("signal data must be exactly {type, sdp}")
    if data["type"] not in ("offer", "answer"):
        raise RelayReject(f"signal data type {str(data['type'])[:20]!r} is not offer/answer")
    sdp = data["sdp"]
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise RelayReject("signal data is not an SDP (must start with v=0)")
    for line in sdp.replace("\r\n", "\n").split("\n"):
        if not line:
            continue
        if not _SDP_LINE_RE.match(line):
            raise RelayReject("signal data has a line that is not an SDP line")
        if line.startswith("a="):
            name = line[2:].split(":", 1)[0]
            if name not in _SDP_ATTRIBUTES:
                raise RelayReject(f"SDP attribute {name[:30]!r} is not allowed")
    return data


@dataclass
class _Client:
    device: str
    ws: web.WebSocketResponse


@dataclass
class Relay:
    """Rooms of connected clients and the audit log.

    ``audit``: one dict per message that crossed the relay, in order:
    ``{"t": unix seconds, "room", "direction": "in" | "out", "device": the client it
    came from or went to, "message": the JSON object}``. ``rejections``: one dict per
    rejected client message ``{"t", "room", "device", "reason"}``.
    """

    rooms: dict[str, dict[str, _Client]] = field(default_factory=dict)
    audit: list[dict] = field(default_factory=list)
    rejections: list[dict] = field(default_factory=list)

    def _record(self, room: str, direction: str, device: str | None, message: dict) -> None:
        self.audit.append({"t": time.time(), "room": room, "direction": direction, "device": device,
                           "message": message})

    async def _send(self, room: str, client: _Client, message: dict) -> None:
        self._record(room, "out", client.device, message)
        try:
            await client.ws.send_str(json.dumps(message))
        except (ConnectionError, RuntimeError) as e:  # client went away meanwhile
            log.info("relay: room %s: could not send to %s: %s", room, client.device, e)

    async def _announce(self, room: str) -> None:
        clients = self.rooms.get(room, {})
        msg = {"type": "peers", "devices": sorted(clients)}
        for c in list(clients.values()):
            await self._send(room, c, msg)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        """The websocket endpoint ``/room/{room}`` (see module doc)."""
        room = request.match_info["room"]
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=None, autoping=True)
        await ws.prepare(request)
        if not _ID_RE.match(room):
            await self._reject(ws, room, None, RelayReject("bad room id"))
            return ws
        me: _Client | None = None
        try:
            async for msg in ws:
                if msg.type == WSMsgType.ERROR:
                    exc = ws.exception()
                    too_big = "too big" in str(exc).lower() or "size" in str(exc).lower()
                    reason = (f"message over {MAX_MESSAGE_BYTES} bytes" if too_big else f"websocket error: {exc}")
                    self._log_reject(room, me.device if me else None, reason)
                    break
                if msg.type != WSMsgType.TEXT:
                    raise RelayReject("only JSON text messages are accepted")
                if len(msg.data.encode()) > MAX_MESSAGE_BYTES:
                    raise RelayReject(f"message over {MAX_MESSAGE_BYTES} bytes", WSCloseCode.MESSAGE_TOO_BIG)
                try:
                    obj = json.loads(msg.data)
                except ValueError:
                    raise RelayReject("message is not JSON") from None
                if not isinstance(obj, dict):
                    raise RelayReject("message is not a JSON object")
                kind = obj.get("type")
                if kind == "hello":
                    if me is not None:
                        raise RelayReject("second hello")
                    device = obj.get("device")
                    if set(obj) != {"type", "device"} or not isinstance(device, str) or not _ID_RE.match(device):
                        raise RelayReject("hello must be {type, device} with a device id of [A-Za-z0-9_.:-]{1,64}")
                    clients = self.rooms.setdefault(room, {})
                    if device in clients:
                        raise RelayReject(f"device {device!r} is already in room {room!r}")
                    self._record(room, "in", device, obj)
                    me = _Client(device, ws)
                    clients[device] = me
                    log.info("relay: room %s: %s joined (%d devices)", room, device, len(clients))
                    await self._announce(room)
                elif kind == "signal":
                    if me is None:
                        raise RelayReject("signal before hello")
                    if set(obj) != {"type", "to", "data"}:
                        raise RelayReject("signal must be {type, to, data}")
                    data = check_sdp(obj["data"])
                    to = obj["to"]
                    target = self.rooms.get(room, {}).get(to) if isinstance(to, str) else None
                    if target is None:
                        log.info("relay: room %s: signal from %s to absent device %r dropped", room, me.device,
                                 str(to)[:64])
                        continue
                    await self._send(room, target, {"type": "signal", "from": me.device, "data": data})
                else:
                    raise RelayReject(f"message type {str(kind)[:20]!r} is not allowed (hello/signal only)")
        except RelayReject as e:
            await self._reject(ws, room, me.device if me else None, e)
        finally:
            if me is not None and self.rooms.get(room, {}).get(me.device) is me:
                del self.rooms[room][me.device]
                log.info("relay: room %s: %s left", room, me.device)
                if self.rooms[room]:
                    await self._announce(room)
                else:
                    del self.rooms[room]
        return ws

    def _log_reject(self, room: str, device: str | None, reason: str) -> None:
        self.rejections.append({"t": time.time(), "room": room, "device": device, "reason": reason})
        log.warning("relay: room %s: rejected %s: %s", room, device or "(no hello yet)", reason)

    async def _reject(self, ws: web.WebSocketResponse, room: str, device: str | None, e: RelayReject) -> None:
        self._log_reject(room, device, e.reason)
        await ws.close(code=e.code, message=e.reason.encode()[:120])

    async def close_all(self) -> None:
        """Close every client connection (code 1001, going away)."""
        for clients in list(self.rooms.values()):
            for c in list(clients.values()):
                await c.ws.close(code=WSCloseCode.GOING_AWAY, message=b"relay shutting down")


def make_app(relay: Relay | None = None) -> web.Application:
    """An aiohttp application serving ``/room/{room}``; the Relay is ``app[RELAY_KEY]``."""
    relay = relay or Relay()
    app = web.Application()
    app[RELAY_KEY] = relay
    app.router.add_get("/room/{room}", relay.handle)

    async def _on_shutdown(app_: web.Application) -> None:
        await app_[RELAY_KEY].close_all()

    app.on_shutdown.append(_on_shutdown)
    return app


async def run_relay(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start a relay on ``host:port`` (port 0: a free one) in the running event loop.

    Returns ``(runner, url)`` with ``url`` like ``ws://127.0.0.1:43121`` (append
    ``/room/NAME``); stop it with ``await runner.cleanup()``. The Relay (audit log)
    is ``runner.app[RELAY_KEY]``. Raises OSError when the address cannot be bound.
    """
    runner = web.AppRunner(make_app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    h = f"[{host}]" if ":" in host else host
    return runner, f"ws://{h}:{bound_port}"


def relay_of(runner: web.AppRunner) -> Relay:
    """The Relay (rooms, audit log, rejections) served by ``runner``."""
    return runner.app[RELAY_KEY]


def main(host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run a relay in the foreground until interrupted (``splitroom relay``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    async def _serve() -> None:
        runner, url = await run_relay(host, port)
        print(f"splitroom relay listening on {url}/room/ROOM", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(_serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":  # pragma: no cover
    main()
