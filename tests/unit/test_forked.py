"""splitroom.forked runs one function in a forked child: its value comes back as this
process would compute it, a failure comes back as ChildFailed, and a child still
running is killed on close. ``simulate`` of a speculating room runs its plain
prediction there when a CPU is idle; its output is the same either way, and the same
as the record of whole processes made before the child existed
(tests/data/simulate_process_oracle.json, case gb10_m5)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from splitroom import forked
from splitroom.cli import app

ROOT = Path(__file__).resolve().parents[2]
ORACLE = json.loads((ROOT / "tests" / "data" / "simulate_process_oracle.json").read_text())

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="processes are forked on Linux only")


def _boom(message: str) -> None:
    raise ValueError(message)


def test_value_comes_back():
    """A value built in the child (a dict of floats and lists) is the one built here."""
    def build(n: int) -> dict:
        return {"squares": [i * i / 7 for i in range(n)], "pid_differs": os.getpid()}
    with forked.start(build, 50) as child:
        got = child.result()
    assert got["squares"] == [i * i / 7 for i in range(50)]
    assert got["pid_differs"] != os.getpid()


def test_child_failure_is_childfailed():
    with forked.start(_boom, "no such room") as child:
        with pytest.raises(forked.ChildFailed, match="ValueError: no such room"):
            child.result()


def test_close_kills_a_running_child(monkeypatch):
    """close() kills a child that would sleep for an hour, with SIGKILL, and reaps it: the
    status close() reaped says the child died of SIGKILL (not an exit of its own). Checked
    by the status, not by how long close() took: close runs in a thread, and the 60 s
    join is a hang guard only (a close() that waited for the child would wait an hour)."""
    child = forked.start(time.sleep, 3600)
    pid = child.pid
    reaped = []
    real_waitpid = os.waitpid

    def recording_waitpid(p, options):
        got = real_waitpid(p, options)
        reaped.append(got)
        return got

    monkeypatch.setattr(os, "waitpid", recording_waitpid)
    closing = threading.Thread(target=child.close, daemon=True)
    try:
        closing.start()
        closing.join(60)
        assert not closing.is_alive(), "close() did not return: it waits for the child instead of killing it"
    finally:
        monkeypatch.setattr(os, "waitpid", real_waitpid)
        if closing.is_alive():
            os.kill(pid, signal.SIGKILL)
    statuses = [status for p, status in reaped if p == pid]
    assert len(statuses) == 1, reaped  # reaped once
    assert os.WIFSIGNALED(statuses[0]) and os.WTERMSIG(statuses[0]) == signal.SIGKILL, statuses
    assert child.pid is None
    with pytest.raises(ChildProcessError):  # reaped: no longer this process's child
        os.waitpid(pid, os.WNOHANG)


def test_result_twice_is_refused():
    child = forked.start(int, "7")
    assert child.result() == 7
    with pytest.raises(forked.ChildFailed):
        child.result()


def _simulate(monkeypatch, idle: int) -> tuple[dict, int]:
    starts = []
    real_start = forked.start

    def counting_start(fn, *args):
        starts.append(fn.__name__)
        return real_start(fn, *args)
    monkeypatch.setattr(forked, "may_fork", lambda: idle >= 1)
    monkeypatch.setattr(forked, "start", counting_start)
    r = CliRunner().invoke(app, ["simulate", "scenarios/gb10_m5.yaml", "--json", "--no-range"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), len(starts)


def test_simulate_plain_prediction_in_a_child_is_the_same(monkeypatch):
    """With an idle CPU the plain prediction runs in a child (one start), without one
    here (none); the printed JSON is the same, and its speculation object is the
    recorded one of gb10_m5 (made before the child existed; the range does not touch it)."""
    monkeypatch.chdir(ROOT)
    in_child, started = _simulate(monkeypatch, idle=1)
    assert started == 1
    here, started = _simulate(monkeypatch, idle=0)
    assert started == 0
    assert in_child == here
    assert in_child["metrics"]["speculation"] == ORACLE["gb10_m5"]["stdout"]["metrics"]["speculation"]


def test_no_fork_while_another_thread_runs(monkeypatch):
    """A CPU idle but a second thread alive (it could hold a lock the child would wait
    for): no fork; with the thread gone and a CPU idle: fork."""
    import threading
    monkeypatch.setattr(forked, "idle_cpus", lambda: 1)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert forked.may_fork() is False
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert forked.may_fork() is True
    monkeypatch.setattr(forked, "idle_cpus", lambda: 0)
    assert forked.may_fork() is False
