"""One compute command carried out on a real stage: shared by the in-process room
(runtime/local_room.py) and each device process (runtime/room.py)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from planner.protocol import Draft, DraftReady, HeadFinished, RollbackKV, RunHead, RunStage, StageFinished

from .backends.base import Stage


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
        ``(event or None, residual produced or None)``. RunStage truncates the KV cache
        to the frame's first position first; the host embeds ``c.inputs`` (and runs its
        layers, if it holds any); the head returns each row's argmax (lowest id on ties).
        A worker stage or head whose residual is missing (a dropped lap) does nothing.
    Raises:
        PositionError, TypeError, ValueError: from the stage (bad positions or shapes).
    """
    cls = type(c)
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
        return StageFinished(c.device, c.lap_id), out
    if cls is RunHead:
        if residual is None:
            return None, None
        logits = stage.head(np.ascontiguousarray(residual[-c.rows:]))
        return HeadFinished(c.lap_id, tuple(int(i) for i in np.argmax(logits, axis=1))), None
    if cls is Draft:
        ctx = list(context or ())[:c.base_len] + list(c.assumed)
        return DraftReady(c.draft_id, tuple(int(t) for t in drafter(ctx, c.k))), None
    raise TypeError(f"not a compute command: {cls.__name__}")
