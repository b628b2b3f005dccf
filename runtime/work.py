"""One compute command carried out on a real stage: shared by each device process
(runtime/room.py) and the tests' in-process room (tests/local_room.py)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from planner.protocol import Draft, DraftReady, HeadFinished, RollbackKV, RunHead, RunStage, StageFinished
from planner.sampling import head_tokens

from .backends.base import Stage


class NumericalFault(ArithmeticError):
    """A residual or the logits hold a NaN or an infinity (the message says which and
    how many). Drivers turn it into :class:`planner.protocol.LapFailed` naming the
    device, so the question fails instead of answering with token 0."""


def nonfinite(x: np.ndarray | None) -> int:
    """How many values of ``x`` are NaN or infinite (0 for None)."""
    if x is None:
        return 0
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        return 0
    return int(x.size - np.count_nonzero(np.isfinite(x)))


def check_finite(x: np.ndarray | None, what: str) -> None:
    """Raise :class:`NumericalFault` naming ``what`` when ``x`` holds a NaN or an inf."""
    n = nonfinite(x)
    if n:
        raise NumericalFault(f"{what} has {n} NaN/inf value{'s' if n != 1 else ''} (of {np.asarray(x).size})")


def consumes_residual(c, stage: Stage) -> bool:
    """True when ``c`` needs the residual that arrived for its lap (a worker's stage, the head)."""
    return type(c) is RunHead or (type(c) is RunStage and not stage.is_host)


def run_work(stage: Stage, c, residual: np.ndarray | None, context: Sequence[int] | None,
             drafter: Callable[[Sequence[int], int], list[int]] | None):
    """Carry out ``c`` (RunStage, RunHead, Draft or RollbackKV) on ``stage``.

    Args:
        residual: ``[n, hidden]`` float32 the command consumes (see :func:`consumes_residual`).
        context: the question's prompt + committed answer ids (for Draft).
        drafter: ``(context ids, k) -> k ids`` (for Draft).
    Returns:
        ``(event or None, residual produced or None)``. RunStage and RollbackKV act on
        the KV cache of the command's ``slot`` (:meth:`Stage.use_cache`); RunStage
        truncates that cache to the frame's first position first; the host embeds ``c.inputs`` (and runs its
        layers, if it holds any); the head returns each row's argmax (lowest id on ties),
        or under sampling each row's token drawn with its uniforms
        (:func:`planner.sampling.head_tokens`; every drafter here is deterministic).
        A worker stage or head whose residual is missing (a dropped lap) does nothing.
    Raises:
        NumericalFault: the stage's output residual, or the head's logits, hold a NaN
            or an infinity (the device computing it is at fault).
        PositionError, TypeError, ValueError: from the stage (bad positions or shapes).
    """
    cls = type(c)
    if cls is RollbackKV or cls is RunStage:
        stage.use_cache(c.slot)  # the KV cache of the command's question
    if cls is RollbackKV:
        if stage.position > c.to_pos:
            stage.rollback(c.to_pos)
        return None, None
    if cls is RunStage:
        if stage.position > c.first_pos:
            stage.rollback(c.first_pos)
        if stage.is_host:
            x = stage.embed(list(c.inputs))
            out = stage.forward(x, c.first_pos) if stage.end > stage.start else x
        elif residual is None:
            return None, None
        else:
            out = stage.forward(residual, c.first_pos)
        check_finite(out, f"the residual of layers {stage.start + 1}-{stage.end} for lap {c.lap_id}"
                     if stage.end > stage.start else f"the embedding for lap {c.lap_id}")
        return StageFinished(c.device, c.lap_id), out
    if cls is RunHead:
        if residual is None:
            return None, None
        logits = stage.head(np.ascontiguousarray(residual[-c.rows:]))
        check_finite(logits, f"the output head's logits for lap {c.lap_id}")
        return HeadFinished(c.lap_id, head_tokens(logits, c.sampling, c.uniforms)), None
    if cls is Draft:
        ctx = list(context or ())[:c.base_len] + list(c.assumed)
        return DraftReady(c.draft_id, tuple(int(t) for t in drafter(ctx, c.k))), None
    raise TypeError(f"not a compute command: {cls.__name__}")
