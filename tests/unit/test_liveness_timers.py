"""planner.liveness without asyncio or a clock: the times are passed in, as aioquic's
timer tests do (next deadline, then handle_timer at that time)."""

from __future__ import annotations

from planner.liveness import LOADING, SILENT, Liveness, Tick


def make(**kw) -> Liveness:
    args = dict(peers=("h", "w2"), beat_s=0.5, timeout_s=2.0, grace_s=10.0, load_timeout_s=30.0, now_s=100.0)
    args.update(kw)
    return Liveness(**args)


def test_heartbeats_every_beat_and_a_peer_never_heard_is_never_lost():
    live = make()
    assert live.next_deadline_s() == 100.5
    assert live.handle_timer(100.5) == Tick(lost=(), beat=("h", "w2"))
    assert live.next_deadline_s() == 101.0
    assert live.handle_timer(500.0) == Tick(lost=(), beat=("h", "w2"))  # never heard: no timeout to count
    live.start(600.0)  # the timers start again from then
    assert live.next_deadline_s() == 600.5


def test_a_peer_silent_past_the_timeout_is_lost_once_with_its_silence():
    live = make()
    live.heard("h", 101.0)
    assert live.handle_timer(103.0).lost == ()  # 2.0 s: not past the timeout
    tick = live.handle_timer(103.25)
    assert tick.lost == (("h", 2.25, SILENT),) and tick.beat == ("w2",)
    live.forget("h")
    assert live.handle_timer(110.0) == Tick(lost=(), beat=("w2",))


def test_loading_grace_and_the_devices_still_loading_spare_silence():
    live = make()
    live.heard("h", 100.0)
    live.heard("w2", 100.0)
    live.loading = True
    assert live.handle_timer(105.0).lost == ()
    live.loading = False
    live.replanned(105.0)  # grace until 115, the loading devices spared until 135
    assert live.handle_timer(114.9).lost == ()
    tick = live.handle_timer(115.0, spared={"w2"})
    assert tick.lost == (("h", 15.0, SILENT),) and tick.beat == ("w2",)
    live.forget("h")
    assert live.handle_timer(135.0, spared={"w2"}).lost == (("w2", 35.0, LOADING),)


def test_refresh_counts_silence_again_only_for_peers_heard():
    live = make()
    live.heard("h", 100.0)
    live.refresh("w2", 120.0)  # never heard: still not timed
    live.refresh_all(120.0)
    assert live.last_heard == {"h": 120.0}
    assert live.handle_timer(121.0).lost == ()


def test_no_timers_without_a_beat_and_no_loss_without_a_timeout():
    assert make(beat_s=0).next_deadline_s() is None
    live = make(timeout_s=0)
    live.heard("h", 0.0)
    assert live.handle_timer(1e6).lost == ()
