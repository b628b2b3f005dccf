"""The one router: a room's scheduler machines behind one ``handle``.

Every driver (the SimPy simulator, the in-process local room, a device process of a
real room, the zero-time test harness) feeds events to a :class:`Chain` and carries out
the commands it returns. The chain owns the model host's :class:`HostScheduler` and a
:class:`WorkerMachine` per worker, builds them from the deal, and routes each event:

* ``FrameArrived`` / ``StageFinished`` of a worker go to that worker's machine;
* everything else (questions, the host's frames and stages, head results, drafts, lost
  devices) goes to the host.

A process that runs one device of a room builds ``Chain(deal, config, runs={device})``:
it owns only that device's machine, and events meant for machines it does not run are
ignored (they return no commands). Sans-IO like the machines: no clock, no IO.
"""

from __future__ import annotations

from typing import Collection

from planner.deal import Deal
from planner.protocol import Command, Event, FrameArrived, StageFinished
from planner.scheduler import HostScheduler, SchedulerConfig, WorkerMachine


class Chain:
    """The host and worker machines of one deal, with one ``handle``.

    Args:
        deal: who hosts and which layer range each device holds.
        config: the scheduler settings (build them with
            :meth:`SchedulerConfig.from_scenario`).
        runs: the devices whose machines this process runs; None (default) runs every
            device of the deal (a simulator, an in-process room, a test harness).
    Attributes:
        host: the HostScheduler, or None when this process does not run the host.
        workers: ``device id -> WorkerMachine`` for the workers this process runs.
    Raises:
        ValueError: the deal's host range is not first in the chain (HostScheduler), or
            ``runs`` names a device that is neither the host nor a worker of the deal.
    """

    def __init__(self, deal: Deal, config: SchedulerConfig, runs: Collection[str] | None = None):
        self.deal = deal
        self.config = config
        members = {deal.host} | {s.device for s in deal.stages}
        if runs is not None:
            unknown = sorted(set(runs) - members)
            if unknown:
                raise ValueError(f"{', '.join(unknown)} is neither the host nor a worker of this deal")
        self.runs = frozenset(members if runs is None else runs)
        self.host: HostScheduler | None = HostScheduler(deal, config) if deal.host in self.runs else None
        self.workers: dict[str, WorkerMachine] = {
            s.device: WorkerMachine(s.device, deal, config.return_path)
            for s in deal.stages if s.device != deal.host and s.device in self.runs}

    def handle(self, event: Event, now_s: float) -> list[Command]:
        """Route ``event`` to the machine it concerns; return that machine's commands, in
        order. ``now_s`` (seconds on the driver's clock) is only passed through. Events
        for machines this chain does not run return ``[]``; never raises for a
        well-typed event in any order."""
        cls = type(event)
        if cls is FrameArrived or cls is StageFinished:
            worker = self.workers.get(event.device)
            if worker is not None:
                return worker.handle(event, now_s)
            if event.device != self.deal.host:
                return []
        if self.host is None:
            return []
        return self.host.handle(event, now_s)
