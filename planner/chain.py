"""The one router: a room's scheduler machines behind one ``handle``.

Every driver (the simulator, a device process of a real room, the tests' in-process
room and zero-time harness; all through :class:`planner.drive.Driver`) feeds events to
a :class:`Chain` and carries out the commands it returns. The chain owns the model host's :class:`HostScheduler` and a
:class:`WorkerMachine` per worker, builds them from the deal, and routes each event:

* ``FrameArrived`` / ``StageFinished`` of a worker go to that worker's machine;
* everything else (questions, the host's frames and stages, head results, drafts, lost
  devices) goes to the host.

A process that runs one device of a room builds ``Chain(deal, config, runs={device})``:
it owns only that device's machine, and events meant for machines it does not run are
ignored (they return no commands and leave an :class:`planner.protocol.Ignored` record,
reason ``not_here``, in :attr:`Chain.ignored`). Sans-IO like the machines: no clock, no IO.

Recovery: given a re-deal rule (:func:`redeal_rule`), a lost worker makes the host
return :class:`planner.protocol.Redeal`; the chain rebuilds the worker machines it runs
for the new deal at once (frames of earlier laps are then dropped), and a process that
runs only a worker adopts the new chain with :meth:`Chain.adopt` when the host's plan
reaches it. The driver loads the new ranges, empties the KV caches and reports
:class:`planner.protocol.ChainReady`; the host then replays the answer so far.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection, Sequence

from planner.deal import Deal, DealError, Stage, deal as make_deal, format_bytes, usable_bytes
from planner.hops import Measured, StageSpeeds
from planner.lapcost import LapCost, lap_hops
from planner.model import ModelSpec
from planner.optimal import SLOWER_THAN_OPTIMAL_RATIO
from planner.protocol import Command, Event, FrameArrived, IgnoreReason, Redeal, RunStage, StageFinished
from planner.room import DealOptions, Device, Network, Scenario
from planner.scheduler import HostScheduler, SchedulerConfig, WorkerMachine
from planner.scheduler.worker import note_ignored

#: ``(current deal, every device lost so far) -> new deal``; raises ValueError (DealError)
#: when the devices left cannot hold the model.
RedealRule = Callable[[Deal, frozenset[str]], Deal]
#: ``(current deal, every device still lost, what the room measured) -> the deal to move
#: to, or None to stay``: what the host does when a lost device comes back
#: (:func:`rejoin_rule`; the measurements are the room's :class:`planner.hops.StageSpeeds`)
RejoinRule = Callable[[Deal, frozenset[str], Measured], "Deal | None"]

#: a device that came back is re-dealt into the chain only when the deal with it is
#: measured this many times faster than the current one (the margin past which the
#: room warns that a deal is slower than it could be: planner.optimal)
REJOIN_MARGIN = SLOWER_THAN_OPTIMAL_RATIO


def _rows(d: Deal) -> list[tuple[str, int, int]]:
    return [(s.device, s.start, s.end) for s in d.stages]


def measured_lap_s(host: str, rows: Sequence[tuple[str, int, int]], measured: Measured,
                   hop_s: Callable[[str, str], float] | None = None, return_path: str = "direct") -> float | None:
    """Seconds of one decode lap of the chain ``rows`` (``(device, start, end)`` in chain
    order, 0-based half-open) hosted by ``host``, from what the room measured: each
    stage's layers at its device's measured seconds per layer, the host's measured head
    (0 when it was not timed: the same host runs it in every deal compared), and each
    hop of the lap (:func:`planner.lapcost.lap_hops`) as measured on its link, else
    ``hop_s(src, dst)`` (a cost model's; None: 0). Returns None when a device that holds
    layers in ``rows`` was never timed (a deal with it cannot be told faster on what
    was measured)."""
    t = measured.head_s or 0.0
    for d, a, b in rows:
        if b > a:
            s = measured.s_per_layer.get(d)
            if s is None:
                return None
            t += s * (b - a)
    hops = measured.hop_s or {}
    for link in lap_hops(host, [r[0] for r in rows], return_path):
        h = hops.get(link)
        t += h if h is not None else (hop_s(*link) if hop_s is not None else 0.0)
    return t


def measured_faster(current: Deal, new: Deal, measured: Measured, hop_s: Callable[[str, str], float] | None = None,
                    return_path: str = "direct", margin: float = REJOIN_MARGIN) -> bool:
    """Whether ``new`` is measured more than ``margin`` times faster than ``current``
    (:func:`measured_lap_s` of each; the same host): False when either lap cannot be
    worked out from the measurements (a device of it never timed) or the hosts differ.
    The one choice of :func:`rejoin_rule` and the real room's
    (runtime.control.NodeConfig.rejoin_rule); pure, nothing timed here."""
    if new.host != current.host:
        return False
    now = measured_lap_s(current.host, _rows(current), measured, hop_s, return_path)
    then = measured_lap_s(new.host, _rows(new), measured, hop_s, return_path)
    return now is not None and then is not None and now > margin * then


def relink_neighbours(host: str, chain: Sequence[str], back: str, return_path: str = "direct") -> list[str]:
    """The devices that must make a new connection with ``back``, a device dealt back into
    ``chain`` (device ids in chain order) of ``host``'s room: the other end of each link a
    lap crosses to or from ``back`` (:func:`planner.lapcost.lap_hops`), in the order the
    lap crosses them, the host left out (it met ``back`` at the relay already, which is
    how ``back`` came back). ``[]`` when ``back`` is not in ``chain``.

    Why every such neighbour, not only those whose link failed: ``back`` was frozen or
    away and cannot tell that a link of its own is dead (its side reads "connected"
    until its own consent checks fail), so both ends go to the relay together, each
    deciding from the re-deal alone."""
    if back not in chain:
        return []
    out: list[str] = []
    for a, b in lap_hops(host, chain, return_path):
        other = b if a == back else a if b == back else None
        if other is not None and other != host and other != back and other not in out:
            out.append(other)
    return out


def merge_lost(current: Deal, lost: frozenset[str]) -> Deal:
    """The pinned re-deal: each lost stage's range goes to the stage before it in the
    chain (to the next one when no stage before it is left). Returns a ``pinned`` Deal
    with the same host. Raises DealError when no stage is left."""
    merged: list[list] = []
    carry: int | None = None  # start of lost layers waiting for a next survivor
    for s in current.stages:
        if s.device in lost:
            if merged:
                merged[-1][2] = s.end
            elif carry is None:
                carry = s.start
            continue
        start = s.start if carry is None else carry
        carry = None
        merged.append([s.device, start, s.end])
    if not merged:
        raise DealError("no device of the chain is left")
    if carry is not None:
        merged[-1][2] = current.stages[-1].end
    stages = tuple(Stage(d, a, b) for d, a, b in merged)
    notes = (f"re-dealt after {', '.join(sorted(lost))} left: their layers went to their neighbours",)
    return Deal(host=current.host, split="pinned", stages=stages, guests=(), fits=current.fits, notes=notes)


def check_lent(new: Deal, usable: dict[str, int], layer_bytes: Sequence[int], host_extra_bytes: int = 0,
               before: Deal | None = None) -> Deal:
    """``new`` when every stage's layers fit in what its device may use, else DealError.
    With ``before`` (the deal re-dealt), only stages whose range changed are checked: a
    device that keeps its range loads nothing new.

    Args:
        usable: device id -> bytes it may use (what it lends less the headroom,
            :func:`planner.deal.usable_bytes`); a device not in it is not checked.
        layer_bytes: memory of each layer (weights + its KV cache at the room's context),
            0-based, one per layer.
        host_extra_bytes: embedding, output head and draft, held by the model host.
    Raises:
        DealError: one line naming each device that would be over, e.g. ``the devices
            left cannot hold the model: laptop would hold layers 1-30 (1.1 GiB) in the
            181 MiB it may use``.
    """
    over = []
    kept = set(before.stages) if before is not None else set()
    for s in new.stages:
        if s in kept:
            continue
        cap = usable.get(s.device)
        used = sum(layer_bytes[s.start:s.end]) + (host_extra_bytes if s.device == new.host else 0)
        if cap is not None and used > cap:
            over.append(f"{s.device} would hold layers {s.shown} ({format_bytes(used)}) in the "
                        f"{format_bytes(cap)} it may use")
    if over:
        raise DealError("the devices left cannot hold the model: " + "; ".join(over))
    return new


def gained_ranges(old: tuple[int, int] | None, new: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """The layers of ``new`` a device did not hold in ``old`` (0-based half-open ranges;
    ``old`` None: it held none): no range, one, or two when it gained on both sides,
    lowest first."""
    a, b = new
    if b <= a:
        return ()
    if old is None or old[1] <= old[0]:
        return ((a, b),)
    lo, hi = max(a, old[0]), min(b, old[1])
    if hi <= lo:
        return ((a, b),)
    return tuple(r for r in ((a, lo), (hi, b)) if r[1] > r[0])


@dataclass(frozen=True)
class CopyPlan:
    """How one device of a re-dealt chain gets the layers it did not hold (0-based
    half-open ranges). ``wire``: the range copied from the model host over the weights
    channel (None: nothing; the model host itself never copies over the wire);
    ``disk``: the ranges it reads from its own model directory. The layers it kept stay
    in its stage."""

    device: str
    wire: tuple[int, int] | None
    disk: tuple[tuple[int, int], ...]


def copy_plan(before: Sequence[tuple[str, int, int]], after: Sequence[tuple[str, int, int]],
              host: str) -> dict[str, CopyPlan]:
    """The re-deal's copy, per device of ``after`` that gains layers: what it copies from
    ``host`` and what it reads from its own disk (:class:`CopyPlan`). Rows are
    ``(device, start, end)``. A worker copies its lowest gained range from the host (the
    only range a Replan can name) and reads a second one, gained above what it kept,
    from its own disk; the host reads what it gains from its disk. The simulator
    (sim/driver.py) and the real room (runtime/room.py) both follow this plan."""
    old = {d: (a, b) for d, a, b in before}
    out: dict[str, CopyPlan] = {}
    for d, a, b in after:
        gained = gained_ranges(old.get(d), (a, b))
        if not gained:
            continue
        out[d] = CopyPlan(d, None, gained) if d == host else CopyPlan(d, gained[0], gained[1:])
    return out


def redeal_rule(devices: Sequence[Device], model: ModelSpec, options: DealOptions | None = None,
                network: Network | None = None, return_path: str = "direct") -> RedealRule:
    """The planner's rule for re-dealing a room that lost devices: a pinned room merges
    the lost ranges into their neighbours (:func:`merge_lost`); otherwise the layers are
    dealt again with :func:`planner.deal.deal` over ``devices`` less the lost ones, the
    host kept, against ``network`` and ``return_path`` (the room's: ``split: optimal``
    searches against them; :func:`redeal_rule_for` passes a scenario's). The rule raises DealError when the rest cannot hold the model in what
    each lends (the merged ranges too: :func:`check_lent`)."""
    opts = options or DealOptions()
    usable = {d.id: usable_bytes(d, opts) for d in devices}
    per_layer = [model.range_memory_bytes(i, i + 1, opts.context_tokens, opts.kv_cache) for i in range(model.layers)]

    def rule(current: Deal, lost: frozenset[str]) -> Deal:
        if opts.stages is not None or current.split == "pinned":
            return check_lent(merge_lost(current, lost), usable, per_layer, model.host_extra_bytes, current)
        rest = [d for d in devices if d.id not in lost]
        new = make_deal(rest, model, replace(opts, host=current.host), network, return_path)
        if not new.fits:
            raise DealError("the devices left cannot hold the model: " + "; ".join(new.notes))
        return new
    return rule


def rejoin_rule(devices: Sequence[Device], model: ModelSpec, first: Deal, options: DealOptions | None = None,
                network: Network | None = None, return_path: str = "direct",
                margin: float = REJOIN_MARGIN) -> RejoinRule:
    """The planner's rule for a device that came back (:class:`planner.protocol.DeviceBack`):
    the deal the room would have without the devices still lost (a pinned room: its first
    deal ``first`` with the still-lost ranges merged into their neighbours,
    :func:`merge_lost`; otherwise :func:`planner.deal.deal` again over ``devices`` less
    the lost, the host kept), checked against what each device lends (:func:`check_lent`),
    is taken only when it is *measured* faster: :func:`measured_faster` past ``margin``,
    on the seconds per layer each device was timed at in this room (the ``Measured``
    the host hands the rule; hops not timed are :class:`planner.lapcost.LapCost`'s over
    ``network``). A device's declared or calibrated speed never decides: a device that
    came back before it was ever timed stays out, as does one timed slower. The rule
    returns None (stay) when that deal does not fit, does not differ, or is not
    measured faster past the margin; it never raises."""
    opts = options or DealOptions()
    usable = {d.id: usable_bytes(d, opts) for d in devices}
    per_layer = [model.range_memory_bytes(i, i + 1, opts.context_tokens, opts.kv_cache) for i in range(model.layers)]
    cost = LapCost(devices, model, network or Network(), return_path)
    members = {s.device for s in first.stages}

    def rule(current: Deal, lost: frozenset[str], measured: Measured) -> Deal | None:
        try:
            if opts.stages is not None or first.split == "pinned":
                gone = lost & members
                new = merge_lost(first, frozenset(gone)) if gone else first
            else:
                rest = [d for d in devices if d.id not in lost]
                new = make_deal(rest, model, replace(opts, host=current.host), network, return_path)
                if not new.fits:
                    return None
            check_lent(new, usable, per_layer, model.host_extra_bytes, current)
        except ValueError:
            return None
        if new.host != current.host or _rows(new) == _rows(current):
            return None
        return new if measured_faster(current, new, measured, cost.hop_s, return_path, margin) else None
    return rule


def rejoin_rule_for(scn: Scenario, first: Deal, margin: float = REJOIN_MARGIN) -> RejoinRule:
    """:func:`rejoin_rule` of scenario ``scn`` (its devices, options, network and return
    path), the room having begun with ``first``."""
    return rejoin_rule(scn.devices, scn.model, first, scn.options, scn.network, scn.decoding.return_path, margin)


def redeal_rule_for(scn: Scenario, devices: Sequence[Device] | None = None) -> RedealRule:
    """:func:`redeal_rule` of scenario ``scn`` (its options, network and return path, as
    :func:`planner.deal.deal_for` deals it) over ``devices`` (default: all of its own)."""
    return redeal_rule(scn.devices if devices is None else devices, scn.model, scn.options, scn.network,
                       scn.decoding.return_path)


def deal_of(r: Redeal) -> Deal:
    """The new chain a :class:`Redeal` announces, as a pinned Deal (:meth:`Deal.pinned`)."""
    return Deal.pinned(r.host, r.stages)


class Chain:
    """The host and worker machines of one deal, with one ``handle``.

    Args:
        deal: who hosts and which layer range each device holds.
        config: the scheduler settings (build them with
            :meth:`SchedulerConfig.from_scenario`).
        runs: the devices whose machines this process runs; None (default) runs every
            device of the deal (a simulator, an in-process room, a test harness).
        redeal: the re-deal rule (:func:`redeal_rule`) that lets the room survive a lost
            worker; None: a lost device of the chain ends the room (the host refuses
            what it cannot answer).
        rejoin: the rule for a lost device that comes back (:func:`rejoin_rule`); None:
            it is no longer lost but gets no layers.
    Attributes:
        host: the HostScheduler, or None when this process does not run the host.
        speeds: the room's measured speeds (:class:`planner.hops.StageSpeeds`) that the
            rejoin rule is given: with a rejoin rule, on the model host, the chain tells
            it each lap the host begins (its positions, the layers each device holds);
            the driver gives it what it timed (:meth:`StageSpeeds.timed`, ``computed``,
            ``hop``).
        workers: ``device id -> WorkerMachine`` for the workers this process runs.
        ignored: the :class:`planner.protocol.Ignored` records of every machine here,
            in order, until a driver takes them (:meth:`take_ignored`).
    Raises:
        ValueError: the deal's host range is not first in the chain (HostScheduler), or
            ``runs`` names a device that is neither the host nor a worker of the deal.
    """

    def __init__(self, deal: Deal, config: SchedulerConfig, runs: Collection[str] | None = None,
                 redeal: RedealRule | None = None, rejoin: RejoinRule | None = None):
        self.deal = deal
        self.config = config
        members = {deal.host} | {s.device for s in deal.stages}
        if runs is not None:
            unknown = sorted(set(runs) - members)
            if unknown:
                raise ValueError(f"{', '.join(unknown)} is neither the host nor a worker of this deal")
        self._runs_all = runs is None
        self.runs = frozenset(members if runs is None else runs)
        self.ignored: list = []
        self.speeds = StageSpeeds()
        self.host: HostScheduler | None = (
            HostScheduler(deal, config, redeal=redeal, ignored=self.ignored, rejoin=rejoin, speeds=self.speeds)
            if deal.host in self.runs else None)
        self._timing = rejoin is not None and self.host is not None  # laps told to speeds
        self._layers = {s.device: s.end - s.start for s in deal.stages}
        self.workers: dict[str, WorkerMachine] = {}
        self._build_workers(deal, 0)

    def _build_workers(self, deal: Deal, first_lap: int) -> None:
        self.workers = {s.device: WorkerMachine(s.device, deal, self.config.return_path, first_lap, self.ignored)
                        for s in deal.stages if s.device != deal.host and s.device in self.runs}

    def take_ignored(self) -> list:
        """The Ignored records made since the last call, in order (then forgotten)."""
        out = self.ignored[:]
        self.ignored.clear()
        return out

    def adopt(self, deal: Deal, first_lap: int) -> None:
        """Take the chain re-dealt by the host (a :class:`Redeal`, see :func:`deal_of`):
        rebuild the worker machines this chain runs for ``deal``; they drop frames of
        laps before ``first_lap``. A chain that runs every device also runs the new
        deal's newcomers."""
        self.deal = deal
        self._layers = {s.device: s.end - s.start for s in deal.stages}
        if self._runs_all:
            self.runs = frozenset({deal.host} | {s.device for s in deal.stages})
        self._build_workers(deal, first_lap)

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Route ``event`` to the machine it concerns; return that machine's commands, in
        order. ``now_s`` (seconds on the driver's clock) is only passed through. Events
        for machines this chain does not run return ``[]`` (an Ignored record: ``stale``
        for a device the chain no longer holds, ``not_here`` for one another process
        runs). Raises what the host raises (:class:`planner.protocol.DriverError`)."""
        cls = type(event)
        if cls is FrameArrived or cls is StageFinished:
            worker = self.workers.get(event.device)
            if worker is not None:
                return worker.handle(event, now_s)
            if event.device != self.deal.host:
                why = IgnoreReason.STALE if self._runs_all else IgnoreReason.NOT_HERE
                return note_ignored(self.ignored, event.device, event, why, f"{event.device} is not run here")
        if self.host is None:
            return note_ignored(self.ignored, self.deal.host, event, IgnoreReason.NOT_HERE,
                                "the model host is not run here")
        cmds = self.host.handle(event, now_s)
        timing, host = self._timing, self.deal.host
        for c in cmds:
            t = type(c)
            if t is Redeal:
                self.adopt(self.host.deal, c.first_lap)
            elif timing and t is RunStage and c.device == host:
                self.speeds.lap(c.lap_id, c.tokens, self._layers)
        return cmds
