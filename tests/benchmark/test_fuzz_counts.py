"""The long fuzzing run (issue 11): many inputs per outside surface, outcomes counted.

Skipped unless ``SPLITROOM_FUZZ_N`` is set (inputs per surface; the issue asks for
10,000), so it is not part of every CI run. Each surface's counts (inputs, accepted,
refused, crashes, hangs) go to ``SPLITROOM_FUZZ_OUT`` (JSON, default
``fuzz-counts.json`` in the working directory) for docs/fuzzing.md; the test fails if
any input crashed or hung. Run one surface with ``-k``::

    SPLITROOM_FUZZ_N=10000 .venv/bin/python -m pytest -q -m fuzz tests/benchmark/test_fuzz_counts.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests import fuzzing

N = int(os.environ.get("SPLITROOM_FUZZ_N", "0"))
OUT = Path(os.environ.get("SPLITROOM_FUZZ_OUT", "fuzz-counts.json"))

pytestmark = [pytest.mark.fuzz,
              pytest.mark.skipif(N <= 0, reason="the long fuzzing run: set SPLITROOM_FUZZ_N (e.g. 10000)")]


def _run(surface: str, strategy, feed) -> dict:
    """Feed N inputs from ``strategy`` to ``feed(input) -> Outcome``; record and return the counts."""
    tally = fuzzing.Tally()

    @settings(max_examples=N, deadline=None, database=None, derandomize=False, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def go(x):
        tally.add(surface, feed(x), x)

    t0 = time.perf_counter()
    go()
    counts = dict(tally.counts.get(surface, {}), seconds=round(time.perf_counter() - t0, 1))
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    old[surface] = {"counts": counts, "examples": tally.examples.get(surface, [])}
    OUT.write_text(json.dumps(old, indent=1))
    assert counts["crash"] == 0 and counts["hang"] == 0, tally.examples.get(surface)
    return counts


def test_fuzz_scenario_files(tmp_path):
    f = tmp_path / "room.yaml"

    def feed(data: bytes):
        f.write_bytes(data)
        return fuzzing.try_cli(f, [])
    _run("scenario files", fuzzing.scenario_files(), feed)


def test_fuzz_set_values(tmp_path):
    f = tmp_path / "room.yaml"
    f.write_text(fuzzing._dump(fuzzing.BASE))
    _run("--set values", fuzzing.set_options(), lambda sets: fuzzing.try_cli(f, sets))


def test_fuzz_frames():
    node = fuzzing.worker_node()
    _run("residual frames", fuzzing.frames(), lambda data: fuzzing.try_frame(node, data))


def test_fuzz_control_messages():
    _run("control messages", fuzzing.control_messages(), fuzzing.try_control)


def test_fuzz_sdps():
    _run("relay SDP check", fuzzing.sdps(), fuzzing.try_sdp)


def test_fuzz_relay_sessions():
    rf = fuzzing.RelayFuzzer()
    try:
        _run("relay sessions", fuzzing.relay_sessions(), rf.feed)
    finally:
        rf.close()


def test_fuzz_weights_requests():
    import asyncio

    from runtime.transport import LoopbackHub
    from runtime.weights import ensure_safetensors
    from runtime.weights_share import serve_weights

    async def make():
        return serve_weights(LoopbackHub().transport("server"), ensure_safetensors(), holds=(29, 30, False, False))
    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(make())
    try:
        _run("weights requests", fuzzing.weights_requests(), lambda data: fuzzing.try_weights_request(srv, data))
    finally:
        srv.close()
        loop.close()


def test_fuzz_api_requests():
    af = fuzzing.ApiFuzzer()
    try:
        _run("serve API requests", fuzzing.api_requests(), af.feed)
    finally:
        af.close()


def test_fuzz_api_requests_with_a_room_attached():
    af = fuzzing.ApiFuzzer(room=True)
    try:
        counts = _run("serve API requests, room attached", fuzzing.api_requests(), af.feed)
        answer = af.ask("What is the capital of France?")
        old = json.loads(OUT.read_text())
        old["serve API requests, room attached"].update(statuses=af.statuses, gave_up=af.gave_up,
                                                        then_asked_france=answer)
        OUT.write_text(json.dumps(old, indent=1))
        assert "Paris" in answer, (counts, answer)
    finally:
        af.close()
