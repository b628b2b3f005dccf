"""A joined worker whose connection is gone comes back through the relay (real
`splitroom join` processes on loopback): the host serves the API (``--serve``) with its
compute padded 4x (``--slowdown 4``: a slower machine), a first answer lets the host
time both devices (the room page's ``layer_ms``), then the worker is frozen (SIGSTOP)
until the host has lost it and re-dealt its layers, then thawed. The live-connection
window is 0 (``--rejoin-live 0``), so the host closes the old connection at the loss and
both meet at the relay for a new one; the worker says hello over it, the host takes it
back after the rejoin hold and, the first deal being measured faster than the host alone
(planner.chain.measured_faster), deals it back its layers. Every step waits for what the
host's /health or /api/room says, never for a time.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.integration.test_serve_room import FRANCE, MODEL, client, greedy  # noqa: F401
from tests.joinroom import SPLITROOM, relay_room

pytestmark = pytest.mark.slow

#: seconds any one step may take before the test fails (a bound, not a margin)
STEP_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(api: str) -> dict:
    try:
        with urllib.request.urlopen(api + "/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # 503 while not ready, with the same body
        return json.loads(e.read())
    except (urllib.error.URLError, ConnectionError):
        return {}


def _until(api: str, what: str, ok, procs) -> dict:
    end = time.monotonic() + STEP_S
    while True:
        body = _health(api)
        if body and ok(body):
            return body
        for p, log in procs:
            assert p.poll() is None, f"a device ended while waiting for {what}: {log.read_text()}"
        assert time.monotonic() < end, f"{what}: /health still says {body}"
        time.sleep(0.2)


def _timed(api: str) -> dict:
    """Device -> its ms per layer on the room page (None until the host timed it)."""
    try:
        with urllib.request.urlopen(api + "/api/room", timeout=10) as r:
            return {d["id"]: d.get("layer_ms") for d in json.loads(r.read())["devices"]}
    except (urllib.error.URLError, ConnectionError, KeyError, ValueError):
        return {}


def _stages(body: dict) -> list:
    return [(s["device"], s["shown"]) for s in body.get("stages", [])]


def test_a_frozen_worker_whose_connection_is_gone_comes_back_through_the_relay(greedy, tmp_path):  # noqa: F811
    host_log, worker_log = tmp_path / "h.log", tmp_path / "w.log"
    with relay_room("rejoin") as (url, env, procs), open(host_log, "w") as hl, open(worker_log, "w") as wl:
        port = _free_port()
        api = f"http://127.0.0.1:{port}"
        common = ["--address", "127.0.0.1", "--timeout", "500", "--rejoin-live", "0"]
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers",
                                             "w", "--serve", str(port), "--slowdown", "4"] + common,
                                env=env, stdout=subprocess.DEVNULL, stderr=hl, text=True)
        procs.append(host)
        worker = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w", "--layers", "16-30", "--peers", "h"]
                                  + common, env=env, stdout=subprocess.DEVNULL, stderr=wl, text=True)
        procs.append(worker)
        both = [(host, host_log), (worker, worker_log)]
        first = _until(api, "the room ready", lambda b: b.get("ready"), both)
        assert _stages(first) == [("h", "1-15"), ("w", "16-30")]
        r = client(api).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}])
        assert r.choices[0].message.content == greedy.tok.decode(greedy(FRANCE))
        end = time.monotonic() + STEP_S
        while None in (_timed(api).get("h"), _timed(api).get("w")):  # both timed on decode steps
            assert time.monotonic() < end, f"the devices not timed: {_timed(api)}"
            time.sleep(0.2)

        worker.send_signal(signal.SIGSTOP)  # frozen: no heartbeat, nothing read
        try:
            alone = _until(api, "the re-deal without w", lambda b: b.get("ready") and b.get("lost") == ["w"],
                           both[:1])
        finally:
            worker.send_signal(signal.SIGCONT)
        assert _stages(alone) == [("h", "1-30")]

        back = _until(api, "w dealt back", lambda b: b.get("ready") and b.get("lost") == [] and len(b["stages"]) == 2,
                      both)
        assert _stages(back) == [("h", "1-15"), ("w", "16-30")]
        r = client(api).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}])
        assert r.choices[0].message.content == greedy.tok.decode(greedy(FRANCE))
        with urllib.request.urlopen(api + "/metrics", timeout=10) as m:
            metrics = m.read().decode()
        assert "splitroom_devices_back_total 1.0" in metrics and "splitroom_devices_lost_total 1.0" in metrics

        host.send_signal(signal.SIGINT)
        assert host.wait(timeout=30) == 0
        assert worker.wait(timeout=30) == 0  # the host's bye
        log = worker_log.read_text()
        assert "still runs: rejoining the room with the same plan" in log, log
        assert "w is back" in host_log.read_text()
