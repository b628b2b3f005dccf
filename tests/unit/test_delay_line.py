"""runtime/testbed/delay.py: the in-process one-way delay, on an injected clock (no waiting).

Due times are checked against hand arithmetic (push time + delay), order and counts against
the pushes; nothing here reads a real clock."""

from __future__ import annotations

import pytest

from runtime.testbed.delay import MAX_SAMPLES, DelayLine, DelayStats


class FakeLoop:
    """A clock and a timer list; ``advance(t)`` moves the clock to ``t`` and runs every
    timer due by then, earliest first."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[list] = []  # [when, fn, cancelled]
        self.scheduled = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn):
        self.scheduled += 1
        t = [when, fn, False]
        self.timers.append(t)

        class Handle:
            def cancel(self_inner) -> None:
                t[2] = True
        return Handle()

    def live(self) -> int:
        return sum(1 for t in self.timers if not t[2])

    def advance(self, to: float) -> None:
        while True:
            due = sorted((t for t in self.timers if not t[2] and t[0] <= to), key=lambda t: t[0])
            if not due:
                break
            t = due[0]
            self.timers.remove(t)
            self.now = t[0]
            t[1]()
        self.now = to


def two_pushes(dl, loop, first: float, second: float, names=("x", "y")) -> None:
    """Push ``names`` at clock times ``first`` and ``second``."""
    for t, p in zip((first, second), names):
        loop.now = t
        dl.push(p)


def line(delay: float, **kw):
    loop = FakeLoop()
    out: list[tuple[object, float, float]] = []  # (packet, due, delivered at)
    dl = DelayLine(delay, lambda p, due: out.append((p, due, loop.now)), loop.time, loop.call_at, **kw)
    return loop, dl, out


def test_each_packet_leaves_its_delay_after_it_was_pushed_in_push_order():
    loop, dl, out = line(0.020)
    for t, p in ((0.0, "a"), (0.001, "b"), (0.0015, "c")):
        loop.now = t
        dl.push(p)
    assert loop.live() == 1  # one timer for the head, not one per packet
    loop.advance(0.0199)
    assert out == []
    loop.advance(0.5)
    assert [p for p, _, _ in out] == ["a", "b", "c"]
    assert [due for _, due, _ in out] == pytest.approx([0.020, 0.021, 0.0215])  # by hand: push + 20 ms
    assert [at for _, _, at in out] == pytest.approx([0.020, 0.021, 0.0215])
    assert dl.held == 0 and loop.live() == 0
    assert loop.scheduled == 3  # the head's timer, then one for each next head


def test_packets_due_together_leave_in_one_firing_in_order():
    loop, dl, out = line(0.040)
    loop.now = 1.0
    for p in range(5):
        dl.push(p)  # same clock reading: same due time
    loop.advance(1.040)
    assert [p for p, _, _ in out] == [0, 1, 2, 3, 4]
    assert loop.scheduled == 1


def test_a_late_timer_releases_everything_overdue_at_once_keeping_the_due_times():
    loop, dl, out = line(0.010)
    two_pushes(dl, loop, 0.0, 0.002)
    # the loop was busy: the timer for 0.010 runs at 0.030
    t = next(t for t in loop.timers if not t[2])
    loop.timers.remove(t)
    loop.now = 0.030
    t[1]()
    assert [(p, due, at) for p, due, at in out] == [("x", pytest.approx(0.010), 0.030), ("y", pytest.approx(0.012), 0.030)]


def test_a_full_line_drops_and_counts_and_close_cuts_what_it_holds():
    loop, dl, out = line(0.020, max_held=2)
    assert dl.push(1) and dl.push(2)
    assert dl.push(3) is False
    assert dl.stats.dropped == 1 and dl.held == 2
    assert dl.close() == 2
    # the two held at close were in the air when the link went down: not drops of a full line
    assert dl.stats.dropped == 1 and dl.stats.cut_at_close == 2
    assert dl.push(4) is False and dl.stats.dropped == 1 and dl.stats.cut_at_close == 3
    loop.advance(1.0)
    assert out == [] and loop.live() == 0


def test_flush_sends_what_is_held_now_in_order_with_its_due_times():
    loop, dl, out = line(0.050)
    two_pushes(dl, loop, 0.0, 0.010, ("p", "q"))
    assert dl.flush() == 2
    assert [(p, due) for p, due, _ in out] == [("p", pytest.approx(0.050)), ("q", pytest.approx(0.060))]
    assert loop.live() == 0
    loop.advance(1.0)
    assert len(out) == 2


@pytest.mark.parametrize("bad", [0, -0.01, float("inf"), float("nan"), "20ms"])
def test_a_delay_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="one_way_s"):
        DelayLine(bad, lambda p, d: None, lambda: 0.0, lambda w, f: None)


def test_stats_nearest_rank_percentiles_by_hand():
    st = DelayStats()
    assert st.summary() == {"packets": 0, "dropped": 0, "cut_at_close": 0, "lateness_p50_s": None, "lateness_p99_s": None,
                            "lateness_max_s": None}
    for x in (0.004, 0.001, 0.003, -0.5, 0.002):  # a negative lateness counts as 0
        st.record(x)
    s = st.summary()
    # sorted: 0, 0.001, 0.002, 0.003, 0.004; p50 = ceil(0.5*5) = 3rd; p99 = ceil(0.99*5) = 5th
    assert s["packets"] == 5
    assert s["lateness_p50_s"] == 0.002
    assert s["lateness_p99_s"] == 0.004
    assert s["lateness_max_s"] == 0.004


def test_stats_memory_is_bounded_but_every_packet_is_counted():
    st = DelayStats()
    for _ in range(MAX_SAMPLES + 10):
        st.record(0.0)
    st.record(0.25)
    s = st.summary()
    assert s["packets"] == MAX_SAMPLES + 11
    assert s["lateness_max_s"] == 0.25  # over all packets
    assert s["lateness_p99_s"] == 0.0  # percentiles over the first MAX_SAMPLES
    assert len(st._samples) == MAX_SAMPLES
