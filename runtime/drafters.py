"""Drafters for speculative decoding on the model host.

A drafter proposes ``k`` next tokens after a context of token ids; the scheduler then
verifies them in one lap and keeps the longest prefix the full model agrees with, so
the answer is the plain greedy answer whatever the drafter proposes. Every drafter
counts its drafted tokens and the seconds it spent (``cost_s_per_token``).

* ``ngram``: prompt lookup, no weights (:func:`ngram_draft`).
* ``early_exit``: the host's first ``m`` layers, then the final norm and the output
  head, greedy, with a KV cache of its own (Elhoushi et al., "LayerSkip: Enabling Early
  Exit Inference and Self-Speculative Decoding", 2024, drafts from early layers).
* ``model``: a separate smaller or cheaper model run whole (here by default the same
  SmolLM2 weights stored in float16 and computed in float32: a stand-in for "a quantized
  copy"; any Llama safetensors directory with the same vocabulary works).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np



def ngram_draft(context: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    """Prompt-lookup drafting: find the latest earlier occurrence of the longest suffix
    of ``context`` (up to ``max_ngram`` tokens) and propose the ``k`` tokens after it,
    padded with the last proposed (or last context) token. No weights.
    Source: "prompt lookup decoding" (A. Saxena, 2023), as used for n-gram drafting.
    """
    n_ctx = len(context)
    for n in range(min(max_ngram, n_ctx - 1), 0, -1):
        suffix = list(context[n_ctx - n:])
        for start in range(n_ctx - n - 1, -1, -1):
            if list(context[start:start + n]) == suffix:
                out = list(context[start + n:start + n + k])
                if out:
                    return (out + [out[-1]] * k)[:k]
    return [context[-1]] * k


class Drafter:
    """Base: ``draft(context, k) -> list of k ids``; tracks tokens drafted and seconds."""

    name = "drafter"

    def __init__(self) -> None:
        self.drafted = 0
        self.seconds = 0.0

    def __call__(self, context: Sequence[int], k: int) -> list[int]:
        t0 = time.perf_counter()
        out = self._draft(list(context), k)
        self.seconds += time.perf_counter() - t0
        self.drafted += k
        return out

    def _draft(self, context: list[int], k: int) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def warm_up(self) -> None:
        """Pay a drafter's first-use costs before the room's clock starts (nothing to pay
        without weights); its counts are not touched."""

    @property
    def cost_s_per_token(self) -> float:
        """Mean seconds per drafted token so far (0 before any)."""
        return self.seconds / self.drafted if self.drafted else 0.0


class NgramDrafter(Drafter):
    """Prompt lookup (no weights)."""

    name = "ngram"

    def _draft(self, context: list[int], k: int) -> list[int]:
        return ngram_draft(context, k)


class StageDrafter(Drafter):
    """Greedy drafting with a host stage of its own (embedding, layers, head).

    Keeps its KV cache in step with the context: on each call it rolls back to the
    longest common prefix with what it has already processed, runs the rest, then
    drafts ``k`` tokens one at a time and rolls those back.
    """

    def __init__(self, stage, name: str) -> None:
        super().__init__()
        if not stage.is_host:
            raise ValueError("a drafter's stage needs the embedding and the output head")
        self.stage = stage
        self.name = name
        self.seen: list[int] = []

    def warm_up(self) -> None:
        """Run its stage's prefill and decode shapes once (:meth:`Stage.warm_up`) and
        forget them: the next call starts from an empty cache."""
        self.stage.warm_up((1, 16))
        self.seen = []

    def _draft(self, context: list[int], k: int) -> list[int]:
        st = self.stage
        common = 0
        for a, b in zip(self.seen, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # always re-run the last token to get its logits
        st.rollback(common)
        self.seen = self.seen[:common]
        x = st.embed(context[common:])
        h = st.forward(x, common) if st.end > st.start else x
        self.seen = list(context)
        out: list[int] = []
        pos = len(context)
        for i in range(k):
            tok = int(np.argmax(st.head(h[-1:])[0]))
            out.append(tok)
            if i + 1 < k:
                x = st.embed([tok])
                h = st.forward(x, pos + i) if st.end > st.start else x
        st.rollback(len(context))
        return out


def make_drafter(kind: str, model_dir: str | None = None, early_exit_layers: int = 8, max_ctx: int = 2048) -> Drafter:
    """A drafter by name: ``ngram``, ``early_exit`` (first ``early_exit_layers`` layers)
    or ``model`` (the whole model, float16-rounded weights). Raises ValueError for an
    unknown kind or a missing ``model_dir``."""
    if kind == "ngram":
        return NgramDrafter()
    if kind not in ("early_exit", "model"):
        raise ValueError(f"unknown drafter {kind!r}; choose ngram, early_exit or model")
    if model_dir is None:
        raise ValueError(f"the {kind} drafter needs the model directory")
    from .backends import StageSpec
    from .backends.numpy_backend import NumpyStage
    from .config import ModelConfig
    from .weights import load_range
    cfg = ModelConfig.load(model_dir)
    end = min(early_exit_layers, cfg.n_layers) if kind == "early_exit" else cfg.n_layers
    w = load_range(model_dir, 0, end, with_embedding=True, with_head=True)
    if kind == "model":
        w = {n: a.astype(np.float16).astype(np.float32) for n, a in w.items()}
    return StageDrafter(NumpyStage(cfg, StageSpec(0, end, True), w, max_ctx=max_ctx), kind)
