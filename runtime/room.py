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
from planner.protocol import (AnswerDone, ChainReady, Computed, DeviceBack, DeviceLost, Draft, DraftReady, DropFrame, EmitToken,
                              FrameArrived, LapFailed, QuestionAsked, Redeal, Refuse, RollbackKV, RunHead, RunStage,
                              SendFrame, StageFinished, Wake, WeightsCopied)
from planner.sampling import MAX_SEED, Sampling
from planner.chain import Chain, CopyPlan, copy_plan, relink_neighbours
from planner.deal import Stage as DealStage, shown_layers
from planner.drive import Driver
from planner.hops import HopMeter, PeerClock
from planner.liveness import LOADING, LOADING_SILENT, READY, UNANSWERED, Liveness
from planner.trace import from_record, to_record

from .backends.base import Stage
from .codec import decode_frame, encode_frame
from .control import (MAX_STAMPS, ControlError, Crash, Fault, Heartbeat, Hello, Loading, NodeConfig, Progress, Ready,
                      Replan, Stamps, Unreachable, encode_control, parse_control)
from .drafters import ngram_draft
from .work import NumericalFault, consumes_residual, nonfinite, run_work

log = logging.getLogger("splitroom.room")

RESIDUAL = "residual"
REPLY = "reply"
#: After a Replan, seconds during which no device is declared lost by silence: every
#: device of the new chain may be loading weights then, its event loop starved of the
#: CPU (the transport still reports a connection that fails).
REDEAL_GRACE_S = 10.0
#: After a Replan, seconds during which a device still loading its re-dealt range (not
#: Ready yet) is not declared lost by silence; after that a silent one is lost like any
#: other (a device that died during a re-deal must not stall the room for good).
REDEAL_LOAD_TIMEOUT_S = 30.0
#: Seconds one meeting at the relay may take when a device dealt back and a neighbour of
#: it make a new connection (:meth:`Node._relink`): both sides go to the relay as the
#: Replan arrives, so this bounds a neighbour that never comes (chosen, not measured; it
#: stays under REDEAL_LOAD_TIMEOUT_S, during which the host spares a device re-dealing).
RELINK_WAIT_S = 20.0
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
#: a peer's heartbeat is echoed (planner/hops.py's exchange) only within this many seconds of its arrival
ECHO_HELD_MAX_S = 60.0


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


class Node:
    """One device of the room (see module doc).

    Args:
        config: what this device does.
        stage: its layer range (the host's has the embedding and head); None for a guest.
        transport: has ``send(dst, channel, bytes)`` (async) and ``set_handler(fn)``.
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

    def _from_lost(self, src: str, channel: str, data: bytes) -> None:
        """A message from ``src``, lost and out of the chain: on the model host its Hello
        starts its rejoin (planner.liveness: heard steadily for the rejoin hold, it is
        back: :meth:`_back`), and while it comes back what it sends keeps it heard;
        anything else from it is ignored."""
        if not self.is_host:
            return
        now = time.monotonic()
        if channel == REPLY and not self.liveness.coming_back(src):
            try:
                msg = parse_control(data)
            except ControlError:
                return
            if isinstance(msg, Hello) and msg.device == src:
                log.warning("%s: %s said hello again; taking it back once heard for the rejoin hold",
                            self.cfg.device, src)
                self.liveness.returned(src, now)
            return
        if self.liveness.coming_back(src):
            self.liveness.heard(src, now)

    def _back(self, peer: str) -> None:
        """``peer``, lost, has been heard for its rejoin hold: it is a member again
        (DeviceBack; the host's rejoin rule may re-deal it back into the chain)."""
        self.lost_peers.discard(peer)
        if hasattr(self.transport, "revive"):
            self.transport.revive(peer)
        log.warning("%s: %s is back", self.cfg.device, peer)
        self.handle(DeviceBack(peer, "said hello again"))

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
            self._notify(msg)
        # hello/plan/bye belong to the join handshake

    def _heartbeat(self, src: str, msg: Heartbeat) -> None:
        """Being heard is what a heartbeat says; its times (when it has them) are one
        leg of NTP's exchange: ``src``'s clock offset (planner/hops.py), taken only when
        its echo is the time of one of the latest heartbeats this device sent it."""
        if msg.sent_s is None or src not in self.cfg.peers:
            return
        now = self.stamp_clock()
        self._beat_in[src] = (msg.sent_s, now)
        if msg.echo_s is not None and msg.held_s is not None and msg.echo_s in self._beat_out.get(src, ()):
            self.clocks.setdefault(src, PeerClock()).heard(msg.sent_s, msg.echo_s, msg.held_s, now)

    def _stamps(self, src: str, msg: Stamps) -> None:
        """The model host pairs a worker's stamps with the other ends' (planner/hops.py);
        a stamp naming a device not in the chain, or ``src`` itself, is not kept."""
        chain = {s.device for s in self.deal.stages} | {self.cfg.host}
        if src not in chain:
            return
        for lap, peer, t in msg.arrived:
            if peer in chain and peer != src:
                self._hop(self.hops.arrived(peer, src, lap, t))
        for lap, peer, t in msg.sent:
            if peer in chain and peer != src:
                self._hop(self.hops.sent(src, peer, lap, t))

    def _hop(self, hop) -> None:
        """A hop and the workers' lap times the host's meter paired: to the room's
        measured speeds (planner.hops.StageSpeeds: the rejoin rule's) and the observers."""
        speeds = self.chain.speeds
        if hop is not None:
            speeds.hop(hop)
            self._notify(hop)
        for st in self.hops.take_stages():  # a worker's stamps of one lap: its time with it
            speeds.timed(st)
            self._notify(st)

    def _stamp(self, src: str, dst: str, lap_id: int) -> None:
        """This device sent (``src`` is this device) or had (``dst`` is) lap ``lap_id``'s
        frame now: the model host pairs it at once, a worker sends it with its next
        heartbeat (:class:`runtime.control.Stamps`)."""
        t = self.stamp_clock()
        me = self.cfg.device
        if self.hops is not None:
            self._hop(self.hops.sent(src, dst, lap_id, t) if src == me else self.hops.arrived(src, dst, lap_id, t))
        elif src == me:
            self._stamps_sent.append((lap_id, dst, t))
        else:
            self._stamps_arrived.append((lap_id, src, t))

    def _on_lost(self, peer: str, reason: str, silent_since_s: float | None = None) -> None:
        """A peer is gone (its connection failed or it fell silent): the scheduler hears
        DeviceLost once (the host re-deals and replays, or refuses what it cannot answer
        and stops); a worker that lost the model host sets :attr:`lost_host` (its device
        loop then ends with a clear status)."""
        if peer in self.lost_peers:
            return
        if self._stopped:  # the room is ending: peers closing their connections are no loss
            log.info("%s: %s closed after the room ended: %s", self.cfg.device, peer, reason)
            return
        self.lost_peers.add(peer)
        self.liveness.forget(peer, time.monotonic())
        log.warning("%s: lost %s: %s", self.cfg.device, peer, reason)
        if peer == self.cfg.host and not self.is_host:
            self.lost_host.set()
        self.handle(DeviceLost(peer, reason, silent_since_s))
        for first in list(self.awaiting):  # a device that was to load a re-dealt range is not coming
            self._ready(peer, first)
        if self.is_host and self.cfg.recover and hasattr(self.transport, "reconnect"):
            self._tasks.append(asyncio.ensure_future(self._meet_again(peer)))

    async def _meet_again(self, peer: str) -> None:
        """The model host lost worker ``peer``: after ``rejoin_live_s`` (a worker whose
        connection still carries messages says hello over it first), meet it at the relay
        for a new connection (``transport.reconnect``: it asks the relay too, having lost
        this host), one lost worker at a time (the relay seats one connection per device),
        for at most ``host_wait_s`` (as long as the worker waits for this host). Over the
        new connection the worker says hello again (:meth:`_from_lost`); nothing more
        here. Gives up quietly when the room stops, the worker is back, or the wait ends."""
        from .transport import TransportError
        await asyncio.sleep(self.cfg.rejoin_live_s)
        end = time.monotonic() + self.cfg.host_wait_s

        def waiting() -> bool:
            return not self._stopped and peer in self.lost_peers and not self.liveness.coming_back(peer)
        while waiting():
            left = end - time.monotonic()
            if left <= 0:
                log.info("%s: %s did not come back through the relay within %g s", self.cfg.device, peer,
                         self.cfg.host_wait_s)
                return
            async with self._meet_lock:
                if not waiting():
                    return
                try:
                    await self.transport.reconnect(peer, left)
                except (TransportError, OSError, ValueError) as e:
                    log.info("%s: meeting %s at the relay: %s", self.cfg.device, peer, e)
                    failed = True
                else:
                    failed = False
            if not failed:
                log.warning("%s: a new connection to %s through the relay: waiting for its hello", self.cfg.device,
                            peer)
                return
            await asyncio.sleep(1.0)

    def _unreachable(self, src: str, msg: Unreachable) -> None:
        """Worker ``src`` could not make a new connection to ``msg.device`` after the
        re-deal of ``msg.first_lap``, which took a device back: the host loses that device
        (the one it took back; ``msg.device`` when the latest re-deal took back neither)
        and re-deals without it. A report about an older re-deal is ignored."""
        if msg.first_lap != self._latest_redeal:
            return
        back = self._latest_back
        who = back if back in (src, msg.device) else msg.device
        self._on_lost(who, f"dealt back, but {src} could not connect to {msg.device} through the relay: {msg.reason}")

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

    # -- recovery -------------------------------------------------------------------

    def _load(self, start: int, end: int, model_dir: str | None = None) -> Stage:
        from .backends import StageSpec, make_stage
        return make_stage(self.cfg.backend, model_dir or self.cfg.model_dir, StageSpec(start, end, host=self.is_host),
                          max_ctx=getattr(self.stage, "max_ctx", 2048), precision=self.cfg.precision())

    def _manifest_sha(self, start: int, end: int) -> str:
        from .weights_share import make_manifest, manifest_sha256
        return manifest_sha256(make_manifest(self.cfg.model_dir, start, end, False, False, blocks=self._blocks))

    @property
    def _blocks(self) -> bool:
        """Whether this room holds the GGUF's blocks as stored (``weights: gguf``): then peer
        copies carry those blocks (runtime.weights_share, ``blocks``), not float32."""
        return self.cfg.weights == "gguf"

    async def _take_range(self, stages, first_lap: int, manifest_sha: str | None = None,
                          copy_range: tuple[int, int] | None = None) -> None:
        """Forget the old chain's work and residuals; load this device's new range (from
        the model directory, in the compute thread, after the compute already queued;
        or, with ``manifest_sha``, the layers ``copy_range`` (default: the whole new
        range) copied from the host over the weights channel first, every byte checked
        against that manifest hash, the rest read from this device's disk)."""
        keep = [c for c in _drain(self.work) if getattr(c, "lap_id", first_lap) >= first_lap
                and type(c) is not RollbackKV]
        for c in keep:
            self.work.put_nowait(c)
        self.residual = {lap: x for lap, x in self.residual.items() if lap >= first_lap}
        mine = [(a, b) for d, a, b in stages if d == self.cfg.device]
        a, b = mine[0] if mine else (0, 0)
        if (mine or self.is_host) and self.stage is not None and (self.stage.start, self.stage.end) != (a, b):
            self.loading = True  # quiet is expected now: no peer is declared lost by silence
            try:
                await self._load_range(a, b, manifest_sha, copy_range or (a, b), first_lap)
            finally:
                self.loading = False
                self.liveness.refresh_all(time.monotonic())  # a fresh start for every peer's silence

    def _progress(self, what: str) -> Callable[[int, int], None]:
        """A fetch_range progress callback logging ``what`` at every quarter and telling
        the model host each whole percent (:class:`runtime.control.Progress`)."""
        t0 = time.perf_counter()
        shown = [0]
        told = [-1]

        def report(done: int, total: int) -> None:
            percent = min(100, 100 * done // max(total, 1))
            if percent > told[0] and not self.is_host:
                told[0] = percent
                asyncio.ensure_future(self._send(self.cfg.host, REPLY, encode_control(Progress(percent=percent))))
            quarter = 4 * done // max(total, 1)
            if quarter > shown[0]:
                shown[0] = quarter
                dt = max(time.perf_counter() - t0, 1e-9)
                log.warning("%s: %s: %d%% (%.1f of %.1f MB, %.1f MB/s)", self.cfg.device, what,
                            100 * done // max(total, 1), done / 1e6, total / 1e6, done / 1e6 / dt)
        return report

    async def _load_range(self, a: int, b: int, manifest_sha: str | None, copy_range: tuple[int, int],
                          first_lap: int) -> None:
        """Load layers ``[a, b)`` as this device's stage: from the model directory, or
        with ``manifest_sha`` the layers ``copy_range`` copied from the host first (the
        copy's progress logged by quarters) and the rest from the model directory; a
        copy that fails (a sha256 check, the connection) is logged and the whole range
        read from the model directory. Records WeightsCopied in the trace. Raises
        OSError/WeightsError when the model directory cannot give the range."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        planned = self._planned(a, b)  # from the range held before this load
        src = None
        ga, gb = copy_range
        if manifest_sha is not None:
            import tempfile

            from .weights_share import fetch_range
            src = tempfile.mkdtemp(prefix=f"splitroom-{self.cfg.device}-layers-")
            what = f"copying {shown_layers(ga, gb, words=True)} from {self.cfg.host}"
            log.warning("%s: %s", self.cfg.device, what)
            try:
                await fetch_range(self.transport, self.cfg.host, ga, gb, False, False, src, manifest_sha,
                                  progress=self._progress(what))
                log.warning("%s: %s copied and verified in %.2f s", self.cfg.device,
                            shown_layers(ga, gb, words=True), time.perf_counter() - t0)
            except Exception as e:  # WeightsError (a check failed), TransportError: this device's disk then
                log.warning("%s: the copy from %s failed (%s: %s); reading %s from this device's disk",
                            self.cfg.device, self.cfg.host, type(e).__name__, e, shown_layers(ga, gb, words=True))
                import shutil
                shutil.rmtree(src, ignore_errors=True)
                src = None
        try:
            self.stage = await loop.run_in_executor(self._pool, self._build_stage, a, b, src, ga, gb)
        finally:
            if src is not None:  # the stage holds the tensors in memory now
                import shutil
                shutil.rmtree(src, ignore_errors=True)
        from .weights_share import range_nbytes
        seconds = time.perf_counter() - t0
        if src is not None:  # the copied range, then what the plan reads from this device's disk
            got = [(self.cfg.host, ga, gb)] + [("disk", da, db) for da, db in planned.disk]
        else:  # its whole new range rebuilt from this device's disk
            got = [("disk", a, b)]
        md = self.cfg.model_dir
        for source, ra, rb in got:  # bytes as stored, the sizes the manifest gives them
            self.trace.append((self.clock(), WeightsCopied(self.cfg.device, first_lap, source, ra, rb,
                                                           range_nbytes(md, ra, rb, self._blocks), seconds)))

    def _planned(self, a: int, b: int) -> CopyPlan:
        """This device's part of the re-deal's copy plan (planner.chain.copy_plan) for its
        new range ``[a, b)``, from the range its stage holds now."""
        held = [(self.cfg.device, self.stage.start, self.stage.end)] if self.stage is not None else []
        me = self.cfg.device
        return copy_plan(held, [(me, a, b)], self.cfg.host).get(me, CopyPlan(me, None, ()))

    def _build_stage(self, a: int, b: int, copied: str | None, ga: int, gb: int) -> Stage:
        """This device's stage for ``[a, b)``: layers ``[ga, gb)`` from the directory
        ``copied`` (a peer's verified copy) when given, every other layer from the model
        directory."""
        if copied is None:
            return self._load(a, b)
        from .backends import StageSpec, make_stage
        from .weights import load_range, load_range_native
        # weights gguf: the GGUF's blocks, from the copy's blocks file and this device's GGUF
        read = load_range_native if self._blocks else load_range
        md, host = self.cfg.model_dir, self.is_host
        w: dict = read(md, 0, 0, host, host)  # the host's embedding and head (none for a worker)
        if a < ga:
            w.update(read(md, a, ga, False, False))
        w.update(read(copied, ga, gb, False, False))
        if gb < b:
            w.update(read(md, gb, b, False, False))
        return make_stage(self.cfg.backend, md, StageSpec(a, b, host=host),
                          max_ctx=getattr(self.stage, "max_ctx", 2048), precision=self.cfg.precision(), weights=w)

    def _start_grace(self) -> None:
        """A re-deal began: silence is no loss for REDEAL_GRACE_S, and a device loading
        its new range is spared for REDEAL_LOAD_TIMEOUT_S; on the model host, only the
        devices that answered the Replan (Loading) are spared, so a second device lost
        meanwhile folds into the re-deal under way (planner.liveness)."""
        self.liveness.replanned(time.monotonic(), answers=self.is_host)

    async def _host_redeal(self, r: Redeal) -> None:
        """Carry out the host's Redeal ``r``: tell the new chain (Replan, sent without
        waiting: a send to a peer that is gone may block), load this device's new range,
        then count itself Ready. Re-deals load one after another, and one superseded by a
        later Redeal (a second device lost meanwhile) loads nothing: only the latest
        chain's range may end up in this device's stage."""
        self._start_grace()
        self.deal = self.chain.deal
        others = [d for d, _, _ in r.stages if d != self.cfg.device]
        plan = copy_plan([(s.device, s.start, s.end) for s in self._deal_before], r.stages, self.cfg.host)
        self._deal_before = tuple(DealStage(d, a, b) for d, a, b in r.stages)
        manifests, copies = {}, {}
        if self.cfg.weights_from_peer:  # the workers that gained layers copy them from here, as planned
            loop = asyncio.get_running_loop()
            for d, p in plan.items():
                if p.wire is not None:
                    copies[d] = p.wire
                    manifests[d] = await loop.run_in_executor(None, self._manifest_sha, *p.wire)
        sigs = {}
        if self.cfg.room_key:
            from .control import manifest_signature
            sigs = {d: manifest_signature(self.cfg.room_key, d, *copies[d], sha) for d, sha in manifests.items()}
        msg = encode_control(Replan(lost=r.lost or None, back=r.back, host=r.host, stages=r.stages, first_lap=r.first_lap,
                                    manifests=manifests, copy_ranges=copies, signatures=sigs))
        for d in others:
            self._tasks.append(asyncio.ensure_future(self._send(d, REPLY, msg)))
        async with self._redeal_lock:
            if r.first_lap != self._latest_redeal:
                return  # superseded: the later re-deal loads its own range
            try:
                await self._take_range(r.stages, r.first_lap)
            except Exception as e:  # the weights cannot be loaded here: nothing can be answered
                log.error("%s: cannot load the re-dealt range: %s", self.cfg.device, e)
                self.handle(DeviceLost(self.cfg.device, f"the model host cannot load its re-dealt range: {e}"))
                return
        self._ready(self.cfg.device, r.first_lap)

    async def _replan(self, msg: Replan) -> None:
        if msg.first_lap < self._latest_redeal:
            return  # an older plan than one already taken
        self._latest_redeal = msg.first_lap
        self._start_grace()
        for d, _, _ in msg.stages:  # a device the host took back: a peer of this one again
            if d in self.lost_peers:
                self.lost_peers.discard(d)
                self.liveness.revive(d, time.monotonic())
                if hasattr(self.transport, "revive"):
                    self.transport.revive(d)
        if any(d == self.cfg.device for d, _, _ in msg.stages):  # before loading: the host spares it then
            self._tasks.append(asyncio.ensure_future(
                self._send(self.cfg.host, REPLY, encode_control(Loading(first_lap=msg.first_lap)))))
        deal = msg.deal()
        self.chain.adopt(deal, msg.first_lap)
        self.deal = deal
        relink = asyncio.ensure_future(self._relink(msg))  # at the relay while this device loads
        self._tasks.append(relink)
        async with self._redeal_lock:  # one load at a time; a later Replan supersedes this one
            if msg.first_lap != self._latest_redeal:
                return
            sha = msg.manifests.get(self.cfg.device)
            if sha is not None and self.cfg.room_key:
                from .control import check_manifest_signature
                rng = msg.copy_ranges.get(self.cfg.device)  # the host signs a manifest with its copy range
                if rng is None or not check_manifest_signature(self.cfg.room_key, self.cfg.device, *rng, sha,
                                                               msg.signatures.get(self.cfg.device, "")):
                    log.warning("%s: the manifest hash in the Replan is not signed with the room key; "
                                "reading the layers from this device's disk instead", self.cfg.device)
                    sha = None
            try:
                await self._take_range(msg.stages, msg.first_lap, sha, msg.copy_ranges.get(self.cfg.device))
            except Exception as e:  # say nothing: the host notices this device is missing
                log.error("%s: cannot load the re-dealt range: %s", self.cfg.device, e)
                return
        if not await relink:  # told the host it cannot reach a neighbour: no Ready
            return
        if msg.first_lap == self._latest_redeal and any(d == self.cfg.device for d, _, _ in msg.stages):
            await self._send(self.cfg.host, REPLY, encode_control(Ready(first_lap=msg.first_lap)))

    async def _relink(self, msg: Replan) -> bool:
        """After a Replan that dealt ``msg.back`` back, while the range loads and before
        Ready: that device and each worker neighbour of it in the new chain
        (:func:`planner.chain.relink_neighbours`) make a new connection through the relay
        (``transport.reconnect``), one meeting at a time per device (``_meet_lock``), the
        device dealt back offering to each neighbour in chain order and each neighbour
        waiting for its offer (so no offer reaches a relay socket of the device that is
        meeting someone else). Its old link may be dead while both sides still read it
        "connected". A meeting that fails within :data:`RELINK_WAIT_S` is reported to
        the host (Unreachable); returns whether this device may say Ready (True when it
        has no one to meet). Re-dealt weights come from the host, never over these links."""
        from .transport import TransportError
        back, me = msg.back, self.cfg.device
        if back is None or self.is_host or not hasattr(self.transport, "reconnect"):
            return True
        near = relink_neighbours(msg.host, [d for d, _, _ in msg.stages], back, self.sched_cfg.return_path)
        meet = [(p, True) for p in near] if me == back else [(back, False)] if me in near else []
        for peer, offer in meet:
            try:
                async with self._meet_lock:
                    await self.transport.reconnect(peer, RELINK_WAIT_S, offer=offer)
            except (TransportError, OSError, ValueError) as e:
                log.warning("%s: no new connection to %s through the relay after %s was dealt back: %s",
                            me, peer, back, e)
                await self._send(self.cfg.host, REPLY, encode_control(
                    Unreachable(first_lap=msg.first_lap, device=peer, reason=str(e)[:300])))
                return False
            if peer in self.lost_peers:  # a send on the old connection may have failed meanwhile
                self.lost_peers.discard(peer)
                self.liveness.revive(peer, time.monotonic())
            if hasattr(self.transport, "revive"):
                self.transport.revive(peer)
            log.warning("%s: a new connection to %s through the relay (%s was dealt back)", me, peer, back)
        return True

    def _ready(self, device: str, first_lap: int) -> None:
        waiting = self.awaiting.get(first_lap)
        if waiting is None:
            return
        waiting.discard(device)
        self.liveness.refresh(device, time.monotonic())  # its silence is counted again from now
        if not waiting:
            del self.awaiting[first_lap]
            self.handle(ChainReady(first_lap))

    @property
    def loading(self) -> bool:
        """True while this device loads a re-dealt range (silence is no loss then)."""
        return self.liveness.loading

    @loading.setter
    def loading(self, value: bool) -> None:
        self.liveness.loading = value

    async def _heartbeats(self) -> None:
        """Run the liveness timers (:class:`planner.liveness.Liveness`): at each deadline,
        declare lost a peer silent too long and tell every other peer this device is here
        (with the times of NTP's exchange; a worker sends the host its stamps after it)."""
        live = self.liveness
        while True:
            deadline = live.next_deadline_s()
            if deadline is None:
                return
            await asyncio.sleep(max(deadline - time.monotonic(), 0.0))
            now = time.monotonic()
            tick = live.handle_timer(now, {d for waiting in self.awaiting.values() for d in waiting})
            for p, silent_s, rule in tick.lost:
                self._on_lost(p, lost_reason(silent_s, rule), self.clock() - silent_s)
            for p in tick.back:
                self._back(p)
            for p in tick.beat:
                for msg in self._beat_for(p):
                    asyncio.ensure_future(self._send(p, REPLY, msg))

    def _beat_for(self, peer: str) -> list[bytes]:
        """The heartbeat to ``peer`` now (sent_s, and the echo of ``peer``'s last one
        with the time it was held: planner/hops.py), then, to the model host, the
        stamps gathered since the last one."""
        now = self.stamp_clock()
        last = self._beat_in.get(peer)
        if last is not None and not 0 <= now - last[1] <= ECHO_HELD_MAX_S:
            last = None  # held too long to time a round trip by: no echo
        beat = Heartbeat(sent_s=now, echo_s=last[0] if last else None, held_s=now - last[1] if last else None)
        self._beat_out.setdefault(peer, collections.deque(maxlen=16)).append(now)
        out = [encode_control(beat)]
        if peer == self.cfg.host and not self.is_host and (self._stamps_arrived or self._stamps_sent):
            out.append(encode_control(Stamps(arrived=tuple(self._stamps_arrived), sent=tuple(self._stamps_sent))))
            self._stamps_arrived.clear()
            self._stamps_sent.clear()
        return out

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
        """Stop the compute, heartbeat and re-deal tasks; losses heard from now on are
        the room ending, not faults (logged at info, no re-deal)."""
        self._stopped = True
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


def lost_reason(silent_s: float, rule: str) -> str:
    """The DeviceLost reason for a peer silent ``silent_s`` seconds, lost by ``rule``
    (planner.liveness: SILENT, UNANSWERED, READY, LOADING_SILENT, LOADING): the rule is
    named, so a reader (and a test) tells a loss folded into a re-deal from one at the
    load window's end."""
    why = f"no heartbeat for {silent_s:.1f} s"
    if rule == UNANSWERED:
        return f"{why}, and no answer to the re-deal under way"
    if rule == READY:
        return f"{why}, after it had loaded its re-dealt range"
    if rule == LOADING_SILENT:
        return f"{why} while loading its re-dealt range (a device that loads still sends heartbeats)"
    if rule == LOADING:
        return f"{why}, still loading its re-dealt range after {REDEAL_LOAD_TIMEOUT_S:g} s"
    return why


def _drain(q: asyncio.Queue) -> list:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def merge_traces(record_lists: Sequence[Sequence[dict]]) -> list[tuple[float, Any]]:
    """Merge several nodes' JSON records into one time-ordered ``[(t, obj)]`` trace
    (stable: records with equal times keep each node's order)."""
    all_ = [r for recs in record_lists for r in recs]
    all_.sort(key=lambda r: r["t"])
    return [from_record(r) for r in all_]
