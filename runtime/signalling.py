"""The relay's signalling messages, typed: what a device and the relay (runtime/relay.py)
say to each other over the relay's websocket, one JSON object per text message, told
apart by ``"type"``.

A device says (:func:`parse_client` reads these on the relay)::

    AskNonce    {"type": "nonce"}                                  before hello, in a room with a key
    RelayHello  {"type": "hello", "device": ID[, "ice": KEY][, "room_tag": 64 hex, "proof": 128 hex]}
    Signal      {"type": "signal", "to": ID, "data": SDP}

The relay says (:func:`parse_relay` reads these on a device)::

    Nonce       {"type": "nonce", "nonce": 32 hex}
    IceServers  {"type": "ice", "servers": [...]}                  (runtime/transport/ice.py's format)
    Peers       {"type": "peers", "devices": [ID, ...]}
    Forwarded   {"type": "signal", "from": ID, "data": SDP}

``SDP`` is :class:`Sdp` on the wire, ``{"type": "offer" | "answer", "sdp": "v=0..."}``. A
signal's ``data`` stays as it was sent until someone checks it: the relay with
:func:`runtime.relay.check_sdp` (its content, line by line), a device with
:meth:`Sdp.parse`. Each message has ``wire()``, the JSON object it is sent as.

A malformed message is a :class:`SignalError` with the one-line reason the relay closes
that socket with. Nothing here does IO.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

#: a device id as the relay accepts it
DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_TAG_RE = re.compile(r"^[0-9a-f]{64}$")
_PROOF_RE = re.compile(r"^[0-9a-f]{128}$")

#: the relay's reasons for a malformed message (the close reason of that socket)
HELLO_SHAPE = ("hello must be {type, device[, ice][, room_tag, proof]} with a device id "
               "of [A-Za-z0-9_.:-]{1,64}")
BAD_PROOF = "the hello's proof of the room key does not check out"
NONCE_SHAPE = "a nonce is asked for once, before hello, as {type}"
SIGNAL_SHAPE = "signal must be {type, to, data}"


class SignalError(ValueError):
    """A signalling message is malformed; ``reason`` is one line, naming no content."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Sdp:
    """An SDP offer or answer as a signal carries it."""

    kind: Literal["offer", "answer"]
    sdp: str

    def wire(self) -> dict:
        return {"type": self.kind, "sdp": self.sdp}

    @classmethod
    def parse(cls, data: Any, kind: str) -> Optional["Sdp"]:
        """``data`` as an SDP of ``kind`` (``offer``/``answer``), or None when it is not one."""
        if not isinstance(data, dict) or data.get("type") != kind or not isinstance(data.get("sdp"), str):
            return None
        return cls(kind, data["sdp"])  # type: ignore[arg-type]


# ------------------------------------------------------------------ device -> relay


@dataclass(frozen=True)
class AskNonce:
    """Asks for this socket's nonce (a keyed room's hello signs it)."""

    def wire(self) -> dict:
        return {"type": "nonce"}


@dataclass(frozen=True)
class RelayHello:
    """A device takes its seat: ``device``; ``room_tag`` and ``proof`` in a room with a
    key (:func:`runtime.relay.relay_hello`, both or neither); ``asks_ice``: it asks for the
    relay's ICE servers with ``ice_key`` (a P-256 public key in base64url, checked by the
    relay's TURN issuer; any JSON value as sent)."""

    device: str
    room_tag: Optional[str] = None
    proof: Optional[str] = None
    asks_ice: bool = False
    ice_key: Any = None

    @property
    def keyed(self) -> bool:
        return self.room_tag is not None

    def wire(self) -> dict:
        out: dict = {"type": "hello", "device": self.device}
        if self.keyed:
            out |= {"room_tag": self.room_tag, "proof": self.proof}
        if self.asks_ice:
            out["ice"] = self.ice_key
        return out


@dataclass(frozen=True)
class Signal:
    """An SDP for the device ``to`` (None: ``to`` was not a string; the relay drops it
    as it drops one for a device not in the room). ``data`` as sent."""

    to: Optional[str]
    data: Any

    def wire(self) -> dict:
        return {"type": "signal", "to": self.to, "data": self.data}


ClientMessage = Union[AskNonce, RelayHello, Signal]


def parse_client(obj: dict) -> ClientMessage:
    """A device's message (a decoded JSON object) as the relay reads it: its shape only
    (a keyed hello's proof is checked by the relay against the socket's nonce, a signal's
    SDP by :func:`runtime.relay.check_sdp`). Raises SignalError with the relay's reason."""
    kind = obj.get("type")
    if kind == "nonce":
        if set(obj) != {"type"}:
            raise SignalError(NONCE_SHAPE)
        return AskNonce()
    if kind == "hello":
        device = obj.get("device")
        fields = set(obj) - {"ice"}
        keyed = fields == {"type", "device", "room_tag", "proof"}
        if not (keyed or fields == {"type", "device"}) or not isinstance(device, str) \
                or not DEVICE_ID_RE.match(device):
            raise SignalError(HELLO_SHAPE)
        tag = proof = None
        if keyed:
            tag, proof = obj["room_tag"], obj["proof"]
            if not isinstance(tag, str) or not isinstance(proof, str) or not _TAG_RE.match(tag) \
                    or not _PROOF_RE.match(proof):
                raise SignalError(BAD_PROOF)
        return RelayHello(device, tag, proof, "ice" in obj, obj.get("ice"))
    if kind == "signal":
        if set(obj) != {"type", "to", "data"}:
            raise SignalError(SIGNAL_SHAPE)
        to = obj["to"]
        return Signal(to if isinstance(to, str) else None, obj["data"])
    raise SignalError(f"message type {str(kind)[:20]!r} is not allowed (hello/signal only)")


# ------------------------------------------------------------------ relay -> device


@dataclass(frozen=True)
class Nonce:
    """This socket's nonce (hex)."""

    nonce: str

    def wire(self) -> dict:
        return {"type": "nonce", "nonce": self.nonce}


@dataclass(frozen=True)
class IceServers:
    """The relay's ICE servers for this device, ``servers`` in the format of
    :meth:`runtime.transport.ice.TurnIssuer.message` (read by
    :func:`runtime.transport.ice.servers_from_relay`, which checks them)."""

    servers: Any

    def wire(self) -> dict:
        return {"type": "ice", "servers": self.servers}


@dataclass(frozen=True)
class Peers:
    """The devices in the room now (sent on every join and leave)."""

    devices: tuple[str, ...]

    def wire(self) -> dict:
        return {"type": "peers", "devices": list(self.devices)}


@dataclass(frozen=True)
class Forwarded:
    """A signal from ``sender`` (``data`` as the relay forwards it: checked there)."""

    sender: str
    data: Any

    def wire(self) -> dict:
        return {"type": "signal", "from": self.sender, "data": self.data}


RelayMessage = Union[Nonce, IceServers, Peers, Forwarded]


def parse_relay(text: str | bytes) -> RelayMessage:
    """One message from the relay (its JSON text). Raises SignalError for text that is
    not JSON or not one of the relay's messages."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise SignalError("the relay sent a message that is not JSON") from None
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind == "nonce" and isinstance(obj.get("nonce"), str):
        return Nonce(obj["nonce"])
    if kind == "ice":
        return IceServers(obj.get("servers"))
    if kind == "peers":
        devices = obj.get("devices", [])
        if isinstance(devices, list) and all(isinstance(d, str) for d in devices):
            return Peers(tuple(devices))
    if kind == "signal" and isinstance(obj.get("from"), str):
        return Forwarded(obj["from"], obj.get("data"))
    raise SignalError(f"relay message {str(kind)[:20]!r} is not one of nonce, ice, peers, signal")


def encode(msg: ClientMessage | RelayMessage) -> str:
    """A message as the JSON text sent over the websocket."""
    return json.dumps(msg.wire())
