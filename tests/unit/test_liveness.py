"""Liveness without a model: a worker Node notices a silent host by heartbeat, names it
and sets lost_host; a device loading a re-dealt range is not taken for lost; join's
control waiter turns a peer lost before the plan into a one-line JoinError (status 3)."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.control import Heartbeat, NodeConfig, encode_control
from runtime.room import Node
from splitroom.join_cmd import JoinError, _Mux, _next_control


class Wire:
    """The smallest transport: records what is sent, delivers nothing."""

    def __init__(self):
        self.sent = []
        self.handler = None
        self.lost_handler = None

    def set_handler(self, fn):
        self.handler = fn

    def set_lost_handler(self, fn):
        self.lost_handler = fn

    async def send(self, dst, channel, data):
        self.sent.append((dst, channel, bytes(data)))


def worker(**kw) -> tuple[Node, Wire]:
    cfg = NodeConfig(device="w", host="h", stages=[["h", 0, 15], ["w", 15, 30]], scheduler={"hidden": 576},
                     model_dir="/nonexistent", peers=["h"], heartbeat_s=0.05, heartbeat_timeout_s=0.3, **kw)
    wire = Wire()
    return Node(cfg, None, wire), wire


def test_a_host_that_falls_silent_is_lost_by_heartbeat_and_named():
    async def go():
        node, wire = worker()
        node.start()
        # t0 before the host is first heard (its silence counts from then), so the node's
        # "0.3 s of silence" is at least 0.3 s of t0's clock too, however late it runs
        t0 = time.monotonic()
        node._on_message("h", "reply", encode_control(Heartbeat()))
        await asyncio.wait_for(node.lost_host.wait(), 60.0)  # a hang guard, not a bound
        waited = time.monotonic() - t0
        await node.stop()
        return node, wire, waited
    node, wire, waited = asyncio.run(go())
    # not before the 0.3 s timeout; how soon after is the timers' arithmetic, checked with
    # the time passed in (tests/unit/test_liveness_timers.py), not with this loop's clock
    assert waited >= 0.3
    lost = [o for _, o in node.trace if type(o).__name__ == "DeviceLost"]
    assert len(lost) == 1 and lost[0].device == "h" and lost[0].reason.startswith("no heartbeat for")
    assert lost[0].silent_since_s is not None
    # it sent heartbeats to the host meanwhile, as control messages on the reply channel
    assert any(dst == "h" and ch == "reply" and b'"heartbeat"' in data for dst, ch, data in wire.sent)


def test_silence_is_not_a_loss_before_the_first_message_or_while_loading():
    async def go():
        node, _ = worker()
        node.start()
        await asyncio.sleep(0.5)  # never heard from the host: nothing to time out
        first = node.lost_host.is_set()
        node._on_message("h", "reply", encode_control(Heartbeat()))
        node.loading = True
        await asyncio.sleep(0.5)
        second = node.lost_host.is_set()
        await node.stop()
        return first, second
    assert asyncio.run(go()) == (False, False)


def test_a_peer_lost_before_the_plan_is_a_one_line_join_error():
    async def go():
        wire = Wire()
        mux = _Mux(wire)
        wire.lost_handler("h", "connection failed")
        from runtime.control import Plan
        await _next_control(mux, (Plan,), time.monotonic() + 5, "the host's plan", ["h"])
    with pytest.raises(JoinError) as e:
        asyncio.run(go())
    assert e.value.status == 3 and "lost h while waiting for the host's plan" in str(e.value)
    assert "\n" not in str(e.value)
