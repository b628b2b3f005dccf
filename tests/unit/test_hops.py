"""Hop time per link (planner/hops.py): NTP's on-wire offset and delay worked by hand,
the least-delay filter, the host's pairing of two devices' stamps on their own clocks,
and the real Node's heartbeats and stamps with its stamp clock passed in (no wall clock
is read by an assertion). Bad stamps, heartbeats and progress messages to a host Node:
refused or ignored, never an exception, memory bounded."""

from __future__ import annotations

import asyncio
import json
import math
import random

import numpy as np
import pytest

from planner.frames import FrameHeader, FrameKind
from planner.hops import CLOCK_SAMPLES, HopMeter, HopTimed, PeerClock, StageTimed, exchange
from planner.protocol import SendFrame
from runtime.codec import encode_frame
from runtime.control import ControlError, NodeConfig, Progress, encode_control, parse_control
from runtime.room import Node


def test_ntp_offset_and_delay_by_hand():
    # the worker's clock runs 5 s ahead of the host's; 3 ms out, 1 ms back, held 0.2 s.
    # Host sends at T1 = 100.000; worker hears at 100.003 + 5 = 105.003; sends at 105.203;
    # host hears at 100.203 + 0.001 = 100.204.
    offset, delay = exchange(100.000, 105.003, 105.203, 100.204)
    # ((105.003 - 100.000) + (105.203 - 100.204)) / 2 = (5.003 + 4.999) / 2
    assert offset == pytest.approx(5.001, abs=1e-9)
    assert delay == pytest.approx(0.004, abs=1e-9)  # 0.204 - 0.2
    # the asymmetry bound: the true 5 s offset is within half the delay
    assert abs(offset - 5.0) <= delay / 2 + 1e-12


def _clock(offset_s: float, one_way_s: float, t1_s: float = 0.0, held_s: float = 0.1) -> PeerClock:
    """A PeerClock fed one symmetric exchange: offset exact, error one_way_s."""
    c = PeerClock()
    t2 = t1_s + one_way_s + offset_s
    assert c.heard(t2 + held_s, t1_s, held_s, t1_s + 2 * one_way_s + held_s)
    return c


def test_the_least_delay_exchange_of_the_last_eight_gives_the_offset():
    c = PeerClock()
    # (sent_s, echo_s, held_s, now_s): offsets / delays worked out by hand
    assert c.heard(10.0 + 5.0 + 0.001 + 0.1, 10.0, 0.1, 10.0 + 0.101 + 0.009)  # 1 ms out, 9 ms back
    # offset ((5.001) + (15.101 - 10.11)) / 2 = (5.001 + 4.991) / 2 = 4.996; delay 0.010
    assert c.best() == pytest.approx((4.996, 0.005))
    assert c.heard(20.0 + 5.0 + 0.002 + 0.1, 20.0, 0.1, 20.0 + 0.102 + 0.002)  # 2 ms each way
    assert c.best() == pytest.approx((5.0, 0.002))  # delay 4 ms beats 10 ms
    for i in range(CLOCK_SAMPLES - 1):  # 7 worse ones: the 4 ms one is still among the last 8
        assert c.heard(30.0 + i + 5.0 + 0.02 + 0.1, 30.0 + i, 0.1, 30.0 + i + 0.12 + 0.02)
    assert c.best() == pytest.approx((5.0, 0.002))
    assert c.heard(50.0 + 5.0 + 0.02 + 0.1, 50.0, 0.1, 50.0 + 0.12 + 0.02)  # the 4 ms one leaves
    assert c.best() == pytest.approx((5.0, 0.02))
    # exchanges that cannot be: kept nowhere
    for bad in [(math.nan, 1.0, 0.1, 2.0), (5.0, math.inf, 0.1, 2.0), (5.0, 1.0, -0.1, 2.0),
                (5.0, 3.0, 0.1, 2.0),  # an echo of a heartbeat sent after now
                (5.0, 1.0, 5.0, 2.0)]:  # held longer than the round trip: negative delay
        assert not c.heard(*bad)
    assert c.best() == pytest.approx((5.0, 0.02))


def test_the_host_pairs_stamps_on_three_clocks_into_hops_per_link():
    # w1's clock is 5 s ahead of the host's, w2's 3 s behind; each clock known within 1 ms / 2 ms
    clocks = {"w1": _clock(5.0, 0.001), "w2": _clock(-3.0, 0.002)}
    m = HopMeter("h", clocks)
    got = []
    # lap 7: h sends at 10.000 (h); w1 has it at 10.004 h = 15.004 (w1); w1 sends at
    # 10.030 h = 15.030 (w1); w2 has it at 10.036 h = 7.036 (w2); w2 sends at 10.050 h =
    # 7.050 (w2); h has it at 10.052.  Stamps come in any order (a worker's with its beat).
    for r in (m.arrived("h", "w1", 7, 15.004), m.sent("w1", "w2", 7, 15.030), m.arrived("w2", "h", 7, 10.052),
              m.sent("h", "w1", 7, 10.000), m.arrived("w1", "w2", 7, 7.036), m.sent("w2", "h", 7, 7.050)):
        if r is not None:
            got.append(r)
    by_link = {(r.src, r.dst): r for r in got}
    assert set(by_link) == {("h", "w1"), ("w1", "w2"), ("w2", "h")}
    assert by_link["h", "w1"].seconds == pytest.approx(0.004, abs=1e-9)
    assert by_link["w1", "w2"].seconds == pytest.approx(0.006, abs=1e-9)
    assert by_link["w2", "h"].seconds == pytest.approx(0.002, abs=1e-9)
    # the error bound: each end's half delay (host 0)
    assert [by_link[k].error_s for k in (("h", "w1"), ("w1", "w2"), ("w2", "h"))] == pytest.approx([0.001, 0.003, 0.002])
    assert all(r.lap_id == 7 for r in got) and m.pending == 0
    # each worker's own two stamps of the lap, on its own clock: 15.030 - 15.004 and 7.050 - 7.036
    assert m.take_stages() == [StageTimed("w1", 7, pytest.approx(0.026)), StageTimed("w2", 7, pytest.approx(0.014))]
    assert m.take_stages() == []


def test_a_lap_at_a_worker_is_timed_once_from_its_first_arrival_and_memory_is_bounded():
    m = HopMeter("h", {}, max_pending=4)
    m.arrived("h", "w1", 5, 1.0)
    m.sent("w1", "w2", 5, 1.5)  # the lap at w1: 0.5 s
    m.arrived("w2", "w1", 5, 2.0)  # its frame coming back (return via the stages) and passed on
    m.sent("w1", "h", 5, 2.01)
    m.sent("w2", "h", 6, 3.0)  # a send with no arrival stamp at w2: nothing to time
    m.sent("h", "w1", 6, 3.0)  # the host's own stamps time no stage
    m.arrived("w1", "h", 6, 3.5)
    assert m.take_stages() == [StageTimed("w1", 5, pytest.approx(0.5))]
    m.arrived("h", "w1", 7, 2.0)
    m.sent("w1", "h", 7, 1.0)  # a send before its arrival (a lying clock): not a time
    for lap in range(10, 20):  # arrivals whose sends never come: only the latest 4 kept
        m.arrived("h", "w1", lap, float(lap))
    m.sent("w1", "h", 10, 30.0)
    m.sent("w1", "h", 19, 19.25)
    assert m.take_stages() == [StageTimed("w1", 19, pytest.approx(0.25))] and len(m._held) <= 4


def test_a_stamp_without_a_known_clock_is_not_paired_and_memory_is_bounded():
    m = HopMeter("h", {}, max_pending=4)
    assert m.sent("h", "w9", 1, 1.0) is None
    assert m.arrived("h", "w9", 1, 2.0) is None  # w9's offset is not known yet
    assert m.unclocked == 1 and m.pending == 0
    for lap in range(10):
        m.sent("h", "w1", lap, float(lap))
    assert m.pending == 4  # the 6 oldest let go
    m.clocks["w1"] = _clock(0.0, 0.0005)
    assert m.arrived("h", "w1", 0, 0.5) is None  # lap 0's send stamp was let go
    hop = m.arrived("h", "w1", 9, 9.25)
    assert hop == HopTimed("h", "w1", 9, pytest.approx(0.25), pytest.approx(0.0005))
    # a second send stamp of the same hop: the first counts
    m.sent("h", "w1", 20, 1.0)
    m.sent("h", "w1", 20, 1.5)
    assert m.arrived("h", "w1", 20, 2.0).seconds == pytest.approx(1.0)


# -- the real Node: its heartbeats and stamps, its stamp clock passed in -------------------


class Wire:
    def __init__(self):
        self.sent = []
        self.handler = None

    def set_handler(self, fn):
        self.handler = fn

    async def send(self, dst, channel, data):
        self.sent.append((dst, channel, bytes(data)))


STAGES = [["h", 0, 15], ["w", 15, 30]]


def _node(device: str, clock: list, peers=None) -> tuple[Node, Wire]:
    cfg = NodeConfig(device=device, host="h", stages=STAGES, scheduler={"hidden": 576}, model_dir="/nonexistent",
                     peers=peers or (["w"] if device == "h" else ["h"]), heartbeat_s=0.25)
    wire = Wire()
    return Node(cfg, None, wire, stamp_clock=lambda: clock[0]), wire


def test_two_nodes_heartbeats_and_stamps_give_the_hops_by_hand():
    # w's clock is 5 s ahead of h's; the wire takes 1 ms each way for heartbeats, the
    # frame 4 ms out and 3 ms back; every time is set by hand
    hc, wc = [100.0], [0.0]
    host, hwire = _node("h", hc)
    work, wwire = _node("w", wc)
    hops, stages = [], []
    host.observers.append(lambda o: hops.append(o) if type(o) is HopTimed else None)
    host.observers.append(lambda o: stages.append(o) if type(o) is StageTimed else None)

    async def go():
        # host beats at 100.000; w hears it at 105.001, beats back at 105.101; h hears at 100.102
        for m in host._beat_for("w"):
            wc[0] = 105.001
            work._on_message("h", "reply", m)
        wc[0] = 105.101
        beats = work._beat_for("h")
        assert json.loads(beats[0]) == {"type": "heartbeat", "sent_s": 105.101, "echo_s": 100.0,
                                        "held_s": pytest.approx(0.1)}
        assert len(beats) == 1  # no stamps yet
        hc[0] = 100.102
        forged = {"type": "heartbeat", "sent_s": 105.101, "echo_s": 100.1, "held_s": 0.0}  # echoes no beat h sent
        host._on_message("w", "reply", json.dumps(forged).encode())
        assert "w" not in host.clocks
        host._on_message("w", "reply", beats[0])
        assert host.clocks["w"].best() == pytest.approx((5.0, 0.001))
        # lap 3: h sends at 200.000, w has it at 205.004, sends its result at 205.020, h has it at 200.023
        x = np.zeros((1, 576), np.float32)
        out = FrameHeader(FrameKind.DECODE, 0, 3, 0, 1, 576, returns=True)
        hc[0] = 200.0
        host.residual[3] = x
        host.send_frame(SendFrame("h", "w", out))
        await asyncio.sleep(0)
        (dst, ch, data), = [s for s in hwire.sent if s[1] == "residual"]
        wc[0] = 205.004
        work._on_message("h", ch, data)
        wc[0] = 205.020
        work.residual[3] = x
        work.send_frame(SendFrame("w", "h", out.with_kind(FrameKind.RESULT)))
        await asyncio.sleep(0)
        (dst, ch, data), = [s for s in wwire.sent if s[1] == "residual"]
        hc[0] = 200.023
        host._on_message("w", ch, data)
        assert hops == []  # w's stamps have not come yet
        wc[0] = 205.25
        beat, stamps = work._beat_for("h")
        assert json.loads(stamps) == {"type": "stamps", "arrived": [[3, "h", 205.004]], "sent": [[3, "h", 205.02]]}
        hc[0] = 200.3
        for m in (beat, stamps):
            host._on_message("w", "reply", m)
        assert work._beat_for("h")[1:] == []  # sent once
    asyncio.run(go())
    by_link = {(h.src, h.dst): h for h in hops}
    assert set(by_link) == {("h", "w"), ("w", "h")}
    assert by_link["h", "w"].seconds == pytest.approx(0.004, abs=1e-6)
    assert by_link["w", "h"].seconds == pytest.approx(0.003, abs=1e-6)
    assert by_link["h", "w"].error_s == pytest.approx(0.001, abs=1e-9)
    assert stages == [StageTimed("w", 3, pytest.approx(0.016, abs=1e-6))]  # 205.020 - 205.004, w's own clock


def test_stamps_and_progress_from_outside_the_chain_are_not_kept():
    hc = [10.0]
    host, _ = _node("h", hc, peers=["w", "g"])  # g: a peer with no layers
    host.clocks["w"] = _clock(0.0, 0.001)
    host.clocks["g"] = _clock(0.0, 0.001)
    seen = []
    host.observers.append(seen.append)
    host.hops.sent("h", "w", 1, 9.0)
    for src, msg in [("g", {"type": "stamps", "arrived": [[1, "h", 9.5]]}),       # g holds no layers
                     ("w", {"type": "stamps", "arrived": [[1, "zz", 9.5]]}),      # names a device not in the chain
                     ("w", {"type": "stamps", "arrived": [[1, "w", 9.5]]}),       # names itself
                     ("x", {"type": "progress", "percent": 50})]:                 # not a peer
        host._on_message(src, "reply", json.dumps(msg).encode())
    assert host.progress == {} and not [o for o in seen if type(o) in (HopTimed, Progress)]
    host._on_message("w", "reply", encode_control(Progress(percent=40)))
    assert host.progress == {"w": 40}


@pytest.mark.parametrize("msg", [
    {"type": "heartbeat", "sent_s": -1.0},
    {"type": "heartbeat", "sent_s": "NaN"},
    {"type": "heartbeat", "sent_s": 1e300},
    {"type": "heartbeat", "sent_s": 1.0, "held_s": -0.5},
    {"type": "heartbeat", "sent_s": "soon"},
    {"type": "heartbeat", "sent_s": 1.0, "extra": 1},
    {"type": "stamps", "arrived": [[-1, "h", 1.0]]},
    {"type": "stamps", "arrived": [[1 << 32, "h", 1.0]]},
    {"type": "stamps", "arrived": [[1, "", 1.0]]},
    {"type": "stamps", "arrived": [[1, "x" * 65, 1.0]]},
    {"type": "stamps", "sent": [[1, "h"]]},
    {"type": "stamps", "sent": [[1, "h", 1.0]] * 129},
    {"type": "stamps", "sent": "all of them"},
    {"type": "progress", "percent": 101},
    {"type": "progress", "percent": -1},
    {"type": "progress", "percent": 50.5},
    {"type": "progress"},
])
def test_bad_stamps_heartbeats_and_progress_are_one_line_errors(msg):
    with pytest.raises(ControlError) as e:
        parse_control(json.dumps(msg).encode())
    assert "\n" not in str(e.value) and str(e.value).startswith("bad control message")


def test_hostile_control_messages_to_a_host_node_never_raise_and_memory_stays_bounded():
    """Random mutations of valid heartbeats, stamps and progress (fixed seed), fed to a
    host Node as its worker's: every one is taken, ignored or refused in one log line."""
    rng = random.Random(20261201)
    hc = [1000.0]
    host, _ = _node("h", hc)
    valid = [{"type": "heartbeat", "sent_s": 5.0, "echo_s": 999.9, "held_s": 0.1},
             {"type": "stamps", "arrived": [[1, "h", 5.0]], "sent": [[1, "h", 5.01]]},
             {"type": "progress", "percent": 30}]
    values = [None, -1, 0, 1, 2 ** 32, 2 ** 64, 1e308, -1e308, "h", "w", "", "x" * 100, [], {}, [1, "h", 1.0],
              True, 0.5, "NaN"]
    taken = 0  # mutants that are still valid messages (odd values the host must judge itself)
    for i in range(3000):
        m = json.loads(json.dumps(rng.choice(valid)))
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(list(m) + ["held_s", "arrived", "extra"])
            if key == "type" and rng.random() < 0.7:
                continue
            m[key] = rng.choice(values) if key not in ("arrived", "sent") or rng.random() < 0.5 else \
                [[rng.choice([0, 1, 2, 2 ** 31]), rng.choice(["h", "w", "q"]), rng.uniform(-1, 1e4)]
                 for _ in range(rng.randint(0, 200))]
        hc[0] += 0.01
        data = json.dumps(m).encode()
        try:
            parse_control(data)
            taken += 1
        except ControlError:
            pass
        host._on_message("w", "reply", data)
        host._on_message("w", "reply", bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
    assert taken > 300, taken
    assert len(host.clocks) <= 1 and len(host.clocks.get("w", PeerClock())._samples) <= CLOCK_SAMPLES
    assert host.hops.pending <= 2 * host.hops.max_pending
    assert set(host.progress) <= {"w"} and 0 <= host.progress.get("w", 0) <= 100


def test_a_heartbeat_held_past_a_minute_is_not_echoed():
    from runtime.room import ECHO_HELD_MAX_S
    wc = [10.0]
    work, _ = _node("w", wc)
    work._on_message("h", "reply", json.dumps({"type": "heartbeat", "sent_s": 3.0}).encode())
    wc[0] = 10.0 + ECHO_HELD_MAX_S
    assert json.loads(work._beat_for("h")[0])["echo_s"] == 3.0
    wc[0] = 10.0 + ECHO_HELD_MAX_S + 0.5
    assert json.loads(work._beat_for("h")[0]) == {"type": "heartbeat", "sent_s": 70.5, "echo_s": None, "held_s": None}


def test_a_device_that_says_ready_is_loaded_whatever_its_last_percent():
    # a re-dealt worker's copy over the weights channel failed at 40% and it read the
    # layers from its own disk: its Ready says it is done, and its screen is no longer "Loading 40%"
    hc = [1.0]
    host, _ = _node("h", hc)
    seen = []
    host.observers.append(seen.append)
    host._on_message("w", "reply", encode_control(Progress(percent=40)))
    assert host.progress == {"w": 40}
    host._on_message("w", "reply", json.dumps({"type": "ready", "first_lap": 5}).encode())
    assert host.progress == {} and [o.percent for o in seen if type(o) is Progress] == [40, 100]
