"""ICE servers (STUN and TURN) for the room's peer connections: parsing, redaction,
time-limited TURN credentials, and reading which candidate pair ICE chose.

Where they come from: ``splitroom join --ice-server URL`` (repeatable), the scenario key
``network.ice_servers``, or the relay (``splitroom relay --turn-url ... --turn-secret-file``
issues time-limited TURN credentials to each device; see :func:`turn_rest_credentials`).
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


def parse_ice_server(text: str) -> IceServer:
    """Parse one ``stun:`` or ``turn:`` URL (module doc for the forms).

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
