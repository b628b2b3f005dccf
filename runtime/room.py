"""One device of a real room: the shared scheduler over real compute and a transport.

A :class:`Node` is one process's part of the room: a :class:`planner.chain.Chain` that
runs only this device's machine, fed by :class:`planner.drive.Driver` with the node as
its executor (the model host's scheduler with its stage: embedding,
its layers, head, the tokenizer and a drafter; or a worker's machine with its layer
range). Frames travel as bytes over a transport (WebRTC data channels
in ``runtime.transport``, or an in-process hub in tests); residuals go on the
``residual`` channel, answer tokens to a guest on ``reply``.

Each node computes one thing at a time (a queue drained by one task), like a GPU:
frames that arrive meanwhile wait. ``slowdown`` pads every compute step to that factor
(``emulate: {slowdown: 3}`` in a scenario: one machine behaving like a slower one).

Every event and command is appended to the node's trace with the wall-clock time
(``time.time()``, shared by every process of one machine), so the traces of all nodes
merge into one and :mod:`planner.metrics` computes the measured numbers.

Liveness and recovery: every node sends each peer a heartbeat on the ``reply``
channel (runtime.control) every ``heartbeat_s``; a peer silent for
``heartbeat_timeout_s`` after it was first heard is lost (DeviceLost, naming it), as is
one whose connection fails. With ``recover`` the host's chain re-deals a lost worker's
layers (to the stage before it), sends the new chain a Replan, loads its own new range,
waits for every device's Ready, then feeds ChainReady and the scheduler replays the
answer so far. A worker that gets a Replan loads its new range from the model
directory (its own disk) in the compute thread and answers Ready.

The Node is in three files: the loop here (messages in, the Driver's executor, the
compute queue, the host's questions); its liveness in runtime/room_liveness.py
(:class:`~runtime.room_liveness.NodeLiveness`: heartbeats, stamps, losses, a peer back)
and its re-deal in runtime/room_redeal.py (:class:`~runtime.room_redeal.NodeRedeal`:
loading or copying a re-dealt range, Replan and Ready), both mixed into :class:`Node`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from planner.frames import FrameError, FrameHeader, FrameKind
from planner.protocol import (AnswerDone, Computed, Draft, DraftReady, DropFrame, EmitToken, FrameArrived, LapFailed,
                              QuestionAsked, Redeal, Refuse, RollbackKV, RunHead, RunStage, SendFrame, StageFinished,
                              Wake)
from planner.sampling import MAX_SEED, Sampling
from planner.chain import Chain
from planner.drive import Driver
from planner.hops import HopMeter, PeerClock
from planner.liveness import Liveness
from planner.trace import from_record, to_record

from .backends.base import Stage
from .codec import decode_frame, encode_frame
from .control import (MAX_STAMPS, ControlError, Crash, Fault, Heartbeat, Loading, NodeConfig, Progress, Ready, Replan,
                      Stamps, Unreachable, encode_control, parse_control)
from .drafters import ngram_draft
from .room_liveness import (ECHO_HELD_MAX_S, REDEAL_GRACE_S, REDEAL_LOAD_TIMEOUT_S, REPLY,  # noqa: F401 (importable
                            NodeLiveness, lost_reason)                               # from here too)
from .room_redeal import RELINK_WAIT_S, NodeRedeal  # noqa: F401
from .work import NumericalFault, consumes_residual, nonfinite, run_work

log = logging.getLogger("splitroom.room")

RESIDUAL = "residual"
#: trace records a node whose trace is not written keeps, or a ``keep_open`` one (the
#: latest; older ones are dropped). Nothing reads such a trace (``splitroom serve``'s and
#: ``join``'s devices write none), so it is a window of the latest few hundred laps for a
#: debugger, not memory a device lends the room: 0.8 MB by :func:`record_bytes` (20,000
#: records were 8 MB, 7% of a phone lending 120 MB)
OPEN_TRACE_RECORDS = 2_000
#: what such a node's trace may hold, bytes (estimated by :func:`record_bytes`;
#: the oldest records are dropped past it)
OPEN_TRACE_BYTES = 2 * 1024 * 1024
#: a trace record's own cost, bytes: the (time, object) pair and a frozen dataclass of a
#: few fields (sys.getsizeof of a typical event and its tuple, rounded up)
RECORD_BYTES = 400
#: one token id held in a record's tuple, bytes: an 8-byte slot and a 28-byte int object (32 as
#: pymalloc allocates it; measured with tracemalloc in tests/unit/test_host_bounds.py)
TOKEN_BYTES = 40
_TOKEN_FIELDS = {QuestionAsked: "prompt", RunStage: "inputs"}


def record_bytes(obj: Any) -> int:
    """An estimate of the memory one trace record holds, bytes: :data:`RECORD_BYTES`,
    plus :data:`TOKEN_BYTES` per token id of a question's prompt or a stage's inputs."""
    name = _TOKEN_FIELDS.get(type(obj))
    return RECORD_BYTES + (TOKEN_BYTES * len(getattr(obj, name)) if name is not None else 0)


class BoundedTrace:
    """A trace that keeps its latest records within ``max_records`` and ``max_bytes``
    (:func:`record_bytes` each): appending past either drops the oldest. Iterates as
    ``(t, obj)`` pairs, oldest first. ``dropped``: records let go so far."""

    def __init__(self, max_records: int = OPEN_TRACE_RECORDS, max_bytes: int = OPEN_TRACE_BYTES):
        import collections
        self.max_records, self.max_bytes = max_records, max_bytes
        self._items: collections.deque = collections.deque()
        self._sizes: collections.deque = collections.deque()
        self.bytes = 0
        self.dropped = 0

    def append(self, item: tuple[float, Any]) -> None:
        n = record_bytes(item[1])
        self._items.append(item)
        self._sizes.append(n)
        self.bytes += n
        while len(self._items) > 1 and (len(self._items) > self.max_records or self.bytes > self.max_bytes):
            self._items.popleft()
            self.bytes -= self._sizes.popleft()
            self.dropped += 1

    def __iter__(self):
        return iter(self._items)

    def clear(self) -> None:
        """Let go of every record (``dropped`` counts them)."""
        self.dropped += len(self._items)
        self._items.clear()
        self._sizes.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


class Node(NodeLiveness, NodeRedeal):
    """One device of the room (see module doc).

    Args:
        config: what this device does.
        stage: its layer range (the host's has the embedding and head); None for a guest.
        transport: has ``send(dst, channel, bytes)`` (async) and ``set_handler(fn)``; and
            ``subscribe(channel, fn, accepts)`` when the weights are copied between devices
            (runtime.weights_share).
        tokenizer: the host's ChatTokenizer (None elsewhere).
        drafter: the host's drafter ``(context ids, k) -> k ids``.
        clock: seconds, for the trace (``time.time`` by default).
        stamp_clock: seconds, monotonic, for heartbeats' times and frames' stamps (the
            host's hop time per link, planner/hops.py; ``time.monotonic`` by default).
        keep_open: the host keeps taking questions (:meth:`ask`) after its configured
            prompts: :attr:`done` is never set by running out of them.
    The trace (:attr:`trace`, ``[(t, event or command)]``) is kept whole only when it is
    written out at the end (``config.trace_path`` set) and the node is not ``keep_open``;
    otherwise (a long-lived room: ``splitroom serve``'s and ``join``'s devices, whose
    traces nobody writes) it keeps only its latest :data:`OPEN_TRACE_RECORDS` records, at
    most :data:`OPEN_TRACE_BYTES` (:class:`BoundedTrace`).
    Attributes:
        observers: callables given every event and command, in order, after the node
            carried it out, and each Computed record (this device's compute seconds)
            (e.g. an HTTP server streaming answers); on the model host also each
            :class:`planner.hops.HopTimed` (a hop of one link measured), each
            :class:`planner.hops.StageTimed` (a lap's time at a worker) and each
            :class:`runtime.control.Progress` a device sent; an observer that
            raises is logged and the node goes on.
        clocks: peer -> its :class:`planner.hops.PeerClock` (offset from this device's
            stamp clock, from the heartbeats' times).
        hops: the model host's :class:`planner.hops.HopMeter` (None on a worker).
        progress: the model host's last :class:`runtime.control.Progress` percent per device.
    """

    def __init__(self, config: NodeConfig, stage: Stage | None, transport, tokenizer=None,
                 drafter: Callable[[Sequence[int], int], list[int]] = ngram_draft,
                 clock: Callable[[], float] = time.time, keep_open: bool = False,
                 stamp_clock: Callable[[], float] = time.monotonic):
        self.cfg = config
        self.stamp_clock = stamp_clock
        self.stage = stage
        self.transport = transport
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.clock = clock
        self.deal = config.deal()
        self.sched_cfg = config.scheduler_config()
        self.sched_cfg = self.sched_cfg.capped(getattr(stage, "max_ctx", None))  # this device's cache bounds it
        self.compute_errors = 0
        self.is_host = config.device == config.host
        self.chain = Chain(self.deal, self.sched_cfg, runs={config.device},
                           redeal=config.redeal_rule() if config.recover else None,
                           rejoin=config.rejoin_rule() if config.recover else None)
        self.driver = Driver(self.chain, self, self._record, self._notify)
        #: the heartbeat timers (sans-IO, time.monotonic() seconds): who was heard when, who is spared
        self.liveness = Liveness(config.peers, config.heartbeat_s, config.heartbeat_timeout_s, REDEAL_GRACE_S,
                                 REDEAL_LOAD_TIMEOUT_S, time.monotonic())
        self.lost_peers: set[str] = set()
        self._stopped = False  # stop() began: a peer's connection closing now is the room ending
        self.awaiting: dict[int, set[str]] = {}  # host: re-deal first lap -> devices not ready yet
        self.emitted = 0
        self._tasks: list[asyncio.Future] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._weights_server = None  # the host's peer-copy server (start(), when re-deals copy from the host)
        self._deal_before = self.deal.stages  # the chain before the last re-deal (whose ranges changed)
        self._latest_redeal = -1  # first lap of the latest re-deal taken (Redeal or Replan)
        self._redeal_lock = asyncio.Lock()  # re-dealt ranges load one at a time, in order
        self._meet_lock = asyncio.Lock()  # one meeting of this device at the relay at a time
        self._latest_back: str | None = None  # host: the device its latest re-deal took back
        self.trace: list[tuple[float, Any]] = []
        self.residual: dict[int, np.ndarray] = {}  # lap -> residual held here
        self.work: asyncio.Queue = asyncio.Queue()
        self.context: dict[int, list[int]] = {}
        self.answers: dict[int, list[int]] = {}
        self.ended: dict[int, str] = {}
        self.done = asyncio.Event()
        self.lost_host = asyncio.Event()  # a worker lost the model host: nothing more will come
        self.rejected_frames = 0
        self._next_q = 0
        self.keep_open = keep_open
        self.observers: list[Callable[[Any], None]] = []
        self._asked_here = 0  # questions asked with ask()
        self.clocks: dict[str, PeerClock] = {}
        self._beat_in: dict[str, tuple[float, float]] = {}  # peer -> (its last heartbeat's sent_s, heard at)
        self._beat_out: dict[str, collections.deque] = {}  # peer -> sent_s of the latest heartbeats sent to it
        self.hops = HopMeter(config.host, self.clocks) if self.is_host else None
        self.progress: dict[str, int] = {}
        self._stamps_arrived: collections.deque = collections.deque(maxlen=MAX_STAMPS)
        self._stamps_sent: collections.deque = collections.deque(maxlen=MAX_STAMPS)
        if keep_open or not config.trace_path:
            self.trace = BoundedTrace(OPEN_TRACE_RECORDS, OPEN_TRACE_BYTES)  # type: ignore[assignment]
        transport.set_handler(self._on_message)
        if hasattr(transport, "set_lost_handler"):
            transport.set_lost_handler(self._on_lost)

    # -- events in ------------------------------------------------------------------

    def _on_message(self, src: str, channel: str, data: bytes) -> None:
        if src in self.lost_peers and all(s.device != src for s in self.deal.stages):
            self._from_lost(src, channel, data)  # a lost device left the chain: only its hello counts
            return
        self.liveness.heard(src, time.monotonic())
        if channel == REPLY:
            self._on_control(src, data)
            return
        if channel != RESIDUAL:
            return
        try:
            h, x = decode_frame(data)
        except FrameError as e:
            self.rejected_frames += 1
            log.warning("%s: frame from %s rejected: %s", self.cfg.device, src, e)
            return
        if h.kind in (FrameKind.WAKE, FrameKind.ROLLBACK):
            return
        if h.hidden != self.sched_cfg.hidden:
            self.rejected_frames += 1
            log.warning("%s: frame from %s rejected: hidden %d, expected %d", self.cfg.device, src, h.hidden,
                        self.sched_cfg.hidden)
            return
        cap = self.sched_cfg.context
        if cap is not None and h.kind in (FrameKind.PREFILL, FrameKind.DECODE) and h.first_pos + h.tokens > cap:
            self.rejected_frames += 1  # a frame longer than the cache: dropped, the device keeps serving
            log.warning("%s: frame from %s rejected: positions %d-%d do not fit the cache of %d", self.cfg.device,
                        src, h.first_pos, h.first_pos + h.tokens - 1, cap)
            return
        bad = nonfinite(x)
        if bad:  # a NaN/inf never becomes a token: the sender is named and its lap's question fails
            self.rejected_frames += 1
            reason = f"the residual it sent for lap {h.lap_id} has {bad} NaN/inf value{'s' if bad != 1 else ''}"
            log.warning("%s: frame from %s rejected: %s", self.cfg.device, src, reason)
            self._fault(h.lap_id, src, reason)
            return
        self.residual[h.lap_id] = x
        self._stamp(src, self.cfg.device, h.lap_id)
        self.handle(FrameArrived(self.cfg.device, src, h))

    def _on_control(self, src: str, data: bytes) -> None:
        try:
            msg = parse_control(data)
        except ControlError as e:
            log.warning("%s: control message from %s ignored: %s", self.cfg.device, src, e)
            return
        if isinstance(msg, Replan) and not self.is_host and src == self.cfg.host:
            self._tasks.append(asyncio.ensure_future(self._replan(msg)))
        elif isinstance(msg, Loading) and self.is_host:
            self.liveness.answered(src)  # it took the re-deal: its silence while it loads is spared
        elif isinstance(msg, Ready) and self.is_host:
            if msg.first_lap == self._latest_redeal:  # loaded for the re-deal under way: the plain rule again
                self.liveness.loaded(src)
            else:
                self.liveness.answered(src)
            if self.progress.pop(src, None) is not None:  # loaded, whatever the last percent said (a copy
                self._notify(Progress(percent=100))       # that failed half way and was read from disk)
            self._ready(src, msg.first_lap)
        elif isinstance(msg, Fault) and self.is_host:
            self.handle(LapFailed(msg.lap_id, msg.device, msg.reason))
        elif isinstance(msg, Unreachable) and self.is_host:
            self._unreachable(src, msg)
        elif isinstance(msg, Crash) and self.cfg.crashable and src == self.cfg.host:
            log.warning("%s: crashing now (fault injection)", self.cfg.device)
            os._exit(9)
        elif isinstance(msg, Heartbeat):
            self._heartbeat(src, msg)
        elif isinstance(msg, Stamps) and self.is_host:
            self._stamps(src, msg)
        elif isinstance(msg, Progress) and self.is_host and src in self.cfg.peers:
            self.progress[src] = msg.percent
            self.liveness.progressed(src, msg.percent, time.monotonic())  # a copy that goes on spares it
            self._notify(msg)
        # hello/plan/bye belong to the join handshake

    def _fault(self, lap_id: int, device: str, reason: str) -> None:
        """Lap ``lap_id``'s residual went bad at ``device``: the host's scheduler hears
        LapFailed (a worker tells the host with a Fault message)."""
        if self.is_host:
            self.handle(LapFailed(lap_id, device, reason))
        else:
            msg = encode_control(Fault(lap_id=lap_id, device=device, reason=reason[:300]))
            asyncio.ensure_future(self._send(self.cfg.host, REPLY, msg))

    async def _send(self, dst: str, channel: str, data: bytes) -> None:
        try:
            await self.transport.send(dst, channel, data)
        except Exception as e:  # TransportError, a closed channel: the peer is gone
            self._on_lost(dst, f"send failed: {e}")

    def handle(self, event) -> None:
        """Feed one event to this node's machine and carry out its commands. A residual
        no command takes up is let go at once: that of a frame that arrived (a stale lap,
        a frame the machine ignored) and that of a stage that finished with nothing to
        send (a prefill chunk that does not return: its work is in the KV cache), so
        frames and chunks that lead nowhere are not kept."""
        cmds = self.driver.dispatch(event, self.clock())
        cls = type(event)
        if cls is FrameArrived or cls is StageFinished:
            lap = event.header.lap_id if cls is FrameArrived else event.lap_id
            if lap in self.residual and not any(getattr(c, "lap_id", None) == lap or (
                    type(c) is SendFrame and c.header.lap_id == lap) for c in cmds):
                del self.residual[lap]

    def _record(self, now: float, event, cmds, ignored) -> None:
        trace = self.trace
        trace.append((now, event))
        self._notify(event)
        for x in ignored:
            trace.append((now, x))
        for c in cmds:
            trace.append((now, c))

    def _notify(self, obj) -> None:
        for fn in self.observers:
            try:
                fn(obj)
            except Exception as e:  # an observer's bug never stops the room
                log.warning("%s: observer failed on %s: %s: %s", self.cfg.device, type(obj).__name__,
                            type(e).__name__, e)

    # -- commands out ---------------------------------------------------------------

    # -- the executor (planner.drive.Executor) ------------------------------------

    def run_stage(self, c: RunStage) -> None:
        self.work.put_nowait(c)

    def run_head(self, c: RunHead) -> None:
        self.work.put_nowait(c)

    def draft(self, c: Draft) -> None:
        self.work.put_nowait(c)

    def rollback(self, c: RollbackKV) -> None:
        self.work.put_nowait(c)  # through the compute queue: it never races a running stage

    def send_frame(self, c: SendFrame) -> None:
        x = self.residual.pop(c.header.lap_id, None)
        if x is None:
            log.warning("%s: no residual for lap %d", self.cfg.device, c.header.lap_id)
            return
        self._stamp(self.cfg.device, c.dst, c.header.lap_id)
        asyncio.ensure_future(self._send(c.dst, RESIDUAL, encode_frame(c.header, x)))

    def wake(self, c: Wake) -> None:
        h = FrameHeader(FrameKind.WAKE, 0, c.lap_id, 0, 0, self.sched_cfg.hidden)
        asyncio.ensure_future(self._send(c.device, RESIDUAL, encode_frame(h, None)))

    def drop_frame(self, c: DropFrame) -> None:
        self.residual.pop(c.header.lap_id, None)

    def emit(self, c: EmitToken) -> None:
        self.answers.setdefault(c.question_id, []).append(c.token)
        self.context.setdefault(c.question_id, []).append(c.token)
        self.emitted += 1
        for dev, n in self.cfg.crash_at_token:  # fault injection (run --real with faults:)
            if n == self.emitted:
                self._crash(dev)

    def redeal(self, c: Redeal) -> None:
        self._latest_redeal = max(self._latest_redeal, c.first_lap)  # now: an earlier task sees it superseded
        self._latest_back = c.back
        # now too: a loss handled right after this Redeal must not complete the re-deal it supersedes
        self.awaiting = {c.first_lap: {d for d, _, _ in c.stages} | {self.cfg.device}}
        self._tasks.append(asyncio.ensure_future(self._host_redeal(c)))

    def question_ended(self, c: AnswerDone | Refuse) -> None:
        answered = type(c) is AnswerDone
        self.ended[c.question_id] = "answered" if answered else f"refused: {c.reason}"
        self._ask_next()

    async def _pad(self, t0: float) -> None:
        if self.cfg.slowdown > 1.0:
            await asyncio.sleep((time.perf_counter() - t0) * (self.cfg.slowdown - 1.0))

    async def compute_loop(self) -> None:
        """Do queued compute one item at a time until cancelled.

        The compute runs in one worker thread (numpy releases the GIL), so the event
        loop keeps receiving frames and acknowledging packets while a device computes:
        a frame's arrival time is when it arrived, not when the device was next free.
        KV rollbacks go through the same queue, so they never race a running stage.
        """
        loop = asyncio.get_running_loop()
        while True:
            c = await self.work.get()
            t0 = time.perf_counter()
            try:
                event = await loop.run_in_executor(self._pool, self._compute, c)
            except NumericalFault as e:  # this device computed a NaN/inf: its lap's question fails
                self.compute_errors += 1
                self.residual.pop(getattr(c, "lap_id", None), None)
                log.warning("%s: %s of lap %s: %s", self.cfg.device, type(c).__name__, c.lap_id, e)
                self._fault(c.lap_id, self.cfg.device, str(e))
                continue
            except Exception as e:  # one bad command never ends the loop (PositionError, a bad shape)
                self.compute_errors += 1
                self.residual.pop(getattr(c, "lap_id", None), None)
                log.warning("%s: %s dropped: %s: %s", self.cfg.device, type(c).__name__, type(e).__name__, e)
                why = f"{type(c).__name__} failed on {self.cfg.device}: {type(e).__name__}: {e}"
                if type(c) is Draft:  # the question ends with the reason (no drafts: the scheduler aborts it)
                    log.warning("%s: %s", self.cfg.device, why)
                    self.handle(DraftReady(c.draft_id, ()))
                elif type(c) is not RollbackKV:  # its lap's question ends with the reason, never a hang
                    self._fault(c.lap_id, self.cfg.device, why)
                continue
            await self._pad(t0)
            if type(c) is not RollbackKV:
                ref = c.draft_id if type(c) is Draft else c.lap_id
                done = Computed(self.cfg.device, type(c).__name__, ref, time.perf_counter() - t0)
                self.trace.append((self.clock(), done))
                if self.is_host:
                    self.chain.speeds.computed(done)  # its stage and head, timed for the rejoin rule
                self._notify(done)
            if event is not None:
                self.handle(event)

    def _compute(self, c):
        lap = getattr(c, "lap_id", None)
        x = self.residual.pop(lap, None) if consumes_residual(c, self.stage) else None
        event, out = run_work(self.stage, c, x, self.context.get(getattr(c, "question_id", None)), self.drafter)
        if out is not None:
            self.residual[lap] = out
        return event

    # -- the host's questions ---------------------------------------------------------

    def _ask_next(self) -> None:
        if not self.is_host:
            return
        if self._next_q >= len(self.cfg.prompts):
            if not self.keep_open:
                self.done.set()
            return
        qid = self._next_q
        self._next_q += 1
        ids = self.tokenizer.encode_chat(self.cfg.prompts[qid])
        self.context[qid] = list(ids)
        asyncio.get_event_loop().call_soon(
            self.handle, QuestionAsked(qid, self.cfg.device, tuple(ids), self.cfg.max_new_tokens))

    def ask(self, prompt_ids: Sequence[int], max_new_tokens: int, device: str,
            sampling: Sampling | None = None) -> int:
        """Ask a question while the room runs (the model host; see ``keep_open``).

        ``prompt_ids``: the prompt's token ids (chat template applied); ``max_new_tokens``:
        the answer's cap, tokens; ``device``: who asks (the scheduler's queue limits count
        per asker); ``sampling``: how to decode it (None: the room's); a sampled question
        without a seed gets a fresh one (``secrets``), so seedless answers differ. The question reaches the scheduler on the next turn of the event loop,
        so an observer keyed on the returned id sees all of it: BeginAnswer or Refuse,
        EmitToken..., AnswerDone. Returns the question id (never one of the configured
        prompts' ids). Raises RuntimeError on a node that is not the model host.
        """
        if not self.is_host:
            raise RuntimeError(f"{self.cfg.device} is not the model host; only the host takes questions")
        qid = len(self.cfg.prompts) + self._asked_here
        self._asked_here += 1
        self.context[qid] = list(prompt_ids)
        if sampling is not None and not sampling.greedy and sampling.seed is None:
            import secrets
            sampling = sampling.with_seed(secrets.randbelow(MAX_SEED + 1))
        asyncio.get_running_loop().call_soon(
            self.handle, QuestionAsked(qid, device, tuple(int(t) for t in prompt_ids), int(max_new_tokens), sampling))
        return qid

    def withdraw(self, question_id: int) -> None:
        """The asker no longer wants ``question_id`` (it went away, or a stop sequence
        ended its answer): a waiting question frees its place, the active one ends now
        (:class:`planner.protocol.QuestionWithdrawn`, on the next turn of the loop)."""
        from planner.protocol import QuestionWithdrawn
        asyncio.get_running_loop().call_soon(self.handle, QuestionWithdrawn(question_id))

    def forget(self, question_id: int) -> None:
        """Drop what this node keeps of an ended question (its context, answer, how it
        ended): a long-lived host calls it once the answer was delivered."""
        for d in (self.context, self.answers, self.ended):
            d.pop(question_id, None)

    def start(self) -> None:
        """Begin asking (host) and computing."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"compute-{self.cfg.device}")
        self._task = asyncio.ensure_future(self.compute_loop())
        if self.cfg.heartbeat_s > 0:
            self.liveness.start(time.monotonic())
            self._tasks.append(asyncio.ensure_future(self._heartbeats()))
        if self.is_host and self.cfg.recover and self.cfg.weights_from_peer:
            from .weights_share import serve_weights
            self._weights_server = serve_weights(self.transport, self.cfg.model_dir, blocks=self._blocks)
        if self.is_host:
            loop = asyncio.get_running_loop()
            for dev, at_s in self.cfg.crash_at_s:  # fault injection by time (run --real with faults:)
                self._timers.append(loop.call_later(at_s, self._crash, dev))
            self._ask_next()

    def _crash(self, device: str) -> None:
        log.warning("%s: telling %s to crash (fault injection)", self.cfg.device, device)
        asyncio.ensure_future(self._send(device, REPLY, encode_control(Crash())))

    async def stop(self) -> None:
        """Stop the compute, heartbeat and re-deal tasks and the host's weights server
        (its subscription and open weight files); losses heard from now on are the room
        ending, not faults (logged at info, no re-deal)."""
        self._stopped = True
        if self._weights_server is not None:
            self._weights_server.close()
            self._weights_server = None
        for h in self._timers:
            h.cancel()
        for t in [self._task, *self._tasks]:
            t.cancel()
        for t in [self._task, *self._tasks]:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a re-deal task that failed: already logged where it could be
                log.warning("%s: %s", self.cfg.device, e)
        self._pool.shutdown(wait=True)

    def trace_records(self) -> list[dict]:
        """This node's trace as JSON records."""
        return [to_record(t, o) for t, o in self.trace]


def merge_traces(record_lists: Sequence[Sequence[dict]]) -> list[tuple[float, Any]]:
    """Merge several nodes' JSON records into one time-ordered ``[(t, obj)]`` trace
    (stable: records with equal times keep each node's order)."""
    all_ = [r for recs in record_lists for r in recs]
    all_.sort(key=lambda r: r["t"])
    return [from_record(r) for r in all_]
