"""The driver kernel: the half of sans-IO that every room shares.

A room's machines (:class:`planner.chain.Chain`) take events and return commands; a
*driver* feeds them the events and carries out the commands. Every driver of this
project -- the simulator (sim/driver.py), a device process of a real room
(runtime/room.py), and the tests' in-process room and zero-time harness
(tests/local_room.py, tests/harness.py) -- does that through one :class:`Driver`:

1. an event for a device that died is dropped (:attr:`Driver.dead`);
2. the chain handles the event;
3. the event, the :class:`planner.protocol.Ignored` records it left and its commands are
   recorded (the driver's ``record``: a trace, a metrics accumulator, observers);
4. each command goes to the executor's method for its type, through the one table
   :data:`COMMAND_METHODS`.

An executor (:class:`Executor`) is what differs between rooms: simulated time and cost
models, real stages and a transport, or instant reorderable work. A new command is one
row of the table plus one method per executor.

Also here, because two drivers need them: the synthetic tokens of a room without a model
(:func:`synthetic_head`, :func:`synthetic_draft`).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from planner.chain import Chain
from planner.protocol import (AnswerDone, BeginAnswer, Command, Draft, DropFrame, EmitToken, Event, FrameArrived,
                              Ignored, LapEnded, Redeal, Refuse, RollbackKV, RunHead, RunStage, SendFrame,
                              StageFinished, Wake)


class Executor(Protocol):
    """What a room does with each command (see the module doc). Every method takes the
    command and returns nothing; what it causes comes back later as events the room's
    driver dispatches (StageFinished after a stage, FrameArrived after a frame...)."""

    def run_stage(self, c: RunStage) -> None:
        """Run ``c.device``'s layers for the lap; later ``StageFinished``."""

    def send_frame(self, c: SendFrame) -> None:
        """Carry the lap's residual from ``c.src`` to ``c.dst``; later ``FrameArrived``."""

    def run_head(self, c: RunHead) -> None:
        """The host's output head on the returned rows; later ``HeadFinished``."""

    def draft(self, c: Draft) -> None:
        """The host's drafter; later ``DraftReady``."""

    def rollback(self, c: RollbackKV) -> None:
        """Truncate ``c.device``'s KV cache for the question to ``c.to_pos`` positions."""

    def drop_frame(self, c: DropFrame) -> None:
        """``c.device`` dropped a frame: forget its residual."""

    def wake(self, c: Wake) -> None:
        """Tell phone ``c.device`` a frame is coming."""

    def redeal(self, c: Redeal) -> None:
        """Load the new chain's ranges; later ``ChainReady``."""

    def emit(self, c: EmitToken) -> None:
        """An answer token for the asker."""

    def question_ended(self, c: AnswerDone | Refuse) -> None:
        """A question ended: answered, or refused with a reason."""


class NoOpExecutor:
    """An :class:`Executor` whose every method does nothing: a base for executors that
    act on some commands only (a simulator needs no KV rollback)."""

    def run_stage(self, c: RunStage) -> None: ...
    def send_frame(self, c: SendFrame) -> None: ...
    def run_head(self, c: RunHead) -> None: ...
    def draft(self, c: Draft) -> None: ...
    def rollback(self, c: RollbackKV) -> None: ...
    def drop_frame(self, c: DropFrame) -> None: ...
    def wake(self, c: Wake) -> None: ...
    def redeal(self, c: Redeal) -> None: ...
    def emit(self, c: EmitToken) -> None: ...
    def question_ended(self, c: AnswerDone | Refuse) -> None: ...


#: command type -> the :class:`Executor` method that carries it out; None: bookkeeping
#: for the trace only (BeginAnswer, LapEnded)
COMMAND_METHODS: dict[type, str | None] = {
    RunStage: "run_stage", SendFrame: "send_frame", RunHead: "run_head", Draft: "draft", RollbackKV: "rollback",
    DropFrame: "drop_frame", Wake: "wake", Redeal: "redeal", EmitToken: "emit", AnswerDone: "question_ended",
    Refuse: "question_ended", BeginAnswer: None, LapEnded: None}

#: ``(now_s, event, commands, ignored) -> None``: what a driver keeps of one dispatch
Record = Callable[[float, Event, Sequence[Command], Sequence[Ignored]], None]


class Driver:
    """Feeds events to a :class:`planner.chain.Chain` and hands its commands to an
    :class:`Executor` (module doc).

    Args:
        chain: the room's machines (or this process's share of them).
        executor: carries the commands out.
        record: called once per dispatched event, before any command is carried out,
            with ``(now_s, event, commands, ignored records)``; None keeps nothing.
        after: called with each command after the executor carried it out (e.g. a
            device's observers); None: nothing.
    Attributes:
        dead: devices that died; ``FrameArrived`` and ``StageFinished`` events at them
            are dropped unseen (work for, or a frame to, a device that is gone).
    Raises:
        TypeError: at construction, when ``executor`` lacks a method of the table.
    """

    __slots__ = ("chain", "executor", "record", "after", "dead", "_table")

    def __init__(self, chain: Chain, executor: Executor, record: Record | None = None,
                 after: Callable[[Command], None] | None = None):
        self.chain = chain
        self.executor = executor
        self.record = record
        self.after = after
        self.dead: set[str] = set()
        table: dict[type, Callable | None] = {}
        for cls, name in COMMAND_METHODS.items():
            fn = getattr(executor, name, None) if name else None
            if name and fn is None:
                raise TypeError(f"{type(executor).__name__} has no {name}() for {cls.__name__}")
            table[cls] = fn
        self._table = table

    def dispatch(self, event: Event, now_s: float) -> list[Command]:
        """Drop ``event`` if it is at a dead device; else feed it to the chain, record
        it with what it gave, and carry the commands out in order. Returns the commands
        (``[]`` for a dropped event). Raises :class:`planner.protocol.DriverError` from the
        machines, and TypeError for a command no table row names."""
        cls = type(event)
        if self.dead and (cls is FrameArrived or cls is StageFinished) and event.device in self.dead:
            return []
        chain = self.chain
        cmds = chain.handle(event, now_s)
        ignored = chain.ignored
        if ignored:
            ignored = chain.take_ignored()
        if self.record is not None:
            self.record(now_s, event, cmds, ignored)
        table, after = self._table, self.after
        for c in cmds:
            try:
                fn = table[type(c)]
            except KeyError:
                raise TypeError(f"no executor method for {type(c).__name__}: add a row to COMMAND_METHODS") from None
            if fn is not None:
                fn(c)
            if after is not None:
                after(c)
        return cmds


def synthetic_head(truth: Callable[[int], int], first_pos: int, tokens: int, rows: int) -> tuple[int, ...]:
    """The head's tokens for a lap of a room without a model: the lap ran ``tokens``
    positions from ``first_pos``; its last ``rows`` rows predict the positions after
    them, ``truth(p)`` being the target model's greedy token at position ``p``."""
    first = first_pos + tokens - rows
    return tuple([truth(first + i + 1) for i in range(rows)])


def synthetic_draft(truth: Callable[[int], int], c: Draft, accepted: int) -> tuple[int, ...]:
    """``c.k`` drafted tokens continuing ``c.base_len`` committed and ``c.assumed``
    tokens, right (``truth``) for the first ``accepted`` and wrong (``truth + 1``) after."""
    j = c.base_len + len(c.assumed)
    return tuple([truth(j + i) + (i >= accepted) for i in range(c.k)])
