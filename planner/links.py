"""Which properties a link between two devices has: the room's defaults with every
per-pair override applied.

:func:`resolve_link` is the one resolution of a :class:`planner.room.Network` into the
:class:`ResolvedLink` of an ordered pair of devices; the simulator (sim/link.py) moves
frames over it and the lap-cost model (planner/lapcost.py) prices a hop with it, so the
two never read a scenario's overrides differently.

Units: seconds, bytes, bytes per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.room import Episodes, Jitter, LinkSpec, Network

__all__ = ["LOOPBACK", "ResolvedLink", "resolve_link"]


@dataclass(frozen=True)
class ResolvedLink:
    """The properties of one ordered pair's link, all defaults and overrides applied.

    Attributes:
        rtt_s: round-trip time without jitter, seconds; a one-way frame pays half.
        jitter: per-message jitter spec (:mod:`sim.jitter`).
        bandwidth_Bps: the sender's uplink rate on this link, bytes/s (``inf``: none).
        hop_overhead_s: fixed cost per hand-off, seconds.
        episodes: correlated stall episodes, or ``None``.
        window_bytes: the transport's initial congestion window, bytes, or ``None``
            for none (see :meth:`Link.schedule`).
        hop_s_per_byte: the hand-off's cost per byte of the frame, seconds (the
            transport stack's copies; room-wide, from ``Network.hop_s_per_byte``).
        burst_bytes: most bytes sent in one burst before an acknowledgement returns,
            or ``None`` for no cap (room-wide, from ``Network.burst_bytes``; see
            :meth:`sim.link.Link.schedule`).
    """

    rtt_s: float
    jitter: Jitter
    bandwidth_Bps: float
    hop_overhead_s: float
    episodes: Episodes | None
    window_bytes: float | None = None
    hop_s_per_byte: float = 0.0
    burst_bytes: float | None = None

    def serialize_s(self, frame_bytes: float) -> float:
        """Seconds ``frame_bytes`` bytes hold the sender's uplink."""
        return frame_bytes / self.bandwidth_Bps

    def nominal_s(self, frame_bytes: float) -> float:
        """One frame's time from send to delivery on an idle uplink, with no jitter
        and no stall: ``frame_bytes/bandwidth + rtt/2 + hop_overhead``, seconds."""
        return (self.serialize_s(frame_bytes) + self.rtt_s / 2 + self.hop_overhead_s
                + frame_bytes * self.hop_s_per_byte)


#: What a device sending to itself gets: no delay, no overhead, no bandwidth limit.
LOOPBACK = ResolvedLink(rtt_s=0.0, jitter=Jitter(), bandwidth_Bps=math.inf, hop_overhead_s=0.0, episodes=None)


def _matches(spec: LinkSpec, a: str, b: str) -> bool:
    ids = spec.between
    if not ids:
        return True
    if spec.directed:
        if len(ids) != 2:
            raise ValueError(f"a directed link needs exactly two devices (from, to), got {list(ids)}")
        return ids[0] == a and ids[1] == b
    return a in ids and b in ids


def resolve_link(network: Network, a: str, b: str) -> ResolvedLink:
    """The link from device ``a`` to device ``b``.

    Starts from the room defaults of ``network`` and applies every override in
    ``network.links`` that names the pair, field by field (a ``None`` field keeps
    what was there): first those with an empty ``between`` (room-wide), then the
    undirected ones (``between`` lists ``a`` and ``b``, in either order; a list of
    more than two devices covers every pair among them), then the directed ones
    (``between == (a, b)`` exactly) — the more specific wins; within a group, later
    entries win. ``a == b`` gives :data:`LOOPBACK`.

    Raises:
        ValueError: a resulting value out of range (``rtt_s``, ``hop_overhead_s`` < 0
            or not finite, ``bandwidth_Bps`` <= 0), or a directed override that does
            not name exactly two devices.
    """
    if a == b:
        return LOOPBACK
    fields = {
        "rtt_s": network.rtt_s,
        "jitter": network.jitter,
        "bandwidth_Bps": network.bandwidth_Bps,
        "hop_overhead_s": network.hop_overhead_s,
        "episodes": network.episodes,
        "window_bytes": network.window_bytes,
        "hop_s_per_byte": network.hop_s_per_byte,
        "burst_bytes": network.burst_bytes,
    }
    groups: tuple[list[LinkSpec], list[LinkSpec], list[LinkSpec]] = ([], [], [])
    for spec in network.links:
        if not _matches(spec, a, b):
            continue
        groups[0 if not spec.between else 2 if spec.directed else 1].append(spec)
    for group in groups:
        for spec in group:
            for name in fields:
                value = getattr(spec, name, None)  # some fields are room-wide only
                if value is not None:
                    fields[name] = value
    link = ResolvedLink(**fields)
    if not (math.isfinite(link.rtt_s) and link.rtt_s >= 0):
        raise ValueError(f"link {a}->{b}: rtt must be >= 0, got {link.rtt_s}")
    if not (math.isfinite(link.hop_overhead_s) and link.hop_overhead_s >= 0):
        raise ValueError(f"link {a}->{b}: hop_overhead must be >= 0, got {link.hop_overhead_s}")
    if not link.bandwidth_Bps > 0:
        raise ValueError(f"link {a}->{b}: bandwidth must be > 0, got {link.bandwidth_Bps}")
    if link.window_bytes is not None and not link.window_bytes > 0:
        raise ValueError(f"link {a}->{b}: window must be > 0, got {link.window_bytes}")
    if link.burst_bytes is not None and not link.burst_bytes > 0:
        raise ValueError(f"link {a}->{b}: burst must be > 0, got {link.burst_bytes}")
    return link
