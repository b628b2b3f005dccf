"""The model host meets a lost worker at the relay for a new connection
(runtime.room.Node._meet_again), after the live-connection window, unless the worker
said hello over the live connection first. A stand-in transport records the
``reconnect`` calls; no model is loaded (the host's node holds no stage)."""

from __future__ import annotations

import asyncio

from runtime.control import Hello, encode_control
from runtime.room import REPLY, Node, NodeConfig

CHAIN = [["h", 0, 15], ["w", 15, 30]]
SCHED = dict(hidden=576, prefill_chunk=16, eos_token=2, phones=[])


class Relay:
    """What the host's Node uses of a transport; ``reconnect`` fails ``fail`` times first."""

    def __init__(self, fail: int = 0):
        self.calls: list[tuple[str, float]] = []
        self.fail = fail
        self.handler = None

    def set_handler(self, fn):
        self.handler = fn

    def set_lost_handler(self, fn):
        pass

    async def send(self, dst, channel, data):
        pass

    async def reconnect(self, peer, timeout_s):
        self.calls.append((peer, timeout_s))
        if len(self.calls) <= self.fail:
            raise OSError("the relay refused the connection")


def host(transport, live_s: float) -> Node:
    cfg = NodeConfig(device="h", host="h", stages=CHAIN, scheduler=SCHED, model_dir="/nonexistent", peers=["w"],
                     rejoin_live_s=live_s, host_wait_s=30.0, heartbeat_s=0.0)  # no timers: losses are told
    node = Node(cfg, None, transport, keep_open=True)
    node.start()
    return node


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_host_meets_a_lost_worker_at_the_relay_and_tries_again_after_a_failed_attempt():
    async def go():
        t = Relay(fail=1)
        node = host(t, live_s=0.0)
        node._on_lost("w", "no heartbeat for 1.1 s")
        for _ in range(400):  # bounded: the second attempt follows the first one's failure
            if len(t.calls) == 2:
                break
            await asyncio.sleep(0.01)
        await turns()
        await node.stop()
        return t.calls
    calls = asyncio.run(go())
    assert [p for p, _ in calls] == ["w", "w"]
    assert 0 < calls[1][1] < calls[0][1] <= 30.0  # each attempt waits at most what is left of host_wait_s


def test_a_worker_that_says_hello_over_the_live_connection_is_not_met_at_the_relay():
    async def go():
        t = Relay()
        node = host(t, live_s=0.5)
        node._on_lost("w", "no heartbeat for 1.1 s")
        await turns()  # the re-deal without w has begun: w is out of the chain
        t.handler("w", REPLY, encode_control(Hello(device="w")))
        assert node.liveness.coming_back("w")
        await asyncio.sleep(1.0)  # past the live window
        await node.stop()
        return t.calls
    assert asyncio.run(go()) == []


def test_a_room_that_stops_meets_no_one():
    async def go():
        t = Relay()
        node = host(t, live_s=0.5)
        node._on_lost("w", "no heartbeat for 1.1 s")
        await turns()
        await node.stop()
        await asyncio.sleep(1.0)
        return t.calls
    assert asyncio.run(go()) == []
