"""How many tokens to draft in the next verify lap (``draft_tokens: auto``).

A pure rule, no clock and no IO: the host's scheduler asks it once per lap of a
speculative question and tells it what each judged lap accepted. It picks the ``k`` in
``0..max_draft_tokens`` (``0``: a plain decode lap) that maximises the expected tokens
committed per second of lap time:

    rate(k) = (1 + E[accepted | k]) / lap_s[k]

* ``E[accepted | k]`` generalises the expected accepted length of Leviathan, Kalman and
  Matias 2023 ("Fast Inference from Transformers via Speculative Decoding", ICML,
  section 3.1, equation 1: ``E[#generated] = (1 - alpha**(k+1)) / (1 - alpha)`` with
  one acceptance rate ``alpha`` for every position) to one rate per position: with
  ``c_i`` the chance that draft ``i`` is right given drafts ``1..i-1`` were,
  ``E[accepted | k] = sum_{i=1..k} prod_{j=1..i} c_j``. With every ``c_i = alpha``
  this is the paper's ``sum_{i=1..k} alpha**i``.
* ``lap_s[k]`` is the lap-cost model's seconds of one lap that drafts ``k``: the
  drafter's call, every stage's pass over ``k + 1`` positions, every hop with its
  frame, the head on ``k + 1`` rows (:func:`lap_costs` builds it from a scenario).
* ``c_i`` starts at a prior (the calibration profile's walk on the workload's
  sample, or the scenario's per-token acceptance) worth ``prior_weight`` laps; with
  ``by_k`` there is one prior per draft length (the walk measured at that k: a walk
  that drafts 8 a lap passes through a copied span in fewer, longer laps than one that
  drafts 1, so its first position is right less often), else one for all. It is
  updated by the laps of the question so far: a Beta-Bernoulli posterior mean per
  position, ``(prior_weight * prior_i + right_i) / (prior_weight + tried_i)``. A lap
  that accepted ``a`` of ``k`` tried positions ``1..min(a + 1, k)`` and found ``1..a``
  right.

Adapting the speculation window per round from the acceptance seen is the idea of
DSD-Sim's Adaptive Window Control (distributed speculative decoding, edge and cloud);
the rule here is the plain expected-rate maximisation above, not theirs.

A plain lap says nothing about acceptance, so a question that chose ``k = 0`` would
never learn otherwise: after ``probe_every`` plain laps in a row one lap drafts
``probe_tokens`` (1 by default) to look again.

Whatever is chosen, the scheduler keeps the longest prefix of drafts the model agrees
with plus the model's own next token, so the text is plain greedy decoding's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["DraftPolicy", "DraftState", "expected_accepted", "conditional_rates", "best_k"]


def conditional_rates(lengths: Sequence[int], k: int) -> tuple[float, ...]:
    """Per-position acceptance ``c_1..c_k`` from accepted lengths of ``k``-token drafts
    (each in ``[0, k]``): ``c_i = #(a >= i) / #(a >= i - 1)``; a position no draft
    reached takes the rate before it (0.5 for the first when there are no lengths).
    Raises ValueError for ``k < 0`` or a length outside ``[0, k]``."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if any(a < 0 or a > k for a in lengths):
        raise ValueError(f"accepted lengths must lie in [0, {k}]")
    out: list[float] = []
    reach = len(lengths)
    prev = 0.5
    for i in range(1, k + 1):
        right = sum(1 for a in lengths if a >= i)
        c = right / reach if reach else prev
        out.append(c)
        prev, reach = c, right
    return tuple(out)


def expected_accepted(rates: Sequence[float], k: int) -> float:
    """``sum_{i=1..k} prod_{j<=i} rates[j-1]``: the mean accepted drafts of a lap of
    ``k`` drafts (module doc; Leviathan et al. 2023, eq. 1, with a rate per position).
    Raises ValueError when ``k`` is negative or beyond ``len(rates)``."""
    if k < 0 or k > len(rates):
        raise ValueError(f"k must be in 0..{len(rates)}, got {k}")
    total, run = 0.0, 1.0
    for i in range(k):
        run *= rates[i]
        total += run
    return total


def best_k(rates: Sequence[float], lap_s: Sequence[float]) -> int:
    """The ``k`` in ``0..len(lap_s) - 1`` with the most expected committed tokens per
    second, ``(1 + expected_accepted(rates, k)) / lap_s[k]``; the smallest on ties.
    ``rates`` needs at least ``len(lap_s) - 1`` values. Raises ValueError for no lap
    costs, a cost that is not finite and > 0, or too few rates."""
    if not lap_s:
        raise ValueError("lap_s needs a cost for k = 0 at least")
    if len(rates) < len(lap_s) - 1:
        raise ValueError(f"{len(lap_s) - 1} draft positions need as many rates, got {len(rates)}")
    best, best_rate = 0, -1.0
    total, run = 0.0, 1.0
    for k, s in enumerate(lap_s):
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"lap_s[{k}] must be finite and > 0 seconds, got {s}")
        if k > 0:
            run *= rates[k - 1]
            total += run
        r = (1.0 + total) / s
        if r > best_rate * (1 + 1e-12):
            best, best_rate = k, r
    return best


@dataclass(frozen=True)
class DraftPolicy:
    """The settings of the rule (module doc); one per room, shared by its questions.

    Attributes:
        lap_s: seconds of one lap that drafts ``k``, for ``k = 0..max_draft_tokens``
            (``len(lap_s) = max_draft_tokens + 1``), each finite and > 0.
        prior: per-position acceptance ``c_1..c_max`` before any lap of the question,
            each in [0, 1] (:func:`conditional_rates` of a measured walk).
        prior_weight: laps the prior counts as (> 0).
        probe_every: plain laps in a row before a probe lap (>= 1).
        probe_tokens: drafts of a probe lap (1..max_draft_tokens).
        by_k: optional priors per draft length: ``by_k[k - 1]`` holds the ``k`` rates
            of a lap that drafts ``k`` (``()``: ``prior[:k]`` for every k).

    Raises ValueError for settings outside these ranges.
    """

    lap_s: tuple[float, ...]
    prior: tuple[float, ...]
    prior_weight: float = 4.0
    probe_every: int = 8
    probe_tokens: int = 1
    by_k: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lap_s", tuple(float(x) for x in self.lap_s))
        object.__setattr__(self, "prior", tuple(float(x) for x in self.prior))
        object.__setattr__(self, "by_k", tuple(tuple(float(c) for c in row) for row in self.by_k))
        if self.by_k and (len(self.by_k) != len(self.lap_s) - 1
                          or any(len(row) != k + 1 for k, row in enumerate(self.by_k))):
            raise ValueError("by_k needs one row per draft length k = 1..max_draft_tokens, of k rates each")
        if any(not (0.0 <= c <= 1.0) for row in self.by_k for c in row):
            raise ValueError("by_k rates must lie in [0, 1]")
        if len(self.lap_s) < 2:
            raise ValueError("lap_s needs the costs of k = 0 and at least k = 1")
        if any(not (math.isfinite(s) and s > 0) for s in self.lap_s):
            raise ValueError(f"lap_s must be finite and > 0 seconds, got {list(self.lap_s)}")
        if len(self.prior) != self.max_draft_tokens:
            raise ValueError(f"prior needs one rate per draft position ({self.max_draft_tokens}), "
                             f"got {len(self.prior)}")
        if any(not (0.0 <= c <= 1.0) for c in self.prior):
            raise ValueError(f"prior rates must lie in [0, 1], got {list(self.prior)}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight > 0):
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")
        if self.probe_every < 1 or not 1 <= self.probe_tokens <= self.max_draft_tokens:
            raise ValueError("probe_every must be >= 1 and probe_tokens in 1..max_draft_tokens")

    @property
    def max_draft_tokens(self) -> int:
        """The longest draft the rule may choose."""
        return len(self.lap_s) - 1

    def start(self) -> "DraftState":
        """A fresh state for one question."""
        return DraftState(self)

    def to_json(self) -> dict:
        """As a JSON-ready mapping (:meth:`from_json` reads it back)."""
        return {"lap_s": list(self.lap_s), "prior": list(self.prior), "prior_weight": self.prior_weight,
                "probe_every": self.probe_every, "probe_tokens": self.probe_tokens,
                "by_k": [list(row) for row in self.by_k]}

    @classmethod
    def from_json(cls, m: Mapping[str, Any]) -> "DraftPolicy":
        """Read :meth:`to_json`'s mapping. Raises ValueError (or KeyError/TypeError for
        a mapping that lacks ``lap_s`` or ``prior``)."""
        return cls(tuple(m["lap_s"]), tuple(m["prior"]), float(m.get("prior_weight", 4.0)),
                   int(m.get("probe_every", 8)), int(m.get("probe_tokens", 1)),
                   tuple(tuple(row) for row in m.get("by_k", ())))


@dataclass
class DraftState:
    """One question's view: positions tried and right so far, plain laps in a row."""

    policy: DraftPolicy
    tried: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    plain_run: int = 0

    def __post_init__(self) -> None:
        n = self.policy.max_draft_tokens
        self.tried = [0] * n
        self.right = [0] * n

    def rates(self, k: int | None = None) -> tuple[float, ...]:
        """The posterior mean acceptance of each position (module doc) of a lap that
        drafts ``k`` (its prior ``by_k[k - 1]`` when the policy has one; None: every
        position, from ``prior``)."""
        p = self.policy
        w = p.prior_weight
        prior = p.by_k[k - 1] if (k and p.by_k) else p.prior[:k]
        return tuple((w * c + r) / (w + t) for c, r, t in zip(prior, self.right, self.tried))

    def expected_rate(self, k: int) -> float:
        """Expected committed tokens per second of a lap that drafts ``k``."""
        return (1.0 + (expected_accepted(self.rates(k), k) if k else 0.0)) / self.policy.lap_s[k]

    def choose(self, limit: int | None = None) -> int:
        """Drafts for the next lap: the best expected rate, or a probe after
        ``probe_every`` plain laps in a row; never more than ``limit`` (positions left
        in the context, None: no limit) nor ``max_draft_tokens``, never negative."""
        p = self.policy
        cap = p.max_draft_tokens if limit is None else max(0, min(limit, p.max_draft_tokens))
        if p.by_k:
            k, best = 0, self.expected_rate(0)
            for j in range(1, cap + 1):
                r = self.expected_rate(j)
                if r > best * (1 + 1e-12):
                    k, best = j, r
        else:
            k = best_k(self.rates(), p.lap_s[:cap + 1])
        if k == 0 and cap > 0 and self.plain_run >= p.probe_every:
            k = min(p.probe_tokens, cap)
        return k

    def plain_lap(self) -> None:
        """A lap that drafted nothing was launched."""
        self.plain_run += 1

    def observe(self, drafted: int, accepted: int) -> None:
        """A judged lap drafted ``drafted`` and ``accepted`` of them were right
        (clamped to ``0..drafted``; positions beyond ``max_draft_tokens`` are not
        counted)."""
        if drafted <= 0:
            return
        self.plain_run = 0
        a = max(0, min(accepted, drafted))
        n = len(self.tried)
        for i in range(min(a + 1, drafted, n)):
            self.tried[i] += 1
            if i < a:
                self.right[i] += 1
