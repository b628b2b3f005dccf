"""Sampling: temperature, top-k, top-p and a seed, and speculative sampling that keeps
the target distribution. Pure: numpy only, no clock, no global random state.

Who does what (docs/architecture.md, "Sampling"):

* the **scheduler** owns a question's randomness: a :class:`Uniforms` stream made from
  the question's seed, where pair ``j`` decides answer token ``j`` whatever lap it
  lands in. It hands each :class:`planner.protocol.RunHead` the pairs of the rows it
  asks for, and it judges a verify lap as it always has: keep the drafts the head's
  tokens agree with, then the head's token at the first disagreement;
* the **head** (where the probabilities are) turns each row's logits into target
  probabilities ``p`` (:func:`probabilities`) and picks the row's token with that row's
  pair (:func:`verify_row`).

Speculative sampling (Leviathan et al., "Fast Inference from Transformers via
Speculative Decoding", ICML 2023, algorithm 1; Chen et al., "Accelerating Large
Language Model Decoding with Speculative Sampling", 2023, algorithm 2): a draft token
``x`` drawn from the drafter's ``q`` is kept with probability ``min(1, p(x) / q(x))``;
when it is not, the token is drawn from ``norm(max(0, p - q))``; when every draft is
kept, one more token is drawn from ``p``. The tokens kept are then distributed exactly
as tokens drawn from ``p`` one at a time.

Every drafter of this project (``ngram``, ``early_exit``, ``model``) is deterministic:
its ``q`` is one-hot at the draft ``x``. Then ``min(1, p(x) / q(x)) = p(x)`` and
``norm(max(0, p - q))`` is ``p`` without ``x``, renormalised, and the rule is the same
as "draw ``t`` from ``p``; keep ``x`` when ``t == x``, else take ``t``": ``t == x`` has
probability ``p(x)``, and given ``t != x``, ``t`` is distributed as ``p`` without ``x``.
:func:`verify_row` uses that form for a one-hot ``q`` (``q=None``): the token then does
not depend on the draft at all, so a seed gives the same answer with or without
speculation, split or not (up to float rounding of the logits), as greedy does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: the largest seed (seeds are unsigned 64-bit, as a scenario's ``seed``)
MAX_SEED = 2**64 - 1
#: the smallest temperature other than 0: a smaller one is greedy decoding in all but
#: name, and the smallest (5e-324) is 0 as a float32, so dividing the logits by it fails;
#: vLLM decodes greedily below the same 1e-5 (``_SAMPLING_EPS`` in vllm/sampling_params.py)
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class Sampling:
    """How the head picks a token.

    Attributes:
        temperature: logits are divided by it; 0 means greedy (argmax, lowest id on
            ties), the default. Finite, 0 or at least :data:`MIN_TEMPERATURE`.
        top_p: keep the smallest set of most likely tokens whose probability reaches
            ``top_p`` (nucleus sampling; Holtzman et al. 2020); 1 keeps all. In (0, 1].
        top_k: keep the ``top_k`` most likely tokens (ties with the k-th kept); 0 keeps all.
        seed: the question's random stream (:class:`Uniforms`), 0..2**64-1; None: the
            driver's choice (the scheduler falls back to the question id).
    Raises:
        ValueError: a value out of range.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        t, p, k, s = self.temperature, self.top_p, self.top_k, self.seed
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {k!r}")
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED):
            raise ValueError(f"seed must be an integer 0..{MAX_SEED}, got {s!r}")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        """True when the head takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    def with_seed(self, seed: int) -> "Sampling":
        """The same settings with ``seed``."""
        return Sampling(self.temperature, self.top_p, self.top_k, seed)

    def to_json(self) -> dict:
        """As a JSON-ready mapping (the constructor's keywords)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


#: greedy decoding, the default
GREEDY = Sampling()


class Uniforms:
    """One question's random stream: pair ``j`` = ``(u_j, v_j)``, two uniforms in
    [0, 1), decides answer token ``j`` (``u`` the keep-or-not test of a draft drawn from
    a non-deterministic drafter, ``v`` the draw of a token). The pairs come from a
    ``numpy.random.Generator`` (PCG64) seeded with ``seed`` and are drawn in answer-token
    order whatever the order they are asked for, so a seed always gives the same pairs.
    """

    _BLOCK = 64

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._pairs = np.empty((0, 2))

    def pairs(self, first: int, n: int) -> tuple[tuple[float, float], ...]:
        """Pairs ``first .. first + n - 1`` (``first`` >= 0, answer-token indices).
        Raises ValueError for a negative ``first`` or ``n``."""
        if first < 0 or n < 0:
            raise ValueError(f"answer-token indices start at 0, got {first} (+{n})")
        need = first + n - len(self._pairs)
        if need > 0:
            blocks = -(-need // self._BLOCK)
            self._pairs = np.concatenate([self._pairs, self._rng.random((blocks * self._BLOCK, 2))])
        return tuple((float(u), float(v)) for u, v in self._pairs[first:first + n])


def probabilities(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """Target probabilities from logits, as transformers' warpers make them, in their
    order: divide by the temperature, keep the ``top_k`` largest (ties with the k-th
    kept; ``TopKLogitsWarper``), softmax, keep the most likely tokens up to ``top_p``
    (``TopPLogitsWarper``: a token goes when the tokens less likely than it, itself
    included, add up to at most ``1 - top_p``; the most likely one always stays), and
    renormalise.

    Args:
        logits: ``[rows, vocab]`` (or ``[vocab]``), any float dtype, finite; float32 logits
            are scaled and exponentiated in float32 (relative error ~1e-7, the logits'
            own precision), anything else in float64.
        sampling: not greedy (temperature > 0).
    Returns:
        ``[rows, vocab]`` float64 (``[vocab]`` for a 1-d input), each row summing to 1.
    Raises:
        ValueError: greedy ``sampling`` (no distribution: the head takes the argmax).
    """
    if sampling.greedy:
        raise ValueError("greedy decoding has no sampling distribution; take the argmax")
    x = np.asarray(logits)
    x = x if x.dtype == np.float32 else x.astype(np.float64)  # float32 logits: exp in float32 (5x faster here)
    one = x.ndim == 1
    x = np.atleast_2d(x) / x.dtype.type(sampling.temperature)
    vocab = x.shape[1]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(x, vocab - sampling.top_k, axis=1)[:, vocab - sampling.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=1, keepdims=True)
    p = np.exp(x).astype(np.float64)
    p /= p.sum(axis=1, keepdims=True)
    if sampling.top_p < 1.0:
        p = np.stack([_nucleus(row, sampling.top_p) for row in p])
    return p[0] if one else p


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """``p`` ``[vocab]`` (sums to 1) cut to its nucleus and renormalised. Only the most
    likely candidates are sorted: the fewest (256, 2048, ... up to all) whose mass
    reaches ``top_p``; every other token's ascending cumulative mass is at most
    ``1 - top_p``, so transformers' rule drops it anyway."""
    vocab = len(p)
    m = min(vocab, 256)
    while True:
        cand = np.argpartition(p, vocab - m)[vocab - m:] if m < vocab else np.arange(vocab)
        if m == vocab or p[cand].sum() >= top_p:
            break
        m = min(vocab, m * 8)
    order = cand[np.argsort(p[cand], kind="stable")]  # least likely first
    outside = p.sum() - p[cand].sum()  # the mass below every candidate, first in ascending order
    drop = outside + np.cumsum(p[order]) <= 1.0 - top_p
    drop[-1] = False
    out = np.zeros_like(p)
    keep = order[~drop]
    out[keep] = p[keep]
    return out / out.sum()


def inverse_cdf(p: np.ndarray, v: float) -> int:
    """The token whose cumulative probability interval holds ``v``: the smallest id
    ``i`` with ``p[0] + ... + p[i] > v * sum(p)``; a token of probability 0 is never
    picked. ``p``: ``[vocab]`` non-negative with a positive sum; ``v`` in [0, 1)."""
    c = np.cumsum(p, dtype=np.float64)
    i = int(np.searchsorted(c, v * c[-1], side="right"))
    if i >= len(c) or p[i] <= 0:  # rounding at the top end: the last token that can be drawn
        i = int(np.flatnonzero(np.asarray(p) > 0)[-1])
    return i


def verify_row(p: np.ndarray, pair: tuple[float, float], draft: int | None = None,
               q: np.ndarray | None = None) -> int:
    """One row of a verify lap under sampling: the token this row commits if the lap
    gets this far (module doc, Leviathan et al. 2023 / Chen et al. 2023).

    Args:
        p: the target probabilities of this row, ``[vocab]``.
        pair: ``(u, v)``, this answer token's uniforms (:class:`Uniforms`).
        draft: the draft token that follows this row's input (None: no draft, e.g. the
            last row of a lap, a prefill, a plain decode).
        q: the drafter's probabilities ``[vocab]`` that ``draft`` was drawn from; None
            for a deterministic drafter (``q`` one-hot at ``draft``).
    Returns:
        ``draft`` when it is kept, else a token drawn from the residual
        ``norm(max(0, p - q))`` (never ``draft``), or from ``p`` when there is no draft.
        With ``q=None`` this is ``inverse_cdf(p, v)``, equal to ``draft`` with
        probability ``p[draft]``.
    """
    u, v = pair
    if draft is None or q is None:
        return inverse_cdf(p, v)
    qx = float(q[draft])
    if qx <= 0.0 or u < min(1.0, float(p[draft]) / qx):
        return int(draft)
    residual = np.maximum(np.asarray(p, np.float64) - q, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: rejection had probability ~0
        return inverse_cdf(p, v)
    return inverse_cdf(residual, v)


def head_tokens(logits: np.ndarray, sampling: Sampling | None, pairs: Sequence[tuple[float, float]] = (),
                drafts: Sequence[int] = (), q: np.ndarray | None = None) -> tuple[int, ...]:
    """The head's token for every row of a lap.

    Args:
        logits: ``[rows, vocab]``.
        sampling: None or greedy: each row's argmax (lowest id on ties), as before
            sampling existed. Otherwise :func:`verify_row` on :func:`probabilities`.
        pairs: one ``(u, v)`` per row (:class:`planner.protocol.RunHead` ``uniforms``).
        drafts: the draft after row ``i`` is ``drafts[i]`` (the lap's inputs after the
            first); rows past it have none. Needed only with ``q``.
        q: ``[len(drafts), vocab]``, the drafter's probabilities; None: deterministic.
    Returns:
        one token id per row.
    Raises:
        ValueError: fewer pairs than rows when sampling.
    """
    logits = np.asarray(logits)
    if sampling is None or sampling.greedy:
        return tuple(int(i) for i in np.argmax(logits, axis=1))
    if len(pairs) < logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows need as many uniform pairs, got {len(pairs)}")
    p = probabilities(logits, sampling)
    out = []
    for i in range(p.shape[0]):
        d = drafts[i] if i < len(drafts) else None
        out.append(verify_row(p[i], pairs[i], d, q[i] if (q is not None and d is not None) else None))
    return tuple(out)
