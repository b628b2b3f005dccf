"""A prediction's honest range: P10-P90 over bootstrap replicas of the simulated run.

The point prediction is one seeded run with every lap's accepted length drawn from all
the measured prompts' walks. What it leaves out, and what a user's run varies by:

* **which questions are asked**: a calibration profile keeps each drafter's walk prompt
  by prompt (the scenario's ``workload.sample``, else the built-in prompts of its
  kind). A replica draws ``questions`` prompts from the walk with replacement (the
  bootstrap, Efron 1979) and each question takes its accepted lengths from its own
  prompt only (sim.acceptance, ``by_question``), so a replica of a two-question run
  varies as two real questions do;
* **the network**: every replica has its own seed, so jitter draws and the phase of
  stall episodes (``network.jitter``, ``network.episodes``) differ from replica to
  replica;
* **compute noise**: a profile whose calibration room kept every decode lap's stage
  time over its mean (``Profile.stage_noise``) gives each replica one factor on
  every profiled stage pass: the mean of that sequence over blocks of
  :data:`NOISE_BLOCK_LAPS` consecutive laps drawn with replacement, as many blocks as
  cover the room's laps (the circular block bootstrap, Politis and Romano 1992;
  planner.profile.block_mean). So a replica runs as much slower or faster as a
  stretch of the calibration room did. It is the spread of that one room on that
  machine at that load, not of the machine's load later.

Nothing else is varied: no fixed +-%. A room with none of these (no speculation
measured by prompt, no jitter, no episodes, no compute noise measured) gets a range of
one point, and the sources say so.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Sequence

import numpy as np

from planner.deal import Deal
from planner.profile import block_mean
from planner.room import Scenario

__all__ = ["NOISE_BLOCK_LAPS", "REPLICAS", "SWEEP_REPLICAS", "PendingRange", "acceptance_source", "compute_factors",
           "default_jobs", "range_sources", "predict_range", "start_range", "with_compute_factor"]

#: replicas of one prediction (simulate, run --real --calibration); sweep takes fewer
REPLICAS = 10
SWEEP_REPLICAS = 5
#: simulated answer tokens all replicas together may cost (fewer replicas beyond it)
TOKEN_BUDGET = 200_000
MIN_REPLICAS = 5
#: consecutive decode laps in one block of the compute-noise bootstrap
NOISE_BLOCK_LAPS = 8


def _walk_prompts(scn: Scenario) -> int:
    """How many prompts the profile's walk of the scenario's drafter holds (0: none)."""
    spec, prof = scn.decoding.speculative, scn.profile
    if spec is None or prof is None or spec.drafter not in prof.drafters:
        return 0
    if spec.accepted_sequence or spec.accepted_lengths:
        return 0
    try:
        return prof.drafters[spec.drafter].for_workload(scn.workload.acceptance_workload).prompts()
    except ValueError:
        return 0


def range_sources(scn: Scenario) -> list[str]:
    """What varies between replicas, in words (empty: nothing, the range is a point)."""
    out = []
    n = _walk_prompts(scn)
    if n:
        out.append(f"acceptance: bootstrap over {n} measured prompts")
    net = scn.network
    jit = [net.jitter] + [link.jitter for link in net.links if link.jitter is not None]
    if any(j is not None and j.distribution != "none" and (j.scale_s > 0 or j.samples_s) for j in jit):
        out.append("network jitter")
    if net.episodes is not None or any(link.episodes is not None for link in net.links):
        out.append("stall episodes")
    if _noise(scn):
        out.append(f"compute: block bootstrap over {len(_noise(scn))} calibration-room laps")
    return out


def _noise(scn: Scenario) -> tuple[float, ...]:
    """The profile's compute-noise sequence when the scenario has profiled devices."""
    prof = scn.profile
    if prof is None or not prof.stage_noise or not any(d.id in prof.devices for d in scn.devices):
        return ()
    return prof.stage_noise


def compute_factors(noise: Sequence[float], replicas: int, rng: np.random.Generator,
                    block: int = NOISE_BLOCK_LAPS) -> list[float]:
    """One compute factor per replica (module doc): block starts drawn uniformly from
    ``rng``, ceil(len(noise) / block) blocks each. ``noise``: stage time over the mean
    per lap, at least one value."""
    m = max(1, -(-len(noise) // block))
    return [block_mean(noise, rng.integers(0, len(noise), m).tolist(), block) for _ in range(replicas)]


def with_compute_factor(scn: Scenario, factor: float) -> Scenario:
    """``scn`` with every profiled device's stage pass times ``factor`` (head, drafters
    and transport unchanged); ``scn`` itself for a factor of 1 or no profile."""
    prof = scn.profile
    if prof is None or factor == 1.0:
        return scn
    devs = {k: dataclasses.replace(v, stage=v.stage.scaled(factor))
            for k, v in prof.devices.items()}
    return dataclasses.replace(scn, profile=dataclasses.replace(prof, devices=devs))


def _pct(xs: Sequence[float]) -> dict:
    a = np.asarray(xs, dtype=float)
    return {"p10": float(np.percentile(a, 10)), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90))}


def _run_replica(scn: Scenario, deal: Deal, seed: int, picks: list[int] | None,
                 factor: float = 1.0) -> tuple[bool, float, float]:
    """One replica: ``scn`` at network seed ``seed``, questions drawing from prompts
    ``picks``, stage passes times ``factor``; returns ``(answered every question,
    tokens per second, first token s)``."""
    from sim.driver import simulate
    m = simulate(dataclasses.replace(with_compute_factor(scn, factor), seed=seed), deal, trace=False,
                 acceptance_picks=picks).metrics
    return m.get("answered", 0) >= m.get("questions", 0), m["tokens_per_s"], m["ttft_s"]


_JOB: tuple | None = None  # (scenario, deal) of the replicas a worker process runs


def _replica(seed: int, picks: list[int] | None, factor: float = 1.0) -> tuple[bool, float, float]:
    """:func:`_run_replica` of the scenario :func:`_use` gave this worker process."""
    return _run_replica(*_JOB, seed, picks, factor)


def _use(scn: Scenario, deal: Deal) -> None:
    """A worker process's start: the job, and SIGTERM and SIGINT back to their defaults, so
    that :meth:`PendingRange.close` (the pool's SIGTERM) ends it even when the process it
    was forked from had a Python handler for them (a room's stop_on_signals, a server): a
    Python handler runs between bytecodes, and a worker waiting for a task never gets there."""
    global _JOB
    _reset_signals()
    _JOB = (scn, deal)


def _reset_signals() -> None:
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _fork_pool(jobs: int, scn: Scenario, deal: Deal):
    """A fork Pool of ``jobs`` workers whose SIGTERM is the default action from the fork
    on (see :func:`_use`): where this is the main thread the handlers are set to the
    default around the fork and put back, so no SIGTERM between the fork and the
    initializer is caught either."""
    import multiprocessing
    import signal
    import threading
    ctx = multiprocessing.get_context("fork")
    if threading.current_thread() is not threading.main_thread():
        return ctx.Pool(jobs, initializer=_use, initargs=(scn, deal))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _reset_signals()
        # fork: the workers inherit the scenario (set before they start) instead of pickling it
        return ctx.Pool(jobs, initializer=_use, initargs=(scn, deal))
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def default_jobs() -> int:
    """Processes a prediction's replicas may use: one per CPU this process may run on
    that is idle now (the one-minute load average below the CPUs), at least 1. On a
    machine whose CPUs are all busy, worker processes only share the same CPUs and
    cost more CPU time (measured: docs/benchmarks.md), so the replicas then run one
    after another here, as they do where processes cannot be forked (not Linux)."""
    if sys.platform != "linux":  # fork is Linux's start method; elsewhere it is unsafe or missing
        return 1
    try:
        cpus = max(len(os.sched_getaffinity(0)), 1)
        idle = cpus - os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover
        return 1
    return max(1, min(cpus, int(idle) + 1)) if idle >= 1 else 1


class PendingRange:
    """The replicas of a prediction's range, started at once so that they run while
    the caller simulates the point prediction (:func:`start_range`). Use as a context
    manager, or call :meth:`close`: worker processes still running are ended."""

    def __init__(self, scn: Scenario, deal: Deal, replicas: int = REPLICAS, jobs: int = 1):
        self.sources = range_sources(scn)
        self._job = (scn, deal)
        self._runs: list = []
        self._pool = None
        if not self.sources or replicas < 1:
            return
        w = scn.workload
        per_run = max(w.questions * w.answer_tokens, 1)
        n = max(min(replicas, TOKEN_BUDGET // per_run), min(MIN_REPLICAS, replicas))
        prompts = _walk_prompts(scn)
        rng = np.random.default_rng(np.random.SeedSequence([scn.seed, 0x5EED]))
        args = []
        for _ in range(n):  # every replica's draws made here, in order: the same for any jobs
            seed = int(rng.integers(0, 2**63))
            picks = rng.integers(0, prompts, w.questions).tolist() if prompts else None
            args.append((seed, picks))
        noise = _noise(scn)
        if noise:  # drawn after the others, from its own stream: the other draws stay as they were
            nrng = np.random.default_rng(np.random.SeedSequence([scn.seed, 0xC0FFEE]))
            args = [a + (f,) for a, f in zip(args, compute_factors(noise, n, nrng))]
        jobs = min(jobs, n)
        if jobs > 1:
            self._pool = _fork_pool(jobs, scn, deal)
            self._runs = [self._pool.apply_async(_replica, a) for a in args]
        else:
            self._runs = args

    def result(self, point: dict) -> dict:
        """The range (:func:`predict_range`'s dict) beside ``point``, the point
        prediction's metrics; waits for the replicas."""
        try:
            if self._pool is not None:
                runs = [r.get() for r in self._runs]
            else:
                runs = [_run_replica(*self._job, *a) for a in self._runs]
        finally:
            self.close()
        tps = [r[1] for r in runs if r[0]]
        ttft = [r[2] for r in runs if r[0]]
        if not tps:
            one = {"p10": point["tokens_per_s"], "p50": point["tokens_per_s"], "p90": point["tokens_per_s"]}
            t = {"p10": point["ttft_s"], "p50": point["ttft_s"], "p90": point["ttft_s"]}
            # no replica (none asked, or none answered every question): skipped when there was spread
            return {"tokens_per_s": one, "ttft_s": t, "replicas": 0, "sources": [], "skipped": bool(self.sources)}
        return {"tokens_per_s": _pct(tps), "ttft_s": _pct(ttft), "replicas": len(tps), "sources": self.sources,
                "skipped": False}

    @property
    def processes(self) -> int:
        """Worker processes running the replicas (0: they run in :meth:`result`)."""
        return 0 if self._pool is None else len(self._pool._pool)

    def close(self) -> None:
        """End the worker processes (those still running a replica too)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            pool.join()

    def __enter__(self) -> "PendingRange":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_range(scn: Scenario, deal: Deal, replicas: int = REPLICAS, jobs: int = 1) -> PendingRange:
    """Start the bootstrap replicas of ``scn``'s range (module doc) in up to ``jobs``
    forked processes (1: none, they run in :meth:`PendingRange.result`); the draws of
    every replica are made here, so the range is the same for any ``jobs``."""
    return PendingRange(scn, deal, replicas, jobs)


def predict_range(scn: Scenario, deal: Deal, point: dict, replicas: int = REPLICAS, jobs: int = 1) -> dict:
    """P10, P50 and P90 of tokens per second and time to first token over bootstrap
    replicas of ``scn`` (module doc), beside the ``point`` prediction's metrics.

    Returns ``{"tokens_per_s": {p10, p50, p90}, "ttft_s": {...}, "replicas": n,
    "sources": [...], "skipped": bool}``; with no source of spread (or ``replicas`` 0:
    ``skipped`` is then True when there was one), every percentile is the point's and
    ``replicas`` is 0. Replicas are fewer than asked when the scenario is long
    (:data:`TOKEN_BUDGET` simulated tokens in all, at least :data:`MIN_REPLICAS`).
    ``jobs``: processes to run them in (:func:`start_range`). Deterministic for the
    scenario's seed."""
    with start_range(scn, deal, replicas, jobs) as pending:
        return pending.result(point)


def acceptance_source(scn: Scenario) -> str | None:
    """Which prompts a prediction's drafter acceptance comes from, in words (None
    without speculation or without a profile that measured the drafter)."""
    spec, prof = scn.decoding.speculative, scn.profile
    if spec is None or prof is None or spec.drafter not in prof.drafters:
        return None
    if spec.accepted_sequence or spec.accepted_lengths:
        return "the scenario's own accepted lengths"
    if scn.workload.sample:
        key = scn.workload.acceptance_workload
        return f"workload.sample ({prof.notes.get(key, f'{len(scn.workload.sample)} prompts')})"
    return f"the built-in {scn.workload.kind} calibration prompts (no workload.sample given)"
