"""splitroom calibrate interrupted while its measuring child runs: the child ends too.

Ctrl-C at a terminal signals the whole process group, but SIGINT (or any exception)
reaching the parent alone used to leave ``python -m runtime.calibrate`` running as an
orphan for the rest of its two minutes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import runtime.weights
import splitroom.calibration as calibration


def test_an_interrupted_measure_kills_its_child(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime.weights, "ensure_safetensors", lambda: tmp_path)
    started = []
    real_popen = subprocess.Popen

    def fake_popen(argv, **kw):  # a child that says one line, then measures "forever"
        p = real_popen([sys.executable, "-c", "import sys, time; print('measuring', file=sys.stderr, flush=True); "
                        "time.sleep(60)"], **kw)
        started.append(p)
        return p

    monkeypatch.setattr(calibration.subprocess, "Popen", fake_popen)

    def log(line):  # Ctrl-C arrives while the child is measuring
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        calibration.measure(log=log)
    (child,) = started
    assert child.poll() is not None, "the measuring child was left running"
