"""Correlated stall episodes: tails that come in bursts, as they do on home networks.

An :class:`planner.room.Episodes` spec ``{every_s, lasting_s, extra_rtt_s}`` says: once
every ``every_s`` seconds the link stalls for ``lasting_s`` seconds, and during a stall
every message's round trip is ``extra_rtt_s`` longer (a one-way message pays half).
Independent per-message jitter cannot produce this: with episodes, consecutive
messages inside one stall are *all* slow, so whole laps and runs of tokens slow down
together, which is what moves p99 inter-token latency.

Timeline. Episode ``n = 0, 1, 2, ...`` owns the window
``[phase + (n-1)*every_s, phase + n*every_s)`` and stalls during
``[start_n, start_n + lasting_s)`` with ``start_n = window start + offset_n``:

* ``phase`` is drawn once, uniform in ``[0, every_s)``, from the injected generator,
  so different links (and different seeds) do not stall in lock-step and a run of
  ``T`` seconds sees a stall fraction near ``lasting_s/every_s`` whatever ``T`` is.
* ``offset_n`` is 0 by default (strictly periodic). With ``start_jitter`` ``f`` in
  ``[0, 1]``, ``offset_n`` is drawn uniform in ``[0, f * (every_s - lasting_s)]``, so
  starts wander but a stall never leaves its window and two stalls never overlap;
  the long-run stall fraction stays ``lasting_s/every_s``. Offsets are drawn in
  episode order (lazily, as later times are asked about), so the answers do not
  depend on the order of the queries.
* ``lasting_s >= every_s`` means always stalled.

Nothing reads a clock: times are passed in (seconds since the start of the run,
``t >= 0``).
"""

from __future__ import annotations

import math

import numpy as np

from planner.room import Episodes

__all__ = ["EpisodeClock"]


class EpisodeClock:
    """When a link is stalled, and by how much.

    Args:
        episodes: the spec, or ``None`` for a link that never stalls.
        rng: seeded generator for the phase (one draw at construction) and, with
            ``start_jitter > 0``, one draw per episode.
        start_jitter: fraction in ``[0, 1]`` of the free time ``every_s - lasting_s``
            over which each episode's start may wander (0: strictly periodic).

    Raises:
        ValueError: ``every_s <= 0``, ``lasting_s < 0``, ``extra_rtt_s < 0``, a
            non-finite value, or ``start_jitter`` outside ``[0, 1]``.
    """

    __slots__ = ("episodes", "phase_s", "_every", "_lasting", "_extra", "_slack", "_offsets", "_rng", "_always", "_never")

    def __init__(self, episodes: Episodes | None, rng: np.random.Generator, *, start_jitter: float = 0.0) -> None:
        self.episodes = episodes
        self._offsets: list[float] = []
        self._rng = rng
        if not 0.0 <= start_jitter <= 1.0:
            raise ValueError(f"start_jitter must be in [0, 1], got {start_jitter}")
        if episodes is None:
            self._never, self._always = True, False
            self._every = self._lasting = self._extra = self._slack = self.phase_s = 0.0
            return
        every, lasting, extra = float(episodes.every_s), float(episodes.lasting_s), float(episodes.extra_rtt_s)
        if not all(math.isfinite(v) for v in (every, lasting, extra)):
            raise ValueError(f"episodes must be finite, got {episodes}")
        if every <= 0:
            raise ValueError(f"episodes.every must be > 0, got {every}")
        if lasting < 0 or extra < 0:
            raise ValueError(f"episodes.lasting and extra_rtt must be >= 0, got {episodes}")
        self._every, self._lasting, self._extra = every, lasting, extra
        self._never = lasting == 0.0 or extra == 0.0
        self._always = (not self._never) and lasting >= every
        self._slack = start_jitter * max(every - lasting, 0.0)
        self.phase_s = float(rng.uniform(0.0, every))

    @property
    def stall_fraction(self) -> float:
        """Long-run fraction of time stalled: ``min(1, lasting_s/every_s)`` (0 when
        it never stalls)."""
        if self._never:
            return 0.0
        return min(1.0, self._lasting / self._every)

    def _offset(self, n: int) -> float:
        offs = self._offsets
        if self._slack == 0.0:
            return 0.0
        while len(offs) <= n:
            offs.extend(self._rng.uniform(0.0, self._slack, 256).tolist())
        return offs[n]

    def window(self, t_s: float) -> tuple[float, float] | None:
        """The stall ``(start_s, end_s)`` that contains time ``t_s``, or ``None``.

        For an always-stalled link this is ``(0.0, inf)``.
        Raises ValueError for ``t_s < 0``.
        """
        if t_s < 0:
            raise ValueError(f"time must be >= 0, got {t_s}")
        if self._never:
            return None
        if self._always:
            return (0.0, math.inf)
        every = self._every
        n = int((t_s - self.phase_s + every) // every)
        start = self.phase_s + (n - 1) * every + self._offset(n)
        if start <= t_s < start + self._lasting:
            return (start, start + self._lasting)
        return None

    def next_window(self, t_s: float) -> tuple[float, float] | None:
        """The first stall ``(start_s, end_s)`` that starts at or after ``t_s``
        (seconds, ``>= 0``), or ``None`` for a link that never stalls or is always
        stalled (its delay never changes, so it never falls silent). Raises ValueError
        for ``t_s < 0``."""
        if t_s < 0:
            raise ValueError(f"time must be >= 0, got {t_s}")
        if self._never or self._always:
            return None
        every = self._every
        n = int((t_s - self.phase_s + every) // every)
        while True:
            start = self.phase_s + (n - 1) * every + self._offset(n)
            if start >= t_s:
                return (start, start + self._lasting)
            n += 1

    def stalled(self, t_s: float) -> bool:
        """True when time ``t_s`` (seconds, ``>= 0``) falls inside a stall."""
        return self.window(t_s) is not None

    def extra_rtt_s(self, t_s: float) -> float:
        """Extra round-trip time at time ``t_s``: ``extra_rtt_s`` inside a stall, else
        0.0 (seconds). A one-way message pays half of it. Raises ValueError for
        ``t_s < 0``."""
        if self._never:
            if t_s < 0:
                raise ValueError(f"time must be >= 0, got {t_s}")
            return 0.0
        return self._extra if self.window(t_s) is not None else 0.0
