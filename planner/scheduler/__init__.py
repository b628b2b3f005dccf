"""The sans-IO scheduler: the model host's state machine and a worker's.

* :mod:`planner.scheduler.config`: :class:`SchedulerConfig` and the product's limits;
* :mod:`planner.scheduler.host`: :class:`HostScheduler` (prefill, decode, speculation,
  recovery) and its :class:`HostState`;
* :mod:`planner.scheduler.worker`: :class:`WorkerMachine` and its :class:`Verdict`.

Every room drives them through :class:`planner.chain.Chain` and
:class:`planner.drive.Driver`.
"""

from planner.scheduler.config import (MAX_WAITING, MAX_WAITING_PER_DEVICE, SEEN_QUESTIONS, WAKE_MAX_S,
                                      SchedulerConfig)
from planner.scheduler.worker import MAX_IGNORED, Verdict, WorkerMachine
from planner.scheduler.host import HostScheduler, HostState

__all__ = ["MAX_IGNORED", "MAX_WAITING", "MAX_WAITING_PER_DEVICE", "SEEN_QUESTIONS", "WAKE_MAX_S", "HostScheduler",
           "HostState", "SchedulerConfig", "Verdict", "WorkerMachine"]
