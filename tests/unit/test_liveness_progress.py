"""A re-dealt device whose copy still progresses is not dealt out at the load window
(planner/liveness.py, times passed in, no clock; and the model host Node's wiring of
runtime.control.Progress into it, its clock replaced by a list).

The runtime's values: a beat every 0.25 s, lost after 1 s of silence, a 10 s grace, a
30 s load window, four timeouts (4 s) of silence while loading, ten timeouts (10 s)
without a new percent. The case seen on a loaded machine: the host lost w1 and re-dealt
at 1.25; w2 took the re-deal and copies 141.6 MB of layers from the host at 4.6 MB/s
(30.78 s; one whole percent each 1.416 MB / 4.6 MB/s = 0.3078 s), so the copy ends at
1.25 + 30.78 = 32.03 s, past the load window's end at 1.25 + 30 = 31.25. w2's
heartbeats leave at 1.4 + 0.25 j (its own phase), the host's timer ticks at 1.5 + 0.25 k."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import runtime.room
from planner.liveness import LOADING, LOADING_SILENT, STALLED, Liveness
from runtime.control import NodeConfig, Progress, encode_control
from runtime.room import Node

PERCENT_S = 141.6 / 100 / 4.6  # 0.3078 s per whole percent at 4.6 MB/s
REDEAL_S = 1.25


def redealt(**kw) -> Liveness:
    """The host's timers after w1's loss and the re-deal at 1.25, which w2 answered."""
    live = Liveness(["w1", "w2"], beat_s=0.25, timeout_s=1.0, grace_s=10.0, load_timeout_s=30.0, **kw)
    live.heard("w1", 0.0)
    live.heard("w2", 1.0)
    live.forget("w1", 1.25)
    live.replanned(REDEAL_S, answers=True)
    live.answered("w2")
    return live


def run(live: Liveness, messages, until_s: float, spared=("w2",), from_s: float = 1.5):
    """Tick every 0.25 s from ``from_s`` to ``until_s``; ``messages``: ``[(t, percent or None)]``
    that arrive from w2 (None: a heartbeat), each fed before the first tick at or after
    it. Returns ``[(tick, peer, rule)]`` of the losses (forgotten as the Node does)."""
    todo = sorted(messages, key=lambda m: m[0])
    out, i, k = [], 0, 0
    while from_s + 0.25 * k <= until_s:
        t = from_s + 0.25 * k
        while i < len(todo) and todo[i][0] <= t:
            at, percent = todo[i]
            live.heard("w2", at)
            if percent is not None:
                live.progressed("w2", percent, at)
            i += 1
        for p, _, rule in live.handle_timer(t, spared).lost:
            out.append((t, p, rule))
            live.forget(p)
        k += 1
    return out


def beats(first_s: float, last_s: float, arrives=lambda t: t):
    """w2's heartbeats from 1.4 + 0.25 j within ``[first_s, last_s]``, at their arrival times."""
    return [(arrives(1.4 + 0.25 * j), None) for j in range(400) if first_s <= 1.4 + 0.25 * j <= last_s]


def percents(first: int, last: int, arrives=lambda t: t):
    """The copy's whole percents ``first``..``last`` (at 4.6 MB/s), at their arrival times."""
    return [(arrives(REDEAL_S + p * PERCENT_S), p) for p in range(first, last + 1)]


def starved(t: float) -> float:
    """w2's event loop, starved by the copy, sends nothing from 30.65 to 31.8: what it
    sent meanwhile arrives at 31.8."""
    return 31.8 if 30.65 < t < 31.8 else t


def test_a_copy_that_goes_on_past_the_load_window_is_not_dealt_out_for_a_late_heartbeat():
    live = redealt()
    got = run(live, beats(1.4, 32.5, starved) + percents(1, 100, starved), until_s=32.5)
    # at 31.75 (past 31.25) w2 is 1.1 s silent (last heard: its heartbeat at 30.65); its
    # latest percent (95, at 1.25 + 95 x 0.3078 = 30.49) came 1.26 s before: spared
    # (the rule before: lost at 31.75, LOADING)
    assert got == []
    live.loaded("w2")  # its Ready at 32.5: copied (100 % at 32.03) and its stage built
    assert run(live, beats(32.5, 45.0), until_s=45.0, spared=(), from_s=32.75) == []


def test_a_copy_that_stops_is_lost_at_its_first_silence_ten_timeouts_after_its_last_percent():
    live = redealt()
    # the copy reaches 50 % at 1.25 + 50 x 0.3078 = 16.64 and stops; heartbeats go on to
    # 30.9, then w2 freezes. Silent past 1 s from the tick at 32.0 (1.1 s), past the
    # window, its last percent 15.4 s before (> 10 s): lost
    assert run(live, beats(1.4, 30.9) + percents(1, 50), until_s=40.0) == [(32.0, "w2", STALLED)]


def test_a_slow_copy_is_spared_while_it_progresses_and_lost_once_it_stops():
    live = redealt()
    # one percent each 9.5 s: at 10.75, 20.25, 29.75, 39.25, then it stops. Heartbeats to
    # 40.15, a 1.5 s gap, heartbeats 41.65 to 52.15, then w2 freezes.
    hb = beats(1.4, 40.15) + beats(41.65, 52.15)
    pc = [(REDEAL_S + 9.5 * p, p) for p in range(1, 5)]
    # at 41.25 w2 is 1.1 s silent, past the window, 2.0 s after its latest percent: spared
    # (the rule before: lost at 41.25, LOADING). At 53.25 it is 1.1 s silent, 14 s after
    # its latest percent: lost
    assert run(live, hb + pc, until_s=60.0) == [(53.25, "w2", STALLED)]


def test_a_progressing_copy_whose_device_dies_is_lost_four_timeouts_after_it_was_last_heard():
    live = redealt()
    # no starved gap; w2 dies after its heartbeat at 30.9 (its last percent: 96, at
    # 1.25 + 96 x 0.3078 = 30.80). Past the window from the tick at 32.0 (1.1 s silent):
    # spared by the percent 1.2 s before; more than 4 s silent from the tick at 35.0 (4.1 s)
    got = run(live, beats(1.4, 30.9) + percents(1, 96), until_s=40.0)
    assert got == [(35.0, "w2", LOADING_SILENT)]


def test_the_same_percent_again_is_no_progress_and_a_lower_one_is_a_new_copy():
    live = redealt()
    live.progressed("w2", 40, 10.0)
    live.progressed("w2", 40, 25.0)  # nothing arrived since 10.0
    live.heard("w2", 31.0)
    # 1.25 s silent at 32.25, past the window; 22.25 s since the percent changed: lost
    assert live.handle_timer(32.25, {"w2"}).lost == (("w2", 1.25, STALLED),)
    live = redealt()
    live.progressed("w2", 40, 10.0)
    live.progressed("w2", 3, 25.0)  # its copy failed and began again: bytes arrived at 25.0
    live.heard("w2", 31.0)
    assert live.handle_timer(32.25, {"w2"}).lost == ()  # 7.25 s since the percent changed


def test_a_re_deal_forgets_the_progress_of_the_copies_before_it():
    live = redealt(stall_s=60.0)
    live.progressed("w2", 80, 30.0)
    live.replanned(31.0, answers=True)  # a second re-deal: w2 loads again, from its disk (no percent)
    live.heard("w2", 60.0)
    # 1.25 s silent at 61.25, past the second window (31 + 30); the percent at 30.0 would
    # spare it (31.25 s before, within 60 s): forgotten, so lost as loading
    assert live.handle_timer(61.25, {"w2"}).lost == (("w2", 1.25, LOADING),)


def test_the_host_node_counts_a_progress_message_as_its_copy_progressing(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(runtime.room, "time", SimpleNamespace(monotonic=lambda: now[0]))
    cfg = NodeConfig(device="h", host="h", stages=[["h", 0, 15], ["w", 15, 30]], scheduler={"hidden": 576},
                     model_dir="/nonexistent", peers=["w"], heartbeat_s=0.25, heartbeat_timeout_s=1.0)
    host = Node(cfg, None, SimpleNamespace(set_handler=lambda fn: None))
    live = host.liveness
    live.heard("w", 1.0)
    live.replanned(REDEAL_S, answers=True)
    for t, msg in [(1.3, {"type": "loading", "first_lap": 5}), (30.49, encode_control(Progress(percent=95)))]:
        now[0] = t
        host._on_message("w", "reply", msg if isinstance(msg, bytes) else json.dumps(msg).encode())
    # w last heard at 30.49 (its 95 %): at 31.75, past the window (31.25), 1.26 s silent: spared
    # by that percent (the Node before: lost, LOADING)
    assert live.handle_timer(31.75, {"w"}).lost == ()
    (lost,) = live.handle_timer(34.75, {"w"}).lost  # more than four timeouts silent
    assert lost[0] == "w" and lost[1] == pytest.approx(4.26) and lost[2] == LOADING_SILENT
