"""How many drafted tokens a verify lap accepts.

``accepted(k)`` is the number of the ``k`` drafted tokens that match what the model
itself would have produced, counted from the first draft up to the first mismatch:
an integer in ``[0, k]``. The lap then keeps those plus one more token from the
model (the correction, or the bonus token when all ``k`` were right), so a lap yields
``accepted(k) + 1`` tokens and the text equals plain greedy decoding.

Three models, picked from :class:`planner.room.Speculative` in this order:

``accepted_sequence`` (recorded)
    A sequence of accepted counts recorded from a real run, replayed in order and
    cycling back to the start when it runs out. Each value is capped at the ``k`` asked
    for (a count recorded at a larger ``k`` cannot exceed the drafts of this lap).
    No randomness.
``accepted_lengths`` (empirical)
    Accepted counts resampled uniformly with replacement from the given list (its
    empirical distribution), each capped at ``k``.
``acceptance`` = ``p`` (per token)
    Each drafted token is accepted with probability ``p``, independently, until the
    first rejection: the standard model of speculative decoding (Leviathan, Kalman &
    Matias 2023, "Fast Inference from Transformers via Speculative Decoding", ICML,
    section 3.3, with acceptance rate ``alpha`` = ``p``), so
    ``P(accepted >= i) = p**i`` and ``E[accepted] = sum_{i=1..k} p**i`` =
    ``p (1 - p**k) / (1 - p)``. Drawn by inversion from one uniform ``u`` per lap:
    ``min(k, floor(log(u) / log(p)))``, since ``P(floor(log u / log p) >= i) =
    P(u <= p**i) = p**i``. One uniform per lap whatever ``k`` is, so changing ``k``
    does not shift the random stream.

Uniforms and indices are drawn from the injected generator in blocks of
:data:`BLOCK`, so a call costs a list index and a little float arithmetic.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from planner.room import Speculative

__all__ = ["BLOCK", "AcceptanceModel", "expected_accepted", "make_acceptance"]

BLOCK = 4096


class AcceptanceModel(Protocol):
    """What :func:`make_acceptance` returns."""

    def accepted(self, k: int, question: int = 0) -> int:
        """Accepted drafts of a lap of ``question`` that drafted ``k``: an int in ``[0, k]``."""
        ...


def expected_accepted(p: float, k: int) -> float:
    """``sum_{i=1..k} p**i``: the mean accepted drafts per lap under the per-token
    model (Leviathan et al. 2023)."""
    return sum(p**i for i in range(1, k + 1))


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


class _PerToken:
    """Per-token acceptance probability ``p`` (see the module docstring)."""

    def __init__(self, p: float, rng: np.random.Generator) -> None:
        self.p = p
        self._rng = rng
        self._inv_log_p = 1.0 / math.log(p) if 0.0 < p < 1.0 else 0.0
        self._buf: list[float] = []
        self._i = 0

    def accepted(self, k: int, question: int = 0) -> int:
        """Accepted drafts out of ``k`` (int in ``[0, k]``); every question alike.
        Raises ValueError for ``k < 0``."""
        _check_k(k)
        p = self.p
        if p >= 1.0:
            return k
        if p <= 0.0:
            return 0
        i = self._i
        if i >= len(self._buf):
            # 1 - random() is in (0, 1]: log never sees 0
            self._buf = (1.0 - self._rng.random(BLOCK)).tolist()
            i = 0
        self._i = i + 1
        run = math.log(self._buf[i]) * self._inv_log_p
        return k if run >= k else int(run)


class _Empirical:
    """Accepted counts resampled from ``lengths``, capped at ``k``."""

    def __init__(self, lengths: tuple[int, ...], rng: np.random.Generator) -> None:
        self.lengths = lengths
        self._rng = rng
        self._buf: list[int] = []
        self._i = 0

    def accepted(self, k: int, question: int = 0) -> int:
        """A resampled count, capped at ``k`` (every question alike). Raises
        ValueError for ``k < 0``."""
        _check_k(k)
        i = self._i
        if i >= len(self._buf):
            idx = self._rng.integers(0, len(self.lengths), BLOCK)
            self._buf = [self.lengths[j] for j in idx.tolist()]
            i = 0
        self._i = i + 1
        v = self._buf[i]
        return k if v > k else v


class _Measured:
    """Accepted counts resampled from a profile's walk at the asked ``k``: one uniform
    per lap, from every prompt's lengths
    (:meth:`~planner.profile.DrafterProfile.accepted_lengths`). ``by_question``: question
    ``q`` draws from the walk of prompt ``q mod prompts`` only
    (:meth:`planner.profile.DrafterProfile.prompt_lengths`), so a question's laps are
    alike as a real question's are (a copying question accepts much, an open one
    little): what a bootstrap replica of a prediction's range does."""

    def __init__(self, drafter, rng: np.random.Generator, by_question: bool = False) -> None:
        self.drafter = drafter
        self.by_question = by_question
        self._rng = rng
        self._lengths: dict[tuple[int, int], tuple[int, ...]] = {}
        self._buf: list[float] = []
        self._i = 0

    def accepted(self, k: int, question: int = 0) -> int:
        """A count drawn from the lengths measured for ``k`` (0 when none were), on
        ``question``'s prompt. Raises ValueError for ``k < 0``."""
        _check_k(k)
        key = (k, question if self.by_question else 0)
        lengths = self._lengths.get(key)
        if lengths is None:
            if self.by_question:
                per = self.drafter.prompt_lengths(k)
                lengths = per[question % len(per)] if per else ()
            else:
                lengths = self.drafter.accepted_lengths(k)
            if len(self._lengths) < 4096:
                self._lengths[key] = lengths
        if not lengths:
            return 0
        i = self._i
        if i >= len(self._buf):
            self._buf = self._rng.random(BLOCK).tolist()
            i = 0
        self._i = i + 1
        return lengths[min(int(self._buf[i] * len(lengths)), len(lengths) - 1)]


class _Replay:
    """A recorded sequence of accepted counts, in order, cycling; capped at ``k``."""

    def __init__(self, sequence: tuple[int, ...]) -> None:
        self.sequence = sequence
        self._i = 0

    def accepted(self, k: int, question: int = 0) -> int:
        """The next recorded count, capped at ``k`` (whatever the question). Raises
        ValueError for ``k < 0``."""
        _check_k(k)
        seq = self.sequence
        v = seq[self._i]
        self._i = (self._i + 1) % len(seq)
        return k if v > k else v


def make_acceptance(spec: Speculative, rng: np.random.Generator, measured=None,
                    by_question: bool = False) -> AcceptanceModel:
    """The acceptance model a :class:`~planner.room.Speculative` spec asks for.

    ``accepted_sequence`` if non-empty (replay), else ``accepted_lengths`` if non-empty
    (resample), else a calibration profile's measured walk for this drafter
    (``measured``, a :class:`planner.profile.DrafterProfile` with accepted lengths:
    resampled at each lap's ``k``), else the per-token probability ``acceptance``.

    Args:
        spec: the speculative-decoding settings.
        rng: seeded generator (unused by replay).
        measured: the profile's measurement of ``spec.drafter``, or None.
        by_question: draw each question from one prompt's walk of ``measured``
            (see ``_Measured``).

    Returns:
        An object with ``accepted(k: int) -> int`` in ``[0, k]``.

    Raises:
        ValueError: negative recorded counts, or no sequence, no lengths and an
            ``acceptance`` that is None or outside ``[0, 1]``.
    """
    if spec.accepted_sequence:
        seq = tuple(int(v) for v in spec.accepted_sequence)
        if min(seq) < 0:
            raise ValueError("accepted_sequence values must be >= 0")
        return _Replay(seq)
    if spec.accepted_lengths:
        lengths = tuple(int(v) for v in spec.accepted_lengths)
        if min(lengths) < 0:
            raise ValueError("accepted_lengths values must be >= 0")
        return _Empirical(lengths, rng)
    if measured is not None and measured.accepted:
        return _Measured(measured, rng, by_question)
    p = spec.acceptance
    if p is None or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"acceptance must be a probability in [0, 1], got {p}")
    return _PerToken(float(p), rng)
