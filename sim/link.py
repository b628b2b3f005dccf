"""Links between devices: which properties a pair has, and how a frame crosses it.

:func:`planner.links.resolve_link` turns a :class:`planner.room.Network` (room defaults
plus per-pair overrides) into the :class:`planner.links.ResolvedLink` of one ordered pair
of devices (the lap-cost model resolves links the same way).
:class:`Link` moves frames over it inside a SimPy environment; :class:`Links` builds
and caches every ordered pair's :class:`Link` with its own seeded random stream.

The model of one frame of ``frame_bytes`` bytes sent from ``src`` to ``dst`` at
time ``now``:

1. Serialization through the sender's uplink. Every device has one uplink, shared by
   all links it sends on; frames go through it one at a time, first come first
   served, each holding it for ``frame_bytes / bandwidth_Bps`` seconds. The link's
   bandwidth is the pair's bandwidth (the scenario's ``bandwidth``).
2. Flight. When its last byte has left (time ``t``), the frame arrives after
   ``rtt_s/2 + jitter + extra_rtt(t)/2 + hop_overhead_s``, where ``jitter`` is drawn per
   frame (:mod:`sim.jitter`; ``rtt/2 + jitter`` is clamped at 0, as netem does),
   ``extra_rtt(t)`` is the stall of a correlated episode (:mod:`sim.episodes`) and
   ``hop_overhead_s`` the fixed per-hand-off cost (serialize, GPU read-back, stack).
3. Order. WebRTC data channels are ordered by default (SCTP ordered delivery,
   RFC 8831 section 6.6), so a frame is never delivered before an earlier frame of the
   same ``(src, dst)`` link: delivery = max(own arrival, previous delivery) —
   head-of-line blocking, as a reliable ordered channel behaves.

The uplink as a queue. A capacity-1, FIFO ``simpy.Resource`` held for the
serialization time is the textbook model; since service is FIFO and non-preemptive,
each frame's start is exactly ``max(now, when the uplink frees)``, so
:class:`Uplinks` keeps one "free at" time per device instead of a Resource. That gives
the same times (the unit tests check it against a ``simpy.Resource`` model) for one
SimPy event per frame instead of four (request, grant, timeout, release), which the
simulator's speed goal (20,000 tokens per second of wall time) needs.

Units: seconds, bytes, bytes per second.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generator

import numpy as np

from planner.links import LOOPBACK, ResolvedLink, resolve_link
from planner.room import Episodes, Network
from sim.episodes import EpisodeClock
from sim.jitter import make_jitter

if TYPE_CHECKING:  # the links need only an object with .now (the driver's queue, or a SimPy environment)
    import simpy

__all__ = ["LOOPBACK", "Link", "Links", "ResolvedLink", "Uplinks", "resolve_link", "sctp_frame_rounds"]


#: Cap on the grown window (aiortc's receive window is 128 KiB).
WINDOW_MAX_BYTES = 131072
#: User data in one SCTP DATA chunk (aiortc's ``USERDATA_MAX_LENGTH``).
SCTP_CHUNK_BYTES = 1160


def sctp_frame_rounds(frame_bytes: float, cwnd: float, burst_bytes: float | None = None,
                      backlogged: bool = False) -> tuple[int, float]:
    """Extra round trips one frame of ``frame_bytes`` needs from a congestion window of
    ``cwnd`` bytes, and the window after it: aiortc 1.16's SCTP sender, chunk by chunk.

    The frame goes as chunks of :data:`SCTP_CHUNK_BYTES` (the last one shorter), sent
    while the bytes in flight are below the window; the first flight also stops at
    ``burst_bytes`` (None: no cap; runtime.transport.tune_sctp's 32 chunks). The receiver
    acknowledges every packet (one chunk a packet) and the acknowledgements of a flight
    come back one round trip later, in order. Each acknowledgement that arrives while the
    flight filled the window (``flight >= cwnd``) grows the window by one chunk (RFC 4960
    section 7.2.1 slow start: "only if the congestion window is being fully utilized",
    by at most one MTU); each one then sends what the window allows
    (aiortc/rtcsctptransport.py ``_receive_sack_chunk``, ``_transmit``). So a frame of
    ``F`` chunks from a window of ``W < F`` gains about ``(F - W) / 2 + 1`` chunks, not a
    doubling: a frame sent once a lap pays a round trip on several laps before the window
    holds it (measured on aiortc at 80 ms: 18-chunk frames from a 11-chunk window paid on
    3 frames, the window 11 -> 15 -> 17 -> 18; docs/benchmarks.md, 2026-12-03). The frame
    starts with nothing in flight. ``backlogged``: more data queues behind this frame
    before its acknowledgements are back (pipelined prefill chunks), so the window stays
    full and every acknowledgement grows it: a doubling a round trip. Returns
    ``(rounds, the window after)``, the window at most :data:`WINDOW_MAX_BYTES`; 0 rounds
    for a frame that fits the first flight. Bytes; ``cwnd`` and ``burst_bytes`` > 0."""
    first = cwnd if burst_bytes is None else min(cwnd, burst_bytes)
    if frame_bytes < first:  # fits the first flight: no round trip (and no growth counted)
        return 0, cwnd
    chunk = SCTP_CHUNK_BYTES
    n = max(1, math.ceil(frame_bytes / chunk))
    last = frame_bytes - (n - 1) * chunk
    size = [chunk] * (n - 1) + [last]
    flight = 0.0
    nxt = 0  # next chunk to send
    while nxt < n and flight < first:
        flight += size[nxt]
        nxt += 1
    in_flight = list(range(nxt))  # chunks of the flight whose acknowledgements come next round
    rounds = 0
    while in_flight:
        arriving, in_flight = in_flight, []
        sent_this_round = False
        for c in arriving:
            full = backlogged or flight >= cwnd
            flight -= size[c]
            if full:
                cwnd = min(cwnd + min(size[c], chunk), WINDOW_MAX_BYTES)
            while nxt < n and flight < cwnd:
                flight += size[nxt]
                in_flight.append(nxt)
                nxt += 1
                sent_this_round = True
        if sent_this_round:
            rounds += 1
    return rounds, cwnd


class Uplinks:
    """Every device's uplink: frames serialize through it one at a time, FIFO.

    Equivalent to one capacity-1 FIFO ``simpy.Resource`` per sending device held for
    each frame's serialization time (see the module docstring); kept as a "free at"
    time per device so a frame costs no SimPy events here.

    Args:
        env: the SimPy environment whose ``now`` is the current time.
    """

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._free_at: dict[str, float] = {}

    def reserve(self, device_id: str, hold_s: float, now_s: float | None = None) -> tuple[float, float]:
        """Queue a frame that holds ``device_id``'s uplink for ``hold_s`` seconds,
        behind every frame reserved before it. Returns ``(start_s, end_s)``, the
        absolute times its serialization starts and ends. ``now_s``: the time the
        frame is handed over (default ``env.now``; a driver that works ahead of its
        clock passes it, and must reserve each device's frames in time order).
        Raises ValueError for a negative or NaN ``hold_s``."""
        if not hold_s >= 0:
            raise ValueError(f"hold time must be >= 0, got {hold_s}")
        now = self.env.now if now_s is None else now_s
        free = self._free_at.get(device_id, now)
        start = free if free > now else now
        end = start + hold_s
        self._free_at[device_id] = end
        return start, end

    def free_at_s(self, device_id: str) -> float:
        """When ``device_id``'s uplink has sent everything queued so far (absolute
        seconds; ``env.now`` or earlier when idle)."""
        return self._free_at.get(device_id, self.env.now)

    def busy(self, device_id: str) -> bool:
        """True while ``device_id``'s uplink is still sending."""
        return self._free_at.get(device_id, -math.inf) > self.env.now


class Link:
    """One direction of one pair's link inside a SimPy environment.

    Args:
        env: the SimPy environment.
        src, dst: sender and receiver device ids.
        spec: the resolved link properties.
        uplinks: the room's uplinks (shared by every link, so a device's frames to
            different receivers queue behind each other).
        rng: seeded generator for this link's jitter draws.
        episodes: the stall clock to use; ``None`` builds one from
            ``spec.episodes`` with ``rng`` (pass a shared clock to make both
            directions of a pair stall together, as :class:`Links` does).

    Raises:
        ValueError: from :func:`sim.jitter.make_jitter` for a bad jitter spec.
    """

    __slots__ = ("env", "uplinks", "src", "dst", "spec", "episodes", "_jitter", "_half_rtt", "_overhead",
                 "_inv_bw", "_clock", "_last", "frames", "bytes", "_cwnd", "_per_byte", "_free_at", "_acked_s")

    def __init__(
        self,
        env: simpy.Environment,
        src: str,
        dst: str,
        spec: ResolvedLink,
        uplinks: Uplinks,
        rng: np.random.Generator,
        *,
        episodes: EpisodeClock | None = None,
    ) -> None:
        self.env = env
        self.uplinks = uplinks
        self.src = src
        self.dst = dst
        self.spec = spec
        self._half_rtt = spec.rtt_s / 2
        self._overhead = spec.hop_overhead_s
        self._inv_bw = 0.0 if math.isinf(spec.bandwidth_Bps) else 1.0 / spec.bandwidth_Bps
        self._per_byte = spec.hop_s_per_byte
        self._free_at = uplinks._free_at  # the uplinks' "free at" times (schedule inlines reserve)
        self._jitter = make_jitter(spec.jitter, rng, base_s=self._half_rtt)
        if episodes is None and spec.episodes is not None:
            episodes = EpisodeClock(spec.episodes, rng)
        self.episodes = episodes
        self._clock = episodes if (episodes is not None and episodes.stall_fraction > 0) else None
        self._last = -math.inf
        self._cwnd = spec.window_bytes
        self._acked_s = -math.inf  # when the last frame's acknowledgements are all back
        self.frames = 0  #: frames sent so far
        self.bytes = 0  #: bytes sent so far

    @property
    def last_delivery_s(self) -> float:
        """Delivery time of the latest frame sent (``-inf`` before the first)."""
        return self._last

    def schedule(self, frame_bytes: int, now_s: float | None = None) -> float:
        """Send a frame now (or at ``now_s``, seconds) and return its delivery time
        (absolute seconds) at once.

        Reserves the sender's uplink, draws the jitter and reads the stall clock at
        the moment the last byte leaves. Use it from a driver that schedules its own
        wake-up (e.g. ``env.timeout(t - env.now)``); :meth:`send` wraps it as a
        process. A driver that works ahead of its clock passes ``now_s`` and must
        send each device's frames in time order. Raises ValueError for a negative
        ``frame_bytes``.
        """
        if frame_bytes < 0:
            raise ValueError(f"frame_bytes must be >= 0, got {frame_bytes}")
        # Uplinks.reserve(self.src, frame_bytes / bandwidth, now_s), inlined (one call per hop)
        up = self._free_at
        now = self.uplinks.env.now if now_s is None else now_s
        free = up.get(self.src, now)
        left = (free if free > now else now) + frame_bytes * self._inv_bw
        up[self.src] = left
        delay = self._half_rtt + self._jitter.sample()  # >= 0: clamped in sim.jitter
        clock = self._clock
        if clock is not None:
            delay += 0.5 * clock.extra_rtt_s(left)
        if self._cwnd is not None:
            rounds = self._window_rounds(frame_bytes, left < self._acked_s)
            delay += rounds * 2 * self._half_rtt
            self._acked_s = left + (rounds + 1) * 2 * self._half_rtt
        arrive = left + delay + self._overhead + frame_bytes * self._per_byte
        if arrive < self._last:  # ordered channel: never overtake an earlier frame
            arrive = self._last
        self._last = arrive
        self.frames += 1
        self.bytes += frame_bytes
        return arrive

    def control_delay_s(self, t_s: float) -> float:
        """Seconds a control message (a heartbeat: a few bytes) sent at ``t_s`` takes:
        ``rtt/2 + extra_rtt(t)/2 + hop_overhead``, without jitter (no draw, so the
        frames' random stream is not moved) and without queueing behind frames."""
        clock = self._clock
        return self._half_rtt + self._overhead + (0.5 * clock.extra_rtt_s(t_s) if clock is not None else 0.0)

    def next_stall(self, t_s: float) -> tuple[float, float] | None:
        """The first stall of this link starting at or after ``t_s``, ``(start_s, end_s)``,
        or None (see :meth:`sim.episodes.EpisodeClock.next_window`)."""
        return self._clock.next_window(t_s) if self._clock is not None else None

    def _window_rounds(self, frame_bytes: int, backlogged: bool = False) -> int:
        """Extra round trips a frame needs from this link's congestion window
        (:func:`sctp_frame_rounds`: aiortc's sender, one chunk of growth per acknowledgement
        that arrives while the window is full). The window a frame grew carries over to the
        next however long the link was idle: aiortc 1.16, the real room's transport, shrinks
        its window only on a loss or a retransmission timeout (``rtcsctptransport.py``),
        never after idle time, and the simulated links have no loss. A frame that fits the
        window pays nothing. With the link's ``burst_bytes`` cap, the first flight is at
        most that many bytes however large the window has grown (aiortc's ``_transmit`` as
        tuned by runtime.transport.tune_sctp: 32 chunks of 1160 bytes); later chunks are
        clocked by the acknowledgements and limited by the window alone. ``backlogged``: the
        frame leaves before the previous frame's acknowledgements are back (pipelined
        prefill chunks), so the window stays full (:func:`sctp_frame_rounds`)."""
        rounds, self._cwnd = sctp_frame_rounds(frame_bytes, self._cwnd, self.spec.burst_bytes, backlogged)
        return rounds

    def send(self, frame_bytes: int) -> Generator[simpy.Event, object, float]:
        """SimPy process: send ``frame_bytes`` bytes; finishes at delivery.

        Use as ``t = yield env.process(link.send(n))``: the process holds the
        sender's uplink for ``n / bandwidth`` seconds (queued FIFO behind earlier
        frames from the same device), then delivers after
        ``rtt/2 + jitter + extra_rtt/2 + hop_overhead``, never before an earlier frame
        of this link. Returns the delivery time (absolute seconds).
        Raises ValueError (at once, not when run) for a negative ``frame_bytes``.
        """
        arrive = self.schedule(frame_bytes)
        return self._wait_until(arrive)

    def _wait_until(self, t: float) -> Generator[simpy.Event, object, float]:
        env = self.env
        if t > env.now:
            yield env.timeout(t - env.now)
        return t


class Links:
    """Every ordered pair's :class:`Link` in one environment, built on first use.

    Each ordered pair gets its own generator, derived from one draw of ``rng`` and a
    CRC-32 of the two ids, so a pair's random stream does not depend on the order in
    which links are first used or on which other links exist. Both directions of a
    pair share one :class:`~sim.episodes.EpisodeClock` when their episode specs are
    equal (a stalled home link stalls both ways), else each has its own.

    Args:
        env: the SimPy environment.
        network: the room's network (defaults and overrides).
        rng: seeded generator; one number is drawn from it at construction.
        episode_start_jitter: passed to every :class:`~sim.episodes.EpisodeClock`.
    """

    def __init__(self, env: simpy.Environment, network: Network, rng: np.random.Generator, *,
                 episode_start_jitter: float = 0.0) -> None:
        self.env = env
        self.network = network
        self.uplinks = Uplinks(env)
        self._base = int(rng.integers(0, 2**63 - 1))
        self._start_jitter = episode_start_jitter
        self._links: dict[tuple[str, str], Link] = {}
        self._clocks: dict[tuple[str, str, Episodes], EpisodeClock] = {}

    def _rng(self, a: str, b: str, stream: int) -> np.random.Generator:
        return np.random.default_rng([self._base, zlib.crc32(a.encode()), zlib.crc32(b.encode()), stream])

    def get(self, src: str, dst: str) -> Link:
        """The link ``src -> dst`` (created on first use).
        Raises ValueError from :func:`resolve_link` for invalid properties."""
        key = (src, dst)
        link = self._links.get(key)
        if link is None:
            spec = resolve_link(self.network, src, dst)
            clock = None
            if spec.episodes is not None:
                lo, hi = sorted(key)
                ckey = (lo, hi, spec.episodes)
                clock = self._clocks.get(ckey)
                if clock is None:
                    clock = EpisodeClock(spec.episodes, self._rng(lo, hi, 1), start_jitter=self._start_jitter)
                    self._clocks[ckey] = clock
            link = Link(self.env, src, dst, spec, self.uplinks, self._rng(src, dst, 0), episodes=clock)
            self._links[key] = link
        return link

    __call__ = get
