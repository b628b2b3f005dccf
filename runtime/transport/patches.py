"""Patches of aiortc/aioice behaviour: loopback ICE host candidates and SCTP burst and
initial congestion window (process-wide; see docs/transport.md).

Loopback candidates. aioice (``aioice.ice.get_host_addresses``) leaves 127.0.0.1 out
of its host candidates, so two peers that only have loopback (a fresh network
namespace, a sandbox) gather no candidates and ICE hangs silently.
:func:`install_candidate_patch` replaces that function with one that appends
127.0.0.1 to the list, and honours a per-connection override (``host_addresses``, a
context variable) so tests and namespace runs can pin the exact addresses they use.
"""

from __future__ import annotations

import contextvars
import math
from typing import Optional

_host_addresses: contextvars.ContextVar[Optional[tuple[str, ...]]] = contextvars.ContextVar(
    "splitroom_host_addresses", default=None)


def install_candidate_patch() -> None:
    """Replace ``aioice.ice.get_host_addresses`` (see module doc). Idempotent."""
    import aioice.ice as ice

    if getattr(ice.get_host_addresses, "_splitroom", False):
        return
    original = ice.get_host_addresses

    def _patched_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        pinned = _host_addresses.get()
        if pinned is not None:
            return [a for a in pinned if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]
        addrs = original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        if use_ipv4 and "127.0.0.1" not in addrs:
            addrs.append("127.0.0.1")  # loopback last: real interfaces are preferred
        return addrs

    _patched_host_addresses._splitroom = True  # type: ignore[attr-defined]
    _patched_host_addresses._original = original  # type: ignore[attr-defined]
    ice.get_host_addresses = _patched_host_addresses


# --------------------------------------------------------------------------- SCTP burst

#: aiortc's hard-coded burst: ``RTCSctpTransport._transmit`` sends at most
#: ``4 * USERDATA_MAX_LENGTH`` beyond the bytes in flight per call (aiortc 1.16
#: rtcsctptransport.py, "limit burst size"; the module constant SCTP_MAX_BURST = 4 is
#: not what it reads), and the congestion window starts at ``3 * USERDATA_MAX_LENGTH``.
AIORTC_BURST_CHUNKS = 4
AIORTC_INITIAL_CWND_CHUNKS = 3
#: Defaults applied by connect_room (measured in docs/transport.md).
DEFAULT_MAX_BURST_CHUNKS = 32  # a 16-token prefill chunk (36.9 KB, 32 chunks) in one burst
DEFAULT_INITIAL_CWND_CHUNKS = 10  # ~11.6 KB, like TCP's IW10 (RFC 6928)
#: user data per SCTP DATA chunk in aiortc
SCTP_CHUNK_BYTES = 1160
#: the tuned transport's initial congestion window, bytes (what the simulator's links start from)
INITIAL_WINDOW_BYTES = DEFAULT_INITIAL_CWND_CHUNKS * SCTP_CHUNK_BYTES
_sctp_tuning: dict[str, int] = {"max_burst": AIORTC_BURST_CHUNKS, "initial_cwnd": AIORTC_INITIAL_CWND_CHUNKS}


def tune_sctp(max_burst: Optional[int] = DEFAULT_MAX_BURST_CHUNKS,
              initial_cwnd: Optional[int] = DEFAULT_INITIAL_CWND_CHUNKS) -> dict[str, int]:
    """Opt-in fix for aiortc's SCTP sender (process-wide; applies to associations made
    afterwards for ``initial_cwnd``, to every association for ``max_burst``).

    ``max_burst``: most DATA chunks (1160 bytes of user data each) sent in one burst
    (aiortc: 4). Implemented by calling aiortc's own ``_transmit`` again while it
    made progress, the congestion window allows more and no fast recovery is under
    way, so the burst grows in steps of 4 chunks and congestion control, fast
    recovery and retransmission are aiortc's unchanged. ``initial_cwnd``: the
    congestion window of a new association in chunks (aiortc: 3; RFC 6928's IW10 is
    the TCP analogue); losses still shrink it as aiortc does. ``None`` restores
    aiortc's value. Returns the settings now in force. Raises ValueError for values
    below 1.

    Why: a decode frame (2336 bytes + 1) is 3 chunks; a 10 KB frame is 9 chunks, which
    with a 3-chunk window and 4-chunk bursts needs several round trips on a delayed
    link. Sources: aiortc/rtcsctptransport.py ``_transmit``,
    ``_receive_sack_chunk``; RFC 4960 section 6.1 and 7.2.
    """
    from aiortc import rtcsctptransport as m

    cls = m.RTCSctpTransport
    if not hasattr(cls, "_splitroom_orig_transmit"):
        cls._splitroom_orig_transmit = cls._transmit
        cls._splitroom_orig_init = cls.__init__

        async def _transmit(self) -> None:  # type: ignore[no-untyped-def]
            orig = cls._splitroom_orig_transmit
            await orig(self)
            extra = math.ceil(_sctp_tuning["max_burst"] / AIORTC_BURST_CHUNKS) - 1
            for _ in range(max(0, extra)):
                if (self._fast_recovery_exit is not None or not self._outbound_queue
                        or self._flight_size >= self._cwnd):
                    break
                before = self._flight_size
                await orig(self)
                if self._flight_size <= before:
                    break

        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            cls._splitroom_orig_init(self, *args, **kwargs)
            self._cwnd = _sctp_tuning["initial_cwnd"] * m.USERDATA_MAX_LENGTH

        cls._transmit = _transmit
        cls.__init__ = __init__
    for name, v, default in (("max_burst", max_burst, AIORTC_BURST_CHUNKS),
                             ("initial_cwnd", initial_cwnd, AIORTC_INITIAL_CWND_CHUNKS)):
        v = default if v is None else int(v)
        if v < 1:
            raise ValueError(f"{name} must be at least 1 chunk, got {v}")
        _sctp_tuning[name] = v
    return dict(_sctp_tuning)

