"""The sans-IO scheduler: a host state machine and a worker state machine.

Events in, commands out, time passed in (DESIGN.md, "The shared core is sans-IO"; in
the style of h11). The same objects drive the SimPy simulator and the real runtime.

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
  Inference from Transformers via Speculative Decoding", 2023).
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
* **Queue**: one question answered at a time; up to 10 wait, at most 2 per device
  (product page 001); the 11th or a device's 3rd is refused with a reason. An asker
  that withdraws a question (QuestionWithdrawn: it went away) frees its place.
* **Phone GPU wake**: at the start of each lap the host tells every phone that holds
  layers that a frame is coming (at most 50 ms of busy-keeping; product page 001).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

from planner.deal import Deal
from planner.frames import DType, FrameHeader, FrameKind
from planner.room import Scenario
from planner.protocol import (AnswerDone, BeginAnswer, ChainReady, Command, DeviceLost, Draft, DraftReady, DropFrame,
                              EmitToken, Event, FrameArrived, HeadFinished, LapEnded, LapFailed, LapKind, QuestionAsked,
                              QuestionWithdrawn, Redeal, Refuse, ReturnPath, RollbackKV, RunHead, RunStage, SendFrame,
                              StageFinished, Wake)
from planner.sampling import GREEDY, Sampling, Uniforms

#: Product page 001: "Up to 10 questions wait in the host's queue, at most two per device."
MAX_WAITING = 10
MAX_WAITING_PER_DEVICE = 2
#: Product page 001: a woken phone keeps its GPU busy "for at most 50 ms".
WAKE_MAX_S = 0.050

#: What a frame does at a worker (:meth:`WorkerMachine.accept`).
RUN, ROLLBACK_RUN, DROP, FORWARD, IGNORE = range(5)
_RUN, _ROLLBACK_RUN, _FORWARD, _IGNORE = (RUN, None), (ROLLBACK_RUN, None), (FORWARD, None), (IGNORE, None)
_K_RETURN, _K_DECODE, _K_PREFILL = FrameKind.RETURN, FrameKind.DECODE, FrameKind.PREFILL


@dataclass(frozen=True)
class SchedulerConfig:
    """How the host schedules work.

    Attributes:
        hidden: residual width (columns of every frame).
        prefill_chunk: prompt tokens per pipelined prefill frame.
        draft_tokens: k drafted tokens per verify lap; 0 for plain decoding.
        async_laps: verify laps in flight at once (>= 1; used only when k > 0).
        return_path: :class:`ReturnPath` (a plain ``"direct"`` / ``"via_stages"`` is
            converted).
        wake: send phones a wake message at the start of each lap.
        phones: device ids that are phones (woken when they hold layers).
        eos_token: stop when the head predicts this token (None: never).
        stop_tokens: more tokens that end an answer like ``eos_token`` (e.g. Llama 3's
            ``<|eot_id|>`` beside ``<|end_of_text|>``).
        dtype: residual dtype on the wire.
        context: positions every stage's KV cache holds, tokens (None: unbounded). A
            question whose prompt + max new tokens exceeds it is refused when asked,
            and verify laps draft no further than its last position.
        sampling: how questions that do not say are decoded (:data:`GREEDY` by default).
    """

    hidden: int
    prefill_chunk: int = 16
    draft_tokens: int = 0
    async_laps: int = 1
    return_path: ReturnPath = ReturnPath.DIRECT
    wake: bool = True
    phones: frozenset[str] = frozenset()
    eos_token: int | None = None
    dtype: DType = DType.FLOAT32
    context: int | None = None
    sampling: Sampling = GREEDY
    stop_tokens: tuple[int, ...] = ()

    @classmethod
    def from_scenario(cls, scn: Scenario, eos_token: int | None = None,
                      stop_tokens: tuple[int, ...] = ()) -> "SchedulerConfig":
        """The settings a scenario asks for. Residuals travel as float32 when the
        model's residual is 4 bytes per value (the real runtime's SmolLM2), else f16.
        A sampling section without a seed takes the scenario's ``seed``."""
        spec = scn.decoding.speculative
        f32 = scn.model.residual_bytes_per_token >= 4 * scn.model.hidden
        return cls(hidden=scn.model.hidden, prefill_chunk=scn.decoding.prefill_chunk,
                   draft_tokens=spec.draft_tokens if spec else 0,
                   async_laps=scn.decoding.async_laps if spec else 1,
                   return_path=scn.decoding.return_path, wake=scn.decoding.wake,
                   phones=frozenset(d.id for d in scn.devices if d.kind == "phone"),
                   eos_token=eos_token, dtype=DType.FLOAT32 if f32 else DType.FLOAT16,
                   context=scn.options.context_tokens, sampling=_seeded(scn.decoding.sampling, scn.seed),
                   stop_tokens=tuple(sorted(set(stop_tokens) - {eos_token})))

    def to_json(self) -> dict:
        """As a JSON-ready mapping (phones a sorted list, dtype its code, sampling a mapping)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "phones": sorted(self.phones), "dtype": int(self.dtype), "return_path": str(self.return_path),
            "sampling": self.sampling.to_json(), "stop_tokens": list(self.stop_tokens)}

    def __post_init__(self):
        if self.prefill_chunk < 1 or self.async_laps < 1 or self.draft_tokens < 0 or self.hidden < 1:
            raise ValueError("prefill_chunk, async_laps and hidden must be >= 1 and draft_tokens >= 0")
        if self.context is not None and self.context < 1:
            raise ValueError(f"context must be >= 1 position or None, got {self.context}")
        try:
            object.__setattr__(self, "return_path", ReturnPath(self.return_path))
        except ValueError:
            raise ValueError(f"return_path must be direct or via_stages, got {self.return_path!r}") from None
        if not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a planner.sampling.Sampling, got {type(self.sampling).__name__}")


def _seeded(sampling: Sampling, seed: int) -> Sampling:
    """``sampling`` with ``seed`` when it has none (greedy needs none)."""
    return sampling if sampling.greedy or sampling.seed is not None else sampling.with_seed(seed)


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


class HostScheduler:
    """The model host's state machine.

    ``handle(event, now_s) -> list[command]``; ``now_s`` is seconds on the driver's
    clock (only passed through: the scheduler keeps no timers). Raises ValueError for
    a deal whose host range is not first in the chain (the chain starts at the host).
    Never raises for a well-typed event in any order: unexpected events are ignored.

    Recovery: with ``redeal`` (``(deal, lost devices) -> new deal``, raising ValueError
    when the rest of the room cannot hold the model; see :mod:`planner.chain`), a worker
    of the chain that is lost no longer ends the room. The host forgets every lap in
    flight, returns :class:`Redeal` with the new chain, waits for :class:`ChainReady`,
    then replays the active question's prompt and answer so far from position 0 (replay
    laps, prefill chunks) so every stage's KV cache covers exactly the positions so far;
    the replay's head gives the next token and the answer goes on. Questions waiting
    keep their places; questions asked meanwhile wait. Without ``redeal`` (or when the
    host itself is lost, or the re-deal fails) the host refuses what it cannot answer
    and stops, with the reason.
    """

    def __init__(self, deal: Deal, config: SchedulerConfig,
                 redeal: Callable[[Deal, frozenset[str]], Deal] | None = None):
        self.config = config
        self.host = deal.host
        self.redeal = redeal
        self.lost: set[str] = set()
        self.recovering: int | None = None  # first lap of the new chain, until ChainReady
        self._set_deal(deal)
        self.queue: deque[QuestionAsked] = deque()
        self.active: _Question | None = None
        self.laps: dict[int, _Lap] = {}
        self.inflight: deque[int] = deque()  # decode/verify laps not yet judged, in launch order
        self._next_lap = 0
        self._next_draft = 0
        self.stopped: str | None = None
        self.seen_questions: set[int] = set()
        # counters (also derivable from the trace)
        self.emitted = 0
        self.accepted = 0

    def _set_deal(self, deal: Deal) -> None:
        stages = list(deal.stages)
        if any(s.device == self.host for s in stages[1:]):
            raise ValueError("the model host's range must be the first stage of the chain")
        self.deal = deal
        self.host_holds_layers = bool(stages) and stages[0].device == self.host
        self.workers = [s.device for s in stages if s.device != self.host]
        self.wake_targets = [d for d in self.workers if d in self.config.phones] if self.config.wake else []

    # -- public ---------------------------------------------------------------------

    def next_deadline_s(self) -> float | None:
        """The next time the scheduler wants to be called without an event: never."""
        return None

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Feed one event; returns the commands to carry out, in order."""
        cls = type(event)  # the events of every lap first, by exact type; then any subclass
        if cls is StageFinished:
            return self._stage_finished(event) if event.device == self.host else []
        if cls is FrameArrived:
            return self._frame_back(event) if event.device == self.host else []
        if cls is DraftReady:
            return self._draft_ready(event)
        if cls is HeadFinished:
            return self._head_finished(event)
        if isinstance(event, QuestionAsked):
            return self._asked(event)
        if isinstance(event, StageFinished):
            return self._stage_finished(event) if event.device == self.host else []
        if isinstance(event, FrameArrived):
            return self._frame_back(event) if event.device == self.host else []
        if isinstance(event, HeadFinished):
            return self._head_finished(event)
        if isinstance(event, DraftReady):
            return self._draft_ready(event)
        if isinstance(event, DeviceLost):
            return self._lost(event)
        if isinstance(event, ChainReady):
            return self._chain_ready(event)
        if isinstance(event, QuestionWithdrawn):
            return self._withdrawn(event)
        if isinstance(event, LapFailed):
            return self._lap_failed(event)
        return []

    @property
    def busy(self) -> bool:
        """True while a question is being answered."""
        return self.active is not None

    # -- queue ----------------------------------------------------------------------

    def _asked(self, ev: QuestionAsked) -> list:
        refuse = None
        if ev.question_id in self.seen_questions:
            refuse = f"question id {ev.question_id} was already asked"
        elif self.stopped:
            refuse = self.stopped
        elif not ev.prompt:
            refuse = "empty prompt"
        elif ev.max_new_tokens < 1:
            refuse = "asks for no answer tokens"
        elif self.config.context is not None and len(ev.prompt) + ev.max_new_tokens > self.config.context:
            refuse = (f"does not fit the context: a prompt of {len(ev.prompt)} tokens + {ev.max_new_tokens} "
                      f"answer tokens > {self.config.context} positions")
        elif self.active is not None or self.recovering is not None:
            if len(self.queue) >= MAX_WAITING:
                refuse = f"queue full: {MAX_WAITING} questions are waiting"
            elif sum(1 for q in self.queue if q.device == ev.device) >= MAX_WAITING_PER_DEVICE:
                refuse = f"{ev.device} already has {MAX_WAITING_PER_DEVICE} questions waiting"
        self.seen_questions.add(ev.question_id)
        if refuse:
            return [Refuse(ev.question_id, ev.device, refuse)]
        if self.active is not None or self.recovering is not None:
            self.queue.append(ev)
            return []
        return self._begin(ev)

    def _withdrawn(self, ev: QuestionWithdrawn) -> list:
        """The asker withdrew ``ev.question_id``: a waiting one leaves the queue (its
        place is free), the active one ends now and the next begins."""
        for w in self.queue:
            if w.question_id == ev.question_id:
                self.queue.remove(w)
                return [Refuse(w.question_id, w.device, "withdrawn by the asker")]
        q = self.active
        if q is None or q.question_id != ev.question_id:
            return []
        q.done = True
        q.reason = "withdrawn"
        return self._finish(q)

    def _begin(self, ev: QuestionAsked) -> list:
        sampling = ev.sampling if isinstance(ev.sampling, Sampling) else self.config.sampling
        q = _Question(ev.question_id, ev.device, list(ev.prompt), len(ev.prompt), ev.max_new_tokens,
                      fill_len=len(ev.prompt), sampling=sampling)
        if not sampling.greedy:  # no seed: the question id's stream (drivers give one)
            q.uniforms = Uniforms(sampling.seed if sampling.seed is not None else abs(ev.question_id))
        self.active = q
        self.inflight.clear()
        cmds: list = [BeginAnswer(q.question_id, q.device, q.prompt_len)]
        cmds += self._launch_prefill_chunk(q)
        return cmds

    def _next_question(self) -> list:
        self.active = None
        self.inflight.clear()
        if self.queue and self.recovering is None:
            return self._begin(self.queue.popleft())
        return []

    # -- laps -----------------------------------------------------------------------

    def _new_lap(self, q: _Question, kind: LapKind, first_pos: int, inputs: Sequence[int], returns: bool) -> _Lap:
        lap = _Lap(self._next_lap, q.question_id, kind, first_pos, tuple(inputs), returns)
        self._next_lap += 1
        self.laps[lap.lap_id] = lap
        return lap

    def _run_host_stage(self, lap: _Lap) -> list:
        cmds: list = [Wake(d, lap.lap_id, WAKE_MAX_S) for d in self.wake_targets]
        cmds.append(RunStage(self.host, lap.lap_id, lap.question_id, lap.first_pos, len(lap.inputs), lap.inputs))
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
                           self.config.dtype, lap.returns)

    def _stage_finished(self, ev: StageFinished) -> list:
        lap = self.laps.get(ev.lap_id)
        if lap is None:
            return []
        cmds: list = []
        if self.workers:
            kind = FrameKind.PREFILL if lap.kind in (LapKind.PREFILL, LapKind.REPLAY) else FrameKind.DECODE
            cmds.append(SendFrame(self.host, self.workers[0], self._header(lap, kind)))
        elif lap.returns:  # the host holds every layer: the residual is already here
            cmds += self._returned(lap)
        q = self.active
        if lap.kind in (LapKind.PREFILL, LapKind.REPLAY) and q is not None and q.question_id == lap.question_id \
                and q.next_chunk < q.fill_len:
            cmds += self._launch_prefill_chunk(q)
        return cmds

    def _frame_back(self, ev: FrameArrived) -> list:
        lap = self.laps.get(ev.header.lap_id)
        if lap is None or lap.back or ev.header.kind not in (FrameKind.RESULT, FrameKind.RETURN):
            return []
        return self._returned(lap)

    def _returned(self, lap: _Lap) -> list:
        lap.back = True
        q = self.active
        if lap.stale or q is None or q.question_id != lap.question_id:
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
        if lap.lap_id in self.inflight:
            self.inflight.remove(lap.lap_id)
        drafted = len(lap.inputs) - 1 if lap.kind == LapKind.VERIFY else 0
        return [LapEnded(lap.lap_id, lap.question_id, lap.kind, drafted, kept, stale)]

    # -- head results ---------------------------------------------------------------

    def _head_finished(self, ev: HeadFinished) -> list:
        lap = self.laps.get(ev.lap_id)
        q = self.active
        if lap is None or lap.predictions is not None:
            return []
        if q is None or q.question_id != lap.question_id or lap.stale:
            return self._end_lap(lap, stale=True)
        if not ev.predictions:
            return self._abort(f"the output head returned no prediction for lap {lap.lap_id}")
        lap.predictions = tuple(ev.predictions)
        if lap.kind in (LapKind.PREFILL, LapKind.REPLAY):
            cmds = self._end_lap(lap, stale=False, kept=1)
            cmds += self._commit(q, [lap.predictions[-1]])
            return cmds + self._after_commit(q)
        cmds = []
        # judge laps in launch order; a later lap's result waits for its predecessors
        while self.inflight:
            head = self.laps.get(self.inflight[0])
            if head is None:
                self.inflight.popleft()
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
        # the assumed continuation survives only if it starts with what was committed
        if q.assumed[:len(new)] == new:
            del q.assumed[:len(new)]
        else:
            cmds += self._discard_assumed(q)
            if a < len(x) - 1:
                cmds.append(RollbackKV(self.host, q.question_id, lap.first_pos + a + 1))
        cmds += self._commit(q, new)
        return cmds

    def _discard_assumed(self, q: _Question) -> list:
        """Forget the assumed continuation; every lap still in flight is stale."""
        q.assumed.clear()
        q.drafting = None
        return self._drop_inflight()

    def _drop_inflight(self) -> list:
        cmds: list = []
        for lap_id in list(self.inflight):
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
        return self._drop_inflight() + [AnswerDone(q.question_id, q.device, q.generated, q.reason)] + self._next_question()

    def _after_commit(self, q: _Question) -> list:
        if q.done:
            return self._finish(q)
        return self._fill_pipeline(q)

    # -- decode launching -----------------------------------------------------------

    def _fill_pipeline(self, q: _Question) -> list:
        k = self.config.draft_tokens
        if k == 0:
            if self.inflight:
                return []
            lap = self._new_lap(q, LapKind.DECODE, len(q.seq) - 1, (q.seq[-1],), returns=True)
            self.inflight.append(lap.lap_id)
            return self._run_host_stage(lap)
        if q.drafting is not None:
            return []
        live = 0
        laps = self.laps
        for i in self.inflight:
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
        q = self.active
        if q is None or q.drafting != ev.draft_id:
            return []
        q.drafting = None
        if not ev.tokens:
            return self._abort("the drafter returned no tokens")
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
        self.inflight.append(lap.lap_id)
        return self._run_host_stage(lap) + self._fill_pipeline(q)

    # -- failures -------------------------------------------------------------------

    def _lap_failed(self, ev: LapFailed) -> list:
        """A residual of ``ev.lap_id`` went bad (NaN/inf): its question fails, naming the
        device; laps of other questions, stale laps and unknown ones are ignored."""
        lap = self.laps.get(ev.lap_id)
        q = self.active
        if lap is None or lap.stale or q is None or q.question_id != lap.question_id:
            return []
        cmds = [] if lap.lap_id in self.inflight else self._end_lap(lap, stale=True)  # it will not come back
        return cmds + self._abort(f"numerical fault on {ev.device}: {ev.reason}")

    def _abort(self, reason: str) -> list:
        q = self.active
        cmds: list = []
        if q is not None:
            cmds.append(Refuse(q.question_id, q.device, reason))
            cmds += self._drop_inflight()
        return cmds + self._next_question()

    def _lost(self, ev: DeviceLost) -> list:
        dev = ev.device
        if dev in self.lost:
            return []
        in_chain = dev == self.host or dev in self.workers
        if in_chain and dev != self.host and self.redeal is not None and self.stopped is None:
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
        if self.active is not None and self.active.device == dev:
            cmds += self._abort(f"{dev} left the room")
        return cmds

    def _stop(self, reason: str) -> list:
        """Refuse the active question and every waiting one; take no more."""
        self.stopped = reason
        cmds: list = []
        if self.active is not None:
            cmds.append(Refuse(self.active.question_id, self.active.device, reason))
            self.active = None
        while self.queue:
            w = self.queue.popleft()
            cmds.append(Refuse(w.question_id, w.device, reason))
        cmds += self._drop_inflight()
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

    def _recover(self, dev: str, new: Deal) -> list:
        """``dev`` left the chain; ``new`` is the re-deal over the rest (see class doc)."""
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
        self.inflight.clear()
        self._set_deal(new)
        self.recovering = self._next_lap  # a lap id of its own, so each re-deal's ChainReady is told apart
        self._next_lap += 1
        q = self.active
        if q is not None and q.device == dev:
            cmds.append(Refuse(q.question_id, q.device, f"{dev} left the room"))
            self.active = q = None
        if q is not None:
            q.assumed.clear()
            q.drafting = None
            q.next_chunk = 0
            q.fill_len = len(q.seq)
        stages = tuple((s.device, s.start, s.end) for s in new.stages)
        cmds.append(Redeal(dev, self.host, stages, self.recovering, q.question_id if q else None,
                           len(q.seq) if q else 0))
        return cmds

    def _chain_ready(self, ev: ChainReady) -> list:
        if self.recovering is None or ev.first_lap != self.recovering:
            return []
        self.recovering = None
        q = self.active
        if q is not None:
            return self._launch_prefill_chunk(q)
        return self._next_question()


class WorkerMachine:
    """A worker's state machine: frame in -> run my layers -> frame out.

    ``handle(event, now_s) -> list[command]``. Keeps the KV length of the question it
    serves; a frame of a new question starts from an empty cache, a frame whose first
    position is before the cache's end rolls the cache back to it (RollbackKV), and one
    whose first position lies beyond the cache's end is stale and dropped (DropFrame),
    as is any frame of a lap before ``first_lap`` (a lap of the chain before a re-deal).
    Raises ValueError if ``device`` holds no stage of ``deal``.
    """

    def __init__(self, device: str, deal: Deal, return_path: ReturnPath | str = ReturnPath.DIRECT,
                 first_lap: int = 0):
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
        self.question_id: int | None = None
        self.kv_len = 0
        self.pending: dict[int, FrameHeader] = {}

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Feed one event; returns the commands to carry out."""
        if isinstance(event, FrameArrived) and event.device == self.device:
            return self.frame_arrived(event.header)
        if isinstance(event, StageFinished) and event.device == self.device:
            return self.stage_finished(event.lap_id)
        return []

    def accept(self, h: FrameHeader) -> tuple[int, str | None]:
        """Take frame ``h`` (updating the cache length and the frames pending) and say
        what it does here, without building commands: ``(RUN, None)`` run the stage;
        ``(ROLLBACK_RUN, None)`` roll the cache back to ``h.first_pos``, then run;
        ``(DROP, reason)``; ``(FORWARD, None)`` a RETURN frame passed on to the
        previous stage; ``(IGNORE, None)`` a kind a worker does not handle.
        :meth:`frame_arrived` turns the answer into commands (:meth:`commands_for`)."""
        if h.lap_id < self.first_lap:
            return DROP, f"lap {h.lap_id} is from before the re-deal"
        kind = h.kind
        if kind == _K_RETURN:
            return _FORWARD
        if kind != _K_DECODE and kind != _K_PREFILL:
            return _IGNORE
        kv = self.kv_len
        if h.question_id != self.question_id:
            if h.first_pos != 0:  # a question always starts with a prefill frame at position 0
                return DROP, "frame of a question this stage is not serving"
            self.question_id = h.question_id
            kv = 0
        first = h.first_pos
        if first > kv:
            self.kv_len = kv
            return DROP, f"stale: starts at {first}, cache holds {kv}"
        self.kv_len = first + h.tokens
        self.pending[h.lap_id] = h
        return _ROLLBACK_RUN if first < kv else _RUN

    def commands_for(self, h: FrameHeader, verdict: int, reason: str | None) -> list[Command]:
        """The commands of :meth:`accept`'s answer ``(verdict, reason)`` for frame ``h``."""
        if verdict == RUN:
            return [RunStage(self.device, h.lap_id, h.question_id, h.first_pos, h.tokens)]
        if verdict == ROLLBACK_RUN:
            return [RollbackKV(self.device, h.question_id, h.first_pos),
                    RunStage(self.device, h.lap_id, h.question_id, h.first_pos, h.tokens)]
        if verdict == DROP:
            return [DropFrame(self.device, h, reason or "")]
        if verdict == FORWARD:
            return [SendFrame(self.device, self.prev, h)]
        return []

    def frame_arrived(self, h: FrameHeader) -> list[Command]:
        """``handle(FrameArrived(self.device, src, h))`` without building the event (the
        sender is not used): RunStage, or RollbackKV then RunStage, or DropFrame, or the
        RETURN frame forwarded (SendFrame)."""
        verdict, reason = self.accept(h)
        return self.commands_for(h, verdict, reason)

    def release(self, lap_id: int) -> tuple[str, FrameHeader] | None:
        """Lap ``lap_id``'s stage finished: ``(destination, header)`` of the frame to send
        on (the next stage, or the host / previous stage with a RESULT / RETURN
        header), or None (no such frame pending, or a prefill chunk that does not
        return). :meth:`stage_finished` makes it a SendFrame."""
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

    def stage_finished(self, lap_id: int) -> list[Command]:
        """``handle(StageFinished(self.device, lap_id))`` without building the event:
        the frame on to the next stage or back to the host (SendFrame), or nothing."""
        out = self.release(lap_id)
        return [] if out is None else [SendFrame(self.device, out[0], out[1])]
