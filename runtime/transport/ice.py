"""ICE servers (STUN and TURN) for the room's peer connections: parsing, redaction,
time-limited TURN credentials, and reading which candidate pair ICE chose.

Where they come from: ``splitroom join --ice-server URL`` (repeatable), the scenario key
``network.ice_servers``, or the relay (``splitroom relay --turn-url ... --turn-secret-file``
issues time-limited TURN credentials to each device that asks, ``join --ice-from-relay``;
see :class:`TurnIssuer`).
With none configured no STUN or TURN server is ever contacted: a peer connection is
built with ``iceServers=[]`` (aiortc's default of ``None`` would add a public STUN server).

URL forms (RFC 7064 and RFC 7065, with the credentials written into the URL the way
people type them on a command line)::

    stun:HOST[:PORT]
    turn:USER:PASSWORD@HOST[:PORT][?transport=udp|tcp]

``HOST`` is a name, an IPv4 address or ``[IPv6]``; ``PORT`` defaults to 3478 (RFC 5389
section 9); ``USER`` and ``PASSWORD`` are percent-decoded, so ``%40`` writes an ``@``.
aiortc uses the first STUN and the first TURN server of the list (aiortc 1.16
``rtcicetransport.connection_kwargs``), so more than one of each is refused here
rather than ignored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence
from urllib.parse import quote, unquote

#: the STUN/TURN port when a URL names none (RFC 5389 section 9, RFC 5766 section 6)
DEFAULT_ICE_PORT = 3478

_HOST = r"(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
_STUN_RE = re.compile(rf"^stun:(?P<host>{_HOST})(?::(?P<port>\d{{1,5}}))?$")
_TURN_RE = re.compile(rf"^turn:(?:(?P<user>[^:@/?#\s]+):(?P<pw>[^@/?#\s]+)@)?(?P<host>{_HOST})"
                      rf"(?::(?P<port>\d{{1,5}}))?(?:\?transport=(?P<transport>udp|tcp))?$")


@dataclass(frozen=True)
class IceServer:
    """One STUN or TURN server.

    Attributes:
        kind: ``"stun"`` or ``"turn"``.
        host: its name or address (an IPv6 address without brackets).
        port: UDP/TCP port.
        transport: ``"udp"`` or ``"tcp"`` (TURN only; STUN is UDP).
        username, credential: TURN's long-term credentials (RFC 5766 section 4); None
            for STUN. The credential never appears in :meth:`redacted` nor in ``repr``.
    """

    kind: str
    host: str
    port: int = DEFAULT_ICE_PORT
    transport: str = "udp"
    username: Optional[str] = None
    credential: Optional[str] = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The server's URL without credentials (``turn:HOST:PORT?transport=udp``), the
        form WebRTC's ``RTCIceServer.urls`` takes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.kind == "stun":
            return f"stun:{host}:{self.port}"
        return f"turn:{host}:{self.port}?transport={self.transport}"

    def redacted(self) -> str:
        """The URL as a log may show it: the TURN user name kept, the password ``***``."""
        if self.kind == "stun":
            return self.url
        return self.url.replace("turn:", f"turn:{quote(self.username or '', safe='')}:***@", 1)

    def for_webrtc(self) -> dict:
        """The ``RTCIceServer`` dictionary a browser's ``RTCPeerConnection`` takes
        (``{"urls", "username", "credential"}``; STUN: ``urls`` only)."""
        d: dict = {"urls": self.url}
        if self.kind == "turn":
            d.update(username=self.username, credential=self.credential)
        return d


def parse_ice_server(text: str, credentials: bool = True) -> IceServer:
    """Parse one ``stun:`` or ``turn:`` URL (module doc for the forms). ``credentials``:
    a ``turn:`` URL must carry ``USER:PASSWORD@`` (False: it must not, the relay's
    ``--turn-url``, whose credentials it makes itself).

    Raises:
        ValueError: a one-line message naming what is wrong; it never repeats a password.
    """
    if not isinstance(text, str):
        raise ValueError(f"an ICE server is a stun: or turn: URL, got {type(text).__name__}")
    t = text.strip()
    m = _STUN_RE.match(t) or _TURN_RE.match(t)
    if m is None:
        shown = t.split("@", 1)[-1] if "@" in t else t
        raise ValueError(f"ICE server {shown[:80]!r} is not stun:HOST[:PORT] or "
                         "turn:USER:PASSWORD@HOST[:PORT][?transport=udp|tcp]")
    port = int(m.group("port") or DEFAULT_ICE_PORT)
    host = m.group("host").strip("[]")
    where = f"{t.split(':', 1)[0]}:{m.group('host')}"
    if not 1 <= port <= 65535:
        raise ValueError(f"ICE server {where}: port {port} is not 1-65535")
    if t.startswith("stun:"):
        return IceServer("stun", host, port)
    if not credentials:
        if m.group("user") is not None:
            raise ValueError(f"TURN URL {where}: give it without USER:PASSWORD@ (the relay makes the credentials)")
        return IceServer("turn", host, port, m.group("transport") or "udp")
    if m.group("user") is None:
        raise ValueError(f"ICE server {where}: a TURN server needs USER:PASSWORD@ (or give the relay "
                         "--turn-secret-file to issue time-limited credentials)")
    return IceServer("turn", host, port, m.group("transport") or "udp", unquote(m.group("user")),
                     unquote(m.group("pw")))


def parse_ice_servers(texts: Iterable[str]) -> tuple[IceServer, ...]:
    """Parse a list of URLs (:func:`parse_ice_server`) and check aiortc can use them all.

    Raises:
        ValueError: a bad URL, or more than one STUN or more than one TURN server
            (aiortc would silently use only the first).
    """
    servers = tuple(parse_ice_server(t) for t in texts)
    check_ice_servers(servers)
    return servers


def check_ice_servers(servers: Sequence[IceServer]) -> None:
    """Raise ValueError when ``servers`` holds more than one STUN or TURN server."""
    for kind in ("stun", "turn"):
        n = sum(1 for s in servers if s.kind == kind)
        if n > 1:
            raise ValueError(f"{n} {kind.upper()} servers given: aiortc uses one STUN and one TURN server; "
                             "give at most one of each")


def to_rtc_ice_servers(servers: Sequence[IceServer]) -> list:
    """aiortc ``RTCIceServer`` objects for ``servers`` (``[]``, never None, when empty)."""
    from aiortc import RTCIceServer

    return [RTCIceServer(urls=s.url, username=s.username, credential=s.credential) for s in servers]


def turn_rest_credentials(secret: str, user: str, ttl_s: float, now_s: float) -> tuple[str, str]:
    """Time-limited TURN credentials as coturn's ``use-auth-secret`` checks them.

    The user name is ``EXPIRY:USER`` (``EXPIRY`` the Unix time in whole seconds after
    which the server refuses it) and the password ``base64(HMAC-SHA1(secret, user
    name))``. Source: the TURN REST API draft (draft-uberti-behave-turn-rest-00,
    section 2.2) and coturn's ``turnserver`` manual (``--use-auth-secret``,
    ``--static-auth-secret``).

    Args:
        secret: the shared secret also given to the TURN server (``static-auth-secret``).
        user: a name for the holder (here the room and device), no ``:``.
        ttl_s: how long the credentials stay valid, seconds (> 0).
        now_s: the current Unix time, seconds (passed in: the caller owns the clock).
    Returns:
        ``(username, password)``.
    Raises:
        ValueError: an empty secret, a ``user`` holding ``:``, or ``ttl_s <= 0``.
    """
    if not secret:
        raise ValueError("the TURN secret is empty")
    if ":" in user:
        raise ValueError(f"a TURN REST user may not hold ':' (got {user!r})")
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    username = f"{int(now_s + ttl_s)}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


# --------------------------------------------------------------------------- relay-issued credentials

#: HKDF ``info`` of the key that seals a TURN password from the relay to one device
SEAL_INFO = b"splitroom turn credential v1"


def _b64e(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def _b64d(s: str, what: str, most: int = 512) -> bytes:
    if not isinstance(s, str) or len(s) > most or not re.fullmatch(r"[A-Za-z0-9_-]*", s):
        raise ValueError(f"{what} is not base64url text")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _seal_key(private, peer_public_raw: bytes, what: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    try:
        peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), peer_public_raw)
    except ValueError:
        raise ValueError(f"{what} is not a P-256 public key") from None
    shared = private.exchange(ec.ECDH(), peer)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SEAL_INFO).derive(shared)


class CredentialKey:
    """A device's one-use key pair for receiving a TURN password sealed by the relay, so
    the password never crosses the relay's (possibly plain ``ws://``) wire in clear.

    Scheme: ECDH on P-256 between this key and a fresh relay key, HKDF-SHA256 (RFC 5869,
    ``info`` :data:`SEAL_INFO`, no salt) to a 256-bit key, AES-GCM (NIST SP 800-38D) with
    a random 96-bit nonce and the TURN user name as associated data; the sealed form is
    ``nonce || ciphertext+tag``, base64url. All of it is in browsers' WebCrypto too.
    It keeps the password from whoever only reads the wire; a relay that lies could hand
    out credentials of its own, as it could forward any SDP: the DTLS fingerprints (and a
    room key) are what authenticate the peers, never the TURN server.
    """

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec
        self._key = ec.generate_private_key(ec.SECP256R1())

    @property
    def public(self) -> str:
        """The public key, an uncompressed P-256 point (65 bytes, SEC 1 2.3.3), base64url."""
        from cryptography.hazmat.primitives import serialization
        return _b64e(self._key.public_key().public_bytes(serialization.Encoding.X962,
                                                         serialization.PublicFormat.UncompressedPoint))

    def open(self, relay_public: str, sealed: str, username: str) -> str:
        """The password the relay sealed for this key. Raises ValueError when it does not
        open (another key, a changed user name or ciphertext)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        key = _seal_key(self._key, _b64d(relay_public, "the relay's key"), "the relay's key")
        raw = _b64d(sealed, "the sealed credential")
        if len(raw) < 12 + 16:
            raise ValueError("the sealed credential is too short")
        try:
            return AESGCM(key).decrypt(raw[:12], raw[12:], username.encode()).decode()
        except (InvalidTag, UnicodeDecodeError):
            raise ValueError("the sealed TURN credential does not open with this device's key") from None


def seal_credential(device_public: str, password: str, username: str) -> tuple[str, str]:
    """Seal ``password`` for the holder of ``device_public`` (:class:`CredentialKey`):
    returns ``(relay public key, sealed)``, both base64url. Raises ValueError for a key
    that is not a P-256 public key."""
    import os as _os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    mine = ec.generate_private_key(ec.SECP256R1())
    key = _seal_key(mine, _b64d(device_public, "the device's ice key", 128), "the device's ice key")
    nonce = _os.urandom(12)
    sealed = nonce + AESGCM(key).encrypt(nonce, password.encode(), username.encode())
    pub = mine.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return _b64e(pub), _b64e(sealed)


@dataclass(frozen=True)
class TurnIssuer:
    """What the relay hands a device that asks for ICE servers: the STUN server, and the
    TURN server with credentials valid ``ttl_s`` seconds (:func:`turn_rest_credentials`
    with the secret shared with coturn), the password sealed to the device's key.

    Attributes:
        turn: the TURN server, without credentials (``parse_ice_server(url, credentials=False)``).
        secret: coturn's ``static-auth-secret``; never logged, never sent.
        ttl_s: how long issued credentials stay valid, seconds.
        stun: a STUN server to hand out too, or None.
    """

    turn: Optional[IceServer]
    secret: str = field(default="", repr=False)
    ttl_s: float = 3600.0
    stun: Optional[IceServer] = None

    def message(self, room: str, device: str, device_public: str, now_s: float) -> dict:
        """The relay's ``{"type": "ice", "servers": [...]}`` for ``device`` of ``room``:
        STUN as ``{"urls"}``, TURN as ``{"urls", "username", "sealed", "key"}``. Raises
        ValueError for a device key that is not a P-256 public key."""
        servers: list[dict] = []
        if self.stun is not None:
            servers.append({"urls": self.stun.url})
        if self.turn is not None:
            user, password = turn_rest_credentials(self.secret, f"{room}.{device}".replace(":", "_"), self.ttl_s, now_s)
            key, sealed = seal_credential(device_public, password, user)
            servers.append({"urls": self.turn.url, "username": user, "sealed": sealed, "key": key})
        return {"type": "ice", "servers": servers}


def servers_from_relay(message: dict, key: CredentialKey) -> tuple[IceServer, ...]:
    """The ICE servers in a relay's ``ice`` message (:meth:`TurnIssuer.message`), the
    TURN password opened with ``key``. Raises ValueError (one line) for a malformed one."""
    out = []
    items = message.get("servers") if isinstance(message, dict) else None
    if not isinstance(items, list) or len(items) > 2:
        raise ValueError("the relay's ice message holds no list of at most 2 servers")
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("urls"), str):
            raise ValueError("the relay's ice message holds a server without urls")
        s = parse_ice_server(it["urls"], credentials=False)
        if s.kind == "turn":
            user = it.get("username")
            if not isinstance(user, str) or not 1 <= len(user) <= 256:
                raise ValueError("the relay's TURN server comes without a user name")
            s = IceServer("turn", s.host, s.port, s.transport, user, key.open(it.get("key"), it.get("sealed"), user))
        out.append(s)
    servers = tuple(out)
    check_ice_servers(servers)
    return servers


def merge_ice_servers(given: Sequence[IceServer], issued: Sequence[IceServer]) -> tuple[IceServer, ...]:
    """``given`` (the device's own) plus each kind of ``issued`` (the relay's) that
    ``given`` lacks: the device's own STUN or TURN server wins."""
    kinds = {s.kind for s in given}
    return tuple(given) + tuple(s for s in issued if s.kind not in kinds)


# --------------------------------------------------------------------------- candidates

_CAND_RE = re.compile(r"^a=candidate:\S+ \d+ (?:udp|UDP|tcp|TCP) \d+ (\S+) (\d+) typ (host|srflx|prflx|relay)", re.M)


def sdp_candidate_types(sdp: str) -> dict[str, list[str]]:
    """``{type: [ADDRESS:PORT, ...]}`` of the ``a=candidate`` lines of an SDP
    (types ``host``, ``srflx``, ``prflx``, ``relay``; RFC 8839 section 5.1)."""
    out: dict[str, list[str]] = {}
    for addr, port, typ in _CAND_RE.findall(sdp or ""):
        out.setdefault(typ, []).append(f"{addr}:{port}")
    return out


def chosen_pair(pc) -> Optional[tuple[str, str, str, str]]:
    """The candidate pair ICE nominated on an aiortc ``RTCPeerConnection``:
    ``(local type, local ADDRESS:PORT, remote type, remote ADDRESS:PORT)``, or None
    before ICE completes. Reads aioice's ``Connection._nominated`` (aioice 0.13), the
    only place the choice is kept."""
    try:
        ice = pc.sctp.transport.transport  # SCTP -> DTLS -> ICE transport
        conn = ice._connection
        pairs = list(getattr(conn, "_nominated", {}).values())
    except AttributeError:
        return None
    if not pairs:
        return None
    p = pairs[0]
    return (p.local_candidate.type, f"{p.local_candidate.host}:{p.local_candidate.port}",
            p.remote_candidate.type, f"{p.remote_candidate.host}:{p.remote_candidate.port}")


def no_path_hint(local_sdp: str, remote_sdp: str, servers: Sequence[IceServer]) -> str:
    """Why ICE most likely found no path, in one line, from the candidates each side
    offered and the servers configured (the message :func:`connect_room` raises)."""
    mine, theirs = sdp_candidate_types(local_sdp), sdp_candidate_types(remote_sdp)

    def show(c: dict[str, list[str]]) -> str:
        return ", ".join(f"{k} {' '.join(v[:2])}" for k, v in sorted(c.items())) or "none"
    offered = f"this side offered {show(mine)}; the peer offered {show(theirs)}"
    if not servers:
        return (f"no ICE candidate pair worked ({offered}); no STUN/TURN server is configured, so the devices "
                "are likely behind NAT (a home router) and cannot reach each other's private addresses: give "
                "--ice-server stun:HOST:PORT (a port-restricted NAT), or turn:USER:PASS@HOST:PORT or the relay's "
                "--turn-secret-file (a symmetric NAT)")
    if not any(s.kind == "turn" for s in servers):
        return (f"no ICE candidate pair worked ({offered}); STUN alone cannot cross a symmetric NAT (its mapping "
                "changes per destination): add a TURN server")
    if "relay" not in mine and "relay" not in theirs:
        return (f"no ICE candidate pair worked ({offered}); no relay candidate was gathered: the TURN server "
                "refused the credentials or cannot be reached")
    return f"no ICE candidate pair worked ({offered}); the TURN server's relayed path failed too"
