"""A stall the real room's heartbeat rule notices is a loss in the simulator too
(planner.liveness.stall_loss, used by sim/driver.py): the worker is lost, the room
re-deals its layers and answers on; a stall too mild for the rule (home.yaml's 50 ms)
loses nothing.

By hand, for a heartbeat every 0.25 s and a 1 s timeout: the last heartbeat before a
stall that starts at S is sent at S - 0.25 and arrives one base delay d later; the next
(sent at S) arrives only after the stall's extra one-way delay, seconds later. The host's
timer ticks at S - 0.125 + k * 0.25, so the first tick past S - 0.25 + d + 1 (d < 0.125)
is S + 0.875: lost then, silent since S - 0.25 + d."""

from __future__ import annotations

import pytest

from planner.deal import deal
from planner.liveness import stall_loss
from sim.driver import Simulation
from splitroom.scenario import load


def test_the_heartbeat_rule_over_a_stall_by_hand():
    # base one-way delay 10 ms; inside [10, 17) 3.5 s more (a 7 s extra round trip)
    def delay(t):
        return 0.01 + (3.5 if 10.0 <= t < 17.0 else 0.0)
    assert stall_loss(10.0, 17.0, delay, 0.25, 1.0) == pytest.approx((10.875, 9.76))
    # 25 ms more one way (home.yaml's 50 ms round trip): every gap stays under 0.3 s
    assert stall_loss(10.0, 17.0, lambda t: 0.01 + (0.025 if 10.0 <= t < 17.0 else 0.0), 0.25, 1.0) is None
    # 0.4 s more one way: the gap is 0.25 + 0.4 = 0.65 s, under the timeout
    assert stall_loss(10.0, 17.0, lambda t: 0.01 + (0.4 if 10.0 <= t < 17.0 else 0.0), 0.25, 1.0) is None


ROOM = ["devices[0].lends=1 GB", "stages=[{device: desktop, layers: '1-20'}, {device: laptop, layers: '21-30'}]",
        "workload.questions=4", "workload.answer_tokens=512"]


def test_a_seven_second_stall_loses_the_worker_and_the_room_re_deals_as_the_real_one_does():
    scn = load("scenarios/home.yaml", ROOM + ["network.episodes={every: 20 s, lasting: 7 s, extra_rtt: 7 s}"])
    sim = Simulation(scn, deal(scn.devices, scn.model, scn.options))
    link = sim.links.get("laptop", "desktop")
    start, end = link.next_stall(0.0)
    assert end - start == pytest.approx(7.0)
    d = link.control_delay_s(0.0)
    assert d < 0.125
    res = sim.run()
    m = res.metrics
    assert m["answered"] == 4 and m["refused"] == 0
    (rec,) = m["recovery"]
    assert rec["device"] == "laptop"
    assert rec["detected_at_s"] == pytest.approx(start + 0.875)
    assert rec["lost_at_s"] == pytest.approx(start - 0.25 + d)
    lost = [o for _, o in res.trace if type(o).__name__ == "DeviceLost"]
    assert [o.reason for o in lost] == ["no heartbeat for 1.1 s"]  # 0.875 + 0.25 - d
    (redeal,) = [o for _, o in res.trace if type(o).__name__ == "Redeal"]
    assert redeal.stages == (("desktop", 0, 30),)  # the lost range to the stage before it


def test_a_mild_stall_loses_nothing():
    scn = load("scenarios/home.yaml", ROOM + ["network.episodes={every: 20 s, lasting: 7 s, extra_rtt: 50 ms}"])
    res = Simulation(scn, deal(scn.devices, scn.model, scn.options)).run()
    assert res.metrics["recovery"] == [] and res.metrics["answered"] == 4
    assert res.metrics["duration_s"] > 20.0  # the run met at least one stall


def test_a_stall_of_any_length_is_followed_for_a_bounded_number_of_beats():
    # the loss (or none) shows within the first timeout after the stall starts; a stall of
    # 1e9 s, or at times a beat no longer changes (1e300 s), must not be walked beat by beat
    calls = []

    def delay(t):
        calls.append(t)
        return 0.01 + (3.5 if t >= 10.0 else 0.0)
    assert stall_loss(10.0, 1e9, delay, 0.25, 1.0) == pytest.approx((10.875, 9.76))
    assert len(calls) <= 1 + 4 + 4 + 2  # the beat before, then ceil(1 / 0.25) + 4 (+2) at most
    calls.clear()
    assert stall_loss(10.0, 1e9, lambda t: 0.01 + (0.025 if t >= 10.0 else 0.0), 0.25, 1.0) is None
    # where adding a beat leaves the time as it was, no silence can be seen: it ends, None
    assert stall_loss(1e300, 2e300, lambda t: 0.01 + (5.0 if t >= 1e300 else 0.0), 0.25, 1.0) is None
