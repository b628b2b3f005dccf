"""The signalling relay: passes connection details (SDP offers and answers) and
nothing else.

The product page: "the relay only passes connection details, and
prompts and tokens never touch it". Peers find each other here, exchange one SDP
offer/answer per pair, then talk directly over WebRTC (runtime/transport/); the
relay never sees a residual, a prompt or a token.

Protocol (JSON text messages over a websocket at ``ws://HOST:PORT/room/{room}``)::

    client -> relay  {"type": "hello", "device": ID[, "ice": KEY]}   first, once
    relay -> client  {"type": "ice", "servers": [...]}               answer to a hello with "ice"
    client -> relay  {"type": "signal", "to": ID, "data": SDP}       any number
    relay -> client  {"type": "peers", "devices": [ID, ...]}         on every join/leave
    relay -> client  {"type": "signal", "from": ID, "data": SDP}     forwarded

A room with a key (``?key=`` in a join URL; ``run --real`` makes one) is checked by the
relay without the key ever reaching it (:func:`relay_hello`)::

    client -> relay  {"type": "nonce"}                               before hello
    relay -> client  {"type": "nonce", "nonce": 32 hex}              this socket's
    client -> relay  {"type": "hello", "device": ID, "room_tag": 64 hex, "proof": 128 hex}

``room_tag`` is the public key of an Ed25519 key pair (RFC 8032) whose private key is
an HMAC-SHA256 of the room name keyed with the room key; ``proof`` signs the room name,
the device id and the socket's nonce with it. Devices with the key sit in the room of
their tag, apart from every other tag and from devices without one, so a client
without the key can neither take a keyed device's id nor fill its room, and a proof
seen on the wire cannot be replayed on another socket. The relay keeps only tags.

where ``SDP`` is ``{"type": "offer" | "answer", "sdp": "v=0\\r\\n..."}``: only SDP
lines (``x=...``), only the session/media/attribute lines WebRTC data channels use
(see ``_SDP_ATTRIBUTES``), at most ``MAX_MESSAGE_BYTES``.

SDP content is checked, not only line names (:func:`check_sdp`): every line and
attribute value must match what ICE and DTLS put there (a session name of ``-``, a
candidate field by field, an ICE password of the ICE alphabet, a fingerprint of hex), so
no free text crosses. Limits: a socket that says no hello within
``HELLO_TIMEOUT_S`` is closed; at most ``MAX_ROOM_CLIENTS`` devices per room and
``MAX_CLIENTS_PER_ADDRESS`` open websockets per remote address (HTTP 429 beyond); the
audit log and rejections keep the last ``MAX_AUDIT`` entries; the relay writes at most
``LOG_LINES_PER_S`` log lines a second and never a traceback for a client's message.

Everything else is rejected: the relay closes that client's websocket with code
1008 (policy violation) or 1009 (too big) and a reason, and logs one line. A
message type other than hello/signal, a signal whose data is not an SDP offer or
answer, a binary message, a message over 64 KiB, a second hello or a signal before
hello: all close the connection. A signal to a device that is not in the room is
dropped with one logged line (the sender's connection stays up).

ICE servers: a hello with ``"ice"`` (a device's P-256 public key, base64url) asks for the
relay's STUN/TURN servers; the relay answers with one ``ice`` message (empty without a
``turn`` issuer), the TURN credentials time-limited and their password sealed to that key
(runtime/transport/ice.py ``TurnIssuer``), so no TURN password crosses the relay's wire
or its log in clear.

A socket may send ``SIGNAL_BURST`` signals at once and ``SIGNALS_PER_S`` a second
after that (a token bucket); one more closes it (1008).

Every message the relay receives (hello) or sends (peers, forwarded signals) is kept
in an in-memory audit log (:attr:`Relay.audit`), so tests can show what crossed it.

Run it with ``splitroom relay --host 0.0.0.0 --port 8765`` or ``run_relay``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from .signalling import (BAD_PROOF, DEVICE_ID_RE, NONCE_SHAPE, AskNonce, Forwarded, IceServers, Nonce, Peers,
                         RelayHello, RelayMessage, SignalError, encode, parse_client)

log = logging.getLogger("splitroom.relay")

#: Largest message accepted from a client, bytes (text frame payload).
MAX_MESSAGE_BYTES = 64 * 1024
#: Longest device or room id, characters.
MAX_ID_CHARS = 64
#: The largest SDP forwarded, characters, and its most lines and candidates: a data
#: channel offer from aiortc or a browser is 1-3 KB, some 20 lines, a few candidates.
MAX_SDP_CHARS = 16 * 1024
MAX_SDP_LINES = 100
MAX_CANDIDATES = 32

_ADDR = (r"(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f:]{2,39}(?:%\d{1,5})?"
         r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\.local)")
_ICE_CHAR = r"[A-Za-z0-9+/]"
#: The value each SDP line may hold (RFC 8866 section 5), for a data-channel-only
#: session. No line type holds free text: the session name is ``-``, the origin's user
#: name ``-`` (Firefox: its fixed SDPARTA name), and ``i=`` (session information),
#: ``u=``, ``e=``, ``p=``, ``z=``, ``k=`` and ``r=`` lines are refused.
_SDP_LINES = {
    "v": r"0",
    "o": rf"(?:-|mozilla\.\.\.THIS_IS_SDPARTA-[0-9.]{{1,16}}) \d{{1,20}} \d{{1,20}} IN IP[46] {_ADDR}",
    "s": r"-? ?",
    "t": r"\d{1,20} \d{1,20}",
    "c": rf"IN IP[46] {_ADDR}(?:/\d{{1,3}})?",
    "b": r"(?:AS|CT|TIAS|RS|RR):\d{1,10}",
    "m": r"application \d{1,5} (?:UDP/DTLS/SCTP|DTLS/SCTP|UDP/TLS/RTP/SAVPF) (?:webrtc-datachannel|\d{1,5})",
}
#: Attributes allowed in ``a=`` lines and the value each may hold (None: no value): what
#: aiortc and browsers put into a data-channel-only offer/answer (JSEP, RFC 8829; SCTP
#: over DTLS, RFC 8841; ICE, RFC 8839; DTLS fingerprints, RFC 8122). The ICE password
#: and user fragment are held to 32 characters of the ICE alphabet (aiortc writes 22 and
#: 4, browsers 24 and 4-16) and a candidate to its grammar, so no attribute can carry text.
_SDP_ATTRIBUTES: dict[str, str | None] = {
    "group": r"BUNDLE(?: [A-Za-z0-9_-]{1,16}){0,8}",
    "msid-semantic": r" ?WMS(?: [A-Za-z0-9*_-]{1,64})?",
    "mid": r"[A-Za-z0-9_-]{1,16}",
    "sctp-port": r"\d{1,5}",
    "max-message-size": r"\d{1,12}",
    "sctpmap": r"\d{1,5} webrtc-datachannel \d{1,6}",
    "candidate": (rf"{_ICE_CHAR}{{1,32}} \d{{1,3}} (?:udp|tcp|UDP|TCP) \d{{1,10}} {_ADDR} \d{{1,5}} "
                  rf"typ (?:host|srflx|prflx|relay)(?: raddr {_ADDR} rport \d{{1,5}})?"
                  r"(?: tcptype (?:active|passive|so))?(?: generation \d{1,10})?"
                  rf"(?: ufrag {_ICE_CHAR}{{4,32}})?(?: network-id \d{{1,5}})?(?: network-cost \d{{1,5}})?"),
    "end-of-candidates": None,
    "ice-ufrag": rf"{_ICE_CHAR}{{4,32}}",
    "ice-pwd": rf"{_ICE_CHAR}{{22,32}}",
    "ice-options": r"(?:trickle|ice2|renomination)(?: (?:trickle|ice2|renomination)){0,2}",
    "ice-lite": None,
    "fingerprint": r"(?:sha-1|sha-224|sha-256|sha-384|sha-512) [0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){19,63}",
    "setup": r"(?:actpass|active|passive|holdconn)",
    "tls-id": r"[A-Za-z0-9+/=_-]{1,64}",
    "extmap-allow-mixed": None,
    "sendrecv": None, "sendonly": None, "recvonly": None, "inactive": None,
}
_LINE_RES = {k: re.compile(v) for k, v in _SDP_LINES.items()}
_ATTR_RES = {k: (re.compile(v) if v is not None else None) for k, v in _SDP_ATTRIBUTES.items()}
_FINGERPRINT_BYTES = {"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64}

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

    Only what ICE and DTLS need crosses: every line must be one of the line types in
    ``_SDP_LINES`` holding a value of its grammar, and every ``a=`` line an attribute of
    ``_SDP_ATTRIBUTES`` with a value of its grammar (a candidate line field by field, a
    fingerprint whose length fits its hash); at most ``MAX_SDP_CHARS`` characters,
    ``MAX_SDP_LINES`` lines and ``MAX_CANDIDATES`` candidates.

    Raises RelayReject naming the first problem: not a dict of exactly ``{"type",
    "sdp"}``, a type other than offer/answer, an SDP that does not start with ``v=0``,
    or a line that breaks the rules above (the reason names the line type or attribute,
    never the line's content).
    """
    if not isinstance(data, dict) or set(data) != {"type", "sdp"}:
        raise RelayReject("signal data must be exactly {type, sdp}")
    if data["type"] not in ("offer", "answer"):
        raise RelayReject(f"signal data type {str(data['type'])[:20]!r} is not offer/answer")
    sdp = data["sdp"]
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise RelayReject("signal data is not an SDP (must start with v=0)")
    if len(sdp) > MAX_SDP_CHARS:
        raise RelayReject(f"SDP over {MAX_SDP_CHARS} characters")
    lines = [ln for ln in sdp.replace("\r\n", "\n").split("\n") if ln]
    if len(lines) > MAX_SDP_LINES:
        raise RelayReject(f"SDP over {MAX_SDP_LINES} lines")
    candidates = 0
    for line in lines:
        kind, eq, value = line[:1], line[1:2], line[2:]
        if eq != "=" or not (kind in _LINE_RES or kind == "a"):
            raise RelayReject("signal data has a line that is not an allowed SDP line"
                              + (f" ({kind!r}=)" if eq == "=" and kind.isascii() and kind.isalpha() else ""))
        if kind != "a":
            if not _LINE_RES[kind].fullmatch(value):
                raise RelayReject(f"SDP {kind}= line does not hold what WebRTC puts there")
            continue
        name, colon, rest = value.partition(":")
        if name not in _ATTR_RES:
            raise RelayReject(f"SDP attribute {name[:30]!r} is not allowed")
        rule = _ATTR_RES[name]
        if rule is None:
            if colon:
                raise RelayReject(f"SDP attribute {name!r} takes no value")
            continue
        if not colon or not rule.fullmatch(rest):
            raise RelayReject(f"SDP attribute {name!r} does not hold what WebRTC puts there")
        if name == "candidate":
            candidates += 1
            if candidates > MAX_CANDIDATES:
                raise RelayReject(f"SDP over {MAX_CANDIDATES} candidates")
        elif name == "fingerprint":
            algo, _, hexes = rest.partition(" ")
            if len(hexes.split(":")) != _FINGERPRINT_BYTES[algo]:
                raise RelayReject(f"SDP fingerprint is not the length of a {algo} digest")
    return data


def _signing_key(key: str, room: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    seed = hmac.new(key.encode(), b"splitroom-relay-room\x00" + room.encode(), hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def _signed(room: str, device: str, nonce: str) -> bytes:
    return f"splitroom-relay-hello\x00{room}\x00{device}\x00{nonce}".encode()


def room_tag(key: str, room: str) -> str:
    """The relay's name for the keyed room ``room``: the Ed25519 public key (64 hex)
    of the private key HMAC-SHA256(key, room) (module doc). The key cannot be had
    from it."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    return _signing_key(key, room).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def relay_hello(key: str, room: str, device: str, nonce: str) -> dict:
    """The hello a device of the keyed room ``room`` says on a socket whose nonce is
    ``nonce``: its ``room_tag`` and the Ed25519 signature (128 hex) of the room, the
    device id and the nonce."""
    sig = _signing_key(key, room).sign(_signed(room, device, nonce)).hex()
    return RelayHello(device, room_tag(key, room), sig).wire()


def check_relay_hello(room: str, device: str, nonce: str, tag: str, proof: str) -> bool:
    """Whether ``proof`` is the signature :func:`relay_hello` makes for this room,
    device and nonce with the key whose public half is ``tag``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(tag)).verify(bytes.fromhex(proof),
                                                                       _signed(room, device, nonce))
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass
class _Client:
    device: str
    ws: web.WebSocketResponse


#: Seconds a new websocket has to say hello before the relay closes it.
HELLO_TIMEOUT_S = 10.0
#: Devices in one room at once.
MAX_ROOM_CLIENTS = 64
#: Open websockets from one remote address at once (hello said or not).
MAX_CLIENTS_PER_ADDRESS = 32
#: Entries kept in the audit log and in the rejections (the oldest are dropped).
MAX_AUDIT = 10_000
#: Log lines the relay writes per second at most (more are counted, then summarised).
LOG_LINES_PER_S = 20
#: Signals one socket may send at once (an offer to every other device of a full room,
#: twice), and the rate it may go on at, per second.
SIGNAL_BURST = 2 * MAX_ROOM_CLIENTS
SIGNALS_PER_S = 2.0


class _LogBudget:
    """At most ``per_s`` log lines a second; the rest are counted and reported in one
    line when the budget returns, so a flood of bad clients cannot flood the log.
    ``clock``: seconds (a window is one whole second of it)."""

    def __init__(self, per_s: int, clock: Callable[[], float] = time.monotonic):
        self.per_s = per_s
        self.clock = clock
        self.window = 0
        self.used = 0
        self.suppressed = 0

    def __call__(self, level: int, fmt: str, *args) -> None:
        now = int(self.clock())
        if now != self.window:
            if self.suppressed:
                log.warning("relay: %d log lines suppressed (over %d a second)", self.suppressed, self.per_s)
            self.window, self.used, self.suppressed = now, 0, 0
        if self.used >= self.per_s:
            self.suppressed += 1
            return
        self.used += 1
        log.log(level, fmt, *args)


@dataclass
class Relay:
    """Rooms of connected clients and the audit log.

    ``audit``: one dict per message that crossed the relay, in order:
    ``{"t": unix seconds, "room", "direction": "in" | "out", "device": the client it
    came from or went to, "message": the JSON object}``. ``rejections``: one dict per
    rejected client message ``{"t", "room", "device", "reason"}``. Both keep the last
    ``max_audit`` entries; ``dropped`` counts the ones let go.

    Limits (attributes, defaults from the module constants): ``hello_timeout_s``
    (a socket that says nothing is closed, 1008), ``max_room_clients`` (a hello into a
    full room is refused), ``max_clients_per_address`` (more websockets from one address
    get HTTP 429 before any upgrade), ``max_audit``, ``log_lines_per_s``,
    ``signal_burst`` and ``signals_per_s`` (a socket's signals, a token bucket), ``clock``
    (monotonic seconds, for the bucket and the log budget's one-second windows), ``unix_clock``
    (Unix seconds, for TURN credentials' expiry). ``rooms`` is keyed by the room's name, or for a keyed
    room ``NAME#TAG`` (its :func:`room_tag`).
    """

    rooms: dict[str, dict[str, _Client]] = field(default_factory=dict)
    audit: list[dict] = field(default_factory=list)
    rejections: list[dict] = field(default_factory=list)
    hello_timeout_s: float = HELLO_TIMEOUT_S
    max_room_clients: int = MAX_ROOM_CLIENTS
    max_clients_per_address: int = MAX_CLIENTS_PER_ADDRESS
    max_audit: int = MAX_AUDIT
    log_lines_per_s: int = LOG_LINES_PER_S
    signal_burst: int = SIGNAL_BURST
    signals_per_s: float = SIGNALS_PER_S
    clock: Callable[[], float] = time.monotonic
    dropped: int = 0
    connections: dict[str, int] = field(default_factory=dict)
    #: hands out ICE servers to a hello that asks (runtime.transport.ice.TurnIssuer; None: none)
    turn: Any = None
    #: the Unix time, seconds (TURN credentials' expiry counts from it)
    unix_clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._log = _LogBudget(self.log_lines_per_s, self.clock)

    def _keep(self, entries: list, entry: dict) -> None:
        entries.append(entry)
        if len(entries) > self.max_audit:
            n = len(entries) - self.max_audit
            del entries[:n]
            self.dropped += n

    def _record(self, room: str, direction: str, device: str | None, message: dict) -> None:
        self._keep(self.audit, {"t": time.time(), "room": room, "direction": direction, "device": device,
                                "message": message})

    async def _send(self, room: str, client: _Client, message: RelayMessage) -> None:
        self._record(room, "out", client.device, message.wire())
        try:
            await client.ws.send_str(encode(message))
        except (ConnectionError, RuntimeError) as e:  # client went away meanwhile
            self._log(logging.INFO, "relay: room %s: could not send to %s: %s", room, client.device, e)

    async def _announce(self, room: str) -> None:
        clients = self.rooms.get(room, {})
        msg = Peers(tuple(sorted(clients)))
        for c in list(clients.values()):
            await self._send(room, c, msg)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The websocket endpoint ``/room/{room}`` (see module doc). Never raises: a
        client's misbehaviour closes that client's socket with one log line."""
        addr = request.remote or "?"
        if self.connections.get(addr, 0) >= self.max_clients_per_address:
            self._log_reject(str(request.match_info.get("room", ""))[:64], None,
                             f"over {self.max_clients_per_address} connections from one address")
            return web.Response(status=429, text="too many connections from this address\n")
        self.connections[addr] = self.connections.get(addr, 0) + 1
        try:
            return await self._session(request)
        except Exception as e:  # a bug or a broken socket: one line, never a traceback per message
            self._log(logging.WARNING, "relay: connection from %s ended by %s: %s", addr, type(e).__name__,
                      str(e)[:200])
            return web.Response(status=500)
        finally:
            self.connections[addr] -= 1
            if not self.connections[addr]:
                del self.connections[addr]

    async def _session(self, request: web.Request) -> web.WebSocketResponse:
        room = request.match_info["room"]
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=None, autoping=True)
        await ws.prepare(request)
        if not DEVICE_ID_RE.match(room):  # a room id is written as a device id
            await self._reject(ws, room[:64], None, RelayReject("bad room id"))
            return ws
        me: _Client | None = None
        name = room  # the room in the log; ``room`` becomes NAME#TAG for a keyed hello
        nonce: str | None = None
        tokens, filled = float(self.signal_burst), self.clock()
        try:
            while True:
                try:
                    msg = await ws.receive(timeout=self.hello_timeout_s if me is None else None)
                except asyncio.TimeoutError:
                    raise RelayReject(f"no hello within {self.hello_timeout_s:g} s") from None
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
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
                except (ValueError, RecursionError):
                    raise RelayReject("message is not JSON") from None
                if not isinstance(obj, dict):
                    raise RelayReject("message is not a JSON object")
                kind = obj.get("type")
                if kind == "nonce" and me is not None:  # the socket's state first, then the shape
                    raise RelayReject(NONCE_SHAPE)
                if kind == "hello" and me is not None:
                    raise RelayReject("second hello")
                if kind == "signal" and me is None:
                    raise RelayReject("signal before hello")
                try:
                    said = parse_client(obj)
                except SignalError as e:
                    raise RelayReject(e.reason) from None
                if isinstance(said, AskNonce):
                    nonce = nonce or secrets.token_hex(16)
                    await ws.send_str(encode(Nonce(nonce)))
                elif isinstance(said, RelayHello):
                    device = said.device
                    if said.keyed:
                        if nonce is None or not check_relay_hello(name, device, nonce, said.room_tag, said.proof):
                            raise RelayReject(BAD_PROOF)
                        room = f"{name}#{said.room_tag}"
                    ice_msg = self._ice_message(name, device, said.ice_key) if said.asks_ice else None
                    clients = self.rooms.setdefault(room, {})
                    if device in clients:
                        raise RelayReject(f"device {device!r} is already in room {room!r}")
                    if len(clients) >= self.max_room_clients:
                        raise RelayReject(f"room {room!r} is full ({self.max_room_clients} devices)")
                    self._record(room, "in", device, obj)
                    me = _Client(device, ws)
                    clients[device] = me
                    self._log(logging.INFO, "relay: room %s: %s joined (%d devices)", room, device, len(clients))
                    if ice_msg is not None:
                        await self._send(room, me, ice_msg)
                    await self._announce(room)
                else:  # a Signal
                    now = self.clock()
                    tokens, filled = min(float(self.signal_burst), tokens + (now - filled) * self.signals_per_s), now
                    if tokens < 1:
                        raise RelayReject(f"over {self.signal_burst} signals at once or {self.signals_per_s:g} a second")
                    tokens -= 1
                    data = check_sdp(said.data)
                    target = self.rooms.get(room, {}).get(said.to) if said.to is not None else None
                    if target is None:
                        self._log(logging.INFO, "relay: room %s: signal from %s to absent device %r dropped", room,
                                  me.device, str(obj["to"])[:64])
                        continue
                    await self._send(room, target, Forwarded(me.device, data))
        except RelayReject as e:
            await self._reject(ws, room, me.device if me else None, e)
        finally:
            if me is not None and self.rooms.get(room, {}).get(me.device) is me:
                del self.rooms[room][me.device]
                self._log(logging.INFO, "relay: room %s: %s left", room, me.device)
                if self.rooms[room]:
                    await self._announce(room)
                else:
                    del self.rooms[room]
        if not ws.closed:
            await ws.close()
        return ws

    def _ice_message(self, room: str, device: str, key: Any) -> IceServers:
        """The ``ice`` answer to a hello that asked (module doc). Raises RelayReject for a
        key that is not a P-256 public key in base64url."""
        if self.turn is None:
            return IceServers([])
        if not isinstance(key, str):
            raise RelayReject("hello's ice must be a P-256 public key in base64url")
        try:
            return IceServers(self.turn.message(room, device, key, self.unix_clock())["servers"])
        except ValueError as e:
            raise RelayReject(f"hello's ice: {e}") from None

    def _log_reject(self, room: str, device: str | None, reason: str) -> None:
        self._keep(self.rejections, {"t": time.time(), "room": room, "device": device, "reason": reason})
        self._log(logging.WARNING, "relay: room %s: rejected %s: %s", room, device or "(no hello yet)", reason)

    async def _reject(self, ws: web.WebSocketResponse, room: str, device: str | None, e: RelayReject) -> None:
        self._log_reject(room, device, e.reason)
        try:
            await ws.close(code=e.code, message=e.reason.encode()[:120])
        except (ConnectionError, RuntimeError):  # the client is already gone
            pass

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


async def run_relay(host: str = "127.0.0.1", port: int = 0, relay: Relay | None = None) -> tuple[web.AppRunner, str]:
    """Start a relay on ``host:port`` (port 0: a free one) in the running event loop;
    ``relay`` gives one with other limits (a default :class:`Relay` otherwise).

    Returns ``(runner, url)`` with ``url`` like ``ws://127.0.0.1:43121`` (append
    ``/room/NAME``); stop it with ``await runner.cleanup()``. The Relay (audit log)
    is ``runner.app[RELAY_KEY]``. Raises OSError when the address cannot be bound.
    """
    runner = web.AppRunner(make_app(relay), handle_signals=False, access_log=None)
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


def main(host: str = "127.0.0.1", port: int = 8765, turn: Any = None) -> None:
    """Run a relay in the foreground until interrupted (``splitroom relay``); ``turn``: a
    runtime.transport.ice.TurnIssuer for devices that ask for ICE servers."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    budget = _LogBudget(LOG_LINES_PER_S)

    def _one_line(loop, context: dict) -> None:  # e.g. accept() out of file descriptors: no traceback
        exc = context.get("exception")
        budget(logging.WARNING, "relay: %s%s", context.get("message", "error"),
               f": {type(exc).__name__}: {str(exc)[:200]}" if exc else "")

    async def _serve() -> None:
        asyncio.get_running_loop().set_exception_handler(_one_line)
        runner, url = await run_relay(host, port, Relay(turn=turn))
        print(f"splitroom relay listening on {url}/room/ROOM", flush=True)
        if turn is not None:
            print("handing out ICE servers to devices that ask (join --ice-from-relay): "
                  + ", ".join(s.url for s in (turn.stun, turn.turn) if s is not None)
                  + (f", TURN credentials valid {turn.ttl_s:g} s" if turn.turn is not None else ""), flush=True)
        import secrets
        print(f"a room with a key (give every device the same URL): {url}/room/ROOM?key="
              f"{secrets.token_urlsafe(24)}", flush=True)
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
