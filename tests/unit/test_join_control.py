"""`splitroom join`'s control plane against hostile peers: only the model host's plan,
abort and bye count (its id bound to its DTLS certificate by its hello's proof in a
room with a key), and a worker waiting for its host (``--host-wait``) refuses a device
that connects as the host without the proof, logs it and keeps waiting."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from runtime.control import Abort, Bye, Hello, Plan, encode_control, room_proof
from splitroom.join_cmd import JoinError, _Mux, _next_control, await_host_plan

KEY = "test-room-key-0123456789"
FP = {"h": "sha-256 " + ":".join(["AA"] * 32), "w2": "sha-256 " + ":".join(["BB"] * 32),
      "imp": "sha-256 " + ":".join(["CC"] * 32), "w": "sha-256 " + ":".join(["DD"] * 32)}


class FakeTransport:
    """What _Mux uses of a transport; ``cert[peer]`` is the remote certificate's fingerprint now."""

    def __init__(self):
        self.cert = {"h": FP["h"], "w2": FP["w2"]}
        self.sent: list = []
        self.on_reconnect = []  # callables run at each reconnect (the device that answers it)

    def set_handler(self, fn):
        self.fn = fn

    def set_lost_handler(self, fn):
        self.lost_fn = fn

    def fingerprints(self, peer):
        return FP["w"], self.cert.get(peer)

    async def send(self, dst, channel, data):
        self.sent.append((dst, data))

    async def reconnect(self, peer, timeout_s):
        step = self.on_reconnect.pop(0)
        step()


def hello(device, fp, host=False, key=KEY):
    return encode_control(Hello(device=device, host=host, layers=(0, 15) if host else (15, 30),
                                proof=room_proof(key, device, fp) if key else None))


def plan():
    return Plan(host="h", stages=[["h", 0, 15], ["w", 15, 30]], scheduler={"hidden": 576}, max_new_tokens=4)


@pytest.mark.parametrize("key", [KEY, None])
def test_only_the_hosts_abort_bye_and_plan_count(key, caplog):
    async def go():
        t = FakeTransport()
        mux = _Mux(t, key)
        mux._on_message("h", "reply", hello("h", FP["h"], host=True, key=key))
        mux._on_message("w2", "reply", hello("w2", FP["w2"], key=key))
        mux._on_message("w2", "reply", encode_control(Abort(reason="forged")))
        mux._on_message("w2", "reply", encode_control(Bye()))
        mux._on_message("w2", "reply", encode_control(plan().model_copy(update={"host": "w2"})))
        mux._on_message("h", "reply", encode_control(plan().model_copy(update={"host": "w2"})))  # names another
        return await _next_control(mux, (Bye, Plan), time.monotonic() + 0.3, "the bye", ["h"])
    with caplog.at_level(logging.WARNING, "splitroom.join"):
        with pytest.raises(JoinError) as e:
            asyncio.run(go())
    assert e.value.status == 4  # the forged abort, bye and plans were all ignored: still waiting
    ignored = [r.getMessage() for r in caplog.records if "ignored a" in r.getMessage()]
    assert len(ignored) == 4 and all("only the model host (h)" in m for m in ignored), ignored

    async def real():
        t = FakeTransport()
        mux = _Mux(t, key)
        mux._on_message("h", "reply", hello("h", FP["h"], host=True, key=key))
        mux._on_message("w2", "reply", encode_control(Bye()))
        mux._on_message("h", "reply", encode_control(Abort(reason="the host's own")))
        return await _next_control(mux, (Bye,), time.monotonic() + 2, "the bye", ["h"])
    with pytest.raises(JoinError) as e:
        asyncio.run(real())
    assert e.value.status == 2 and "the host's own" in str(e.value)


def test_a_worker_waiting_for_its_host_refuses_an_impostor_and_keeps_waiting(caplog):
    said = []

    async def go():
        t = FakeTransport()
        mux = _Mux(t, KEY)
        mux._on_message("h", "reply", hello("h", FP["h"], host=True))
        mux.host = "h"

        def impostor(key):  # takes the id h and says hello, without the key or with another
            def step():
                t.cert["h"] = FP["imp"]
                asyncio.get_running_loop().call_soon(mux._on_message, "h", "reply",
                                                     hello("h", FP["imp"], host=True, key=key))
            return step

        def the_host():
            t.cert["h"] = FP["h"]
            loop = asyncio.get_running_loop()
            loop.call_soon(mux._on_message, "h", "reply", hello("h", FP["h"], host=True))
            loop.call_soon(mux._on_message, "h", "reply", encode_control(plan()))
        t.on_reconnect = [impostor(None), impostor("another-key-0123456789"), the_host]
        greeted = []

        async def greet():
            greeted.append(1)
        got = await await_host_plan(mux, "h", 10.0, None, said.append, greet)
        return got, len(greeted)
    with caplog.at_level(logging.WARNING, "splitroom.join"):
        got, greetings = asyncio.run(go())
    assert got == plan() and greetings == 3
    refused = [r.getMessage() for r in caplog.records if "refused a device connected as the model host h" in
               r.getMessage()]
    assert len(refused) == 2 and "no proof" in refused[0] and "does not match" in refused[1], refused
    assert sum("still waiting" in s for s in said) == 2 and said[-1] == "h is back: resuming the room"


def test_the_wait_for_the_host_ends_in_room_over_when_only_an_impostor_comes():
    async def go():
        t = FakeTransport()
        mux = _Mux(t, KEY)
        mux.host = "h"

        def impostor():
            t.cert["h"] = FP["imp"]
            asyncio.get_running_loop().call_soon(mux._on_message, "h", "reply", hello("h", FP["imp"], host=True))
        t.on_reconnect = [impostor] * 1000

        async def greet():
            pass
        await await_host_plan(mux, "h", 0.5, None, lambda s: None, greet)
    with pytest.raises(JoinError) as e:
        asyncio.run(go())
    assert e.value.status == 5 and "room over" in str(e.value)


def test_the_room_page_is_told_each_stage_s_layer_bytes_as_the_safetensors_header_gives_them(tmp_path):
    import json as _json
    import struct

    from runtime.weights import ensure_safetensors
    from splitroom.join_cmd import stage_shares
    md = ensure_safetensors()
    raw = (md / "model.safetensors").read_bytes()[:8]
    (n,) = struct.unpack("<Q", raw)
    with open(md / "model.safetensors", "rb") as f:
        f.seek(8)
        header = _json.loads(f.read(n))

    def layers_bytes(a, b):  # every tensor named model.layers.I. for I in [a, b), by its data offsets
        return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                   if k.startswith("model.layers.") and a <= int(k.split(".")[2]) < b)
    got = stage_shares(md, [["host", 0, 25], ["tab", 25, 30]])
    assert got == [{"device": "host", "used_bytes": layers_bytes(0, 25)},
                   {"device": "tab", "used_bytes": layers_bytes(25, 30)}]
    assert got[1]["used_bytes"] > 0
    assert stage_shares(tmp_path, [["host", 0, 30]]) == []  # no weights there: the page says "size not known"


def test_a_worker_back_through_the_relay_keeps_its_plan_when_the_host_still_runs_and_takes_a_new_one_after_a_restart():
    # After the new connection the host that still runs (it lost this worker and met it at
    # the relay) answers the worker's hello with heartbeats; a host that restarted answers
    # with its plan first (its heartbeats start with its Node, after the plan).
    from runtime.control import Heartbeat
    running = plan()
    restarted = plan().model_copy(update={"max_new_tokens": 8})

    async def go(answer):
        t = FakeTransport()
        mux = _Mux(t, KEY)
        mux._on_message("h", "reply", hello("h", FP["h"], host=True))
        mux.host = "h"

        def the_host():
            asyncio.get_running_loop().call_soon(mux._on_message, "h", "reply",
                                                 hello("h", FP["h"], host=True))  # its proof, again
        t.on_reconnect = [the_host]
        said = []

        async def greet():  # the host answers the worker's hello
            for msg in answer:
                asyncio.get_running_loop().call_soon(mux._on_message, "h", "reply", encode_control(msg))
        got = await asyncio.wait_for(await_host_plan(mux, "h", 10.0, None, said.append, greet, running=running), 10)
        return got, said
    got, said = asyncio.run(go([Heartbeat()]))
    assert got is running and said[-1] == "the model host h still runs: rejoining the room with the same plan"
    got, said = asyncio.run(go([restarted, Heartbeat()]))
    assert got == restarted and not any("still runs" in s for s in said)


def test_a_hello_that_arrives_while_a_node_runs_reaches_the_node():
    # the model host's Node takes a lost device back on its hello (runtime.room.Node._from_lost)
    got = []
    t = FakeTransport()
    mux = _Mux(t, None)
    mux.set_handler(lambda src, channel, data: got.append((src, channel, data)))
    mux._on_message("w", "reply", hello("w", FP["w"], key=None))
    assert got == [("w", "reply", hello("w", FP["w"], key=None))] and mux.control.empty()
