"""A zero-time driver for the sans-IO scheduler, for tests.

Every command that takes time becomes a pending event on a FIFO channel (one per
device's compute, one per directed link); a test chooses which channel delivers next,
so any interleaving that a real room could produce can be replayed. Tokens come from
an independent "target model": the greedy answer at position p is ``truth(p)``.

It is one of the room's drivers: :class:`planner.drive.Driver` feeds the chain, and
:class:`Harness` is only the executor (the channels).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from planner.chain import Chain
from planner.drive import Driver, NoOpExecutor, synthetic_draft, synthetic_head
from planner.protocol import (AnswerDone, ChainReady, DeviceBack, DeviceLost, Draft, DraftReady, EmitToken, FrameArrived,
                              HeadFinished, LapEnded, QuestionAsked, Redeal, Refuse, RunHead, RunStage, SendFrame,
                              StageFinished)
from planner.scheduler import SchedulerConfig


def truth(pos: int) -> int:
    """The reference greedy token at position ``pos`` (never 2, the eos id used in tests)."""
    return 100 + (pos * 31) % 997


class Harness(NoOpExecutor):
    """Drives a room's :class:`planner.chain.Chain` with instant, reorderable work.

    ``accept(k) -> int`` says how many leading drafts of a k-token draft are right;
    ``redeal`` is the chain's re-deal rule (None: a lost device ends the room), ``rejoin``
    its rule for a device that comes back (:meth:`back`). After a
    ``Redeal`` the new chain's readiness (``ChainReady``) waits on its own channel, so
    it may come before or after frames of the old chain still in flight. ``log`` holds
    every event and command in order; ``ignored`` every Ignored record the machines left.
    """

    def __init__(self, deal, config: SchedulerConfig, accept: Callable[[int], int] = lambda k: 0,
                 redeal=None, rejoin=None):
        self.chain = Chain(deal, config, redeal=redeal, rejoin=rejoin)
        self.driver = Driver(self.chain, self, self._record)
        self.dead = self.driver.dead
        self.host = self.chain.host
        self.channels: dict[tuple, deque] = {}
        self.accept = accept
        self.log: list = []
        self.ignored: list = []
        self.lap_span: dict[int, tuple[int, int]] = {}
        self.max_waiting_seen = 0
        self.max_waiting_per_device_seen = 0

    def ask(self, qid: int, device: str, prompt_len: int, max_new: int) -> None:
        """Queue a question on the outside channel."""
        prompt = tuple(truth(p) for p in range(prompt_len))
        self.channels.setdefault(("ask",), deque()).append(QuestionAsked(qid, device, prompt, max_new))

    def pending(self) -> list[tuple]:
        """Channels with something to deliver, in a stable order."""
        return sorted((k for k, q in self.channels.items() if q), key=repr)

    def step(self, choice: int = 0) -> bool:
        """Deliver the head of the ``choice``-th pending channel. False when idle."""
        keys = self.pending()
        if not keys:
            return False
        ev = self.channels[keys[choice % len(keys)]].popleft()
        self.dispatch(ev)
        return True

    def run(self, choose: Callable[[int], int] = lambda n: 0, limit: int = 200_000) -> None:
        """Deliver until idle; ``choose(n_pending)`` picks the channel each time."""
        for _ in range(limit):
            keys = self.pending()
            if not keys:
                return
            self.step(choose(len(keys)))
        raise AssertionError("the room did not go idle")

    def dispatch(self, ev) -> None:
        """Feed ``ev`` to the chain now (through the driver) and carry out its commands."""
        self.driver.dispatch(ev, 0.0)

    def _record(self, now_s: float, ev, cmds, ignored) -> None:
        self.log.append(ev)
        self.log.extend(cmds)
        self.ignored.extend(ignored)
        q = self.host.queue
        self.max_waiting_seen = max(self.max_waiting_seen, len(q))
        for d in {w.device for w in q}:
            self.max_waiting_per_device_seen = max(self.max_waiting_per_device_seen,
                                                   sum(1 for w in q if w.device == d))

    def lose(self, device: str, deliver_sent: bool = False) -> None:
        """``device`` dies now: its queued compute and the frames on their way to it are
        gone, and so are the frames it sent unless ``deliver_sent``; then the host hears
        DeviceLost (at once: detection delay is the drivers' business)."""
        self.dead.add(device)
        for key in list(self.channels):
            if key == ("dev", device) or (key[0] == "link" and (key[2] == device
                                                               or (key[1] == device and not deliver_sent))):
                del self.channels[key]
        self.dispatch(DeviceLost(device, "test"))

    def back(self, device: str) -> None:
        """``device``, lost, is back (alive again, its KV cache empty): the host hears
        DeviceBack at once (the rejoin hold is the drivers' business)."""
        self.dead.discard(device)
        self.dispatch(DeviceBack(device, "test"))

    def _put(self, key: tuple, ev) -> None:
        if (key[0] == "dev" and key[1] in self.dead) or (key[0] == "link" and key[2] in self.dead):
            return  # work for, or a frame to, a device that is gone
        self.channels.setdefault(key, deque()).append(ev)

    # -- the executor (planner.drive.Executor) ------------------------------------

    def run_stage(self, c: RunStage) -> None:
        if c.inputs:
            self.lap_span[c.lap_id] = (c.first_pos, c.tokens)
        self._put(("dev", c.device), StageFinished(c.device, c.lap_id))

    def send_frame(self, c: SendFrame) -> None:
        self._put(("link", c.src, c.dst), FrameArrived(c.dst, c.src, c.header))

    def run_head(self, c: RunHead) -> None:
        first_pos, n = self.lap_span[c.lap_id]
        self._put(("dev", self.host.host), HeadFinished(c.lap_id, synthetic_head(truth, first_pos, n, c.rows)))

    def draft(self, c: Draft) -> None:
        a = min(max(self.accept(c.k), 0), c.k)
        self._put(("dev", self.host.host), DraftReady(c.draft_id, synthetic_draft(truth, c, a)))

    def redeal(self, c: Redeal) -> None:
        self._put(("ready",), ChainReady(c.first_lap))

    # -- what happened -------------------------------------------------------------

    def answers(self) -> dict[int, list[int]]:
        """Emitted tokens per question, in order."""
        out: dict[int, list[int]] = {}
        for x in self.log:
            if isinstance(x, EmitToken):
                out.setdefault(x.question_id, []).append(x.token)
        return out

    def ended(self) -> dict[int, str]:
        """``answered`` or ``refused: reason`` per question."""
        out = {}
        for x in self.log:
            if isinstance(x, AnswerDone):
                out[x.question_id] = "answered"
            elif isinstance(x, Refuse):
                out[x.question_id] = "refused: " + x.reason
        return out

    def laps(self) -> list[LapEnded]:
        return [x for x in self.log if isinstance(x, LapEnded)]
