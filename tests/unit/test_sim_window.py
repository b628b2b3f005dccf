"""Slow start on a simulated link: extra round trips for frames larger than the window,
computed by hand."""

import simpy

from planner.room import Jitter, Network
from sim.link import Link, Uplinks, resolve_link


def link(window=11600.0, rtt=0.080, burst=None):
    env = simpy.Environment()
    net = Network(rtt_s=rtt, jitter=Jitter(), bandwidth_Bps=1e15, hop_overhead_s=0.0, window_bytes=window,
                  burst_bytes=burst)
    import numpy as np
    return env, Link(env, "a", "b", resolve_link(net, "a", "b"), Uplinks(env), np.random.default_rng(0))


def test_a_frame_within_the_window_pays_half_a_round_trip():
    env, ln = link()
    assert abs(ln.schedule(2336) - 0.040) < 1e-9


def test_a_70_kb_frame_needs_two_more_round_trips_then_the_window_has_grown():
    env, ln = link()
    # 70,000 B is 61 chunks of 1160 B: 10 in the first flight; each of their 10
    # acknowledgements arrives with the window full, grows it a chunk and sends two (20);
    # then 20 in flight, and the 31 left go out on the next 16 acknowledgements: 2 extra RTTs,
    # the window 36 chunks
    assert abs(ln.schedule(70_000) - (0.040 + 2 * 0.080)) < 1e-9
    # from 36 chunks, the 25 left go on the first 13 acknowledgements: 1 extra RTT,
    # and the ordered link delivers it no earlier than the first
    t2 = ln.schedule(70_000)
    assert abs(t2 - max(0.040 + 0.080, 0.200)) < 1e-9


def test_the_window_stays_grown_after_60_s_idle():
    # aiortc 1.16 shrinks its window only on a loss or a retransmission timeout, not after
    # idle time: the first 70 KB frame grows the window to 36 chunks (above); 60 s later the
    # next 70 KB frame needs 1 extra RTT, not 2
    env, ln = link()
    ln.schedule(70_000)
    env.run(until=60.0)
    assert abs(ln.schedule(70_000) - (60.0 + 0.040 + 0.080)) < 1e-9


def test_no_window_no_extra_round_trips():
    env, ln = link(window=None)
    assert abs(ln.schedule(1_000_000) - 0.040) < 1e-9


def test_a_burst_cap_costs_a_frame_above_it_one_round_trip_however_large_the_window():
    # the tuned SCTP sender: 32 chunks x 1160 B = 37,120 B a burst; a 5-token verify frame of
    # the Llama-3B shape is 61,472 B (5 x 3072 x 4 + 32 header bytes)
    env, ln = link(window=131072.0, rtt=0.040, burst=37120.0)
    # first flight min(128 KiB, 37,120 B) < 61,472 B; the window (never full) takes the rest
    # on the first acknowledgement: 1 extra RTT
    assert abs(ln.schedule(61_472) - (0.020 + 0.040)) < 1e-9
    # a one-token frame (12,320 B) fits one burst: half a round trip only; the ordered link
    # delivers it no earlier than the frame before
    assert abs(ln.schedule(12_320) - 0.060) < 1e-9
    # the same window without the cap: no extra round trip
    env2, ln2 = link(window=131072.0, rtt=0.040)
    assert abs(ln2.schedule(61_472) - 0.020) < 1e-9


def test_below_the_window_the_burst_cap_changes_nothing():
    # window 11.6 KB < burst 37,120 B: the 70 KB frame still needs 2 extra RTTs (as above)
    env, ln = link(burst=37120.0)
    assert abs(ln.schedule(70_000) - (0.040 + 2 * 0.080)) < 1e-9


def test_a_burst_cap_that_is_not_positive_is_refused():
    import pytest
    with pytest.raises(ValueError, match="burst"):
        resolve_link(Network(window_bytes=11600.0, burst_bytes=0.0), "a", "b")


def test_the_window_grows_as_aiortc_grew_it_frame_by_frame():
    """sctp_frame_rounds against aiortc 1.16 itself: two peers in one process, 40 ms of
    in-process delay each way, tuned SCTP (initial window 10 chunks, bursts of 32), one
    frame every 250 ms; the sender's ``_cwnd`` read after each (2026-12-03, this VM):
    20,802 B frames: one extra round trip on each of 4 frames (126-138 ms against 44-47),
    the window 10 -> 14 -> 16 -> 17 -> 18 chunks, then none; then 36,898 B frames:
    18 -> 25 -> 29 -> 31 -> 32, one round each, then none."""
    from sim.link import sctp_frame_rounds
    seen = []
    cwnd = 11600.0
    for size in [20_802] * 5 + [36_898] * 5:
        r, cwnd = sctp_frame_rounds(size, cwnd, 37120.0)
        seen.append((r, round(cwnd / 1160)))
    assert seen == [(1, 14), (1, 16), (1, 17), (1, 18), (0, 18), (1, 25), (1, 29), (1, 31), (1, 32), (0, 32)]


def test_frames_sent_before_the_last_ones_acknowledgements_keep_the_window_full():
    """Pipelined prefill chunks: a frame that leaves while the previous frame's
    acknowledgements are still out finds the window full on every acknowledgement, so
    the window grows a chunk for each (a doubling a round trip). By hand, 36,896 B frames
    (32 chunks) at 80 ms: the first, alone, 10 -> 21 chunks in 2 extra round trips; the
    second, 10 ms later, pays 1 and grows by all its 32 acknowledgements to 53; the third,
    10 ms later, fits. A fourth after 1 s of idle fits too: delivered at 1.04 s. (Each
    frame alone would leave 21 -> 27 -> 30 chunks, and the fourth would pay a round trip.)"""
    env, ln = link()
    assert abs(ln.schedule(36_896, 0.0) - (0.040 + 2 * 0.080)) < 1e-9
    ln.schedule(36_896, 0.010)
    ln.schedule(36_896, 0.020)
    assert abs(ln.schedule(36_896, 1.0) - 1.040) < 1e-9
