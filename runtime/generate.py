"""Greedy generation over a chain of stages (the model host first, then workers in order).

One *lap*: host layers -> each worker -> back to the host's output head. The prompt is
prefilled in chunks (16 tokens by default, the room's prefill chunk); each decode step then
uses :meth:`Stage.head_embed_forward` on the host, which on the wgpu backend is one submit
(output head, argmax, the next token's embedding and the host's own layers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .backends.base import Stage

PREFILL_CHUNK = 16


@dataclass
class GenerationResult:
    """Outcome of :func:`generate_greedy`.

    Attributes:
        ids: generated token ids (the stop token included if one was produced).
        stopped: True if a stop id ended generation, False if ``max_new_tokens`` did.
        prefill_s: seconds from start to the first generated token (time to first token).
        decode_s: seconds spent on the tokens after the first.
        prompt_tokens: prompt length.
    """

    ids: list[int] = field(default_factory=list)
    stopped: bool = False
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens after the first per second of decoding (0 if fewer than 2 tokens)."""
        n = len(self.ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tok_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


def run_lap(stages: Sequence[Stage], hidden: np.ndarray, first_pos: int) -> np.ndarray:
    """Send ``hidden`` ``[n, hidden]`` through the workers ``stages[1:]`` in order."""
    for s in stages[1:]:
        hidden = s.forward(hidden, first_pos)
    return hidden


def prefill(stages: Sequence[Stage], prompt_ids: Sequence[int], chunk: int = PREFILL_CHUNK) -> np.ndarray:
    """Run the prompt through every stage in chunks; return the last chunk's final residual ``[m, hidden]``.

    Raises:
        ValueError: empty prompt, or the first stage is not the model host.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    host = stages[0]
    if not host.is_host:
        raise ValueError("stages[0] must be the model host")
    pos = host.position
    h = None
    for i in range(0, len(prompt_ids), chunk):
        ids = list(prompt_ids[i : i + chunk])
        h = run_lap(stages, host.embed_forward(ids, pos), pos)
        pos += len(ids)
    return h


def generate_greedy(
    stages: Sequence[Stage],
    prompt_ids: Sequence[int],
    max_new_tokens: int = 128,
    stop_ids: frozenset[int] | set[int] = frozenset({2}),
    on_token: Callable[[int], None] | None = None,
    chunk: int = PREFILL_CHUNK,
) -> GenerationResult:
    """Greedy decoding (argmax, lowest id on ties) through a chain of stages.

    Args:
        stages: ``[host, worker1, ...]`` covering the layers in order, all with empty caches
            (or caches at the same position, to continue a conversation).
        prompt_ids: the prompt's ids (e.g. from :meth:`ChatTokenizer.encode_chat`).
        max_new_tokens: upper bound on generated ids.
        stop_ids: ids that end generation (SmolLM2: ``{2}``, ``<|im_end|>``); they are included in the result.
        on_token: called with each id as soon as it is known (streaming).
    Returns:
        :class:`GenerationResult` with ids and timings (``time.perf_counter`` seconds).
    Raises:
        runtime.work.NumericalFault: a residual reaching the head holds a NaN or an inf.
    """
    host = stages[0]
    return _decode(stages, prompt_ids, max_new_tokens, stop_ids, on_token, chunk,
                   lambda h, pos, j: host.head_embed_forward(h, pos))


def _decode(stages: Sequence[Stage], prompt_ids: Sequence[int], max_new_tokens: int, stop_ids, on_token, chunk: int,
            step: Callable[[np.ndarray, int, int], tuple[int, np.ndarray]]) -> GenerationResult:
    """Prefill, then ``step(final residual [m, hidden], position, answer index j) ->
    (token j, the host stage's output for it)`` and a lap through the workers per token.
    Raises runtime.work.NumericalFault when a final residual holds a NaN or an inf."""
    from .work import check_finite

    res = GenerationResult(prompt_tokens=len(prompt_ids))
    t0 = time.perf_counter()
    h = prefill(stages, prompt_ids, chunk)
    pos = stages[0].position
    t_first = None
    for j in range(max_new_tokens):
        check_finite(h, f"the last stage's residual before answer token {j}")
        tok, h = step(h, pos, j)
        if t_first is None:
            t_first = time.perf_counter()
            res.prefill_s = t_first - t0
        res.ids.append(tok)
        if on_token is not None:
            on_token(tok)
        if tok in stop_ids:
            res.stopped = True
            break
        h = run_lap(stages, h, pos)
        pos += 1
    if t_first is not None:
        res.decode_s = time.perf_counter() - t_first
    return res


def generate_sampled(
    stages: Sequence[Stage],
    prompt_ids: Sequence[int],
    sampling,
    max_new_tokens: int = 128,
    stop_ids: frozenset[int] | set[int] = frozenset({2}),
    on_token: Callable[[int], None] | None = None,
    chunk: int = PREFILL_CHUNK,
) -> GenerationResult:
    """Decoding with ``sampling`` (a :class:`planner.sampling.Sampling`; greedy when its
    temperature is 0) through a chain of stages, without the scheduler.

    Answer token ``j`` is drawn with pair ``j`` of the seed's
    :class:`planner.sampling.Uniforms` stream, as the room's scheduler hands them out,
    so one seed gives the same answer here and in a room (split or not, speculation or
    not) up to float rounding of the logits. Arguments and result as
    :func:`generate_greedy`.

    Raises:
        ValueError: a sampling without a seed (the caller picks one), or an empty prompt.
        runtime.work.NumericalFault: the logits hold a NaN or an infinity.
    """
    from planner.sampling import Uniforms, head_tokens

    from .work import check_finite

    if not sampling.greedy and sampling.seed is None:
        raise ValueError("sampled generation needs a seed")
    uniforms = Uniforms(sampling.seed) if not sampling.greedy else None
    host = stages[0]

    def step(h: np.ndarray, pos: int, j: int) -> tuple[int, np.ndarray]:
        logits = host.head(h[-1:])
        check_finite(logits, f"the output head's logits for answer token {j}")
        tok = head_tokens(logits, sampling, uniforms.pairs(j, 1) if uniforms else ())[0]
        return tok, host.embed_forward([tok], pos)
    return _decode(stages, prompt_ids, max_new_tokens, stop_ids, on_token, chunk, step)
