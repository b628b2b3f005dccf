"""``splitroom join ... --host --serve PORT`` (real machines on a LAN, here 127.0.0.1): the
model host serves the API from the start (503 until the room is ready), the openai client
gets the greedy answer, and Ctrl-C on the host ends the room (its bye ends the worker)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import openai
import pytest

from tests.integration.test_serve_room import FRANCE, MODEL, client, greedy  # noqa: F401
from tests.joinroom import SPLITROOM, relay_room

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_join_host_serves_the_api(greedy):  # noqa: F811
    with relay_room("servejoin") as (url, env, procs):
        port = _free_port()
        api = f"http://127.0.0.1:{port}"
        common = ["--address", "127.0.0.1", "--timeout", "100"]
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers",
                                             "w", "--serve", str(port)] + common,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(host)
        c = client(api)
        end = time.monotonic() + 30  # the API is up before the worker even joined: 503 at once
        while True:
            try:
                c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}],
                                          timeout=20.0)
                raise AssertionError("answered before the room was ready")
            except openai.InternalServerError as e:
                assert e.status_code == 503 and "starting" in e.message
                break
            except openai.APIConnectionError:
                assert time.monotonic() < end and host.poll() is None
                time.sleep(0.2)
        worker = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w", "--layers", "16-30", "--peers", "h"]
                                  + common, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(worker)
        end = time.monotonic() + 80
        while time.monotonic() < end and not [m.id for m in c.models.list()]:
            assert host.poll() is None, host.stderr.read()
            time.sleep(0.25)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}])
        assert r.choices[0].message.content == greedy.tok.decode(greedy(FRANCE))
        import json
        import urllib.request
        with urllib.request.urlopen(api + "/api/room", timeout=10) as resp:  # the room page's data
            screens = {d["id"]: (d["title"], d["layers"]) for d in json.loads(resp.read())["devices"]}
        assert screens == {"h": ("Serving", "1-15"), "w": ("Serving", "16-30")}
        host.send_signal(signal.SIGINT)
        assert host.wait(timeout=30) == 0
        assert worker.wait(timeout=30) == 0  # the host's bye
