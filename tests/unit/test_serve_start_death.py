"""A device that dies while the served room starts: the room is dealt again without it
when the rest can hold the model, else the API says "cannot start: DEVICE died while
loading" with 503 and no Retry-After (waiting will not help).

Expected deals are the planner's rules applied by hand to scenarios/home.yaml's
devices (SmolLM2: 30 layers of about 15 MiB with their KV at 2,048 tokens, a 108 MiB
embedding on the host)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

from planner.deal import deal as make_deal
from splitroom.scenario import load
from splitroom.real_configs import redeal_without
from splitroom.serve_cmd import _refuse_until_stopped


def test_a_room_that_can_do_without_the_dead_device_is_dealt_again():
    # the desktop lends 1 GB: it can hold every layer and the host the rest
    scn = load("scenarios/home.yaml", ["devices[0].lends=1 GB"])
    d = make_deal(scn.devices, scn.model, scn.options, scn.network, scn.decoding.return_path)
    new, why = redeal_without(scn, d, {"phone"})
    assert why == "" and new is not None
    assert "phone" not in {s.device for s in new.stages} and new.host == d.host
    assert sum(s.end - s.start for s in new.stages) == 30 and new.fits


def test_a_room_that_cannot_do_without_it_says_why():
    scn = load("scenarios/home.yaml")  # each lends too little: the deal needs all three
    d = make_deal(scn.devices, scn.model, scn.options, scn.network, scn.decoding.return_path)
    assert {s.device for s in d.stages} == {"desktop", "laptop", "phone"}
    new, why = redeal_without(scn, d, {"phone"})
    assert new is None and "cannot hold the model" in why
    assert redeal_without(scn, d, {d.host}) == (None, "the model host is gone")


def test_the_api_then_answers_503_with_the_reason_and_no_retry_after():
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = threading.Event()
    reason = "cannot start: phone died while loading (the devices left cannot hold the model)"
    t = threading.Thread(target=_refuse_until_stopped, args=(sock, "smollm2-135m", reason, stop.is_set))
    t.start()
    try:
        got = None
        for _ in range(200):  # bounded: the server is up after its first loop turn
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
            except urllib.error.HTTPError as e:
                got = (e.code, json.loads(e.read()), e.headers.get("Retry-After"))
                break
            except OSError:
                stop.wait(0.02)
        assert got is not None and got[0] == 503 and got[2] is None
        assert got[1]["reason"] == reason and got[1]["ready"] is False
        req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": "smollm2-135m",
                                                      "messages": [{"role": "user", "content": "hi"}]}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("chat answered")
        except urllib.error.HTTPError as e:
            assert e.code == 503 and e.headers.get("Retry-After") is None
            assert reason in json.loads(e.read())["error"]["message"]
    finally:
        stop.set()
        t.join(10)
        sock.close()
