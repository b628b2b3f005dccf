"""A worker's state machine: frame in, run my layers, frame out.

Two ways in, one behaviour. :meth:`WorkerMachine.handle` takes the events
(``FrameArrived``, ``StageFinished``) and returns commands, as every machine does. The
simulator's fast path (sim/driver.py, "Running ahead") skips building the command
objects: :meth:`WorkerMachine.accept` says what a frame does here as a :class:`Verdict`,
:meth:`WorkerMachine.release` what goes on when its stage finished. ``handle`` is
exactly ``accept`` + :meth:`WorkerMachine.commands_for`, or ``release`` made a
``SendFrame``, so both paths keep the same state.
"""

from __future__ import annotations

from enum import IntEnum

from planner.deal import Deal
from planner.frames import FrameHeader, FrameKind
from planner.protocol import (Command, DropFrame, Event, FrameArrived, Ignored, IgnoreReason, ReturnPath, RollbackKV,
                              RunStage, SendFrame, StageFinished)

_K_RETURN, _K_DECODE, _K_PREFILL = FrameKind.RETURN, FrameKind.DECODE, FrameKind.PREFILL
#: Ignored records a machine keeps until a driver takes them (planner.drive); more are dropped, oldest first
MAX_IGNORED = 1024


class Verdict(IntEnum):
    """What a frame does at a worker (:meth:`WorkerMachine.accept`)."""

    #: run the stage on it
    RUN = 0
    #: roll the KV cache back to the frame's first position, then run
    ROLLBACK_RUN = 1
    #: drop it (a stale lap, a question this stage is not serving)
    DROP = 2
    #: a RETURN frame passed on to the previous stage
    FORWARD = 3
    #: a kind a worker does not handle
    IGNORE = 4

    @property
    def is_run(self) -> bool:
        """True when the stage runs on the frame (RUN or ROLLBACK_RUN)."""
        return self <= Verdict.ROLLBACK_RUN


RUN, ROLLBACK_RUN, DROP, FORWARD, IGNORE = Verdict
_RUN, _ROLLBACK_RUN, _FORWARD, _IGNORE = (RUN, None), (ROLLBACK_RUN, None), (FORWARD, None), (IGNORE, None)


def note_ignored(sink: list, device: str, event, reason: IgnoreReason, detail: str = "") -> list:
    """Append ``Ignored(device, type(event).__name__, reason, detail)`` to ``sink`` (at
    most :data:`MAX_IGNORED` kept, the oldest dropped) and return ``[]``: no command."""
    if len(sink) >= MAX_IGNORED:
        del sink[0]
    sink.append(Ignored(device, type(event).__name__, str(reason), detail))
    return []


class WorkerMachine:
    """A worker's state machine: frame in -> run my layers -> frame out.

    ``handle(event, now_s) -> list[command]``. Keeps, for each KV cache slot a frame
    names (one per question in flight), the question it serves there and its cache
    length; a frame of a new question in a slot starts that cache empty, a frame whose first
    position is before the cache's end rolls the cache back to it (RollbackKV), and one
    whose first position lies beyond the cache's end is stale and dropped (DropFrame),
    as is any frame of a lap before ``first_lap`` (a lap of the chain before a re-deal).
    Events it takes no action on leave an :class:`planner.protocol.Ignored` record in
    ``ignored`` (a list a driver empties; see :mod:`planner.drive`).
    Raises ValueError if ``device`` holds no stage of ``deal``.
    """

    def __init__(self, device: str, deal: Deal, return_path: ReturnPath | str = ReturnPath.DIRECT,
                 first_lap: int = 0, ignored: list | None = None):
        stages = [s.device for s in deal.stages]
        if device not in stages or device == deal.host:
            raise ValueError(f"{device} is not a worker of this deal")
        self.device = device
        self.host = deal.host
        i = stages.index(device)
        self.next = stages[i + 1] if i + 1 < len(stages) else None
        self.prev = stages[i - 1] if i > 0 else deal.host
        self.return_path = ReturnPath(return_path)
        self.first_lap = first_lap
        self.slot_question: dict[int, int] = {}  # KV cache slot -> the question it serves
        self.slot_kv: dict[int, int] = {}  # KV cache slot -> positions it holds
        self.pending: dict[int, FrameHeader] = {}
        self.ignored: list = [] if ignored is None else ignored

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Feed one event; returns the commands to carry out: RunStage (maybe after
        RollbackKV), DropFrame, or a SendFrame on."""
        cls = type(event)
        if (cls is FrameArrived or cls is StageFinished) and event.device == self.device:
            if cls is FrameArrived:
                h = event.header
                verdict, reason = self.accept(h)
                if verdict is IGNORE:
                    return note_ignored(self.ignored, self.device, event, IgnoreReason.BUG,
                                        f"a {FrameKind(h.kind).name} frame at a worker (lap {h.lap_id})")
                return self.commands_for(h, verdict, reason)
            if event.lap_id not in self.pending:
                return note_ignored(self.ignored, self.device, event, IgnoreReason.STALE,
                                    f"no frame of lap {event.lap_id} pending here")
            out = self.release(event.lap_id)
            return [] if out is None else [SendFrame(self.device, out[0], out[1])]
        return note_ignored(self.ignored, self.device, event, IgnoreReason.BUG, "not an event for this worker")

    def accept(self, h: FrameHeader) -> tuple[Verdict, str | None]:
        """The fast path's first half: take frame ``h`` (updating the cache length and the
        frames pending) and say what it does here, without building commands.

        Returns ``(verdict, reason)``: ``RUN`` run the stage; ``ROLLBACK_RUN`` roll the
        cache back to ``h.first_pos``, then run; ``DROP`` with the reason; ``FORWARD`` a
        RETURN frame passed on to the previous stage; ``IGNORE`` a kind a worker does not
        handle. :meth:`commands_for` turns it into the commands ``handle`` returns."""
        if h.lap_id < self.first_lap:
            return DROP, f"lap {h.lap_id} is from before the re-deal"
        kind = h.kind
        if kind == _K_RETURN:
            return _FORWARD
        if kind != _K_DECODE and kind != _K_PREFILL:
            return _IGNORE
        slot = h.slot
        kv = self.slot_kv.get(slot, 0)
        if h.question_id != self.slot_question.get(slot):
            if h.first_pos != 0:  # a question always starts with a prefill frame at position 0
                return DROP, "frame of a question this stage is not serving"
            self.slot_question[slot] = h.question_id
            kv = 0
        first = h.first_pos
        if first > kv:
            self.slot_kv[slot] = kv
            return DROP, f"stale: starts at {first}, cache holds {kv}"
        self.slot_kv[slot] = first + h.tokens
        self.pending[h.lap_id] = h
        return _ROLLBACK_RUN if first < kv else _RUN

    def commands_for(self, h: FrameHeader, verdict: Verdict, reason: str | None) -> list[Command]:
        """The commands of :meth:`accept`'s answer ``(verdict, reason)`` for frame ``h``."""
        if verdict is RUN:
            return [RunStage(self.device, h.lap_id, h.question_id, h.first_pos, h.tokens, (), h.slot)]
        if verdict is ROLLBACK_RUN:
            return [RollbackKV(self.device, h.question_id, h.first_pos, h.slot),
                    RunStage(self.device, h.lap_id, h.question_id, h.first_pos, h.tokens, (), h.slot)]
        if verdict is DROP:
            return [DropFrame(self.device, h, reason or "")]
        if verdict is FORWARD:
            return [SendFrame(self.device, self.prev, h)]
        return []

    def release(self, lap_id: int) -> tuple[str, FrameHeader] | None:
        """The fast path's second half: lap ``lap_id``'s stage finished. Returns
        ``(destination, header)`` of the frame to send on (the next stage, or the host /
        previous stage with a RESULT / RETURN header), or None (no such frame pending,
        or a prefill chunk that does not return). ``handle`` makes it a SendFrame."""
        h = self.pending.pop(lap_id, None)
        if h is None:
            return None
        if self.next is not None:
            return self.next, h
        if not h.returns:
            return None
        if self.return_path == ReturnPath.DIRECT or self.prev == self.host:
            return self.host, h.with_kind(FrameKind.RESULT)
        return self.prev, h.with_kind(FrameKind.RETURN)
