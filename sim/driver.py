"""The SimPy driver: runs the shared scheduler against a model of the room.

The driver owns a SimPy environment, one compute resource per device (stages run one
at a time, in arrival order), one link per ordered pair of devices (sim/link.py), a
device model per device (sim/devices.py) and an acceptance model (sim/acceptance.py).
It feeds events to the room's :class:`planner.chain.Chain` (the host's scheduler and
every worker's machine behind one router), carries out the commands it returns as
timed SimPy processes, and records every event and command in the trace.

Tokens are synthetic but consistent: the target model's greedy answer is a fixed
sequence ``truth(pos)``; the host's head predicts it exactly, and the drafter proposes
it with the acceptance model deciding how many leading drafts are right. The
scheduler therefore judges drafts exactly as it does with a real model.

Questions are asked one after another (the next when the previous one ends), by the
devices in ``workload.asked_by`` in turn (the host when empty).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import simpy

from planner.deal import Deal, deal as make_deal
from planner.frames import frame_bytes
from planner.metrics import compute as compute_metrics
from planner.protocol import (AnswerDone, ChainReady, DeviceLost, Draft, DraftReady, EmitToken, FrameArrived,
                              HeadFinished, QuestionAsked, Redeal, Refuse, RunHead, RunStage, SendFrame,
                              StageFinished, Wake, WeightsCopied)
from planner.room import Scenario
from planner.chain import Chain, redeal_rule
from planner.scheduler import SchedulerConfig
from sim.acceptance import make_acceptance
from sim.devices import DECODE_MAX_TOKENS, DeviceModel
from sim.engines import engine
from sim.link import Links


def truth(pos: int) -> int:
    """The simulated target model's greedy token at sequence position ``pos``."""
    return 1000 + (pos * 7919) % 40000


def _wrong(pos: int) -> int:
    return truth(pos) + 1


def _device_model(d, scn: Scenario, prof, host: str) -> DeviceModel:
    """The cost model of device ``d``: its profile when the scenario has one, its
    engine preset's efficiency and overheads (sim/engines.py) when it names one."""
    eng = engine(d.engine) if d.engine else None
    return DeviceModel(d, scn.model, profile=prof.devices.get(d.id) if prof else None,
                       drafters=prof.drafters if prof else None, self_wake=scn.decoding.wake and d.id == host,
                       efficiency=eng.efficiency if eng else 1.0,
                       pass_overhead_s=eng.pass_overhead_s if eng else 0.0,
                       layer_overhead_s=eng.layer_overhead_s if eng else 0.0)


@dataclass
class SimResult:
    """What a simulation gives: the deal, the trace ``[(t_s, obj)]`` and its metrics."""

    deal: Deal
    trace: list
    metrics: dict


class Simulation:
    """One simulated run of a scenario. Deterministic for the scenario's ``seed``.

    ``progress(tokens_done, tokens_total)`` is called as answer tokens are emitted.
    Raises planner.deal.DealError when the room cannot be dealt.
    """

    def __init__(self, scn: Scenario, deal: Deal | None = None,
                 progress: Callable[[int, int], None] | None = None):
        self.scn = scn
        self.deal = deal or make_deal(scn.devices, scn.model, scn.options)
        self.env = simpy.Environment()
        seeds = np.random.SeedSequence(scn.seed)
        (link_seed, acc_seed, dev_seed) = seeds.spawn(3)
        self.config = SchedulerConfig.from_scenario(scn)
        self.chain = Chain(self.deal, self.config,
                           redeal=redeal_rule(scn.devices, scn.model, scn.options) if scn.faults else None)
        self.dead: set[str] = set()  # devices killed by a scenario fault
        self.first_deal = self.deal  # self.deal follows re-deals; the result reports the deal the room began with
        self._copy_s: dict[str, float] = {}  # lost device -> seconds the re-dealt weights took to copy
        self.stage_layers = {s.device: s.layers for s in self.deal.stages}
        prof = scn.profile
        self.devices = {d.id: _device_model(d, scn, prof, self.deal.host) for d in scn.devices}
        self._free_at: dict[str, float] = {}
        self.links = Links(self.env, scn.network, np.random.default_rng(link_seed))
        spec = scn.decoding.speculative
        measured = prof.drafters.get(spec.drafter) if (spec and prof) else None
        self.acceptance = make_acceptance(spec, np.random.default_rng(acc_seed), measured) if spec else None
        self.trace: list[tuple[float, Any]] = []
        self.progress = progress
        self.tokens_total = scn.workload.questions * scn.workload.answer_tokens
        self.tokens_done = 0
        self._asked = 0
        self._lap_span: dict[int, tuple[int, int]] = {}  # lap -> (first position, tokens), from RunStage
        self._in_flight: dict[tuple[str, str], deque] = {}  # link -> frames sent, not yet delivered
        self._prompt_len: dict[int, int] = {}  # question -> prompt tokens (laps before it are prefill)

    # -- plumbing -------------------------------------------------------------------

    def dispatch(self, event) -> None:
        """Record ``event`` and feed it to the machine it concerns; run the commands."""
        now = self.env.now
        if self.dead and type(event) in (FrameArrived, StageFinished) and event.device in self.dead:
            return  # work for, or a frame to, a device that died
        self.trace.append((now, event))
        for c in self.chain.handle(event, now):
            self.trace.append((now, c))
            self.execute(c)

    def execute(self, c) -> None:
        """Carry out one command (as a SimPy process when it takes time)."""
        env = self.env
        cls = type(c)
        if cls is RunStage:
            if c.inputs:
                self._lap_span[c.lap_id] = (c.first_pos, c.tokens)
            self._occupy(c.device, lambda start, c=c: self._stage_s(c, start),
                         StageFinished(c.device, c.lap_id))
        elif cls is SendFrame:
            h = c.header
            nbytes = frame_bytes(h.tokens, h.hidden, h.dtype)  # the real frame's size
            arrive = self.links.get(c.src, c.dst).schedule(nbytes)
            self._deliver(arrive, c.src, c.dst, FrameArrived(c.dst, c.src, h))
        elif cls is RunHead:
            dm = self.devices[self.deal.host]
            first_pos, n = self._lap_span.pop(c.lap_id)
            first = first_pos + n - c.rows
            preds = tuple(truth(first + i + 1) for i in range(c.rows))
            head = self._head_s
            self._occupy(self.deal.host, lambda start, r=c.rows: head(dm, r),
                         HeadFinished(c.lap_id, preds))
        elif cls is Draft:
            dm = self.devices[self.deal.host]
            cost = dm.draft_s(c.k, self.scn.decoding.speculative)
            self._occupy(self.deal.host, lambda start: cost, DraftReady(c.draft_id, self._draft_tokens(c)))
        elif cls is Wake:
            self.devices[c.device].wake(env.now, env.now + c.max_s)
        elif cls is Redeal:
            self._redeal(c)
        elif cls is EmitToken:
            self.tokens_done += 1
            for f in self.scn.faults:
                if f.at_token == self.tokens_done:
                    self._kill(f)
            if self.progress is not None and self.tokens_done % 64 == 0:
                self.progress(self.tokens_done, self.tokens_total)
        elif cls is AnswerDone or cls is Refuse:
            env.process(self._ask_next())
        # BeginAnswer, RollbackKV, DropFrame, LapEnded: bookkeeping only

    # -- timed work -----------------------------------------------------------------
    # A device computes one thing at a time, first come first served: its work is
    # placed at max(now, when it is next free), the same as a capacity-1 FIFO
    # simpy.Resource, at one SimPy event per piece of work instead of four.

    def _at(self, t: float, event) -> None:
        ev = self.env.timeout(max(t - self.env.now, 0.0))
        ev.callbacks.append(lambda _e: self.dispatch(event))

    def _deliver(self, t: float, src: str, dst: str, event) -> None:
        """Deliver frame ``event`` on the link ``src -> dst`` at ``t``, in send order.

        SimPy fires at ``now + delay``; in floating point two frames a link delivers
        at the same ``t`` (one waited for the other, sim/link.py) can land an ulp
        apart in either order, and a worker then dropped the later frame as "not
        serving" and the simulated room stopped with nothing answered (issue 9: a
        prediction of 0.0 tok/s). So each link keeps its frames in a FIFO and each
        timeout delivers the oldest one."""
        q = self._in_flight.get((src, dst))
        if q is None:
            q = self._in_flight[(src, dst)] = deque()
        q.append(event)
        ev = self.env.timeout(max(t - self.env.now, 0.0))
        ev.callbacks.append(lambda _e: self.dispatch(q.popleft()))

    def _occupy(self, device: str, duration: Callable[[float], float], done_event) -> None:
        start = max(self.env.now, self._free_at.get(device, 0.0))
        end = start + duration(start)
        self._free_at[device] = end
        self._at(end, done_event)

    def _head_s(self, dm: DeviceModel, rows: int) -> float:
        """Head + sampling on ``rows`` rows: measured per row when the scenario has it."""
        if self.scn.measured_head_s_per_row is not None:
            return rows * self.scn.measured_head_s_per_row
        return dm.head_s(rows) + dm.sample_s(rows)

    def _stage_s(self, c: RunStage, start: float) -> float:
        dm = self.devices[c.device]
        # the stage reads the KV cache of the positions before this frame's first
        s = dm.stage_s(self.stage_layers.get(c.device, 0), c.tokens, now_s=start, context_tokens=c.first_pos,
                       # a decode/verify pass: past the prompt and small (a replay after a
                       # re-deal re-runs answer positions in prefill-sized chunks)
                       decode=c.first_pos >= self._prompt_len.get(c.question_id, 0)
                       and c.tokens <= DECODE_MAX_TOKENS)
        if c.inputs:  # the model host embeds its inputs first
            s += dm.embed_s(c.tokens)
        return s

    def _draft_tokens(self, c: Draft) -> tuple[int, ...]:
        """Drafts that agree with the reference for as many leading tokens as the
        acceptance model says (none once an earlier assumed draft was already wrong)."""
        j = c.base_len + len(c.assumed)
        consistent = all(t == truth(c.base_len + i) for i, t in enumerate(c.assumed))
        a = self.acceptance.accepted(c.k) if (consistent and self.acceptance is not None) else 0
        return tuple(truth(j + i) if i < a else _wrong(j + i) for i in range(c.k))

    def _ask_next(self):
        yield self.env.timeout(0)
        w = self.scn.workload
        if self._asked >= w.questions:
            return
        qid = self._asked
        self._asked += 1
        who = w.asked_by[qid % len(w.asked_by)] if w.asked_by else self.deal.host
        prompt = tuple(truth(p) for p in range(w.prompt_tokens))
        self._prompt_len[qid] = len(prompt)
        self.dispatch(QuestionAsked(qid, who, prompt, w.answer_tokens))

    # -- faults ---------------------------------------------------------------------

    def _kill(self, f) -> None:
        """Fault ``f`` (planner.room.Fault): its device dies now; the room hears
        DeviceLost ``f.detect_s`` later (the heartbeat timeout)."""
        if f.device in self.dead:
            return
        self.dead.add(f.device)
        self._at(self.env.now + f.detect_s, DeviceLost(f.device, f"no heartbeat for {f.detect_s:g} s",
                                                       silent_since_s=self.env.now))

    def _kill_at(self, f):
        yield self.env.timeout(f.at_s)
        self._kill(f)

    def _redeal(self, r: Redeal) -> None:
        """The new chain loads its ranges: every device that gained layers copies their
        weights from the model host over their link (bytes / bandwidth + rtt/2); the
        host itself reads from its disk at its copy speed (instant when not given). All
        copy at once; then ChainReady, and the host replays."""
        old = {s.device: (s.start, s.end) for s in self.deal.stages}
        self.deal = self.chain.deal
        self.stage_layers = {s.device: s.layers for s in self.deal.stages}
        model, host = self.scn.model, self.deal.host
        copy_s = 0.0
        for d, a, b in r.stages:
            oa, ob = old.get(d, (0, 0))
            lo, hi = max(a, oa), min(b, ob)
            nbytes = model.weight_bytes(a, b) - (model.weight_bytes(lo, hi) if hi > lo else 0)
            if nbytes <= 0:
                continue
            if d == host:
                speed = self.scn.device(d).copy_speed_Bps
                t = nbytes / speed if speed else 0.0
                source = "disk"
            else:
                spec = self.links.get(host, d).spec
                t = nbytes / spec.bandwidth_Bps + spec.rtt_s / 2
                source = host
            ga, gb = (a, b) if hi <= lo else ((a, lo) if a < lo else (hi, b))  # the gained part (one side)
            rec = WeightsCopied(d, r.first_lap, source, ga, gb, int(nbytes), t)
            ev = self.env.timeout(t)
            ev.callbacks.append(lambda _e, rec=rec: self.trace.append((self.env.now, rec)))
            copy_s = max(copy_s, t)
        self._copy_s[r.lost] = copy_s
        self._at(self.env.now + copy_s, ChainReady(r.first_lap))

    # -- run ------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Ask the workload's questions one after another and simulate until all end.
        With scenario faults, ``metrics["recovery"]`` lists each one's timeline (lost,
        detected, ``copy_s`` the weights took, ready, next token; ``recovery_s`` from
        the loss to the next answer token, planner.metrics) and ``metrics["recovery_s"]``
        is the longest."""
        self.env.process(self._ask_next())
        for f in self.scn.faults:
            if f.at_s is not None:
                self.env.process(self._kill_at(f))
        self.env.run()
        if self.progress is not None:
            self.progress(self.tokens_done, self.tokens_total)
        metrics = compute_metrics(self.trace)
        for rec in metrics["recovery"]:
            rec["copy_s"] = self._copy_s.get(rec["device"])
        return SimResult(self.first_deal, self.trace, metrics)


def simulate(scn: Scenario, deal: Deal | None = None,
             progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Simulate ``scn`` and return its deal, trace and metrics (see Simulation)."""
    return Simulation(scn, deal, progress).run()
