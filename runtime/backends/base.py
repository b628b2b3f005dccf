"""The stage interface shared by every backend.

A *stage* runs transformer layers ``[start, end)`` (half-open, 0-based; shown to people as
1-based inclusive "layers start+1..end") with a KV cache for those layers only. The
*model host*'s stage also holds the embedding, the final norm and the (tied) output head.

Positions: a stage's KV cache holds ``position`` tokens (positions ``0..position-1``).
``forward(hidden, first_pos)`` requires ``first_pos == position`` and appends ``n`` positions;
to re-run positions (speculative verify, retry), call ``rollback(pos)`` first.

All activations are float32 ``numpy`` arrays; every method asserts its dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.deal import shown_layers

from ..config import ModelConfig


class PositionError(ValueError):
    """``first_pos`` does not match the cache, or the context is full."""


@dataclass(frozen=True)
class StageSpec:
    """What a device runs: layers ``[start, end)``, and whether it is the model host.

    ``host=True`` adds the embedding, final norm and output head.
    """

    start: int
    end: int
    host: bool = False

    def label(self) -> str:
        """People's notation, 1-based inclusive (:func:`planner.deal.shown_layers`):
        ``layers 1-15`` for ``[0, 15)``, ``layer 30`` for ``[29, 30)``, ``no layers``."""
        return shown_layers(self.start, self.end, words=True)


def check_hidden(x: np.ndarray, hidden: int) -> np.ndarray:
    """Validate a residual: 2-D ``[n, hidden]`` float32 with ``n >= 1``; returns it C-contiguous.

    Raises:
        TypeError: wrong dtype. ValueError: wrong shape.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError(f"residual must be a float32 ndarray, got {getattr(x, 'dtype', type(x))}")
    if x.ndim != 2 or x.shape[1] != hidden or x.shape[0] < 1:
        raise ValueError(f"residual must be [n>=1, {hidden}], got {x.shape}")
    return np.ascontiguousarray(x)


def check_ids(ids, vocab: int) -> np.ndarray:
    """Validate token ids: 1-D, non-empty, each in ``[0, vocab)``; returns int64 array."""
    a = np.asarray(ids, dtype=np.int64).reshape(-1)
    if a.size == 0:
        raise ValueError("no token ids")
    if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"token id out of range [0, {vocab})")
    return a


class Stage(ABC):
    """One device's share of the model on one backend.

    Subclasses implement :meth:`forward`, :meth:`embed`, :meth:`head` and keep ``_pos``
    (the cache length) up to date; :meth:`rollback` and :attr:`position` are shared.
    The fused helpers (:meth:`embed_forward`, :meth:`head_embed_forward`) have plain
    compositions here; the wgpu backend overrides them with a single GPU submit each.
    """

    cfg: ModelConfig
    spec: StageSpec
    max_ctx: int

    @property
    def start(self) -> int:
        return self.spec.start

    @property
    def end(self) -> int:
        return self.spec.end

    @property
    def is_host(self) -> bool:
        return self.spec.host

    _pos: int = 0  # positions held in the KV cache; backends advance it in forward()
    _slot: int = 0  # the KV cache forward/rollback/position act on (use_cache)
    _slot_pos: dict | None = None  # positions of the other caches, by slot

    def use_cache(self, slot: int) -> None:
        """Make KV cache ``slot`` the one :meth:`forward`, :meth:`rollback` and
        :attr:`position` act on: a stage keeps one cache per question in flight (the
        scheduler's slot of each question, carried by every frame). A slot not used
        before starts empty; the others keep their positions. Slot 0 is the cache a
        stage starts with, so a room of one question never switches.

        Raises:
            ValueError: ``slot`` < 0.
        """
        slot = int(slot)
        if slot == self._slot:
            return
        if slot < 0:
            raise ValueError(f"KV cache slot {slot} < 0")
        if self._slot_pos is None:
            self._slot_pos = {}
        self._slot_pos[self._slot] = self._pos
        self._swap_cache(self._slot, slot)
        self._slot, self._pos = slot, self._slot_pos.pop(slot, 0)

    def _swap_cache(self, old: int, new: int) -> None:
        """Put away the cache of slot ``old`` and bring in slot ``new``'s (empty when new)."""
        raise NotImplementedError(f"{type(self).__name__} keeps one KV cache")

    @property
    def position(self) -> int:
        """Number of positions in this stage's KV cache (the next ``first_pos``)."""
        return self._pos

    @abstractmethod
    def forward(self, hidden: np.ndarray, first_pos: int) -> np.ndarray:
        """Run layers ``[start, end)`` on ``hidden`` ``[n, hidden]`` float32 at positions
        ``first_pos .. first_pos+n-1``, appending them to the KV cache.

        Returns ``[n, hidden]`` float32 (a new array). With no layers it returns a copy.

        Raises:
            PositionError: ``first_pos != position`` or the cache would exceed ``max_ctx``.
            TypeError / ValueError: bad dtype / shape.
        """

    def rollback(self, pos: int) -> None:
        """Truncate the KV cache to ``pos`` positions (``0 <= pos <= position``); the
        entries past ``pos`` are overwritten by the next forward.

        Raises:
            PositionError: ``pos`` outside that range.
        """
        if not (0 <= pos <= self._pos):
            raise PositionError(f"cannot roll back to {pos}: cache holds {self._pos}")
        self._pos = int(pos)

    @abstractmethod
    def embed(self, ids) -> np.ndarray:
        """Embedding rows for ``ids`` (ints in ``[0, vocab)``) -> ``[n, hidden]`` float32. Host only."""

    @abstractmethod
    def head(self, hidden: np.ndarray) -> np.ndarray:
        """Final RMSNorm + tied output head: ``[n, hidden]`` float32 -> ``[n, vocab]`` float32 logits. Host only."""

    # --- fused helpers ----------------------------------------------------------------
    def embed_forward(self, ids, first_pos: int) -> np.ndarray:
        """``forward(embed(ids), first_pos)``: host's first half of a lap. ``[n]`` ids -> ``[n, hidden]``."""
        return self.forward(self.embed(ids), first_pos)

    def head_embed_forward(self, hidden: np.ndarray, first_pos: int) -> tuple[int, np.ndarray]:
        """Greedy host step: head on the *last* row of ``hidden``, argmax (lowest id on ties,
        like ``numpy.argmax``), embed that token, run this stage's layers at ``first_pos``.

        Returns ``(token_id, next_hidden [1, hidden] float32)``.
        """
        logits = self.head(hidden[-1:])
        tok = int(np.argmax(logits[0]))
        return tok, self.embed_forward([tok], first_pos)

    def warm_up(self, rows: Sequence[int] = (1,)) -> None:
        """Run each lap shape once, then empty the KV cache: a forward of ``n`` rows of
        zeros ``[n, hidden]`` float32 at position 0 for each ``n`` in ``rows`` (a prefill
        chunk, a verify lap's k+1, a decode step's 1), and on the model host the embedding
        and the head on as many rows. First use of a shape costs more than later ones
        (pages of the weights touched for the first time, compiled kernels loaded, BLAS
        and GPU pipelines set up); a device does this while it loads, before it says it
        is ready, so the room's first question does not pay it. llama.cpp's ``--warmup``
        (an empty decode before serving, on by default) is the same idea. Row counts
        over ``max_ctx`` are skipped; whatever the cache held is dropped.
        """
        for n in sorted({int(n) for n in rows if 0 < int(n) <= self.max_ctx}):
            self.rollback(0)
            x = np.zeros((n, self.cfg.hidden), np.float32)
            if self.is_host:
                x = self.embed([0] * n)
            h = self.forward(x, 0)
            if self.is_host:
                self.head(h)
        self.rollback(0)

    def _check_pos(self, first_pos: int, n: int) -> None:
        if first_pos != self.position:
            raise PositionError(f"first_pos {first_pos} != cached positions {self.position}; rollback first")
        if first_pos + n > self.max_ctx:
            raise PositionError(f"{first_pos + n} positions exceed max_ctx {self.max_ctx}")

    def _require_host(self) -> None:
        if not self.spec.host:
            raise RuntimeError(f"stage {self.spec.label()} is not the model host: no embedding/head")
