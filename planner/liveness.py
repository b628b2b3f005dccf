"""Who in the room is still there: heartbeat timers as a sans-IO machine.

A device sends every peer a heartbeat every ``beat_s`` seconds and counts a peer lost
when nothing was heard from it for more than ``timeout_s`` after it was first heard.
Re-deals make silence expected for a while, so three things spare a silent peer: this
device loading a re-dealt range itself (:attr:`Liveness.loading`), the grace window
after a re-deal began (``grace_s``), and, for ``load_timeout_s`` after it began, the
devices still loading their new ranges (``spared`` in :meth:`Liveness.handle_timer`).

A re-deal opened with ``answers=True`` (the model host's) spares only the peers that
answered it (:meth:`Liveness.answered`: the device took the re-deal and loads its range
now). A peer that has not answered is held to the plain heartbeat rule while the windows
are open, so a second device that died just before or during a re-deal is lost one
timeout after it was last heard, and its loss folds into the re-deal under way, instead
of waiting out the windows. Answers are kept while a re-deal's windows are open (a
device loading for the first re-deal is still spared by a second one) and forgotten when
a re-deal begins after they closed.

A peer that has loaded its re-dealt range (:meth:`Liveness.loaded`: it said Ready) is
past the silence a re-deal explains: on a re-deal that wants answers it is held to the
plain heartbeat rule again, windows or not, so a device that took the re-deal, loaded,
and then died is lost one timeout after it was last heard (rule :data:`READY`) instead
of at the grace window's end. A new re-deal makes it load again: its Ready is forgotten
then (its answer is kept, as above).

A peer that answered and is still loading is not silent either: it loads in a thread
of its own and keeps sending its heartbeats meanwhile. So on a re-deal that wants
answers a peer that answered is spared only as long as it is heard: silent for more than
``loading_silent_s`` (:data:`LOADING_SILENT_TIMEOUTS` heartbeat timeouts by default) it
is lost (rule :data:`LOADING_SILENT`), windows or not. One silent past the timeout (but
not that long) when the load window closes is lost then (rule :data:`LOADING`); one
still heard is waited for (its Ready ends the re-deal).

A copy that progresses is no stuck device: a peer still loading that reports its copy
advanced (:meth:`Liveness.progressed`: a new percent of its re-dealt layers arrived) is
spared past the load window for as long as the copy goes on, on a loaded machine whose
heartbeats come late as much as on a slow link. Silent past the timeout once the window
closed, it is lost only when its copy made no progress for ``stall_s``
(:data:`STALL_TIMEOUTS` heartbeat timeouts by default; rule :data:`STALLED`) or it has
been silent for more than ``loading_silent_s`` (rule :data:`LOADING_SILENT`). So the
slowest copy spared is one percent of its bytes per ``stall_s``; one that stops is lost
``stall_s`` after its last percent.

Each loss names the rule that fired (:data:`SILENT`, :data:`UNANSWERED`, :data:`READY`,
:data:`LOADING_SILENT`, :data:`LOADING`, :data:`STALLED`).

A lost peer may come back (a device whose Wi-Fi dropped for a few seconds): when it says
hello again (:meth:`Liveness.returned`) it gets heartbeats again, and once it has been
heard without a gap past the timeout for the rejoin hold (:func:`rejoin_hold_s`: longer
after each drop in the last :data:`FLAP_WINDOW_S`, so a flapping link does not make the
room re-deal again and again) :meth:`Liveness.handle_timer` names it in ``Tick.back`` and
it counts as present again, its silence timed from then (a driver feeds
:class:`planner.protocol.DeviceBack`). One that falls silent again during the hold counts
as another drop and must say hello again.

The timers follow aioquic's connection API: the driver asks :meth:`Liveness.next_deadline_s`
when to call next, and calls :meth:`Liveness.handle_timer` at that time with the time;
nothing here reads a clock. Times are seconds on one monotonic clock the driver chooses.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from planner.room import HOST_WAIT_S


#: the plain heartbeat rule: silent for more than ``timeout_s``, no re-deal window sparing it
SILENT = "silent"
#: silent for more than ``timeout_s`` while a re-deal is under way that it never answered
UNANSWERED = "unanswered"
#: still loading its re-dealt range (``spared``) when the load window closed
LOADING = "loading"
#: silent for more than ``timeout_s`` after it had loaded its range for the re-deal under way
READY = "ready"
#: answered the re-deal under way, then silent for more than ``loading_silent_s`` while loading
LOADING_SILENT = "loading_silent"
#: still loading past the load window, spared by its copy's progress, then silent past the
#: timeout with no progress for ``stall_s``
STALLED = "stalled"

#: heartbeat timeouts of silence after which a peer still loading its re-dealt range is
#: lost: its heartbeats go on while it loads (the load runs in a thread of its own), so
#: only a device that died is silent that long; several timeouts, not one, because a load
#: competes for the device's cores with its event loop (chosen, not measured: 4 s at the
#: 1 s timeout of ``run --real``, where the load window would wait 30 s)
LOADING_SILENT_TIMEOUTS = 4.0

#: heartbeat timeouts without a new percent of its copy after which a peer spared past the
#: load window by that copy's progress is lost (when silent past the timeout too): the
#: worker reports each whole percent, so this is the slowest copy spared, one percent per
#: ten timeouts (chosen, not measured: 10 s at the 1 s timeout of ``run --real``; a
#: 141.6 MB copy then needs 0.14 MB/s, where 4.6 MB/s was seen on a loaded machine)
STALL_TIMEOUTS = 10.0

#: seconds a lost peer that said hello again must be heard without a gap before it
#: counts as back, after its first drop: two heartbeat timeouts of the room's 1 s (a
#: device that answers steadily for that long is taken to be back; chosen, not measured)
REJOIN_HOLD_S = 2.0
#: the longest rejoin hold, seconds, however often the peer dropped (chosen: a device
#: flapping all day still rejoins every few minutes)
REJOIN_HOLD_MAX_S = 120.0
#: seconds over which a peer's drops are counted for the hold (chosen: ten minutes)
FLAP_WINDOW_S = 600.0


def rejoin_hold_s(drops_s: Iterable[float], now_s: float, base_s: float = REJOIN_HOLD_S,
                  max_s: float = REJOIN_HOLD_MAX_S, window_s: float = FLAP_WINDOW_S) -> float:
    """How long a lost peer must be heard steadily before it counts as back, seconds:
    ``base_s * 2 ** (n - 1)`` for its ``n`` drops (times in ``drops_s``) in the last
    ``window_s`` before ``now_s`` (``base_s`` for n <= 1), at most ``max_s`` (exponential
    back-off, as TCP's retransmission timer doubles, RFC 6298 section 5.5)."""
    n = sum(1 for t in drops_s if now_s - window_s <= t <= now_s)
    return min(max_s, base_s * 2.0 ** max(n - 1, 0))


@dataclass(frozen=True)
class Tick:
    """What :meth:`Liveness.handle_timer` found: ``lost`` the ``(peer, silent for s, rule)``
    newly past the timeout (``rule``: :data:`SILENT`, :data:`UNANSWERED`, :data:`READY`,
    :data:`LOADING_SILENT`, :data:`LOADING` or :data:`STALLED`), ``beat`` the peers to
    send a heartbeat to now (those coming back included), ``back`` the lost peers that
    have now been heard for their rejoin hold."""

    lost: tuple[tuple[str, float, str], ...]
    beat: tuple[str, ...]
    back: tuple[str, ...] = ()


class Liveness:
    """Heartbeat bookkeeping of one device (module doc).

    Args:
        peers: the devices this one talks to.
        beat_s: seconds between heartbeats (> 0; 0 or less: no timers at all).
        timeout_s: silence after which a peer that was heard is lost (0 or less: never).
        grace_s: after :meth:`replanned`, seconds during which no peer is lost by silence.
        load_timeout_s: after :meth:`replanned`, seconds during which the peers named
            ``spared`` (still loading a re-dealt range) are not lost by silence.
        now_s: the time the timers start.
        loading_silent_s: on a re-deal that wants answers, seconds of silence after which
            a peer that answered and is still loading is lost (rule :data:`LOADING_SILENT`);
            default :data:`LOADING_SILENT_TIMEOUTS` times ``timeout_s``.
        stall_s: seconds without progress (:meth:`progressed`) after which a peer spared
            past the load window by its copy's progress is lost by silence (rule
            :data:`STALLED`); default :data:`STALL_TIMEOUTS` times ``timeout_s``.
    """

    def __init__(self, peers: Iterable[str], beat_s: float, timeout_s: float, grace_s: float,
                 load_timeout_s: float, now_s: float = 0.0, loading_silent_s: float | None = None,
                 stall_s: float | None = None):
        self.peers = tuple(peers)
        self.beat_s = beat_s
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.load_timeout_s = load_timeout_s
        self.loading_silent_s = LOADING_SILENT_TIMEOUTS * timeout_s if loading_silent_s is None else loading_silent_s
        self.stall_s = STALL_TIMEOUTS * timeout_s if stall_s is None else stall_s
        self.last_heard: dict[str, float] = {}  # peer -> when it was last heard
        self.progress: dict[str, tuple[int, float]] = {}  # peer -> (its copy's last percent, when it changed)
        self.lost: set[str] = set()
        self.loading = False  # this device loads a re-dealt range: no peer is lost by silence
        self.grace_until = -float("inf")
        self.quiet_until = -float("inf")
        self.wants_answers = False  # the latest re-deal spares only the peers that answered it
        self.answered_peers: set[str] = set()  # peers that answered a re-deal whose windows are open
        self.loaded_peers: set[str] = set()  # peers that loaded their range for the latest re-deal
        self.back_since: dict[str, float] = {}  # lost peer that said hello again -> since when
        self.drops: dict[str, list[float]] = {}  # peer -> when it was lost, each time
        self._next = now_s + beat_s if beat_s > 0 else None

    def start(self, now_s: float) -> None:
        """Start the timers at ``now_s``: the first heartbeat is ``beat_s`` later."""
        if self.beat_s > 0:
            self._next = now_s + self.beat_s

    def heard(self, peer: str, now_s: float) -> None:
        """A message from ``peer`` arrived at ``now_s``."""
        self.last_heard[peer] = now_s

    def refresh(self, peer: str, now_s: float) -> None:
        """Count ``peer``'s silence again from ``now_s`` (when it was heard at all)."""
        if peer in self.last_heard:
            self.last_heard[peer] = now_s

    def refresh_all(self, now_s: float) -> None:
        """Count every heard peer's silence again from ``now_s`` (this device was busy
        loading: what it did not hear meanwhile says nothing)."""
        for p in self.last_heard:
            self.last_heard[p] = now_s

    def replanned(self, now_s: float, answers: bool = False) -> None:
        """A re-deal began at ``now_s``: open the grace and load windows. ``answers``: they
        spare only the peers that answer the re-deal (:meth:`answered`); the others are
        held to the plain heartbeat rule meanwhile (module doc). The copies' progress said
        before (:meth:`progressed`) is forgotten: it counts again from each next percent."""
        if now_s >= self.grace_until and now_s >= self.quiet_until:  # the earlier windows closed
            self.answered_peers.clear()
        self.loaded_peers.clear()  # every device of the new chain loads (or checks) its range again
        self.progress.clear()  # a copy progresses for the re-deal under way from its next percent on
        self.grace_until = now_s + self.grace_s
        self.quiet_until = now_s + self.load_timeout_s
        self.wants_answers = answers

    def progressed(self, peer: str, percent: int, now_s: float) -> None:
        """``peer`` says at ``now_s`` that ``percent`` of its re-dealt layers' copy has
        arrived. A percent other than the last it said is progress (a lower one: a new
        copy began): while it progresses it is spared past the load window (module doc).
        The same percent again is no progress."""
        last = self.progress.get(peer)
        if last is None or last[0] != percent:
            self.progress[peer] = (percent, now_s)

    def answered(self, peer: str) -> None:
        """``peer`` took the re-deal under way (it loads its range now): the windows spare it."""
        self.answered_peers.add(peer)

    def loaded(self, peer: str) -> None:
        """``peer`` holds its range for the re-deal under way (it said Ready): on a re-deal
        that wants answers it is held to the plain heartbeat rule again (rule :data:`READY`)."""
        self.answered_peers.add(peer)
        self.loaded_peers.add(peer)

    def forget(self, peer: str, now_s: float | None = None) -> None:
        """``peer`` is lost (at ``now_s``, counted as a drop for :func:`rejoin_hold_s`
        when given): no more heartbeats to it, no second loss, until it comes back
        (:meth:`returned`)."""
        if peer in self.lost:
            return
        self.lost.add(peer)
        self.back_since.pop(peer, None)
        self.progress.pop(peer, None)
        if now_s is not None:
            self.drops.setdefault(peer, []).append(now_s)
            self.drops[peer] = [t for t in self.drops[peer] if t >= now_s - FLAP_WINDOW_S]  # bounded

    def returned(self, peer: str, now_s: float) -> None:
        """``peer``, lost, said hello again at ``now_s``: it gets heartbeats again, and
        counts as back once heard without a gap past the timeout for its rejoin hold
        (``Tick.back``). Nothing for a peer that is not lost, or already coming back."""
        if peer not in self.lost or peer in self.back_since:
            return
        self.back_since[peer] = now_s
        self.last_heard[peer] = now_s

    def coming_back(self, peer: str) -> bool:
        """True while ``peer`` is lost but said hello again (:meth:`returned`)."""
        return peer in self.back_since

    def revive(self, peer: str, now_s: float) -> None:
        """Count ``peer`` as present again now (the model host took it back into the
        chain, or it is the host heard again): its silence is timed from ``now_s``."""
        self.lost.discard(peer)
        self.back_since.pop(peer, None)
        self.last_heard[peer] = now_s

    def next_deadline_s(self) -> float | None:
        """When :meth:`handle_timer` wants to be called next (None: never)."""
        return self._next

    def handle_timer(self, now_s: float, spared: Collection[str] = ()) -> Tick:
        """The heartbeat timer fired at ``now_s``: which peers are lost by silence, and
        which get a heartbeat now (every other peer not lost). ``spared``: peers still
        loading a re-dealt range, not lost by silence until ``load_timeout_s`` after the
        re-deal began (when the re-deal wants answers: only those that answered, and only
        while heard within ``loading_silent_s``). The next deadline is ``beat_s`` from
        ``now_s``. Past the load window, a peer in ``spared`` whose copy progressed
        within ``stall_s`` is still spared, unless silent for more than
        ``loading_silent_s`` (module doc)."""
        if self._next is not None:
            self._next = now_s + self.beat_s
        in_grace = now_s < self.grace_until
        in_load = now_s < self.quiet_until
        may_lose = self.timeout_s > 0 and not self.loading
        lost, beat, back = [], [], []
        for p in self.peers:
            if p in self.lost:
                since = self.back_since.get(p)
                if since is None:
                    continue
                if self.timeout_s > 0 and now_s - self.last_heard[p] > self.timeout_s:
                    del self.back_since[p]  # silent again before it was back: another drop
                    self.drops.setdefault(p, []).append(now_s)
                    continue
                if now_s - since >= rejoin_hold_s(self.drops.get(p, ()), now_s):
                    self.lost.discard(p)
                    del self.back_since[p]
                    back.append(p)
                beat.append(p)
                continue
            seen = self.last_heard.get(p)
            if may_lose and seen is not None and now_s - seen > self.timeout_s:
                rule = self._rule(p, spared, in_grace, in_load, now_s - seen, now_s)
                if rule is not None:
                    lost.append((p, now_s - seen, rule))
                    continue
            beat.append(p)
        return Tick(tuple(lost), tuple(beat), tuple(back))

    def _rule(self, peer: str, spared: Collection[str], in_grace: bool, in_load: bool,
              silent_s: float, now_s: float) -> str | None:
        """The rule that loses ``peer``, silent ``silent_s`` seconds at ``now_s``, past
        the timeout (None: a window, or its copy's progress, spares it)."""
        held = self.wants_answers and (in_grace or in_load)  # a re-deal that wants answers is under way
        if held and peer not in self.answered_peers:
            return UNANSWERED
        if held and peer in self.loaded_peers:
            return READY
        if held and silent_s > self.loading_silent_s:
            return LOADING_SILENT
        if in_grace or (in_load and peer in spared):
            return None
        if peer not in spared:
            return SILENT
        last = self.progress.get(peer)
        if last is None:
            return LOADING
        if silent_s > self.loading_silent_s:
            return LOADING_SILENT
        return None if now_s - last[1] <= self.stall_s else STALLED


def stall_loss(start_s: float, end_s: float, delay_s: Callable[[float], float], beat_s: float,
               timeout_s: float) -> tuple[float, float] | None:
    """When the heartbeat rule (:class:`Liveness`, no re-deal under way) loses a peer
    whose link stalls over ``[start_s, end_s)``: ``(lost at, last heard at)`` in seconds,
    or None when the stall never makes it silent past ``timeout_s``.

    ``delay_s(t)``: seconds a message the peer sends at ``t`` takes to arrive (longer
    inside the stall). The peer's heartbeats go every ``beat_s`` from ``start_s - beat_s``
    (one just before the stall) on an ordered channel (one never overtakes an earlier
    one); this device's timer ticks every ``beat_s`` half a beat after them (the two
    processes' phases are not known: half a beat is the mean). Only the stall is
    followed: the last tick is one beat after the last message sent in it arrived.
    Raises ValueError for ``beat_s <= 0`` or ``end_s < start_s``."""
    if beat_s <= 0 or end_s < start_s:
        raise ValueError(f"beat_s must be > 0 and end_s >= start_s, got {beat_s}, [{start_s}, {end_s})")
    # A loss, if any, comes at the first tick past the last heartbeat heard before the
    # stall plus the timeout: a stall adds one extra delay to every message sent in it, so
    # once the first of those arrives they arrive a beat apart again. Following that many
    # beats (and counting them, so that times too large to add a beat to still end) is
    # enough, however long the stall.
    beats = math.ceil(timeout_s / beat_s) + 4
    sends = [start_s - beat_s]
    for j in range(beats + 2):
        sends.append(start_s + beat_s * j)
        if sends[-1] >= end_s:
            break
    arrivals, latest = [], -math.inf
    for t in sends:
        latest = max(latest, t + delay_s(t))
        arrivals.append(latest)
    live = Liveness(("peer",), beat_s, timeout_s, 0.0, 0.0, now_s=sends[0])
    i = 0
    for k in range(beats + 2):
        tick = sends[0] + beat_s / 2 + beat_s * k
        if tick > arrivals[-1] + beat_s:
            break
        while i < len(arrivals) and arrivals[i] <= tick:
            live.heard("peer", arrivals[i])
            i += 1
        lost = live.handle_timer(tick).lost
        if lost:
            return tick, live.last_heard["peer"]
    return None


def rejoin_time(lost_s: float, delay_s: Callable[[float], float], beat_s: float, timeout_s: float,
                drops_s: Iterable[float] = (), horizon_s: float = REJOIN_HOLD_MAX_S + 60.0,
                wait_s: float = HOST_WAIT_S) -> float | None:
    """When the model host takes back a peer it lost at ``lost_s`` (:meth:`Liveness.returned`
    then ``Tick.back``), seconds, or None when that does not happen within ``horizon_s``.

    The peer, having lost the host at the same time (the same rule over the same stall),
    says hello every ``beat_s`` from ``lost_s`` on; ``delay_s(t)``: seconds a message it
    sends at ``t`` takes to arrive, on an ordered channel. The host's timer ticks half a
    beat after the hellos (as in :func:`stall_loss`); every hello heard says it is back
    (a no-op while it is already coming back), so one that falls silent during the hold
    is another drop and comes back with its next hello. ``drops_s``: the times it was
    lost before, ``lost_s`` excluded (:func:`rejoin_hold_s`). ``wait_s``: the peer, having
    lost the host, waits that long for it (``host_wait_s``, the runtime's "Host
    reconnecting"): when no hello of its has been heard by ``lost_s + wait_s`` it has
    left the room and does not come back (None). Raises ValueError for ``beat_s <= 0``."""
    if beat_s <= 0:
        raise ValueError(f"beat_s must be > 0, got {beat_s}")
    live = Liveness(("peer",), beat_s, timeout_s, 0.0, 0.0, now_s=lost_s)
    live.drops["peer"] = [t for t in drops_s if t < lost_s]
    live.forget("peer", lost_s)
    latest = -math.inf
    beats = math.ceil(horizon_s / beat_s) + 1
    send = 0  # hellos sent so far
    for k in range(beats):
        tick = lost_s + beat_s / 2 + beat_s * k
        while send <= k:  # the hellos sent before this tick, in order
            t = lost_s + beat_s * send
            latest = max(latest, t + delay_s(t))
            arrivals_due = latest
            if arrivals_due > tick:
                break
            if send == 0 and arrivals_due > lost_s + wait_s:
                return None  # its first hello came after its wait for the host: it left the room
            live.returned("peer", arrivals_due)
            live.heard("peer", arrivals_due)
            send += 1
        if live.handle_timer(tick).back:
            return tick
    return None
