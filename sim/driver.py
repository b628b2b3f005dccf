"""The simulator's driver: runs the shared scheduler against a model of the room.

The driver keeps its own event queue (a heap of callbacks in SimPy's order: time,
priority, insertion), the time each device's
compute is busy until (stages run one at a time, in arrival order), one link per
ordered pair of devices (sim/link.py), a device model per device (sim/devices.py) and
an acceptance model (sim/acceptance.py). :class:`planner.drive.Driver` feeds events to
the room's :class:`planner.chain.Chain` (the host's scheduler and every worker's machine
behind one router) and records every event and command in the trace (or only the
metrics, ``trace=False``); :class:`Simulation` is its executor, carrying the commands
out as timed callbacks.

Running ahead: with no faults, a direct return path and no worker woken by the host,
a worker hears only the frames of its chain, in the order the host sent them (links
and devices are FIFO), and sends only to the next stage. So when the host sends a
frame, the driver runs it through every worker at once (the worker machine's fast path,
:meth:`planner.scheduler.WorkerMachine.accept` and ``release``) -- each worker's machine,
device, link and jitter stream see the same calls in the same order, at the same
(future) times, as event by event -- and queues only its return to the host. The one
thing that can differ: a link whose two frames would fire an ulp out of send order
(see ``_deliver``) delivers the earlier frame at the later one's instant event by
event; that is detected and the run starts again event by event.

Tokens are synthetic but consistent: the target model's greedy answer is a fixed
sequence ``truth(pos)``; the host's head predicts it exactly, and the drafter proposes
it with the acceptance model deciding how many leading drafts are right. The
scheduler therefore judges drafts exactly as it does with a real model.

Questions are asked one after another (the next when the previous one ends), by the
devices in ``workload.asked_by`` in turn (the host when empty); with ``workload.clients``
C > 1, C clients ask at once, each its next question when its answer ends. With
``workload.warm_up_tokens`` W > 0 the host first asks one question alone (the workload's
prompt length, W answer tokens); when it ends, the metrics and the trace start afresh
and the workload begins, so only what the room carries over (links' grown congestion
windows) remains of it.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from dataclasses import replace
from heapq import heappop, heappush
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from planner.deal import Deal, deal_for
from planner.frames import FrameHeader, frame_bytes
from planner.metrics import Accumulator
from planner.protocol import (AnswerDone, ChainReady, Computed, DeviceBack, DeviceLost, Draft, DraftReady, DropFrame,
                              EmitToken, FrameArrived, HeadFinished, QuestionAsked, Redeal, Refuse, ReturnPath, RollbackKV, RunHead, RunStage,
                              SendFrame, StageFinished, Wake, WeightsCopied)
from planner.hops import StageTimed
from planner.liveness import rejoin_time, stall_loss
from planner.room import HEARTBEAT_S, HEARTBEAT_TIMEOUT_S, Scenario
from planner.chain import Chain, copy_plan, redeal_rule_for, rejoin_rule_for
from planner.drive import Driver, synthetic_draft, synthetic_head
from planner.scheduler import SchedulerConfig
from planner.scheduler.worker import ROLLBACK_RUN, RUN
from sim.acceptance import make_acceptance
from sim.devices import DECODE_MAX_TOKENS, DeviceModel, device_model
from sim.draft_costs import draft_policy
from sim.link import Link, Links
from sim.relay import relayed_network


def truth(pos: int) -> int:
    """The simulated target model's greedy token at sequence position ``pos``."""
    return 1000 + (pos * 7919) % 40000


class SimResult:
    """What a simulation gives: the deal, the trace ``[(t_s, obj)]``, its metrics, and
    the refusals (:class:`planner.protocol.Refuse` commands, in order).

    ``trace`` is built on first use from the compact records the run kept: every event
    and command with its time, sorted by time (records at the same instant in the order
    they were made). A run with ``trace=False`` kept none (only the metrics)."""

    __slots__ = ("deal", "metrics", "refusals", "_raw", "_trace")

    def __init__(self, deal: Deal, raw: list | None, metrics: dict, refusals: list | None = None):
        self.deal = deal
        self.metrics = metrics
        self.refusals = list(refusals or [])
        self._raw = raw
        self._trace: list | None = None

    @property
    def trace(self) -> list:
        """``[(t_s, event or command)]`` in time order (planner.trace).
        Raises ValueError for a run made with ``trace=False``."""
        if self._trace is None:
            if self._raw is None:
                raise ValueError("this simulation kept no trace (run it with trace=True)")
            out: list = []
            for t, o in self._raw:
                if type(o) is _Step:  # a worker's frame in, stage, frame out (Simulation._run_ahead)
                    src, dst, h, got, done, sent = o
                    out.append((t, FrameArrived(dst, src, h)))
                    out.extend((t, c) for c in got)
                    if done is not None:
                        out.append((done, StageFinished(dst, h.lap_id)))
                        out.extend((done, c) for c in sent)
                else:
                    out.append((t, o))
            out.sort(key=_time)
            self._trace = out
            self._raw = []
        return self._trace


def _time(rec) -> float:
    return rec[0]


class _Step(NamedTuple):
    """One worker's part of a lap run ahead of the clock, as one trace entry: the frame
    ``h`` from ``src`` arrives at worker ``dst`` (at the entry's time), ``got`` is what the
    worker's machine answered (RunStage, maybe after RollbackKV; or DropFrame), its
    stage finishes at ``done`` (None: dropped) and ``sent`` is what it answered then."""

    src: str
    dst: str
    h: FrameHeader
    got: list
    done: float | None
    sent: list


class _Hop:
    """One hop of a chain run ahead of the clock: the link ``src -> dst``, the
    receiving worker's machine and stage timer (None: the host), the receiver's
    "free at" time and the link's last delivery time."""

    __slots__ = ("link", "src", "dst", "worker", "timer", "free", "fired")

    def __init__(self, link: Link, src: str, dst: str, worker, timer) -> None:
        self.link, self.src, self.dst, self.worker, self.timer = link, src, dst, worker, timer
        self.free = 0.0
        self.fired = -math.inf


class _Reordered(Exception):
    """Two frames of one link fire out of send order (module doc): run event by event."""


#: SimPy's priorities: a process starting (Initialize) goes before timeouts of its instant
_URGENT, _NORMAL = 0, 1


class _Queue:
    """The event queue: callbacks at times, in the order SimPy would run them.

    SimPy keeps ``(time, priority, insertion number, event)`` on a heap, and a timeout of
    ``delay`` fires at ``now + delay``. This queue keeps ``(time, priority, made_at,
    insertion number, callback, argument)``: for callbacks scheduled at the current
    time (``made_at == now``) the order is SimPy's exactly; a callback scheduled ahead of
    the clock (``at(..., made_at=t)``, the driver working ahead: see the module doc)
    sorts as if scheduled at ``t``. ``now`` is the current time; the driver's links
    read it too. Seconds.
    """

    __slots__ = ("now", "_heap", "_n")

    def __init__(self) -> None:
        self.now: float = 0  # an int at the start, as SimPy's (traces write "t": 0)
        self._heap: list = []
        self._n = 0

    def at(self, t: float, fn: Callable, arg=None, made_at: float | None = None, priority: int = _NORMAL) -> None:
        """Call ``fn(arg)`` at ``t`` (not before ``made_at``, default now), as a SimPy
        timeout of ``max(t - made_at, 0)`` made at ``made_at``."""
        now = self.now if made_at is None else made_at
        n = self._n
        self._n = n + 1
        heappush(self._heap, (now + max(t - now, 0.0), priority, now, n, fn, arg))

    def after(self, delay: float, fn: Callable, arg=None) -> None:
        """Call ``fn(arg)`` ``delay`` seconds from now (a SimPy ``timeout(delay)``:
        at ``now + delay``)."""
        now = self.now
        n = self._n
        self._n = n + 1
        heappush(self._heap, (now + delay, _NORMAL, now, n, fn, arg))

    def run(self) -> None:
        """Run every callback, in time order, until none is left."""
        heap = self._heap
        while heap:
            t, _, _, _, fn, arg = heappop(heap)
            self.now = t
            fn(arg)


class Simulation:
    """One simulated run of a scenario. Deterministic for the scenario's ``seed``.

    ``progress(tokens_done, tokens_total)`` is called as answer tokens are emitted.
    ``ahead``: let the driver run workers ahead of its clock where that gives the same
    result (module doc); False runs every event through the queue (the reference the
    tests compare it with). ``trace``: keep the trace (SimResult.trace); without it the
    run keeps only the metrics and refusals, and is faster (nothing it makes outlives
    the step that made it). ``acceptance_picks``: a bootstrap replica's prompts, one
    index into the profile's walk by prompt per question (question ``q`` draws its
    accepted lengths from prompt ``acceptance_picks[q mod len]`` alone;
    splitroom/ranges.py); None draws every lap from all the prompts' lengths. Raises
    planner.deal.DealError when the room cannot be dealt.
    """

    def __init__(self, scn: Scenario, deal: Deal | None = None,
                 progress: Callable[[int, int], None] | None = None, ahead: bool = True, trace: bool = True,
                 acceptance_picks: Sequence[int] | None = None):
        self.scn = scn
        self.deal = deal or deal_for(scn)
        self.loop = _Queue()
        seeds = np.random.SeedSequence(scn.seed)
        (link_seed, acc_seed, dev_seed) = seeds.spawn(3)
        self.config = replace(SchedulerConfig.from_scenario(scn, deal=self.deal),
                              draft_policy=draft_policy(scn, self.deal))
        network = relayed_network(scn.network, [d.id for d in scn.devices], self.deal.host) \
            if scn.decoding.via_host else scn.network  # return: via_host (sim/relay.py)
        self.links = Links(self.loop, network, np.random.default_rng(link_seed))
        #: worker -> its link's first stall that the heartbeat rule loses it in (the real room's)
        self._stall_lost = self._stall_losses()
        self.chain = Chain(self.deal, self.config,
                           redeal=redeal_rule_for(scn) if scn.faults or self._stall_lost else None,
                           rejoin=rejoin_rule_for(scn, self.deal) if self._stall_lost else None)
        #: stages and heads timed for the rejoin rule's measured speeds (a room that can lose a worker to a stall)
        self._timing = bool(self._stall_lost)
        self._drops: dict[str, list[float]] = {}  # device -> when the heartbeat rule lost it, each time
        self.driver = Driver(self.chain, self, self._record)
        self.dead = self.driver.dead  # devices killed by a scenario fault
        self.first_deal = self.deal  # self.deal follows re-deals; the result reports the deal the room began with
        self._copy_s: dict[str, float] = {}  # lost device -> seconds the re-dealt weights took to copy
        self.stage_layers = {s.device: s.layers for s in self.deal.stages}
        prof = scn.profile
        self.devices = {d.id: device_model(d, scn, self.deal, prof) for d in scn.devices}
        self._scale = self._stage_scales()
        self._free_at: dict[str, float] = {}
        spec = scn.decoding.speculative
        measured = prof.drafters.get(spec.drafter) if (spec and prof) else None
        if measured is not None:  # the acceptance measured on this scenario's kind of questions
            measured = measured.for_workload(scn.workload.acceptance_workload)
            if acceptance_picks:
                measured = measured.resampled(acceptance_picks)
        self.acceptance = make_acceptance(spec, np.random.default_rng(acc_seed), measured,
                                          by_question=bool(acceptance_picks)) if spec else None
        self.raw: list | None = [] if trace else None  # (t, obj) or (t, _Step): the trace, compact
        self.refusals: list[Refuse] = []
        self.acc = Accumulator()  # the metrics, fed as the records are made
        self.progress = progress
        self.tokens_total = scn.workload.questions * scn.workload.answer_tokens
        self.tokens_done = 0
        self._asked = 0
        self._ended = 0  # questions answered or refused
        self._lap_span: dict[int, tuple[int, int]] = {}  # lap -> (first position, tokens), from RunStage
        self._in_flight: dict[tuple[str, str], deque] = {}  # link -> frames sent, not yet delivered
        self._prompt_len: dict[int, int] = {}  # question -> prompt tokens (laps before it are prefill)
        self._client_of: dict[int, int] = {}  # question -> the workload client that asked it
        self._faulted = {f.at_token for f in scn.faults if f.at_token is not None}
        self.ahead = ahead and self._can_run_ahead()
        self._hops: list[_Hop] | None = None  # the chain run ahead (built on first use)
        self._t_ahead = -math.inf  # latest record time made ahead of the clock
        self.reordered = False  # a run ahead met frames out of order and ran again event by event
        #: the warm-up question's id (workload.warm_up_tokens; None: no warm-up)
        self._warm_qid: int | None = scn.workload.questions if scn.workload.warm_up_tokens else None

    def _can_run_ahead(self) -> bool:
        """Whether workers may run ahead (module doc): no faults, results return
        directly, and no worker's clock-down state hears from the host (Wake)."""
        if self.scn.faults or self._stall_lost or self.config.return_path != ReturnPath.DIRECT:
            return False
        woken = set(self.chain.host.wake_targets) if self.chain.host else set()
        return not any(self.devices[w].clock_down and not self.devices[w].self_wake for w in self.chain.workers
                       if w in woken)

    # -- plumbing -------------------------------------------------------------------

    def dispatch(self, event) -> None:
        """Feed ``event`` to the room now (planner.drive.Driver: dead devices' events
        dropped, the records kept, the commands carried out by this executor)."""
        self.driver.dispatch(event, self.loop.now)

    def _record(self, now: float, event, cmds, ignored) -> None:
        raw = self.raw
        if raw is not None:
            raw.append((now, event))
            if ignored:
                raw.extend([(now, x) for x in ignored])
            raw.extend([(now, c) for c in cmds])
        self.acc.add_all(now, event, cmds)  # before carrying them out, which adds nothing to it

    # -- the executor (planner.drive.Executor) ------------------------------------

    def run_stage(self, c: RunStage) -> None:
        if c.inputs:
            self._lap_span[c.lap_id] = (c.first_pos, c.tokens)
        done = StageFinished(c.device, c.lap_id)
        start = self._start_s(c.device)
        run_s = self._stage_s(c, start)
        self._occupy(c.device, start + run_s, done)
        if self._timing:  # what the real room times (planner.hops.StageSpeeds), known when the stage ends
            seconds = run_s if c.device == self.deal.host else start + run_s - self.loop.now
            self.loop.at(start + run_s, self._timed, StageTimed(c.device, c.lap_id, seconds))

    def _timed(self, st: StageTimed) -> None:
        """A stage's time as the real room measures it, given to the room's speeds when
        the stage ends: the model host's compute of its RunStage, a worker's time with
        the lap from its frame's arrival until it hands the lap on (queue wait included)."""
        self.chain.speeds.timed(st)

    def send_frame(self, c: SendFrame) -> None:
        if self.ahead and c.src == self.deal.host and c.dst in self.chain.workers:
            self._run_ahead(c)
            return
        h = c.header
        nbytes = frame_bytes(h.tokens, h.hidden, h.dtype)  # the real frame's size
        arrive = self.links.get(c.src, c.dst).schedule(nbytes)
        self._deliver(arrive, c.src, c.dst, FrameArrived(c.dst, c.src, h))

    def run_head(self, c: RunHead) -> None:
        host = self.deal.host
        first_pos, n = self._lap_span.pop(c.lap_id)
        done = HeadFinished(c.lap_id, synthetic_head(truth, first_pos, n, c.rows))
        dm = self.devices[host]
        start = self._start_s(host)
        head_s = self._head_s(dm, c.rows) * dm.idle_factor(start)  # slower after idle (DeviceProfile.idle)
        dm.ran_until(start + head_s)
        self._occupy(host, start + head_s, done)
        if self._timing:
            self.loop.at(start + head_s, self.chain.speeds.computed, Computed(host, "RunHead", c.lap_id, head_s))

    def draft(self, c: Draft) -> None:
        host = self.deal.host
        cost = self.devices[host].draft_s(c.k, self.scn.decoding.speculative)
        done = DraftReady(c.draft_id, self._draft_tokens(c))
        self._occupy(host, self._start_s(host) + cost, done)

    def wake(self, c: Wake) -> None:
        now = self.loop.now
        self.devices[c.device].wake(now, now + c.max_s)

    def emit(self, c: EmitToken) -> None:
        self.tokens_done += 1
        if self.tokens_done in self._faulted:
            for f in self.scn.faults:
                if f.at_token == self.tokens_done:
                    self._kill(f)
        if self.progress is not None and self.tokens_done % 64 == 0:
            self.progress(self.tokens_done, self.tokens_total)

    def question_ended(self, c: AnswerDone | Refuse) -> None:
        if c.question_id == self._warm_qid:
            self._warmed()
            return
        if type(c) is Refuse:
            self.refusals.append(c)
        self._ended += 1
        client = self._client_of.pop(c.question_id, 0)
        self._start(lambda: self._ask_next(client))

    def rollback(self, c: RollbackKV) -> None:
        """A KV rollback costs no simulated time."""

    def drop_frame(self, c: DropFrame) -> None:
        """A dropped frame costs no simulated time."""

    def _start(self, fn: Callable[[], None]) -> None:
        """What ``env.process`` of a process that first yields ``timeout(0)`` does: an
        urgent start now, which schedules ``fn`` behind everything already due now."""
        loop = self.loop
        loop.at(loop.now, lambda _a: loop.at(loop.now, lambda _b: fn()), priority=_URGENT)

    # -- timed work -----------------------------------------------------------------
    # A device computes one thing at a time, first come first served: its work is
    # placed at max(now, when it is next free), the same as a capacity-1 FIFO
    # simpy.Resource, at one queued callback per piece of work instead of four.

    def _at(self, t: float, event) -> None:
        self.loop.at(t, self.dispatch, event)

    def _deliver(self, t: float, src: str, dst: str, event, made_at: float | None = None) -> None:
        """Deliver frame ``event`` on the link ``src -> dst`` at ``t``, in send order.

        A timeout fires at ``now + delay``; in floating point two frames a link delivers
        at the same ``t`` (one waited for the other, sim/link.py) can land an ulp
        apart in either order, and a worker would drop the later frame as "not
        serving". So each link keeps its frames in a FIFO and each timeout delivers the
        oldest one."""
        q = self._in_flight.get((src, dst))
        if q is None:
            q = self._in_flight[(src, dst)] = deque()
        q.append(event)
        self.loop.at(t, self._pop_deliver, q, made_at)

    def _pop_deliver(self, q: deque) -> None:
        self.dispatch(q.popleft())

    def _start_s(self, device: str) -> float:
        """When work handed to ``device`` now starts: max(now, when it is next free)."""
        now = self.loop.now
        free = self._free_at.get(device, 0.0)
        return free if free > now else now

    def _occupy(self, device: str, end: float, done_event) -> None:
        """``device`` works until ``end`` (its start from :meth:`_start_s`), then
        ``done_event`` happens."""
        self._free_at[device] = end
        self._at(end, done_event)

    # -- workers ahead of the clock (module doc, "Running ahead") --------------------

    def _stage_scales(self) -> dict[str, float]:
        """Device -> its stage's weight scale (DeviceModel.stage_scale: 1.0 unless the
        model's layers differ in size, then the stage's bytes over layers x mean)."""
        return {s.device: self.devices[s.device].stage_scale(s.start, s.end) for s in self.deal.stages}

    def _ahead_hops(self) -> list[_Hop]:
        """The chain as hops: host -> first worker, ..., last worker -> host."""
        names = [self.deal.host] + list(self.chain.host.workers) + [self.deal.host]
        out = []
        for src, dst in zip(names, names[1:]):
            w = self.chain.workers.get(dst)
            out.append(_Hop(self.links.get(src, dst), src, dst, w,
                            self.devices[dst].stage_timer(self.stage_layers.get(dst, 0), self._scale.get(dst, 1.0))
                            if w else None))
        return out

    def _run_ahead(self, c: SendFrame) -> None:
        hops = self._hops
        if hops is None:
            hops = self._hops = self._ahead_hops()
        acc, raw = self.acc, self.raw
        hop_s, stage_s = acc.hop_s, acc.stage_s  # a hop and a stage as a whole (Accumulator doc)
        t = self.loop.now
        h = c.header
        lap, tokens, pos = h.lap_id, h.tokens, h.first_pos  # the same all the way round
        nbytes = frame_bytes(tokens, h.hidden, h.dtype)
        decode = pos >= self._prompt_len.get(h.question_id, 0) and tokens <= DECODE_MAX_TOKENS
        for hp in hops:
            arrive = hp.link.schedule(nbytes, t)
            worker = hp.worker
            if worker is None:  # back to the host: through the queue
                acc.sent(hp.src, hp.dst, lap, t)
                self._deliver(arrive, hp.src, hp.dst, FrameArrived(hp.dst, hp.src, h), made_at=t)
                break
            d = arrive - t
            fire = t + (d if d > 0.0 else 0.0)  # t + max(arrive - t, 0.0), as a timeout fires
            if fire < hp.fired:
                raise _Reordered
            hp.fired = fire
            hop_s[(hp.src, hp.dst, lap)] = fire - t
            verdict, reason = worker.accept(h)
            if verdict is not RUN and verdict is not ROLLBACK_RUN:  # dropped (a stale lap) or not for a worker
                if raw is not None:
                    raw.append((fire, _Step(hp.src, hp.dst, h, worker.commands_for(h, verdict, reason), None, ())))
                t = fire
                break
            # Simulation._run_stage / _stage_s for a worker (no inputs to embed)
            start = hp.free
            if start < fire:
                start = fire
            end = start + hp.timer(tokens, pos, start, decode)
            hp.free = end
            d = end - fire
            t = fire + (d if d > 0.0 else 0.0)
            stage_s[(hp.dst, lap)] = t - fire
            out = worker.release(lap)
            if raw is not None:
                raw.append((fire, _Step(hp.src, hp.dst, h, worker.commands_for(h, verdict, reason), t,
                                        [] if out is None else [SendFrame(hp.dst, out[0], out[1])])))
            if out is None:  # a prefill chunk that does not return
                break
            h = out[1]  # on to out[0]: the next hop's receiver
        if t > self._t_ahead:
            self._t_ahead = t

    def _head_s(self, dm: DeviceModel, rows: int) -> float:
        """Head + sampling on ``rows`` rows: measured per row when the scenario has it."""
        if self.scn.measured_head_s_per_row is not None:
            return rows * self.scn.measured_head_s_per_row
        return dm.head_s(rows) + dm.sample_s(rows)

    def _stage_s(self, c: RunStage, start: float) -> float:
        dm = self.devices[c.device]
        # the stage reads the KV cache of the positions before this frame's first;
        # a decode/verify pass: past the prompt and small (a replay after a re-deal
        # re-runs answer positions in prefill-sized chunks)
        s = dm.run_s(self.stage_layers.get(c.device, 0), c.tokens, c.first_pos, start,
                     c.first_pos >= self._prompt_len.get(c.question_id, 0) and c.tokens <= DECODE_MAX_TOKENS,
                     self._scale.get(c.device, 1.0))
        if c.inputs:  # the model host embeds its inputs first
            s += dm.embed_s(c.tokens)
        return s

    def _draft_tokens(self, c: Draft) -> tuple[int, ...]:
        """Drafts that agree with the reference for as many leading tokens as the
        acceptance model says (none once an earlier assumed draft was already wrong)."""
        base = c.base_len
        consistent = True
        for i, t in enumerate(c.assumed):
            if t != truth(base + i):
                consistent = False
                break
        a = self.acceptance.accepted(c.k, c.question_id) if (consistent and self.acceptance is not None) else 0
        return synthetic_draft(truth, c, a)

    def _ask_next(self, client: int = 0) -> None:
        """Client ``client`` asks the workload's next question (its previous one ended).
        With one client the askers are ``asked_by`` in turn (the host when empty); with
        several, client i asks as ``asked_by[i]`` in turn, else as ``client-i``."""
        w = self.scn.workload
        if self._asked >= w.questions:
            return
        qid = self._asked
        self._asked += 1
        self._client_of[qid] = client
        if w.clients > 1:
            who = w.asked_by[client % len(w.asked_by)] if w.asked_by else f"client-{client}"
        else:
            who = w.asked_by[qid % len(w.asked_by)] if w.asked_by else self.deal.host
        n = w.prompt_tokens_each[qid % len(w.prompt_tokens_each)] if w.prompt_tokens_each else w.prompt_tokens
        prompt = tuple(truth(p) for p in range(n))
        self._prompt_len[qid] = len(prompt)
        self.dispatch(QuestionAsked(qid, who, prompt, w.answer_tokens))

    def _warm_up(self) -> None:
        """The host asks the warm-up question (``workload.warm_up_tokens`` answer tokens,
        the workload's prompt length; id :attr:`_warm_qid`, which no workload question has)."""
        w = self.scn.workload
        prompt = tuple(truth(p) for p in range(w.prompt_tokens))
        self._prompt_len[self._warm_qid] = len(prompt)
        self.dispatch(QuestionAsked(self._warm_qid, self.deal.host, prompt, w.warm_up_tokens))

    def _warmed(self) -> None:
        """The warm-up question ended: the metrics, the trace, the refusals and the token
        count start afresh, and the workload's clients ask."""
        self.acc = Accumulator()
        if self.raw is not None:
            self.raw = []
        self.refusals = []
        self.tokens_done = 0
        self._t_ahead = -math.inf
        self._ask_all()

    def _ask_all(self) -> None:
        for client in range(self.scn.workload.clients):
            self._start(lambda client=client: self._ask_next(client))

    # -- faults ---------------------------------------------------------------------

    def _kill(self, f) -> None:
        """Fault ``f`` (planner.room.Fault): its device dies now; the room hears
        DeviceLost ``f.detect_s`` later (the heartbeat timeout)."""
        if f.device in self.dead:
            return
        self.dead.add(f.device)
        now = self.loop.now
        self._at(now + f.detect_s, DeviceLost(f.device, f"no heartbeat for {f.detect_s:g} s", silent_since_s=now))

    def _stall_losses(self) -> dict[str, tuple[float, float]]:
        """``{worker: (start_s, end_s)}``: each worker of the deal whose link to the model
        host stalls (the scenario's episodes) long and hard enough that the heartbeat
        rule loses it, with its first stall. Every stall of a link has the same length
        and extra round trip, so the first one that starts in the run decides; one
        already under way at the start is not counted (nothing was heard before it)."""
        host, out = self.deal.host, {}
        for s in self.deal.stages:
            if s.device == host:
                continue
            link = self.links.get(s.device, host)
            window = link.next_stall(0.0)
            if window is not None and stall_loss(*window, link.control_delay_s, HEARTBEAT_S,
                                                 HEARTBEAT_TIMEOUT_S) is not None:
                out[s.device] = window
        return out

    def _stall(self, device: str, start_s: float, end_s: float) -> None:
        """``device``'s link to the host stalls now (``[start_s, end_s)``): while the
        room still runs, the host's heartbeat rule (planner.liveness.stall_loss) loses
        it when the rule says: DeviceLost then. As in the real room it then says hello
        again, and the host takes it back when planner.liveness.rejoin_time says (the
        rejoin hold, longer after each drop): DeviceBack, and the rejoin rule re-deals it
        back when the deal with it is faster. Every stall of the link is followed."""
        if self._ended >= self.scn.workload.questions:
            return
        link = self.links.get(device, self.deal.host)
        after = link.next_stall(end_s)
        if after is not None and after[0] > start_s:
            self.loop.at(after[0], lambda _a, a=after[0], b=after[1]: self._stall(device, a, b))
        if device in self.dead:
            return  # still lost (its hellos through this stall are rejoin_time's)
        lost = stall_loss(start_s, end_s, link.control_delay_s, HEARTBEAT_S, HEARTBEAT_TIMEOUT_S)
        if lost is None:
            return
        at_s, heard_s = lost

        def lose(_a) -> None:
            if device in self.dead or self._ended >= self.scn.workload.questions:
                return
            self.dead.add(device)
            drops = self._drops.setdefault(device, [])
            self.dispatch(DeviceLost(device, f"no heartbeat for {at_s - heard_s:.1f} s", silent_since_s=heard_s))
            back_s = rejoin_time(at_s, link.control_delay_s, HEARTBEAT_S, HEARTBEAT_TIMEOUT_S, drops)
            drops.append(at_s)
            if back_s is not None:
                self.loop.at(back_s, lambda _b: self._back(device))
        self.loop.at(at_s, lose)

    def _back(self, device: str) -> None:
        """``device``, lost to a stall, is heard again for its rejoin hold: DeviceBack."""
        if device not in self.dead or self._ended >= self.scn.workload.questions:
            return
        self.dead.discard(device)
        self.dispatch(DeviceBack(device, "said hello again after the stall"))

    def redeal(self, r: Redeal) -> None:
        """The new chain loads its ranges, as :func:`planner.chain.copy_plan` says (the
        real room's plan): a worker copies its lowest gained range from the model host
        over their link (bytes / bandwidth + rtt/2, at most the rate a calibration
        profile measured for a peer's copy: ``weights_Bps``), then reads any other gained
        range from its own disk at its copy speed; the host reads what it gains from its
        disk (instant when no copy speed is given). One WeightsCopied per range, bytes
        from the model's layer sizes. All devices load at once; then ChainReady, and the
        host replays."""
        before = [(s.device, s.start, s.end) for s in self.deal.stages]
        self.deal = self.chain.deal
        self.stage_layers = {s.device: s.layers for s in self.deal.stages}
        self._scale = self._stage_scales()
        model, host = self.scn.model, self.deal.host
        copy_s = 0.0
        for plan in copy_plan(before, r.stages, host).values():
            d, t = plan.device, 0.0
            if plan.wire is not None:
                wa, wb = plan.wire
                nbytes = model.weight_bytes(wa, wb)
                spec = self.links.get(host, d).spec
                prof = self.scn.profile
                measured = prof.transport.weights_Bps if (prof and prof.transport) else None
                rate = min(spec.bandwidth_Bps, measured) if measured else spec.bandwidth_Bps
                t = nbytes / rate + spec.rtt_s / 2
                self.loop.after(t, self._record_copied, WeightsCopied(d, r.first_lap, host, wa, wb, int(nbytes), t))
            speed = self.scn.device(d).copy_speed_Bps
            for da, db in plan.disk:
                nbytes = model.weight_bytes(da, db)
                t += nbytes / speed if speed else 0.0
                self.loop.after(t, self._record_copied, WeightsCopied(d, r.first_lap, "disk", da, db, int(nbytes), t))
            copy_s = max(copy_s, t)
        if r.back is None:  # a recovery's copy (a device taken back is no recovery)
            self._copy_s[r.lost] = copy_s
        self._at(self.loop.now + copy_s, ChainReady(r.first_lap))

    def _record_copied(self, rec: WeightsCopied) -> None:
        now = self.loop.now
        if self.raw is not None:
            self.raw.append((now, rec))
        self.acc.add(now, rec)

    # -- run ------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Ask the workload's questions (``clients`` at once, each client one after
        another) and simulate until all end.
        With scenario faults, ``metrics["recovery"]`` lists each one's timeline (lost,
        detected, ``copy_s`` the weights took, ready, next token; ``recovery_s`` from
        the loss to the next answer token, planner.metrics) and ``metrics["recovery_s"]``
        is the longest."""
        loop = self.loop
        if self._warm_qid is not None:
            self._start(self._warm_up)
        else:
            self._ask_all()
        for f in self.scn.faults:
            if f.at_s is not None:  # a process that waits at_s, then kills
                loop.at(0.0, lambda _a, f=f: loop.at(f.at_s, lambda _b: self._kill(f)), priority=_URGENT)
        for dev, (start, end) in self._stall_lost.items():  # a link whose stalls the heartbeat rule notices
            loop.at(0.0, lambda _a, d=dev, a=start, b=end: loop.at(a, lambda _b: self._stall(d, a, b)),
                    priority=_URGENT)
        collecting = gc.isenabled()
        gc.disable()  # the run makes ~10^5 objects that live until its end: collections only rescan them
        try:
            try:
                loop.run()
            except _Reordered:
                self.reordered = True
                return Simulation(self.scn, self.first_deal, self.progress, ahead=False,
                                  trace=self.raw is not None).run()
            if self._t_ahead > -math.inf:
                self.acc.seen(self._t_ahead)
            metrics = self.acc.result()
            self.acc = Accumulator()  # let the run's records go before collections resume
        finally:
            if collecting:
                gc.enable()
        if self.progress is not None:
            self.progress(self.tokens_done, self.tokens_total)
        for rec in metrics["recovery"]:
            rec["copy_s"] = self._copy_s.get(rec["device"])
        return SimResult(self.first_deal, self.raw, metrics, self.refusals)


def simulate(scn: Scenario, deal: Deal | None = None, progress: Callable[[int, int], None] | None = None,
             ahead: bool = True, trace: bool = True, acceptance_picks: Sequence[int] | None = None) -> SimResult:
    """Simulate ``scn`` and return its deal, trace and metrics (see Simulation)."""
    return Simulation(scn, deal, progress, ahead, trace, acceptance_picks).run()
