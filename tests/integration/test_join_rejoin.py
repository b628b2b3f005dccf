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
    except OSError:  # refused, or no answer within 10 s from a machine busy loading: ask again
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


def _wait_log(path, text: str, procs) -> None:
    end = time.monotonic() + STEP_S
    while text not in path.read_text():
        for p, log in procs:
            assert p.poll() is None, f"a device ended while waiting for {text!r}: {log.read_text()}"
        assert time.monotonic() < end, f"no {text!r} in {path.name}: {path.read_text()[-3000:]}"
        time.sleep(0.2)


def test_a_worker_back_in_a_room_of_three_makes_new_connections_to_its_neighbours_too(greedy, tmp_path):  # noqa: F811
    """h 1-10 (serving, padded 4x: a slow machine), w1 11-20, w2 21-30. w1 is frozen until
    the host has re-dealt without it (its layers to the stage before: h 1-20, read from the
    host's own disk) and w2's own connection to w1 has ended (w2's ICE consent checked
    every 0.5 s meanwhile: QUICK_CONSENT_SPLITROOM). Thawed, w1 meets the host at the relay
    and is dealt back, measured faster (by hand, in a layer's time: h at 4x on 20 layers
    and w2 on 10 is 90, with w1 back 40 + 10 + 10 = 60, 1.5x). Its link with w2 is dead, so
    the chain h -> w1 -> w2 -> h can only carry a lap once w1 and w2 made a new one through
    the relay too; the answer is the greedy one."""
    from tests.joinroom import QUICK_CONSENT_SPLITROOM
    logs = {d: tmp_path / f"{d}.log" for d in ("h", "w1", "w2")}
    with relay_room("rejoin3") as (url, env, procs):
        port = _free_port()
        api = f"http://127.0.0.1:{port}"
        common = ["--address", "127.0.0.1", "--timeout", "500", "--rejoin-live", "0"]
        args = {"h": ["--host", "--layers", "1-10", "--peers", "w1,w2", "--serve", str(port), "--slowdown", "4"],
                "w1": ["--layers", "11-20", "--peers", "h,w2"],
                "w2": ["--layers", "21-30", "--peers", "h,w1"]}
        quick = tmp_path / "quick-consent"
        p = {}
        for d in ("h", "w1", "w2"):
            with open(logs[d], "w") as f:
                p[d] = subprocess.Popen(QUICK_CONSENT_SPLITROOM + ["join", url, "--device", d] + args[d] + common,
                                        env=dict(env, QUICK_CONSENT_WHILE=str(quick)) if d == "w2" else env,
                                        stdout=subprocess.DEVNULL, stderr=f, text=True)
            procs.append(p[d])
        every = [(p[d], logs[d]) for d in ("h", "w1", "w2")]
        first = _until(api, "the room ready", lambda b: b.get("ready"), every)
        assert _stages(first) == [("h", "1-10"), ("w1", "11-20"), ("w2", "21-30")]
        want = greedy.tok.decode(greedy(FRANCE))
        r = client(api).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}])
        assert r.choices[0].message.content == want
        end = time.monotonic() + STEP_S
        while None in (_timed(api).get(d) for d in ("h", "w1", "w2")):  # every device timed on decode steps
            assert time.monotonic() < end, f"the devices not timed: {_timed(api)}"
            time.sleep(0.2)

        others = [every[0], every[2]]
        quick.touch()
        p["w1"].send_signal(signal.SIGSTOP)  # frozen: no heartbeat, no consent answer, nothing read
        try:
            alone = _until(api, "the re-deal without w1", lambda b: b.get("ready") and b.get("lost") == ["w1"],
                           others)
            _wait_log(logs["w2"], "w2: connection to w1 closed", others)
        finally:
            quick.unlink()
            p["w1"].send_signal(signal.SIGCONT)
        assert _stages(alone) == [("h", "1-20"), ("w2", "21-30")]

        back = _until(api, "w1 dealt back", lambda b: b.get("ready") and b.get("lost") == [] and len(b["stages"]) == 3,
                      every)
        assert _stages(back) == [("h", "1-10"), ("w1", "11-20"), ("w2", "21-30")]
        r = client(api, timeout_s=STEP_S).chat.completions.create(model=MODEL,
                                                                  messages=[{"role": "user", "content": FRANCE}])
        assert r.choices[0].message.content == want
        with urllib.request.urlopen(api + "/metrics", timeout=10) as m:
            metrics = m.read().decode()
        assert "splitroom_devices_back_total 1.0" in metrics and "splitroom_devices_lost_total 1.0" in metrics

        p["h"].send_signal(signal.SIGINT)
        assert p["h"].wait(timeout=30) == 0
        assert p["w1"].wait(timeout=30) == 0 and p["w2"].wait(timeout=30) == 0  # the host's bye
        w1, w2 = logs["w1"].read_text(), logs["w2"].read_text()
        assert "w1: a new connection to w2 through the relay (w1 was dealt back)" in w1, w1
        assert "w2: a new connection to w1 through the relay (w1 was dealt back)" in w2, w2
