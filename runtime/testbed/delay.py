"""A link's one-way delay applied in the sending process, for machines without netem.

:class:`DelayLine` holds every packet handed to it for ``one_way_s`` seconds and then
passes it on, in the order it was handed over (a FIFO: every packet waits the same
time, so the one at the head is always the next due and one timer at a time
suffices). :class:`DelayStats` records how late each packet really left against the
time it was due: an event loop that is busy when a packet falls due releases it late,
and the record says by how much, so a room measured with this delay states what the
delay really was.

The clock and the timer are passed in (``clock() -> seconds``, ``call_at(when, fn) ->
handle with cancel()``; an asyncio loop's ``time`` and ``call_at``), so the order,
the due times and the counts can be checked by hand without waiting.

What this delay is, against a kernel qdisc (netem) or the namespaces of
runtime/testbed/netem.py: it is applied by :func:`runtime.transport.emulate_delay` where the
ICE transport sends a datagram, below DTLS and SCTP, so SCTP's congestion window,
retransmission timer and acknowledgements all see the round trip. Held packets are
not yet in the socket, so they do not count against the socket buffer (as with
runtime/testbed/netem.py's delay on arrival). Every pair has the same delay, there is no
jitter and nothing is reordered. A packet waits in the process's memory: at most
``max_held`` at once; more are dropped (counted), as a full router buffer would, and
SCTP resends them.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

__all__ = ["DEFAULT_MAX_HELD", "DelayLine", "DelayStats"]

#: Most packets one line holds at once (as runtime.testbed.netem.QUEUE_MAX_LEN); more are dropped.
DEFAULT_MAX_HELD = 16384
#: Lateness samples kept for the percentiles; later packets are counted in ``packets`` and
#: ``lateness_max_s`` only, so the record's memory is bounded.
MAX_SAMPLES = 65536


class DelayStats:
    """How late the packets of one or more delay lines left, seconds after they were due.

    ``record(lateness_s)`` per packet sent; :meth:`summary` gives ``packets`` (sent),
    ``dropped`` (refused by a full line: what the delay itself lost while the link was up),
    ``cut_at_close`` (held when the line was closed, or handed over after: the link was
    taken down with them in the air, as at the end of every room), ``lateness_p50_s``, ``lateness_p99_s`` (nearest
    rank over the first :data:`MAX_SAMPLES` packets) and ``lateness_max_s`` (over all).
    """

    def __init__(self) -> None:
        self.packets = 0
        self.dropped = 0
        self.cut_at_close = 0
        self.max_s = 0.0
        self._samples: list[float] = []

    def record(self, lateness_s: float) -> None:
        """One packet sent ``lateness_s`` seconds after it was due (negative: counted as 0)."""
        late = max(float(lateness_s), 0.0)
        self.packets += 1
        self.max_s = max(self.max_s, late)
        if len(self._samples) < MAX_SAMPLES:
            self._samples.append(late)

    def summary(self) -> dict[str, float | int | None]:
        """The record as a dict (percentiles None before any packet)."""
        s = sorted(self._samples)

        def rank(p: float) -> float | None:  # nearest rank: the ceil(p * n)-th smallest
            if not s:
                return None
            k = max(1, -(-int(p * 1000) * len(s) // 1000))
            return s[min(k, len(s)) - 1]
        return {"packets": self.packets, "dropped": self.dropped, "cut_at_close": self.cut_at_close,
                "lateness_p50_s": rank(0.5),
                "lateness_p99_s": rank(0.99), "lateness_max_s": self.max_s if self.packets else None}


class DelayLine:
    """Hand each packet to ``deliver(packet, due)`` ``one_way_s`` seconds after
    :meth:`push`, in push order (module doc).

    Args:
        one_way_s: the delay, seconds (> 0, finite).
        deliver: called with the packet and the time it was due (``clock()`` units).
        clock: the current time, seconds.
        call_at: schedules ``fn()`` at a ``clock()`` time; returns a handle with ``cancel()``.
        max_held: most packets held at once; a push beyond it is dropped and counted
            (``stats.dropped``).
        stats: where drops and packets cut at close are counted (a new :class:`DelayStats` when None).

    Raises:
        ValueError: ``one_way_s`` not a positive finite number, ``max_held`` < 1.
    """

    def __init__(self, one_way_s: float, deliver: Callable[[Any, float], None], clock: Callable[[], float],
                 call_at: Callable[[float, Callable[[], None]], Any], max_held: int = DEFAULT_MAX_HELD,
                 stats: DelayStats | None = None):
        if not (isinstance(one_way_s, (int, float)) and 0 < one_way_s < float("inf")):
            raise ValueError(f"one_way_s must be a positive number of seconds, not {one_way_s!r}")
        if max_held < 1:
            raise ValueError(f"max_held must be at least 1, not {max_held!r}")
        self.one_way_s = float(one_way_s)
        self._deliver, self._clock, self._call_at = deliver, clock, call_at
        self.max_held = max_held
        self.stats = stats if stats is not None else DelayStats()
        self._held: deque[tuple[float, Any]] = deque()
        self._timer: Any = None
        self.closed = False

    @property
    def held(self) -> int:
        """Packets waiting now."""
        return len(self._held)

    def push(self, packet: Any) -> bool:
        """Hold ``packet`` until ``clock() + one_way_s``. Returns False when the line is
        full (counted in ``stats.dropped``) or closed (counted in ``stats.cut_at_close``)."""
        if self.closed:
            self.stats.cut_at_close += 1
            return False
        if len(self._held) >= self.max_held:
            self.stats.dropped += 1
            return False
        due = self._clock() + self.one_way_s
        self._held.append((due, packet))
        if self._timer is None:
            self._timer = self._call_at(due, self._fire)
        return True

    def _fire(self) -> None:
        self._timer = None
        now = self._clock()
        while self._held and self._held[0][0] <= now:
            due, packet = self._held.popleft()
            self._deliver(packet, due)
        if self._held and not self.closed:
            self._timer = self._call_at(self._held[0][0], self._fire)

    def flush(self) -> int:
        """Deliver every held packet now, in order (each with its own due time); returns
        how many."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n = 0
        while self._held:
            due, packet = self._held.popleft()
            self._deliver(packet, due)
            n += 1
        return n

    def close(self) -> int:
        """Stop: the held packets are discarded (a link taken down while they were in the
        air; counted in ``stats.cut_at_close``, not as drops) and later pushes refused;
        returns how many were held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n = len(self._held)
        self._held.clear()
        self.stats.cut_at_close += n
        self.closed = True
        return n
