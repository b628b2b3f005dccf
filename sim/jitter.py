"""Per-message delay jitter, drawn the way Linux ``tc netem`` draws it.

The one-way delay of a message on a link is

    delay = rtt/2 + jitter,   clamped so that delay >= 0

where ``jitter`` has mean 0 (before clamping) and a spread set by ``scale_s``. This
is netem's model: ``tc qdisc ... netem delay 10ms 2ms distribution normal`` draws
``latency + sigma * t`` per packet, with ``t`` read from a distribution table that is
normalised to mean 0 and (roughly) unit spread (kernel ``net/sched/sch_netem.c``,
``tabledist()``: ``x / NETEM_DIST_SCALE + (sigma / NETEM_DIST_SCALE) * t + mu``).

Negative draws. A draw may be negative, and a large negative draw would put the
delivery before the send. netem never sends a packet before it was enqueued: its
``time_to_send = now + delay`` lies in the past and the packet leaves at once. We do
the same by clamping: a sampler built with ``base_s = rtt/2`` never returns less than
``-base_s``, so ``base_s + sample() >= 0``. With the default ``base_s = 0`` every
sample is ``>= 0`` (a half-normal for ``normal``). Clamping lifts the mean a little
when ``scale_s`` is not small against ``base_s``; that is what netem does too.

Distributions (``Jitter.distribution``; ``sigma = Jitter.scale_s``):

``none``
    Always 0.
``normal``
    ``sigma * t``, ``t ~ N(0, 1)`` limited to netem's table range (below).
``pareto`` (netem, iproute2 ``netem/pareto.c``)
    The table holds ``(4/3) * (u**(-1/a) - 1.5)`` for ``u`` uniform in (0, 1] with
    ``a = 3``: a Pareto(a, x_m = 1) variable, centred on its mean ``a/(a-1) = 1.5``
    and scaled by 4/3. ``Jitter.shape`` sets ``a`` (default 3, as netem; must be
    > 1); the centring is then ``a/(a-1)`` and the 4/3 factor is kept. Note the
    spread is *not* exactly sigma: for a = 3 the standard deviation of the unclamped
    table is ``(4/3) * sqrt(3/4) = 1.155`` sigma.
``paretonormal`` (netem, iproute2 ``netem/paretonormal.c``)
    "simply .25*normal + .75*pareto" (its header comment), built on the *same*
    uniform draw: table entry ``i`` holds ``(N^-1(u) + 3 * P(u)) / 4`` where
    ``N^-1(u)`` is the standard normal quantile at ``u = i/16384`` and ``P(u)`` the
    pareto value above at tail probability ``1 - u``. So it is a comonotone blend of
    quantile functions (one uniform drives both parts), not a two-component
    mixture: ``t = Z/4 + (3/4) * P``, where ``P`` is computed from the normal
    tail ``1 - Phi(Z)`` of the same ``Z``.
``lognormal`` (not in netem; mean-centred in netem's style)
    ``X = exp(s * Z)`` with log-sigma ``s = Jitter.shape`` (default 1.0, an
    assumption: a moderately heavy right tail), rescaled to standard deviation
    sigma and centred: ``sigma * (X - E[X]) / sd[X]``.
``gamma`` (not in netem; mean-centred)
    ``X ~ Gamma(k, 1)`` with ``k = Jitter.shape`` (default 2.0, an assumption),
    ``sigma * (X - k) / sqrt(k)``: mean 0, standard deviation sigma.
``empirical``
    Resample ``Jitter.samples_s`` uniformly with replacement. The samples are taken
    as measured one-way *extra* delays in seconds and are used as they are (not
    centred, not scaled by ``scale_s``); only the clamp at ``-base_s`` applies.

netem's table range. netem stores each table entry as a signed 16-bit integer in
units of ``1/NETEM_DIST_SCALE = 1/8192`` (iproute2 ``maketable.c``, the
``SHRT_MIN``/``32767`` clamps in ``pareto.c`` and ``paretonormal.c``), so ``t`` never
leaves ``[-4.0, 32767/8192 = 3.99988]``. We apply the same limit to ``normal``,
``pareto`` and ``paretonormal`` so that a simulated netem link has the tail of the
real ``tc netem`` link the runtime tests use: netem's pareto jitter never exceeds
about 4 sigma (about 1.1 % of pareto draws sit at that cap, which moves the
pareto mean to -0.033 sigma). The draws themselves
are exact inverse-CDF draws, not netem's 4096-entry tables.

Speed: random numbers are drawn from the injected ``numpy.random.Generator`` in
blocks of :data:`BLOCK` and handed out as Python floats, so ``sample()`` costs a
list index, not a numpy call. ``sample()`` and ``sample_many()`` read the same stream:
``n`` calls of ``sample()`` return exactly ``sample_many(n)`` for the same seed.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from planner.room import Jitter

__all__ = [
    "BLOCK",
    "DISTRIBUTIONS",
    "NETEM_TABLE_MAX",
    "NETEM_TABLE_MIN",
    "JitterSampler",
    "make_jitter",
]

#: Random numbers drawn from the generator at a time.
BLOCK = 4096
#: netem's table entries are int16 in units of 1/NETEM_DIST_SCALE (8192).
NETEM_DIST_SCALE = 8192
NETEM_TABLE_MAX = 32767 / NETEM_DIST_SCALE
NETEM_TABLE_MIN = -32768 / NETEM_DIST_SCALE
#: Every distribution name :func:`make_jitter` accepts.
DISTRIBUTIONS = ("none", "normal", "lognormal", "gamma", "pareto", "paretonormal", "empirical")

DEFAULT_PARETO_ALPHA = 3.0  # iproute2 netem/pareto.c: `static const double a=3.0;`
DEFAULT_LOGNORMAL_SIGMA = 1.0  # assumption (not a netem distribution)
DEFAULT_GAMMA_SHAPE = 2.0  # assumption (not a netem distribution)
_PARETO_GAIN = 4.0 / 3.0  # iproute2 netem/pareto.c: `dvalue *= (4.0/3.0)*TABLEFACTOR`
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


class JitterSampler(Protocol):
    """What :func:`make_jitter` returns."""

    base_s: float

    def sample(self) -> float:
        """One jitter draw in seconds, ``>= -base_s``."""
        ...

    def sample_many(self, n: int) -> np.ndarray:
        """``n`` draws as a float64 array of shape ``(n,)``, each ``>= -base_s``."""
        ...


class _Zero:
    """The ``none`` distribution (or a zero spread): every draw is 0.0 seconds."""

    def __init__(self, base_s: float) -> None:
        self.base_s = base_s

    def sample(self) -> float:
        """Always 0.0 (seconds)."""
        return 0.0

    def sample_many(self, n: int) -> np.ndarray:
        """``np.zeros(n)`` (seconds). Raises ValueError for ``n < 0``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return np.zeros(n)


class _Blocked:
    """A jitter stream drawn in blocks of :data:`BLOCK` by ``draw(rng, BLOCK)``.

    ``draw`` returns unclamped jitter in seconds; the clamp at ``-base_s`` is
    applied here. Use :func:`make_jitter` rather than building this directly.
    """

    def __init__(self, draw, rng: np.random.Generator, base_s: float) -> None:
        self._draw = draw
        self._rng = rng
        self.base_s = base_s
        self._floor = -base_s
        self._buf: list[float] = []
        self._i = 0

    def _block(self) -> np.ndarray:
        x = self._draw(self._rng, BLOCK)
        np.maximum(x, self._floor, out=x)
        return x

    def sample(self) -> float:
        """One jitter draw in seconds, ``>= -base_s``."""
        i = self._i
        buf = self._buf
        if i >= len(buf):
            buf = self._buf = self._block().tolist()
            i = 0
        self._i = i + 1
        return buf[i]

    def sample_many(self, n: int) -> np.ndarray:
        """``n`` draws (seconds), shape ``(n,)``, the same values ``n`` calls of
        :meth:`sample` would give. Raises ValueError for ``n < 0``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        parts = [np.asarray(self._buf[self._i:self._i + n], dtype=float)]
        got = len(parts[0])
        self._i += got
        while got < n:
            block = self._block()
            take = min(n - got, BLOCK)
            parts.append(block[:take])
            got += take
            if take < BLOCK:
                self._buf = block.tolist()
                self._i = take
            else:
                self._buf, self._i = [], 0
        return np.concatenate(parts)


def _netem_clip(t: np.ndarray) -> np.ndarray:
    return np.clip(t, NETEM_TABLE_MIN, NETEM_TABLE_MAX, out=t)


def pareto_unit(tail: np.ndarray, alpha: float = DEFAULT_PARETO_ALPHA) -> np.ndarray:
    """netem's pareto table value at upper-tail probability ``tail`` in (0, 1].

    ``(4/3) * (tail**(-1/alpha) - alpha/(alpha-1))``, capped at
    :data:`NETEM_TABLE_MAX` (iproute2 ``netem/pareto.c``). Unitless, shape of ``tail``.
    """
    v = _PARETO_GAIN * (tail ** (-1.0 / alpha) - alpha / (alpha - 1.0))
    return np.minimum(v, NETEM_TABLE_MAX, out=v)


def make_jitter(j: Jitter | None, rng: np.random.Generator, *, base_s: float = 0.0) -> JitterSampler:
    """A seeded sampler of per-message one-way jitter for the link spec ``j``.

    Args:
        j: the jitter spec (distribution, ``scale_s`` seconds, ``shape``,
            ``samples_s`` seconds); ``None`` means no jitter.
        rng: the generator every draw comes from (seeded by the caller).
        base_s: the one-way base delay the jitter is added to (``rtt/2``), seconds;
            samples are clamped to ``>= -base_s`` so the delay is never negative.

    Returns:
        An object with ``sample() -> float`` and ``sample_many(n) -> np.ndarray``
        (seconds; see the module docstring for each distribution and its source).

    Raises:
        ValueError: unknown distribution, negative ``scale_s`` or ``base_s``, a
            shape outside its range (pareto ``> 1``, lognormal/gamma ``> 0``), or
            ``empirical`` without samples.
    """
    if base_s < 0 or not math.isfinite(base_s):
        raise ValueError(f"base_s must be a finite number >= 0, got {base_s}")
    if j is None:
        return _Zero(base_s)
    dist = j.distribution
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown jitter distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    sigma = float(j.scale_s)
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError(f"jitter scale must be a finite number >= 0, got {sigma}")

    if dist == "empirical":
        if not j.samples_s:
            raise ValueError("empirical jitter needs samples_s (measured one-way extra delays)")
        table = np.asarray(j.samples_s, dtype=float)
        if not np.all(np.isfinite(table)):
            raise ValueError("empirical jitter samples must be finite")

        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            return table[g.integers(0, len(table), size=n)]

        return _Blocked(draw, rng, base_s)

    if dist == "none" or sigma == 0.0:
        return _Zero(base_s)

    if dist == "normal":
        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            return sigma * _netem_clip(g.standard_normal(n))

    elif dist == "pareto":
        alpha = DEFAULT_PARETO_ALPHA if j.shape is None else float(j.shape)
        if not alpha > 1.0:
            raise ValueError(f"pareto shape (alpha) must be > 1, got {alpha}")

        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            tail = 1.0 - g.random(n)  # uniform in (0, 1]
            return sigma * pareto_unit(tail, alpha)

    elif dist == "paretonormal":
        alpha = DEFAULT_PARETO_ALPHA if j.shape is None else float(j.shape)
        if not alpha > 1.0:
            raise ValueError(f"paretonormal shape (alpha) must be > 1, got {alpha}")
        erfc = math.erfc

        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            z = g.standard_normal(n)
            # upper tail 1 - Phi(z), accurate far out in the tail through erfc
            tail = np.array([0.5 * erfc(v * _INV_SQRT2) for v in z.tolist()])
            np.maximum(tail, np.finfo(float).tiny, out=tail)
            t = (_netem_clip(z) + 3.0 * pareto_unit(tail, alpha)) / 4.0
            return sigma * _netem_clip(t)

    elif dist == "lognormal":
        s = DEFAULT_LOGNORMAL_SIGMA if j.shape is None else float(j.shape)
        if not s > 0.0:
            raise ValueError(f"lognormal shape (log-sigma) must be > 0, got {s}")
        mean = math.exp(s * s / 2.0)
        sd = math.sqrt(math.expm1(s * s)) * mean

        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            return (sigma / sd) * (np.exp(s * g.standard_normal(n)) - mean)

    else:  # gamma
        k = DEFAULT_GAMMA_SHAPE if j.shape is None else float(j.shape)
        if not k > 0.0:
            raise ValueError(f"gamma shape must be > 0, got {k}")
        gain = sigma / math.sqrt(k)

        def draw(g: np.random.Generator, n: int) -> np.ndarray:
            return gain * (g.standard_gamma(k, n) - k)

    return _Blocked(draw, rng, base_s)
