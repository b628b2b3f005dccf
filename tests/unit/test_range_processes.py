"""The range's replicas run in worker processes (splitroom/ranges.py, start_range):
the same range as one after another in this process, and no process left behind."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from planner.deal import deal_for
from sim.driver import simulate
from splitroom.ranges import predict_range, range_sources, start_range
from splitroom.scenario import load

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="replicas fork worker processes on Linux only")


def _room(*sets):
    return load("scenarios/wan_glm.yaml", ["decoding.return=direct", "workload.answer_tokens=30", *sets])


@pytest.mark.parametrize("sets", [(), ("decoding.async_laps=3", "workload.questions=2")])
def test_replicas_in_processes_give_the_range_of_replicas_in_turn(sets):
    scn = _room(*sets)
    assert range_sources(scn) == ["network jitter"]
    d = deal_for(scn)
    point = simulate(scn, d, trace=False).metrics
    serial = predict_range(scn, d, point, 6, jobs=1)
    # the replicas differ (jitter drawn per seed): not a claim about speed, but without it
    # the equalities below would hold for a range of one repeated point
    assert serial["replicas"] == 6 and serial["tokens_per_s"]["p90"] != serial["tokens_per_s"]["p10"]
    assert predict_range(scn, d, point, 6, jobs=2) == serial
    assert predict_range(scn, d, point, 6, jobs=4) == serial
    assert not multiprocessing.active_children()


def test_a_range_closed_before_its_result_ends_its_workers():
    scn = _room("workload.answer_tokens=2000")
    pending = start_range(scn, deal_for(scn), 6, jobs=2)
    assert len(multiprocessing.active_children()) == 2
    pending.close()
    assert not multiprocessing.active_children()


def test_a_range_closed_ends_its_workers_though_this_process_catches_sigterm():
    """A process with a Python SIGTERM handler (a room's stop_on_signals, a server) forks
    the workers: close's SIGTERM still ends them, and the handler here is kept. (Before:
    the workers inherited the handler, caught the pool's SIGTERM, and close waited for ever;
    here the close runs in a thread so that such a hang fails the test instead.)"""
    import signal
    import threading
    caught = []

    def handler(signum, frame):
        caught.append(signum)
    old = signal.signal(signal.SIGTERM, handler)
    try:
        scn = _room("workload.answer_tokens=2000")
        pending = start_range(scn, deal_for(scn), 6, jobs=2)
        assert signal.getsignal(signal.SIGTERM) is handler
        workers = multiprocessing.active_children()
        assert len(workers) == 2
        closer = threading.Thread(target=pending.close, daemon=True)
        closer.start()
        closer.join(60)
        hung = closer.is_alive()
        for p in workers:  # never leave a worker behind, whatever happened
            if p.is_alive():
                p.kill()
        assert not hung, "close() did not end the workers"
        assert not multiprocessing.active_children()
        assert caught == []
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_range_with_nothing_to_vary_starts_no_process():
    scn = _room("network.jitter={distribution: none}")
    point = {"tokens_per_s": 3.0, "ttft_s": 0.5}
    with start_range(scn, deal_for(scn), 10, jobs=4) as pending:
        assert not multiprocessing.active_children()
        r = pending.result(point)
    assert r == {"tokens_per_s": {"p10": 3.0, "p50": 3.0, "p90": 3.0}, "ttft_s": {"p10": 0.5, "p50": 0.5, "p90": 0.5},
                 "replicas": 0, "sources": [], "skipped": False}


@pytest.mark.parametrize("cpus,load,want", [(2, 0.0, 2), (2, 0.9, 2), (2, 1.5, 1), (2, 12.0, 1), (8, 3.5, 5),
                                            (8, 0.2, 8), (1, 0.0, 1)])
def test_replicas_fork_onto_idle_cpus_only(monkeypatch, cpus, load, want):
    import os

    from splitroom.ranges import default_jobs
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert default_jobs() == want
