"""Hop time per link in a real room, from each device's own stamps (sans-IO: times in).

A **hop** of link ``A -> B`` for a lap is the span the simulator and
:mod:`planner.metrics` call a hop (SendFrame -> FrameArrived): from ``A`` handing the
lap's residual frame to its transport (the SendFrame carried out: the frame is encoded
and sent from then on) until ``B`` has the whole frame, decoded and checked (the
FrameArrived it feeds its machine). It includes encoding, the data channel (SCTP, DTLS,
the network, pieces and their reassembly) and the receiver's decoding and checks; not
the stage either side runs.

Each device stamps those two moments on its own monotonic clock. The devices' clocks
are not the host's, so each worker's offset from the model host is estimated from the
heartbeats they exchange anyway, with NTP's on-wire calculation (RFC 5905, section 8):
a heartbeat carries its send time ``T3``, the send time ``T1`` of the last heartbeat
its sender heard from the receiver, and how long it held that one (``T3 - T2``, on the
sender's clock). The receiver, at ``T4``::

    offset θ = ((T2 - T1) + (T3 - T4)) / 2     (the sender's clock minus the receiver's)
    delay  δ = (T4 - T1) - (T3 - T2)           (the round trip, the time held taken out)

Of the last :data:`CLOCK_SAMPLES` exchanges the one with the least delay is used, as
NTP's clock filter does (RFC 5905, section 10): queueing only ever adds delay. Its
offset is off by at most ``δ / 2`` (all of the round trip on one side), so a hop is
reported with ``error_s``, the sum of that bound for both its ends (0 for the host).

The hop of ``A -> B`` on the host's clock is then ``(t_B - θ_B) - (t_A - θ_A)``.

A worker's own two stamps of one lap, the frame had from the stage before and the lap's
frame handed to the next, are both on its clock: their difference is how long the lap
was at that worker (its stage, and any wait for it), with no offset and no bound
(:class:`StageTimed`).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Mapping, Optional

from planner.fastdc import frozen

#: heartbeat exchanges kept per peer; the least-delay one gives the offset (RFC 5905 section 10 keeps 8)
CLOCK_SAMPLES = 8
#: one end's stamp kept at most this many laps while the other end's has not come
MAX_PENDING = 512


@frozen
class HopTimed:
    """One measured hop: the frame of lap ``lap_id`` from ``src`` to ``dst`` took
    ``seconds``, within ``error_s`` (the clock offsets' bound, module doc)."""

    src: str
    dst: str
    lap_id: int
    seconds: float
    error_s: float


@frozen
class StageTimed:
    """Lap ``lap_id`` was at worker ``device`` for ``seconds``: from the device having the
    lap's frame (whole, decoded, checked) until it handed the lap's frame on, both stamps
    on its own clock (its stage run and any wait for it; no clock offset involved)."""

    device: str
    lap_id: int
    seconds: float


def exchange(t1_s: float, t2_s: float, t3_s: float, t4_s: float) -> tuple[float, float]:
    """NTP's on-wire offset and delay of one exchange (module doc), seconds.

    Args:
        t1_s: the receiver sent its heartbeat (receiver's clock).
        t2_s: the sender heard it (sender's clock).
        t3_s: the sender sent its own (sender's clock).
        t4_s: the receiver heard that (receiver's clock).
    Returns:
        ``(offset_s, delay_s)``: the sender's clock minus the receiver's, and the round
        trip without the time the sender held the first heartbeat.
    """
    return ((t2_s - t1_s) + (t3_s - t4_s)) / 2, (t4_s - t1_s) - (t3_s - t2_s)


class PeerClock:
    """A peer's clock offset from this device's, from the last :data:`CLOCK_SAMPLES`
    heartbeat exchanges (module doc)."""

    def __init__(self, samples: int = CLOCK_SAMPLES):
        self._samples: deque[tuple[float, float]] = deque(maxlen=samples)

    def heard(self, sent_s: float, echo_s: float, held_s: float, now_s: float) -> bool:
        """A heartbeat sent at ``sent_s`` (peer's clock) echoing this device's heartbeat
        sent at ``echo_s`` (this clock), held ``held_s`` by the peer, arrived at
        ``now_s`` (this clock). Returns False (and keeps nothing) for an exchange that
        cannot be one: a value not finite, ``held_s`` negative, an echo from the future
        or a negative delay."""
        if not all(math.isfinite(v) for v in (sent_s, echo_s, held_s, now_s)) or held_s < 0 or echo_s > now_s:
            return False
        offset, delay = exchange(echo_s, sent_s - held_s, sent_s, now_s)
        if delay < 0:
            return False
        self._samples.append((delay, offset))
        return True

    def best(self) -> Optional[tuple[float, float]]:
        """``(offset_s, error_s)`` of the least-delay exchange kept (error: half its
        delay), or None before any."""
        if not self._samples:
            return None
        delay, offset = min(self._samples)
        return offset, delay / 2


class HopMeter:
    """The model host's hop times per link (module doc), fed with every device's stamps.

    Args:
        host: the model host's id (its offset is 0 by definition).
        clocks: device -> its :class:`PeerClock` on the host (the meter reads them when
            it pairs two stamps; a device without one yet cannot be paired).
        max_pending: stamps waiting for their other end, at most (the oldest dropped).
    """

    def __init__(self, host: str, clocks: dict[str, PeerClock], max_pending: int = MAX_PENDING):
        self.host = host
        self.clocks = clocks
        self.max_pending = max_pending
        self._sent: OrderedDict[tuple[int, str, str], float] = OrderedDict()
        self._arrived: OrderedDict[tuple[int, str, str], float] = OrderedDict()
        #: stamps that could not be paired: the other end's clock offset was not known yet
        self.unclocked = 0
        self._held: OrderedDict[tuple[int, str], float] = OrderedDict()  # (lap, worker) -> it had the frame
        self._timed: OrderedDict[tuple[int, str], None] = OrderedDict()  # (lap, worker) already timed
        #: the latest :class:`StageTimed` not yet taken (:meth:`take_stages`), at most ``max_pending``
        self.stages: deque[StageTimed] = deque(maxlen=max_pending)

    def _offset(self, device: str) -> Optional[tuple[float, float]]:
        if device == self.host:
            return 0.0, 0.0
        clock = self.clocks.get(device)
        return clock.best() if clock is not None else None

    def _stamp(self, mine: OrderedDict, other: OrderedDict, key: tuple[int, str, str], t: float) -> Optional[HopTimed]:
        if key in other:
            t_other = other.pop(key)
            lap, src, dst = key
            t_sent, t_arrived = (t_other, t) if mine is self._arrived else (t, t_other)
            a, b = self._offset(src), self._offset(dst)
            if a is None or b is None:
                self.unclocked += 1
                return None
            return HopTimed(src, dst, lap, (t_arrived - b[0]) - (t_sent - a[0]), a[1] + b[1])
        if key not in mine:  # a second stamp for the same hop (a resent lap): the first counts
            mine[key] = t
            while len(mine) > self.max_pending:
                mine.popitem(last=False)
        return None

    def _keep(self, d: OrderedDict, key, value) -> None:
        d[key] = value
        while len(d) > self.max_pending:
            d.popitem(last=False)

    def sent(self, src: str, dst: str, lap_id: int, t_s: float) -> Optional[HopTimed]:
        """``src`` sent lap ``lap_id``'s frame to ``dst`` at ``t_s`` (src's clock): the
        hop, when ``dst``'s arrival stamp came first, else None. A worker's send after its
        own arrival stamp of the lap also times the lap at it (:attr:`stages`)."""
        key = (lap_id, src)
        if key in self._held:
            t_in = self._held.pop(key)
            if t_s >= t_in:
                self.stages.append(StageTimed(src, lap_id, t_s - t_in))
                self._keep(self._timed, key, None)
        return self._stamp(self._sent, self._arrived, (lap_id, src, dst), t_s)

    def arrived(self, src: str, dst: str, lap_id: int, t_s: float) -> Optional[HopTimed]:
        """``dst`` had lap ``lap_id``'s frame from ``src`` at ``t_s`` (dst's clock): the
        hop, when ``src``'s send stamp came first, else None. Only a worker's first
        arrival of a lap starts its stage time (a returning frame it passes back does not)."""
        key = (lap_id, dst)
        if dst != self.host and key not in self._held and key not in self._timed:
            self._keep(self._held, key, t_s)
        return self._stamp(self._arrived, self._sent, (lap_id, src, dst), t_s)

    def take_stages(self) -> list[StageTimed]:
        """The :class:`StageTimed` measured since the last call, oldest first."""
        out = list(self.stages)
        self.stages.clear()
        return out

    @property
    def pending(self) -> int:
        """Stamps waiting for their other end."""
        return len(self._sent) + len(self._arrived)


#: one-position laps each device's measured seconds per layer is the mean of (the room
#: page's ``layer_ms`` keeps as many: runtime/serve/page.py)
SPEED_LAPS_KEPT = 32


@frozen
class Measured:
    """What a room measured of itself, for :func:`planner.chain.rejoin_rule`'s choice.

    ``s_per_layer``: device -> seconds per layer of one position (the mean of its latest
    :data:`SPEED_LAPS_KEPT` one-position laps over the layers it held then); a device
    missing here was never timed in this room. ``head_s``: the model host's output head
    on one row, seconds (None: not timed). ``hop_s``: ``(src, dst)`` -> seconds of one
    position's frame on that link (the mean of its latest hops); a link missing here was
    not timed."""

    s_per_layer: dict
    head_s: Optional[float] = None
    hop_s: Optional[dict] = None


class StageSpeeds:
    """Each device's measured speed in a running room, sans-IO (no clock: every time is
    given): the seconds a one-position lap (a decode step) spent at each device, over the
    layers that device held for that lap, and the model host's head and each link's hop
    for such laps.

    Fed by the room's router and its driver (planner/chain.py's :class:`Chain` tells it
    each lap the host begins; the driver gives it what it timed):

    * :meth:`lap`: the model host began lap ``lap_id`` of ``positions`` positions, with
      the chain holding ``layers`` (device -> its layer count);
    * :meth:`timed`: a :class:`StageTimed` (a worker's own two stamps of a lap; the model
      host's RunStage compute is given as one too, :meth:`computed`);
    * :meth:`computed`: a :class:`planner.protocol.Computed` record of the model host
      (RunStage: its stage; RunHead: its head);
    * :meth:`hop`: a :class:`HopTimed`.

    Only laps of one position count (every lap of a decode step is alike; a prefill chunk
    or a verify lap is not); a time for a lap it was not told of, or for a device that
    held no layers in it, is dropped. Bounded: :data:`SPEED_LAPS_KEPT` times per device
    and link, ``laps_kept`` laps remembered."""

    def __init__(self, keep: int = SPEED_LAPS_KEPT, laps_kept: int = MAX_PENDING):
        self.keep = keep
        self.laps_kept = laps_kept
        self._laps: OrderedDict[int, Mapping[str, int]] = OrderedDict()  # one-position lap -> layers held
        self._stage: dict[str, deque] = {}  # device -> seconds per layer of its latest one-position laps
        self._head: deque = deque(maxlen=keep)
        self._hops: dict[tuple[str, str], deque] = {}

    def lap(self, lap_id: int, positions: int, layers: Mapping[str, int]) -> None:
        """The model host began lap ``lap_id`` of ``positions`` positions; ``layers``:
        device -> layers it holds for this lap (the mapping is kept, not copied)."""
        if positions != 1:
            return
        self._laps[lap_id] = layers
        while len(self._laps) > self.laps_kept:
            self._laps.popitem(last=False)

    def timed(self, st: StageTimed) -> None:
        """Lap ``st.lap_id`` was ``st.seconds`` at ``st.device`` (module doc)."""
        layers = self._laps.get(st.lap_id)
        n = layers.get(st.device, 0) if layers is not None else 0
        if n > 0 and math.isfinite(st.seconds) and st.seconds >= 0:
            self._stage.setdefault(st.device, deque(maxlen=self.keep)).append(st.seconds / n)

    def computed(self, rec) -> None:
        """A :class:`planner.protocol.Computed` record of the model host: a RunStage of a
        one-position lap times its stage (as :meth:`timed`), a RunHead its head."""
        if rec.command == "RunStage":
            self.timed(StageTimed(rec.device, rec.ref, rec.seconds))
        elif rec.command == "RunHead" and rec.ref in self._laps and math.isfinite(rec.seconds):
            self._head.append(rec.seconds)

    def hop(self, ht: HopTimed) -> None:
        """A hop of a one-position lap counts for its link."""
        if ht.lap_id in self._laps and math.isfinite(ht.seconds):
            self._hops.setdefault((ht.src, ht.dst), deque(maxlen=self.keep)).append(ht.seconds)

    def measured(self) -> Measured:
        """The means so far (:class:`Measured`)."""
        return Measured({d: sum(v) / len(v) for d, v in self._stage.items() if v},
                        sum(self._head) / len(self._head) if self._head else None,
                        {k: sum(v) / len(v) for k, v in self._hops.items() if v})
