"""The shared scheduler driving a real model, every stage in this one process.

The same :class:`planner.chain.Chain` (host scheduler and worker machines behind one
router) that the simulator drives, here fed by real compute: each ``RunStage`` runs a real layer range
(numpy or wgpu), each ``SendFrame`` encodes the residual into the real binary frame
(:mod:`planner.frames`) and decodes it on the receiving side, each ``RunHead`` takes the
argmax of real logits, and each ``Draft`` asks a real drafter. Work is done one command
at a time in the order the machines ask for it (no network, no clock in the results).

This is the room without its transport: the networked room replaces the in-process
queue with data channels and keeps everything else. :class:`planner.drive.Driver` feeds
the chain; :class:`LocalRoom` is its executor. Only tests use it.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Mapping, Sequence

import numpy as np

from planner.deal import Deal
from planner.model import lookup
from planner.room import Decoding, Scenario, Speculative
from planner.protocol import (AnswerDone, ChainReady, DeviceLost, Draft, DropFrame, EmitToken, FrameArrived, LapFailed,
                              QuestionAsked, Redeal, Refuse, RollbackKV, RunHead, RunStage, SendFrame, StageFinished)
from planner.sampling import Sampling
from planner.chain import Chain, RedealRule, deal_of
from planner.drive import Driver
from planner.scheduler import SchedulerConfig
from runtime.backends.base import Stage
from runtime.codec import decode_frame, encode_frame
from runtime.drafters import ngram_draft
from runtime.work import NumericalFault, consumes_residual, nonfinite, run_work


class LocalRoom:
    """Run questions through a chain of real stages with the shared scheduler.

    Args:
        stages: ``device id -> Stage``; the host's stage must have ``is_host``; the
            chain order is ``deal.stages``.
        deal: who hosts and which range each device holds (ranges must match the stages).
        config: scheduler settings (``eos_token`` 2 for SmolLM2).
        drafter: ``(context ids, k) -> k ids``; :func:`ngram_draft` by default.
        redeal: the chain's re-deal rule (:func:`planner.chain.redeal_rule`); with
            ``make_stage`` the room survives a lost worker (see :meth:`lose`).
        make_stage: ``(device, start, end, is_host) -> Stage`` loads a re-dealt range.
    Raises ValueError when a stage's range differs from the deal's, or ``redeal`` comes
    without ``make_stage``.
    """

    def __init__(self, stages: Mapping[str, Stage], deal: Deal, config: SchedulerConfig,
                 drafter: Callable[[Sequence[int], int], list[int]] = ngram_draft,
                 redeal: RedealRule | None = None,
                 make_stage: Callable[[str, int, int, bool], Stage] | None = None):
        if redeal is not None and make_stage is None:
            raise ValueError("a re-deal rule needs make_stage to load the re-dealt ranges")
        for s in deal.stages:
            st = stages[s.device]
            if (st.start, st.end) != (s.start, s.end):
                raise ValueError(f"{s.device}: stage holds [{st.start}, {st.end}), the deal says [{s.start}, {s.end})")
        self.stages = dict(stages)
        self.deal = deal
        caps = [st.max_ctx for st in stages.values() if getattr(st, "max_ctx", None) is not None]
        config = config.capped(min(caps) if caps else None)  # the smallest cache bounds questions
        self.config = config
        self.drafter = drafter
        self.chain = Chain(deal, config, redeal=redeal)
        self.driver = Driver(self.chain, self, self._record)
        self.make_stage = make_stage
        self.dead = self.driver.dead
        self.faults: list[tuple[int, str]] = []  # (answer tokens emitted, device to lose then)
        self.emitted = 0
        self.redeals: list[Redeal] = []
        self.queue: deque = deque()
        self.trace: list = []
        self.residual: dict[tuple[str, int], np.ndarray] = {}  # (device, lap) -> residual there
        self.context: dict[int, list[int]] = {}  # question -> prompt + committed answer
        self.answers: dict[int, list[int]] = {}
        #: question -> how it ended: ``eos``, ``length``, ``withdrawn`` or ``refused: REASON``
        self.ended: dict[int, str] = {}
        self.step = 0

    def ask(self, question_id: int, prompt: Sequence[int], max_new_tokens: int, device: str | None = None,
            sampling: Sampling | None = None) -> None:
        """Queue a question (prompt token ids), decoded with ``sampling`` (None: the
        config's)."""
        self.context[question_id] = list(prompt)
        self.answers[question_id] = []
        self.queue.append(QuestionAsked(question_id, device or self.deal.host, tuple(prompt), max_new_tokens,
                                        sampling))

    def lose_after(self, device: str, tokens: int) -> None:
        """Lose ``device`` once ``tokens`` answer tokens (all questions) have been emitted."""
        self.faults.append((tokens, device))
        self.faults.sort()

    def lose(self, device: str) -> None:
        """``device`` dies now: its stage, its queued work and the frames to and from it
        are gone; the chain hears DeviceLost (and re-deals, with a rule)."""
        self.dead.add(device)
        self.stages.pop(device, None)
        self.queue = deque(ev for ev in self.queue if not (
            (type(ev) is FrameArrived and device in (ev.device, ev.src))
            or (type(ev) is StageFinished and ev.device == device)))
        self.residual = {k: v for k, v in self.residual.items() if k[0] != device}
        self._dispatch(DeviceLost(device, "lost"))

    def run(self) -> dict[int, list[int]]:
        """Work until every question has ended; returns the answer ids per question."""
        while self.queue:
            self._dispatch(self.queue.popleft())
            while self.faults and self.emitted >= self.faults[0][0]:
                self.lose(self.faults.pop(0)[1])
        return self.answers

    def _dispatch(self, ev) -> None:
        self.step += 1
        self.driver.dispatch(ev, float(self.step))

    def _record(self, now: float, ev, cmds, ignored) -> None:
        self.trace.append((now, ev))
        self.trace.extend((now, x) for x in ignored)
        self.trace.extend((now, c) for c in cmds)

    # -- the executor (planner.drive.Executor) ------------------------------------

    def _compute(self, c, dev: str) -> None:
        """RunStage, RunHead, Draft or RollbackKV on ``dev``'s stage (none: it is gone)."""
        st = self.stages.get(dev)
        if st is None:
            return
        key = (dev, getattr(c, "lap_id", None))
        x = self.residual.pop(key, None) if consumes_residual(c, st) else None
        try:
            event, out = run_work(st, c, x, self.context.get(getattr(c, "question_id", None)), self.drafter)
        except NumericalFault as e:  # this device computed a NaN/inf: its lap's question fails
            self.queue.append(LapFailed(c.lap_id, dev, str(e)))
            return
        if out is not None:
            self.residual[key] = out
        if event is not None:
            self.queue.append(event)

    def run_stage(self, c: RunStage) -> None:
        self._compute(c, c.device)

    def rollback(self, c: RollbackKV) -> None:
        self._compute(c, c.device)

    def run_head(self, c: RunHead) -> None:
        self._compute(c, self.deal.host)

    def draft(self, c: Draft) -> None:
        self._compute(c, self.deal.host)

    def send_frame(self, c: SendFrame) -> None:
        if c.dst in self.dead:
            self.residual.pop((c.src, c.header.lap_id), None)
            return
        x = self.residual.pop((c.src, c.header.lap_id))
        h, payload = decode_frame(encode_frame(c.header, x))
        bad = nonfinite(payload)
        if bad:  # as a device process does on arrival: the sender is named, the frame dropped
            self.queue.append(LapFailed(h.lap_id, c.src, f"the residual it sent for lap {h.lap_id} has {bad} "
                                        f"NaN/inf value{'s' if bad != 1 else ''}"))
            return
        self.residual[(c.dst, h.lap_id)] = payload
        self.queue.append(FrameArrived(c.dst, c.src, h))

    def drop_frame(self, c: DropFrame) -> None:
        self.residual.pop((c.device, c.header.lap_id), None)

    def wake(self, c) -> None:
        """No phone here to wake."""

    def emit(self, c: EmitToken) -> None:
        self.emitted += 1
        self.answers[c.question_id].append(c.token)
        self.context[c.question_id].append(c.token)

    def question_ended(self, c: AnswerDone | Refuse) -> None:
        self.ended[c.question_id] = c.reason if type(c) is AnswerDone else f"refused: {c.reason}"

    def redeal(self, r: Redeal) -> None:
        """Load every re-dealt range (a stage whose range is unchanged keeps its weights;
        its KV cache is rebuilt by the replay, which starts at position 0), forget the
        residuals of the old laps, then report the new chain ready."""
        self.redeals.append(r)
        for d, a, b in r.stages:
            st = self.stages.get(d)
            if st is None or (st.start, st.end) != (a, b):
                self.stages[d] = self.make_stage(d, a, b, d == r.host)
        self.deal = deal_of(r)
        self.residual.clear()
        self.queue.append(ChainReady(r.first_lap))


def chain_deal(host: str, ranges: Sequence[tuple[str, int, int]]) -> Deal:
    """A pinned deal from ``[(device, start, end), ...]`` (host's range first): :meth:`Deal.pinned`."""
    return Deal.pinned(host, ranges)


def scheduler_config(hidden: int, draft_tokens: int = 0, async_laps: int = 1, prefill_chunk: int = 16,
                     return_path: str = "direct", eos_token: int | None = 2,
                     model_id: str = "smollm2-135m", sampling: Sampling | None = None,
                     questions_in_flight: int = 1) -> SchedulerConfig:
    """Scheduler settings for a real room of catalog model ``model_id`` (SmolLM2:
    float32 residuals, eos 2), made as every room makes them: a scenario's decoding
    section through :meth:`SchedulerConfig.from_scenario` (``sampling``: the room's
    default for questions; a seedless one takes seed 0, the scenario's).

    Raises ValueError when ``hidden`` is not the model's residual width, or for
    settings the scheduler refuses (see SchedulerConfig)."""
    model = lookup(model_id)
    if model.hidden != hidden:
        raise ValueError(f"{model_id} has hidden {model.hidden}, not {hidden}")
    spec = Speculative(drafter="ngram", draft_tokens=draft_tokens) if draft_tokens else None
    scn = Scenario(name="local", seed=0, model=model, devices=(),
                   decoding=Decoding(prefill_chunk=prefill_chunk, speculative=spec, async_laps=async_laps,
                                     return_path=return_path, sampling=sampling or Sampling(),
                                     questions_in_flight=questions_in_flight))
    return SchedulerConfig.from_scenario(scn, eos_token=eos_token)
