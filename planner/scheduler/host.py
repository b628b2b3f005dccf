"""The model host's state machine.

Events in, commands out, time passed in (sans-IO, in the style of h11). The same object
runs in the simulator, in every device process of a real room and in the tests' rooms,
behind :class:`planner.chain.Chain`.

States (:class:`HostState`, held in one attribute): ``IDLE`` (no question), ``FILLING``
(a prompt's prefill, or the replay after a re-deal, still going through the chain, for
every question answered), ``DECODING`` (decode or verify laps), ``RECOVERING`` (a re-deal
announced, waiting for ChainReady), ``STOPPED`` (the room cannot answer any more: final).
:data:`TRANSITIONS` is the literal table, in the manner of h11's
``EVENT_TRIGGERED_TRANSITIONS``: for each state, the event types it has a transition for
and the states the host may be in once it is handled. :data:`HostScheduler.HANDLERS`
is the one table from event type to handler. An event type missing from its state's row
has no transition there and goes to :data:`HostScheduler.MISSES`, which, as h11 does for
each side, tells the two kinds of miss apart: one that only the driver's own mistake can
produce raises :class:`planner.protocol.DriverError`; a peer's late or unknown event (a
stale lap, a frame of the chain before a re-deal, a Fault naming a lap never launched)
leaves an :class:`planner.protocol.Ignored` record with its reason and no command. A
handler that finds the same inside a transition (a lap of the question answered that
is over) hands it to the same miss.

What the model host does per question (product pages 001 and 002):

* **Prefill** in pipelined chunks of ``prefill_chunk`` tokens: as soon as the host's own
  stage has finished chunk i, chunk i's frame goes to the next stage and chunk i+1
  enters the host's stage. Only the last chunk's residual comes back; the output head
  runs on its last row and gives the first answer token.
* **Plain decode**: one token per lap (embed, every stage, back, head, sample).
* **Speculative decode** (``draft_tokens`` k > 0): the host drafts k tokens; one lap
  verifies k+1 positions; the longest prefix of drafts equal to the head's tokens is
  kept, plus the head's own next token (the correction, or a bonus token when all k
  were accepted), so the text equals plain greedy decoding (Leviathan et al., "Fast
  Inference from Transformers via Speculative Decoding", 2023). With
  ``config.draft_policy`` (``draft_tokens: auto``) each question's
  :class:`planner.draft_policy.DraftState` chooses every lap's k (0: a plain lap) and
  hears every judged lap's accepted length.
* **Sampling** (a question's :class:`planner.sampling.Sampling`, temperature > 0): each
  question gets a seeded :class:`planner.sampling.Uniforms` stream; every RunHead
  carries the uniform pairs of the answer tokens its rows decide, and the head draws
  each row's token with them. The judge above is then the speculative sampling rule
  for a deterministic drafter (draw from p, keep the draft when the draw equals it),
  so the answer keeps the target distribution, and a seed gives one answer with or
  without speculation, split or not (see :mod:`planner.sampling`).
* **Numerical faults**: :class:`LapFailed` (a NaN or inf in a residual, found by a
  driver) fails the question its lap belongs to, naming the device; the next begins.
* **Async laps** (``async_laps`` N > 1): up to N verify laps in flight. The next lap is
  launched assuming the previous one is accepted in full: its k+1 inputs are drafted
  continuing the earlier drafts (the first guessing the bonus token). A rejection makes
  every later lap in flight stale; they are discarded when they come back.
* **KV rollback**: every frame carries the position of its first token; a stage first
  truncates its KV cache to that position (so rejected positions are rolled back by the
  next frame), and drops a frame whose first position lies beyond its cache (a stale
  lap launched before a rejection).
* **Return path**: ``direct`` (the last stage sends to the host) or ``via_stages``.
* **Queue**: ``questions_in_flight`` questions answered at once (1 by default: product
  page 001's one at a time); up to 10 more wait, at most 2 per device (product page
  001); the 11th or a device's 3rd is refused with a reason. An asker that withdraws a
  question (QuestionWithdrawn: it went away) frees its place.
* **Several questions in flight** (``questions_in_flight`` N > 1, at most the deal's
  ``kv_caches``): each question answered holds a KV cache slot (0 .. N-1, the lowest
  free when it begins) on every stage, named by each of its frames, and runs its own
  laps exactly as it would alone (prefill, decode or verify, async laps, rollback);
  their laps interleave through the chain, so while one question's lap is at a worker
  another's runs on the host. A question that ends frees its slot for the next waiting
  one. Nothing of one question's laps depends on another's, so each answer is the one
  it would be alone.
* **Phone GPU wake**: at the start of each lap the host tells every phone that holds
  layers that a frame is coming (at most 50 ms of busy-keeping; product page 001).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Sequence

from planner.deal import Deal
from planner.draft_policy import DraftState
from planner.frames import MAX_SLOTS, FrameHeader, FrameKind
from planner.hops import Measured, StageSpeeds
from planner.protocol import (AnswerDone, BeginAnswer, ChainReady, Command, DeviceBack, DeviceLost, Draft, DraftReady, DriverError,
                              EmitToken, Event, FrameArrived, HeadFinished, IgnoreReason, LapEnded, LapFailed, LapKind,
                              QuestionAsked, QuestionWithdrawn, Redeal, Refuse, RollbackKV, RunHead, RunStage,
                              SendFrame, StageFinished, Wake)
from planner.sampling import GREEDY, Sampling, Uniforms
from planner.scheduler.config import (MAX_WAITING, MAX_WAITING_PER_DEVICE, SEEN_QUESTIONS, WAKE_MAX_S,
                                      SchedulerConfig)
from planner.scheduler.worker import note_ignored

_STALE, _UNKNOWN, _REPEATED, _BUG = IgnoreReason.STALE, IgnoreReason.UNKNOWN, IgnoreReason.REPEATED, IgnoreReason.BUG



def in_flight_limit(config, deal: Deal) -> int:
    """Most questions a room answers at once: ``config.questions_in_flight`` (a
    SchedulerConfig), no more than the KV caches every stage of ``deal`` holds
    (``deal.kv_caches``; None or 0: not counted), nor :data:`planner.frames.MAX_SLOTS`;
    at least 1. What the host's scheduler runs with, known before any device loads."""
    return max(1, min(config.questions_in_flight, MAX_SLOTS, deal.kv_caches if deal.kv_caches else MAX_SLOTS))


class HostState(StrEnum):
    """What the model host is doing (see the module doc and :data:`TRANSITIONS`)."""

    IDLE = "idle"
    FILLING = "filling"
    DECODING = "decoding"
    RECOVERING = "recovering"
    STOPPED = "stopped"


IDLE, FILLING, DECODING, RECOVERING, STOPPED = HostState
#: the states in which the host takes questions; which one it is follows from the
#: questions answered (none: IDLE; every one still filling: FILLING; else DECODING)
OPEN = frozenset({IDLE, FILLING, DECODING})

#: state -> event type -> the states the host may be in once it has handled the event.
#: An event type missing from a state's row has no transition there
#: (:data:`HostScheduler.MISSES`). :meth:`HostScheduler.handle` raises RuntimeError if a
#: handler leaves the host in a state its row does not name.
TRANSITIONS: dict[HostState, dict[type, frozenset[HostState]]] = {
    IDLE: {
        QuestionAsked: frozenset({IDLE, FILLING}),
        StageFinished: frozenset({IDLE}),  # a chunk of a question that ended still goes on
        FrameArrived: frozenset({IDLE}),
        HeadFinished: frozenset({IDLE}),
        DeviceLost: frozenset({IDLE, RECOVERING, STOPPED}),
        DeviceBack: frozenset({IDLE, RECOVERING}),
    },
    FILLING: {
        QuestionAsked: frozenset({FILLING}),
        StageFinished: frozenset({FILLING}),
        FrameArrived: frozenset({FILLING}),
        HeadFinished: frozenset({IDLE, FILLING, DECODING}),
        DeviceLost: frozenset({IDLE, FILLING, RECOVERING, STOPPED}),
        DeviceBack: frozenset({FILLING, RECOVERING}),
        QuestionWithdrawn: frozenset({IDLE, FILLING}),
        LapFailed: frozenset({IDLE, FILLING}),
    },
    DECODING: {
        QuestionAsked: frozenset({DECODING}),
        StageFinished: frozenset({DECODING}),
        FrameArrived: frozenset({DECODING}),
        HeadFinished: frozenset({IDLE, FILLING, DECODING}),
        DraftReady: frozenset({IDLE, FILLING, DECODING}),
        DeviceLost: frozenset({IDLE, FILLING, DECODING, RECOVERING, STOPPED}),
        DeviceBack: frozenset({DECODING, RECOVERING}),
        QuestionWithdrawn: frozenset({IDLE, FILLING, DECODING}),
        LapFailed: frozenset({IDLE, FILLING, DECODING}),
    },
    RECOVERING: {
        QuestionAsked: frozenset({RECOVERING}),
        DeviceLost: frozenset({RECOVERING, STOPPED}),
        DeviceBack: frozenset({RECOVERING}),
        ChainReady: frozenset({IDLE, FILLING, RECOVERING}),  # RECOVERING: the ChainReady of an earlier re-deal
        QuestionWithdrawn: frozenset({RECOVERING}),
    },
    STOPPED: {
        QuestionAsked: frozenset({STOPPED}),  # refused with the reason
        StageFinished: frozenset({STOPPED}),
        FrameArrived: frozenset({STOPPED}),
        HeadFinished: frozenset({STOPPED}),
        DeviceLost: frozenset({STOPPED}),
    },
}


@dataclass
class _Lap:
    lap_id: int
    question_id: int
    kind: LapKind
    first_pos: int
    inputs: tuple[int, ...]
    returns: bool
    stale: bool = False
    predictions: tuple[int, ...] | None = None
    back: bool = False  # its frame came back to the host
    sent: bool = False  # the host's stage finished it (a prefill chunk that does not return is then done here)
    slot: int = 0  # its question's KV cache slot


@dataclass
class _Question:
    question_id: int
    device: str
    seq: list[int]
    prompt_len: int
    max_new: int
    fill_len: int = 0  # tokens the prefill (or, after a re-deal, the replay) runs through the chain
    generated: int = 0
    next_chunk: int = 0
    assumed: list[int] = field(default_factory=list)
    drafting: int | None = None  # draft id outstanding
    done: bool = False
    reason: str = "length"
    sampling: Sampling = GREEDY
    uniforms: Uniforms | None = None  # the question's random stream (sampling only)
    draft: DraftState | None = None  # draft_tokens: auto (planner.draft_policy)
    filling: bool = True  # the prefill (or the replay) has not given its token yet
    slot: int = 0  # its KV cache on every stage (frames carry it)
    inflight: deque = field(default_factory=deque)  # its decode/verify laps not yet judged, in launch order


class HostScheduler:
    """The model host's state machine.

    ``handle(event, now_s) -> list[command]``; ``now_s`` is seconds on the driver's
    clock (only passed through: the scheduler keeps no timers; the room's liveness
    timers are :class:`planner.liveness.Liveness`). Raises ValueError for a deal whose
    host range is not first in the chain (the chain starts at the host).

    Any well-typed event in any order a room of honest peers can produce is taken: one
    the host takes no action on (a lap made stale, a frame of the chain before a
    re-deal, a peer's frame naming an unknown lap) appends an
    :class:`planner.protocol.Ignored` record to ``ignored`` (a list a driver empties).
    Raises :class:`planner.protocol.DriverError` for an event only a wrong driver can
    produce: ``HeadFinished`` or the host's own ``StageFinished`` for a lap never
    launched, ``HeadFinished`` for a lap given no RunHead, ``DraftReady`` for a draft
    never asked for. Which events each state has a transition for is
    :data:`TRANSITIONS`; the rest are :data:`MISSES`.

    The question ids of the latest :data:`SEEN_QUESTIONS` questions are kept, so a
    repeated id is refused; a long-lived host's memory stays bounded.

    Recovery: with ``redeal`` (``(deal, lost devices) -> new deal``, raising ValueError
    when the rest of the room cannot hold the model; see :mod:`planner.chain`), a worker
    of the chain that is lost no longer ends the room. The host forgets every lap in
    flight, returns :class:`Redeal` with the new chain, waits for :class:`ChainReady`,
    then replays every question in flight, each its prompt and answer so far from
    position 0 in its own slot (replay laps, prefill chunks), so every stage's KV cache
    covers exactly the positions so far; each replay's head gives that question's next
    token and its answer goes on. When the re-deal holds fewer questions' caches
    (``Deal.kv_caches``) than are in flight, the ones begun last are refused with the
    reason, and the others keep going. Questions waiting
    keep their places; questions asked meanwhile wait. Without ``redeal`` (or when the
    host itself is lost, or the re-deal fails) the host refuses what it cannot answer
    and stops, with the reason.

    Rejoin: :class:`DeviceBack` takes a lost device out of :attr:`lost`. With ``rejoin``
    (``(deal, devices still lost, what the room measured) -> the deal to move to, or None
    to stay``; see :func:`planner.chain.rejoin_rule`; the measurements are ``speeds``'
    :meth:`planner.hops.StageSpeeds.measured`, none without it) the host then re-deals it
    back into the chain through the same path as a loss (:class:`Redeal` with ``back`` set and ``lost``
    empty, then ChainReady and the replay), when the rule says so; otherwise the device
    waits outside the chain. A room that has stopped stays stopped (Ignored, stale).
    """

    def __init__(self, deal: Deal, config: SchedulerConfig,
                 redeal: Callable[[Deal, frozenset[str]], Deal] | None = None, ignored: list | None = None,
                 rejoin: Callable[[Deal, frozenset[str], Measured], Deal | None] | None = None,
                 speeds: StageSpeeds | None = None):
        self.config = config
        self.ignored: list = [] if ignored is None else ignored
        self.host = deal.host
        self.redeal = redeal
        self.rejoin = rejoin
        self.speeds = speeds
        self.lost: set[str] = set()
        self._state = IDLE
        self._stop_reason = ""
        self._redeal_lap = -1  # the first lap of the chain re-dealt last (RECOVERING waits for its ChainReady)
        self._set_deal(deal)
        self.queue: deque[QuestionAsked] = deque()
        self.active: dict[int, _Question] = {}  # question id -> question being answered, in the order begun
        self.laps: dict[int, _Lap] = {}
        self._next_lap = 0
        self._next_draft = 0
        self.seen_questions: set[int] = set()  # the ids of the latest SEEN_QUESTIONS questions
        self._seen_order: deque[int] = deque()
        # counters (also derivable from the trace)
        self.emitted = 0
        self.accepted = 0

    def _set_deal(self, deal: Deal) -> None:
        stages = list(deal.stages)
        #: most questions answered at once: the setting, no more than the deal's KV caches
        self.questions_in_flight = in_flight_limit(self.config, deal)
        if any(s.device == self.host for s in stages[1:]):
            raise ValueError("the model host's range must be the first stage of the chain")
        self.deal = deal
        self.host_holds_layers = bool(stages) and stages[0].device == self.host
        self.workers = [s.device for s in stages if s.device != self.host]
        self.wake_targets = [d for d in self.workers if d in self.config.phones] if self.config.wake else []

    # -- public ---------------------------------------------------------------------

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Feed one event; returns the commands to carry out, in order. An event with no
        transition in the current state (:data:`TRANSITIONS`) goes to its miss
        (:data:`MISSES`): an Ignored record and ``[]``, or DriverError. Raises TypeError
        for an object that is not an event of :mod:`planner.protocol`, and RuntimeError if
        a handler left the host in a state :data:`TRANSITIONS` does not allow (a fault of
        this class, never of the driver)."""
        cls = type(event)
        before = self._state
        after = TRANSITIONS[before].get(cls)
        if after is None:
            miss = self.MISSES.get(cls)
            if miss is None:
                raise TypeError(f"not a scheduler event: {cls.__name__}")
            return miss(self, event)
        cmds = self.HANDLERS[cls](self, event)
        if self._state in OPEN:
            self._settle()
        if self._state not in after:
            raise RuntimeError(f"the host went from {before} to {self._state} on {cls.__name__}, "
                               "which TRANSITIONS does not allow")
        return cmds

    @property
    def state(self) -> HostState:
        """What the host is doing now (:class:`HostState`)."""
        return self._state

    @property
    def stopped(self) -> str | None:
        """Why the room stopped (the first reason), or None while it has not."""
        return self._stop_reason if self._state is STOPPED else None

    @property
    def recovering(self) -> int | None:
        """The first lap of the re-dealt chain while its ChainReady is awaited, else None."""
        return self._redeal_lap if self._state is RECOVERING else None

    def _settle(self) -> None:
        """The open state the questions answered make (see :data:`OPEN`)."""
        state = IDLE
        for q in self.active.values():
            if not q.filling:
                state = DECODING
                break
            state = FILLING
        self._state = state

    def _ignore(self, event, reason: IgnoreReason, detail: str = "") -> list:
        return note_ignored(self.ignored, self.host, event, reason, detail)

    def _launched(self, lap_id: int) -> bool:
        return 0 <= lap_id < self._next_lap

    @property
    def busy(self) -> bool:
        """True while a question is being answered."""
        return bool(self.active)

    @property
    def in_flight(self) -> int:
        """Questions being answered now (0 .. :attr:`questions_in_flight`)."""
        return len(self.active)

    @property
    def inflight(self) -> list[int]:
        """The decode/verify laps not yet judged, of every question in flight."""
        return [i for q in self.active.values() for i in q.inflight]

    def _full(self) -> bool:
        """No question can begin now: every slot taken, or a re-deal under way."""
        return len(self.active) >= self.questions_in_flight or self._state is RECOVERING

    # -- queue ----------------------------------------------------------------------

    def _asked(self, ev: QuestionAsked) -> list:
        refuse = None
        if ev.question_id in self.seen_questions:
            refuse = f"question id {ev.question_id} was already asked"
        elif self._state is STOPPED:
            refuse = self._stop_reason
        elif not ev.prompt:
            refuse = "empty prompt"
        elif ev.max_new_tokens < 1:
            refuse = "asks for no answer tokens"
        elif self.config.context is not None and len(ev.prompt) + ev.max_new_tokens > self.config.context:
            refuse = (f"does not fit the context: a prompt of {len(ev.prompt)} tokens + {ev.max_new_tokens} "
                      f"answer tokens > {self.config.context} positions")
        elif self._full():
            if len(self.queue) >= MAX_WAITING:
                refuse = f"queue full: {MAX_WAITING} questions are waiting"
            elif sum(1 for q in self.queue if q.device == ev.device) >= MAX_WAITING_PER_DEVICE:
                refuse = f"{ev.device} already has {MAX_WAITING_PER_DEVICE} questions waiting"
        self._remember(ev.question_id)
        if refuse:
            return [Refuse(ev.question_id, ev.device, refuse)]
        if self._full():
            self.queue.append(ev)
            return []
        return self._begin(ev)

    def _remember(self, question_id: int) -> None:
        """Keep ``question_id`` among the latest :data:`SEEN_QUESTIONS` asked."""
        if question_id in self.seen_questions:
            return
        self.seen_questions.add(question_id)
        self._seen_order.append(question_id)
        if len(self._seen_order) > SEEN_QUESTIONS:
            self.seen_questions.discard(self._seen_order.popleft())

    def _withdrawn(self, ev: QuestionWithdrawn) -> list:
        """The asker withdrew ``ev.question_id``: a waiting one leaves the queue (its
        place is free), the active one ends now and the next begins."""
        for w in self.queue:
            if w.question_id == ev.question_id:
                self.queue.remove(w)
                return [Refuse(w.question_id, w.device, "withdrawn by the asker")]
        q = self.active.get(ev.question_id)
        if q is None:
            return self._miss_withdrawn(ev)
        q.done = True
        q.reason = "withdrawn"
        return self._finish(q)

    def _begin(self, ev: QuestionAsked) -> list:
        sampling = ev.sampling if isinstance(ev.sampling, Sampling) else self.config.sampling
        q = _Question(ev.question_id, ev.device, list(ev.prompt), len(ev.prompt), ev.max_new_tokens,
                      fill_len=len(ev.prompt), sampling=sampling)
        if not sampling.greedy:  # no seed: the question id's stream (drivers give one)
            q.uniforms = Uniforms(sampling.seed if sampling.seed is not None else abs(ev.question_id))
        if self.config.draft_policy is not None:
            q.draft = self.config.draft_policy.start()
        taken = {a.slot for a in self.active.values()}
        q.slot = min(i for i in range(self.questions_in_flight + 1) if i not in taken)
        self.active[q.question_id] = q
        cmds: list = [BeginAnswer(q.question_id, q.device, q.prompt_len)]
        cmds += self._launch_prefill_chunk(q)
        return cmds

    def _end_question(self, q: _Question) -> list:
        """``q`` is no longer answered (answered, refused or withdrawn; its laps in
        flight already dropped): its slot is free and the next waiting questions begin."""
        for lap_id in [i for i, lap in self.laps.items()
                       if lap.question_id == q.question_id and lap.sent and not lap.returns]:
            del self.laps[lap_id]  # its prefill chunks that never come back
        self.active.pop(q.question_id, None)
        return self._next_question()

    def _next_question(self) -> list:
        """Begin waiting questions while slots are free."""
        cmds: list = []
        while self.queue and not self._full():
            cmds += self._begin(self.queue.popleft())
        return cmds

    # -- laps -----------------------------------------------------------------------

    def _new_lap(self, q: _Question, kind: LapKind, first_pos: int, inputs: Sequence[int], returns: bool) -> _Lap:
        lap = _Lap(self._next_lap, q.question_id, kind, first_pos, tuple(inputs), returns, slot=q.slot)
        self._next_lap += 1
        self.laps[lap.lap_id] = lap
        return lap

    def _run_host_stage(self, lap: _Lap) -> list:
        cmds: list = [Wake(d, lap.lap_id, WAKE_MAX_S) for d in self.wake_targets]
        cmds.append(RunStage(self.host, lap.lap_id, lap.question_id, lap.first_pos, len(lap.inputs), lap.inputs,
                             lap.slot))
        return cmds

    def _launch_prefill_chunk(self, q: _Question) -> list:
        start = q.next_chunk
        end = min(start + self.config.prefill_chunk, q.fill_len)
        q.next_chunk = end
        kind = LapKind.PREFILL if q.generated == 0 else LapKind.REPLAY
        lap = self._new_lap(q, kind, start, q.seq[start:end], returns=end == q.fill_len)
        return self._run_host_stage(lap)

    def _header(self, lap: _Lap, kind: FrameKind) -> FrameHeader:
        return FrameHeader(kind, lap.question_id, lap.lap_id, lap.first_pos, len(lap.inputs), self.config.hidden,
                           self.config.dtype, lap.returns, lap.slot)

    def _stage_finished(self, ev: StageFinished) -> list:
        lap = self.laps.get(ev.lap_id) if ev.device == self.host else None
        if lap is None:
            return self._miss_stage(ev)
        if self._state is STOPPED:  # its question was refused: nothing goes on to the chain, the lap is over
            return self._end_lap(lap, stale=True)
        lap.sent = True
        cmds: list = []
        if self.workers:
            kind = FrameKind.PREFILL if lap.kind in (LapKind.PREFILL, LapKind.REPLAY) else FrameKind.DECODE
            cmds.append(SendFrame(self.host, self.workers[0], self._header(lap, kind)))
        elif lap.returns:  # the host holds every layer: the residual is already here
            cmds += self._returned(lap)
        q = self.active.get(lap.question_id)
        mine = q is not None
        if lap.kind in _FILL_KINDS and mine and q.next_chunk < q.fill_len:
            cmds += self._launch_prefill_chunk(q)
        if not lap.returns and not mine:  # a chunk of a question that ended: nothing more comes of it
            del self.laps[lap.lap_id]
        return cmds

    def _frame_back(self, ev: FrameArrived) -> list:
        h = ev.header
        lap = (self.laps.get(h.lap_id) if ev.device == self.host and (h.kind == FrameKind.RESULT
                                                                        or h.kind == FrameKind.RETURN) else None)
        if lap is None:
            return self._miss_frame(ev)
        if lap.back:
            return self._ignore(ev, _BUG, f"lap {h.lap_id} came back twice")
        return self._returned(lap)

    def _returned(self, lap: _Lap) -> list:
        lap.back = True
        q = self.active.get(lap.question_id)
        if lap.stale or q is None:
            return self._end_lap(lap, stale=True)
        rows = 1 if lap.kind in (LapKind.PREFILL, LapKind.REPLAY) else len(lap.inputs)
        if q.uniforms is None:
            return [RunHead(lap.lap_id, lap.question_id, rows)]
        # row r predicts sequence position first_pos + len(inputs) - rows + r + 1: that
        # answer token's pair decides it, whichever lap it lands in
        first = lap.first_pos + len(lap.inputs) - rows + 1 - q.prompt_len
        return [RunHead(lap.lap_id, lap.question_id, rows, q.sampling, q.uniforms.pairs(first, rows))]

    def _end_lap(self, lap: _Lap, stale: bool, kept: int = 0) -> list:
        self.laps.pop(lap.lap_id, None)
        q = self.active.get(lap.question_id)
        if q is not None and lap.lap_id in q.inflight:
            q.inflight.remove(lap.lap_id)
        drafted = len(lap.inputs) - 1 if lap.kind == LapKind.VERIFY else 0
        return [LapEnded(lap.lap_id, lap.question_id, lap.kind, drafted, kept, stale)]

    # -- head results ---------------------------------------------------------------

    def _head_finished(self, ev: HeadFinished) -> list:
        lap = self.laps.get(ev.lap_id)
        if lap is None:
            return self._miss_head(ev)
        if not lap.back:  # no RunHead was given for it
            raise DriverError(f"HeadFinished for lap {ev.lap_id}, whose frame has not come back to the host")
        q = self.active.get(lap.question_id)
        if lap.predictions is not None:
            return self._ignore(ev, _BUG, f"a second head result for lap {ev.lap_id}")
        if q is None or lap.stale:
            return self._end_lap(lap, stale=True)
        if not ev.predictions:  # the lap ends stale with its question (a prompt lap is in no inflight list)
            cmds = [] if lap.lap_id in q.inflight else self._end_lap(lap, stale=True)
            return cmds + self._abort(q, f"the output head returned no prediction for lap {lap.lap_id}")
        lap.predictions = tuple(ev.predictions)
        if lap.kind in (LapKind.PREFILL, LapKind.REPLAY):
            q.filling = False
            cmds = self._end_lap(lap, stale=False, kept=1)
            cmds += self._commit(q, [lap.predictions[-1]])
            return cmds + self._after_commit(q)
        cmds = []
        # judge laps in launch order; a later lap's result waits for its predecessors
        while q.inflight:
            head = self.laps.get(q.inflight[0])
            if head is None:
                q.inflight.popleft()
                continue
            if head.predictions is None:
                break
            cmds += self._judge(q, head)
            if q.done:
                break
        if q.done:
            return cmds + self._finish(q)
        return cmds + self._after_commit(q)

    def _judge(self, q: _Question, lap: _Lap) -> list:
        x, y = lap.inputs, lap.predictions
        valid = lap.first_pos == len(q.seq) - 1 and x[0] == q.seq[-1] and not lap.stale
        if not valid:
            return self._end_lap(lap, stale=True)
        a = 0
        while a < len(x) - 1 and a < len(y) and y[a] == x[a + 1]:
            a += 1
        new = list(x[1:a + 1]) + ([y[a]] if a < len(y) else [])
        cmds = self._end_lap(lap, stale=False, kept=len(new))
        self.accepted += a
        if q.draft is not None:
            q.draft.observe(len(x) - 1, a)
        # the assumed continuation survives only if it starts with what was committed
        if q.assumed[:len(new)] == new:
            del q.assumed[:len(new)]
        else:
            cmds += self._discard_assumed(q)
            if a < len(x) - 1:
                cmds.append(RollbackKV(self.host, q.question_id, lap.first_pos + a + 1, q.slot))
        cmds += self._commit(q, new)
        return cmds

    def _discard_assumed(self, q: _Question) -> list:
        """Forget the assumed continuation; every lap still in flight is stale."""
        q.assumed.clear()
        q.drafting = None
        return self._drop_inflight(q)

    def _drop_inflight(self, q: _Question) -> list:
        """Every decode/verify lap of ``q`` still in flight is stale."""
        cmds: list = []
        for lap_id in list(q.inflight):
            lap = self.laps[lap_id]
            lap.stale = True
            cmds += self._end_lap(lap, stale=True)
        return cmds

    def _commit(self, q: _Question, tokens: Sequence[int]) -> list:
        cmds = []
        for t in tokens:
            if q.generated >= q.max_new:
                q.done = True
                break
            if (self.config.eos_token is not None and t == self.config.eos_token) or t in self.config.stop_tokens:
                q.done = True
                q.reason = "eos"
                break
            q.seq.append(t)
            q.generated += 1
            self.emitted += 1
            cmds.append(EmitToken(q.question_id, q.device, q.generated - 1, t))
        if q.generated >= q.max_new:
            q.done = True
        return cmds

    def _finish(self, q: _Question) -> list:
        cmds = self._drop_inflight(q) + [AnswerDone(q.question_id, q.device, q.generated, q.reason)]
        return cmds + self._end_question(q)

    def _after_commit(self, q: _Question) -> list:
        if q.done:
            return self._finish(q)
        return self._fill_pipeline(q)

    # -- decode launching -----------------------------------------------------------

    def _fill_pipeline(self, q: _Question) -> list:
        k = self.config.draft_tokens if q.draft is None else q.draft.choose(self._positions_left(q))
        if k == 0:
            if q.inflight or q.drafting is not None:
                return []
            pre = self._discard_assumed(q) if q.assumed else []  # an adaptive question going plain
            if q.draft is not None:
                q.draft.plain_lap()
            lap = self._new_lap(q, LapKind.DECODE, len(q.seq) - 1, (q.seq[-1],), returns=True)
            q.inflight.append(lap.lap_id)
            return pre + self._run_host_stage(lap)
        if q.drafting is not None:
            return []
        live = 0
        laps = self.laps
        for i in q.inflight:
            if not laps[i].stale:
                live += 1
        if live >= self.config.async_laps:
            return []
        cmds: list = []
        if live == 0 and q.assumed:
            cmds += self._discard_assumed(q)
        n = min(k if not q.assumed else k + 1, self._positions_left(q))
        if n < 1:  # the laps in flight already reach the end of the context
            return cmds
        d = Draft(self._next_draft, q.question_id, len(q.seq), tuple(q.assumed), n)
        self._next_draft += 1
        q.drafting = d.draft_id
        return cmds + [d]

    def _positions_left(self, q: _Question) -> int:
        """Drafted tokens that still fit the context after the committed and assumed ones."""
        if self.config.context is None:
            return 1 << 62
        return self.config.context - len(q.seq) - len(q.assumed)

    def _draft_ready(self, ev: DraftReady) -> list:
        q = next((a for a in self.active.values() if a.drafting == ev.draft_id), None)
        if q is None:
            return self._miss_draft(ev)
        q.drafting = None
        if not ev.tokens:
            return self._abort(q, "the drafter returned no tokens")
        tokens = tuple(ev.tokens)[:self._positions_left(q)]  # a drafter that sent more than asked
        if not tokens:
            return self._fill_pipeline(q)
        sync = not q.assumed
        if sync:
            first_pos = len(q.seq) - 1
            inputs = (q.seq[-1],) + tokens
        else:
            first_pos = len(q.seq) + len(q.assumed)
            inputs = tokens
        q.assumed.extend(tokens)
        lap = self._new_lap(q, LapKind.VERIFY, first_pos, inputs, returns=True)
        q.inflight.append(lap.lap_id)
        return self._run_host_stage(lap) + self._fill_pipeline(q)

    # -- failures -------------------------------------------------------------------

    def _lap_failed(self, ev: LapFailed) -> list:
        """A residual of ``ev.lap_id`` went bad (NaN/inf): its question fails, naming the
        device; laps of other questions, stale laps and unknown ones are ignored."""
        lap = self.laps.get(ev.lap_id)
        q = self.active.get(lap.question_id) if lap is not None and not lap.stale else None
        if q is None:
            return self._miss_lap_failed(ev)
        cmds = [] if lap.lap_id in q.inflight else self._end_lap(lap, stale=True)  # it will not come back
        return cmds + self._abort(q, f"numerical fault on {ev.device}: {ev.reason}")

    def _abort(self, q: _Question, reason: str) -> list:
        """Refuse ``q`` with ``reason`` mid-answer; the next waiting question begins."""
        cmds: list = [Refuse(q.question_id, q.device, reason)] + self._drop_inflight(q)
        return cmds + self._end_question(q)

    def _lost(self, ev: DeviceLost) -> list:
        dev = ev.device
        if dev in self.lost:
            return self._ignore(ev, _REPEATED, f"{dev} was already lost")
        if self._state is STOPPED:  # nothing is left to refuse or re-deal
            self.lost.add(dev)
            return self._ignore(ev, _STALE, f"the room has stopped: {self._stop_reason}")
        in_chain = dev == self.host or dev in self.workers
        if in_chain and dev != self.host and self.redeal is not None:
            try:
                new = self.redeal(self.deal, frozenset(self.lost | {dev}))
                self._check_redeal(new, frozenset(self.lost | {dev}))
            except ValueError as e:
                self.lost.add(dev)
                return self._stop(f"{dev} left the room and the others cannot take its layers: {e}")
            self.lost.add(dev)
            return self._recover(dev, new)
        self.lost.add(dev)
        if in_chain:
            return self._stop(f"{dev} left the room; the model must be re-dealt")
        cmds: list = []
        keep: deque[QuestionAsked] = deque()
        for w in self.queue:
            if w.device == dev:
                cmds.append(Refuse(w.question_id, w.device, f"{dev} left the room"))
            else:
                keep.append(w)
        self.queue = keep
        for q in [a for a in self.active.values() if a.device == dev]:
            cmds += self._abort(q, f"{dev} left the room")
        return cmds

    def _back(self, ev: DeviceBack) -> list:
        dev = ev.device
        if dev not in self.lost:
            return self._miss_back(ev)
        self.lost.discard(dev)
        if self.rejoin is None:
            return []
        still = frozenset(self.lost)
        try:
            new = self.rejoin(self.deal, still, self.speeds.measured() if self.speeds is not None else Measured({}))
            if new is not None:
                self._check_redeal(new, still)
        except ValueError as e:
            return self._ignore(ev, _STALE, f"{dev} is back but not re-dealt: {e}")
        if new is None or tuple(new.stages) == tuple(self.deal.stages):
            return []
        return self._recover(None, new, back=dev)

    def _stop(self, reason: str) -> list:
        """Refuse the active question and every waiting one; take no more. A room that
        has stopped keeps the first reason: a later loss does not hide why it stopped."""
        if self._state is not STOPPED:
            self._state, self._stop_reason = STOPPED, reason
        reason = self._stop_reason
        cmds: list = []
        active = list(self.active.values())
        self.active = {}
        for q in active:
            cmds.append(Refuse(q.question_id, q.device, reason))
        while self.queue:
            w = self.queue.popleft()
            cmds.append(Refuse(w.question_id, w.device, reason))
        for q in active:
            for lap_id in list(q.inflight):
                cmds += self._end_lap(self.laps[lap_id], stale=True)
        for lap in self.laps.values():
            lap.stale = True
        return cmds

    def _check_redeal(self, new: Deal, lost: frozenset[str]) -> None:
        """Raise ValueError unless ``new`` keeps this host, leaves every lost device
        out and tiles the same layers as the chain before."""
        if new.host != self.host:
            raise ValueError(f"the re-deal moved the model host to {new.host}")
        held = sorted(lost & {s.device for s in new.stages})
        if held:
            raise ValueError(f"the re-deal gives layers to {', '.join(held)}, which left")
        old_end = max((s.end for s in self.deal.stages), default=0)
        at = 0
        for s in sorted(new.stages, key=lambda s: s.start):
            if s.start != at or s.end < s.start:
                raise ValueError(f"the re-deal does not tile the layers at layer {at + 1}")
            at = s.end
        if at != old_end:
            raise ValueError(f"the re-deal holds {at} layers, the model has {old_end}")

    def _recover(self, dev: str | None, new: Deal, back: str | None = None) -> list:
        """``dev`` left the chain (or ``back`` came back: ``dev`` None); ``new`` is the
        re-deal over the devices in the room (see class doc)."""
        cmds: list = []
        keep: deque[QuestionAsked] = deque()
        for w in self.queue:  # the lost device's own questions cannot be answered to it
            if w.device == dev:
                cmds.append(Refuse(w.question_id, w.device, f"{dev} left the room"))
            else:
                keep.append(w)
        self.queue = keep
        for lap in sorted(self.laps.values(), key=lambda lap: lap.lap_id):  # every lap in flight is lost
            lap.stale = True
            cmds += self._end_lap(lap, stale=True)
        self._set_deal(new)
        self._state = RECOVERING
        self._redeal_lap = self._next_lap  # a lap id of its own, so each re-deal's ChainReady is told apart
        self._next_lap += 1
        kept: list[_Question] = []
        for q in self.active.values():
            if q.device == dev:
                cmds.append(Refuse(q.question_id, q.device, f"{dev} left the room"))
            elif len(kept) >= self.questions_in_flight:  # the chain left holds fewer KV caches
                cmds.append(Refuse(q.question_id, q.device, (f"{dev} left the room and the devices left" if dev else
                                                             f"{back} came back and the re-dealt chain") + " hold the KV "
                                   f"caches of {self.questions_in_flight} question"
                                   f"{'s' if self.questions_in_flight != 1 else ''} at once"))
            else:
                kept.append(q)
        self.active = {}
        for slot, q in enumerate(kept):  # every cache of the new chain is empty: slots from 0 again
            q.assumed.clear()
            q.drafting = None
            q.inflight.clear()
            q.next_chunk = 0
            q.fill_len = len(q.seq)
            q.filling = True
            q.slot = slot
            self.active[q.question_id] = q
        stages = tuple((s.device, s.start, s.end) for s in new.stages)
        cmds.append(Redeal(dev or "", self.host, stages, self._redeal_lap, kept[0].question_id if kept else None,
                           sum(len(q.seq) for q in kept), back))
        return cmds

    def _chain_ready(self, ev: ChainReady) -> list:
        if ev.first_lap != self._redeal_lap:
            return self._miss_chain_ready(ev)
        self._settle()  # open again: the questions kept are FILLING (their replays)
        cmds: list = []
        for q in list(self.active.values()):  # each replays in its own slot, their laps interleaved
            cmds += self._launch_prefill_chunk(q)
        return cmds + self._next_question()

    # -- misses: events with no transition -------------------------------------------

    def _never_launched(self, ev, lap_id: int) -> None:
        """Raise DriverError when ``lap_id`` was never launched (the driver's own event)."""
        if not self._launched(lap_id):
            raise DriverError(f"{type(ev).__name__} for lap {lap_id}, which the host never launched")

    def _miss_stage(self, ev: StageFinished) -> list:
        if ev.device != self.host:
            return self._ignore(ev, _BUG, f"a stage of {ev.device} reached the host's machine")
        self._never_launched(ev, ev.lap_id)
        return self._ignore(ev, _STALE, f"lap {ev.lap_id} is over")

    def _miss_frame(self, ev: FrameArrived) -> list:
        h = ev.header
        if ev.device != self.host:
            return self._ignore(ev, _BUG, f"a frame for {ev.device} reached the host's machine")
        if h.kind != FrameKind.RESULT and h.kind != FrameKind.RETURN:
            return self._ignore(ev, _BUG, f"a {FrameKind(h.kind).name} frame from {ev.src} at the host")
        if not self._launched(h.lap_id):  # a peer's frame: outside input, never trusted
            return self._ignore(ev, _UNKNOWN, f"lap {h.lap_id} from {ev.src} was never launched")
        return self._ignore(ev, _STALE, f"lap {h.lap_id} is over")

    def _miss_head(self, ev: HeadFinished) -> list:
        self._never_launched(ev, ev.lap_id)
        return self._ignore(ev, _STALE, f"lap {ev.lap_id} is over")

    def _miss_draft(self, ev: DraftReady) -> list:
        if not 0 <= ev.draft_id < self._next_draft:
            raise DriverError(f"DraftReady for draft {ev.draft_id}, which the host never asked for")
        return self._ignore(ev, _STALE, f"draft {ev.draft_id} is no longer awaited")

    def _miss_lap_failed(self, ev: LapFailed) -> list:
        if not self._launched(ev.lap_id):  # a peer's Fault: outside input
            return self._ignore(ev, _UNKNOWN, f"lap {ev.lap_id} was never launched")
        return self._ignore(ev, _STALE, f"lap {ev.lap_id} is over")

    def _miss_chain_ready(self, ev: ChainReady) -> list:
        reason = _STALE if self._launched(ev.first_lap) else _UNKNOWN
        return self._ignore(ev, reason, f"no re-deal with first lap {ev.first_lap} is awaited")

    def _miss_withdrawn(self, ev: QuestionWithdrawn) -> list:
        return self._ignore(ev, _UNKNOWN, f"question {ev.question_id} is neither waiting nor being answered")

    def _miss_back(self, ev: DeviceBack) -> list:
        if ev.device not in self.lost:
            return self._ignore(ev, _REPEATED, f"{ev.device} was not lost")
        return self._ignore(ev, _STALE, f"the room has stopped: {self._stop_reason}")

    #: event type -> handler: the one table ``handle`` dispatches a transition by
    HANDLERS: dict = {QuestionAsked: _asked, StageFinished: _stage_finished, FrameArrived: _frame_back,
                      HeadFinished: _head_finished, DraftReady: _draft_ready, DeviceLost: _lost, DeviceBack: _back,
                      ChainReady: _chain_ready, QuestionWithdrawn: _withdrawn, LapFailed: _lap_failed}
    #: event type -> what an event with no transition in the host's state is: a peer's
    #: late or unknown event (an Ignored record and ``[]``) or the driver's own mistake
    #: (DriverError). QuestionAsked and DeviceLost have a transition in every state.
    MISSES: dict = {StageFinished: _miss_stage, FrameArrived: _miss_frame, HeadFinished: _miss_head,
                    DraftReady: _miss_draft, DeviceBack: _miss_back, ChainReady: _miss_chain_ready,
                    QuestionWithdrawn: _miss_withdrawn, LapFailed: _miss_lap_failed}


_FILL_KINDS = (LapKind.PREFILL, LapKind.REPLAY)
