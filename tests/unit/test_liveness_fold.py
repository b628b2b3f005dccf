"""Two devices lost close together fold into one re-deal (planner/liveness.py, times
passed in, no clock): while the model host's re-deal is under way, only the peers that
answered it are spared by its grace and load windows; a peer that never answered is held
to the plain heartbeat rule, and its loss names that rule (UNANSWERED); so is a peer
that said Ready for the re-deal under way (READY). A peer that answered and is still
loading keeps sending heartbeats (it loads in a thread of its own): silent for more than
four timeouts it is lost (LOADING_SILENT), inside the windows.

The runtime's values: a beat every 0.25 s, lost after 1 s of silence, a 10 s grace and a
30 s load window. w1 falls silent at 0, w2 at 0.3 (both killed); w3 lives."""

from __future__ import annotations

from planner.liveness import LOADING, LOADING_SILENT, READY, SILENT, UNANSWERED, Liveness


def ticks(live: Liveness, times, spared=(), beating=()):
    """``[(time, [(peer, rule)])]`` for each tick at ``times``; losses forgotten as the Node does.
    ``beating``: peers heard just before each tick (a device loading still sends heartbeats)."""
    out = []
    for t in times:
        for p in beating:
            live.heard(p, t)
        lost = [(p, rule) for p, _, rule in live.handle_timer(t, spared).lost]
        for p, _ in lost:
            live.forget(p)
        out.append((t, lost))
    return out


def room() -> Liveness:
    live = Liveness(["w1", "w2", "w3"], beat_s=0.25, timeout_s=1.0, grace_s=10.0, load_timeout_s=30.0)
    for p in ("w1", "w2", "w3"):
        live.heard(p, 0.0)
    live.heard("w2", 0.3)
    for t in (0.25, 0.5, 0.75, 1.0):
        live.heard("w3", t)
    return live


def first_loss(live: Liveness) -> None:
    got = ticks(live, [0.25, 0.5, 0.75, 1.0, 1.25])
    assert [(t, lost) for t, lost in got if lost] == [(1.25, [("w1", SILENT)])]


def re_dealing(*answered: str) -> Liveness:
    """:func:`room` after w1's loss at 1.25 and the host's re-deal then (answers counted),
    which the peers ``answered`` took."""
    live = room()
    first_loss(live)
    live.replanned(1.25, answers=True)
    for p in answered:
        live.answered(p)
    return live


def test_a_second_device_dead_before_the_re_deal_is_lost_by_the_heartbeat_rule_not_after_the_windows():
    live = re_dealing("w3")  # the host re-deals w1's layers; w3 took it: it loads now, silent (heard last at 1.0)
    got = ticks(live, [1.5 + 0.25 * i for i in range(8)], spared={"w2", "w3"})  # to 3.25
    # w2, last heard at 0.3, is past the 1 s timeout at the first tick after 1.3; w3 is spared
    assert [(t, lost) for t, lost in got if lost] == [(1.5, [("w2", UNANSWERED)])]


def test_a_second_device_that_dies_during_the_re_deal_without_answering_it_is_lost_one_timeout_later():
    live = Liveness(["w1", "w2", "w3"], beat_s=0.25, timeout_s=1.0, grace_s=10.0, load_timeout_s=30.0)
    live.heard("w1", 0.0)
    live.heard("w3", 1.0)
    live.forget("w1")  # lost at 1.25
    live.replanned(1.25, answers=True)
    live.heard("w2", 1.3)  # a heartbeat already on its way when the re-deal began; then w2 dies
    live.answered("w3")
    got = ticks(live, [1.5 + 0.25 * i for i in range(8)], spared={"w2", "w3"})
    assert [(t, lost) for t, lost in got if lost] == [(2.5, [("w2", UNANSWERED)])]


def test_a_device_that_answered_is_spared_until_the_load_window_and_then_named_as_loading():
    live = re_dealing("w2", "w3")
    both = {"w2", "w3"}
    got = ticks(live, [1.5 + 0.25 * i for i in range(111)], spared=both, beating=both)  # to 29.0, both heard
    got += ticks(live, [29.25 + 0.25 * i for i in range(9)], spared=both, beating={"w2"})  # to 31.25
    # neither is lost while loading; w3, last heard at 29.0, is silent past the 1 s timeout
    # (and within four) when the load window (1.25 + 30) closes; w2 is heard
    assert [(t, lost) for t, lost in got if lost] == [(31.25, [("w3", LOADING)])]


def test_a_device_that_answered_and_died_while_loading_is_lost_four_timeouts_later_not_at_the_load_window():
    live = re_dealing("w2", "w3")
    live.heard("w2", 2.0)  # w2's last heartbeat while it loads; then w2 dies, still loading
    got = ticks(live, [1.5 + 0.25 * i for i in range(48)], spared={"w2", "w3"}, beating={"w3"})  # to 13.25
    # w2 last heard at 2.0: more than 4 x 1 s silent at the first tick after 6.0, in the 10 s grace
    assert [(t, lost) for t, lost in got if lost] == [(6.25, [("w2", LOADING_SILENT)])]


def test_an_answer_to_the_first_re_deal_still_spares_a_device_during_the_second():
    live = re_dealing("w3")
    assert ticks(live, [1.5], spared={"w2", "w3"}) == [(1.5, [("w2", UNANSWERED)])]
    live.replanned(1.5, answers=True)  # the second re-deal, without w2: w3 is still loading the first
    got = ticks(live, [1.75 + 0.25 * i for i in range(20)], spared={"w3"}, beating={"w3"})
    assert [lost for _, lost in got if lost] == []


def test_answers_are_forgotten_once_the_windows_closed():
    live = re_dealing("w3")
    assert ticks(live, [1.5], spared={"w2", "w3"}) == [(1.5, [("w2", UNANSWERED)])]
    live.heard("w3", 40.0)
    live.replanned(40.0, answers=True)  # a later re-deal, long after: w3 has not answered this one
    assert ticks(live, [41.25], spared={"w3"}) == [(41.25, [("w3", UNANSWERED)])]


def test_without_answers_the_windows_spare_every_peer_as_before():
    live = room()
    first_loss(live)
    live.replanned(1.25)  # a worker's own view of a re-deal: nobody answers it
    got = ticks(live, [1.5 + 0.25 * i for i in range(30)], spared=())  # to 8.75: inside the grace
    assert [lost for _, lost in got if lost] == []
    assert ticks(live, [11.25]) == [(11.25, [("w2", SILENT), ("w3", SILENT)])]


def test_a_device_that_loaded_its_range_and_then_died_is_lost_one_timeout_later_not_at_the_grace_end():
    live = re_dealing("w2", "w3")
    live.heard("w2", 2.0)  # w2's Ready: its range is loaded; then w2 dies
    live.loaded("w2")
    got = ticks(live, [1.5 + 0.25 * i for i in range(48)], spared={"w3"}, beating={"w3"})  # to 13.25, w3 loading
    # w2 last heard at 2.0: past the 1 s timeout at the first tick after 3.0, inside the 10 s grace
    assert [(t, lost) for t, lost in got if lost] == [(3.25, [("w2", READY)])]


def test_a_device_loaded_for_one_re_deal_is_spared_again_while_it_loads_for_the_next():
    live = re_dealing("w2", "w3")
    live.heard("w2", 2.0)
    live.loaded("w2")
    live.heard("w3", 2.0)
    live.loaded("w3")
    live.replanned(2.1, answers=True)  # a second re-deal: both load again
    got = ticks(live, [2.25 + 0.25 * i for i in range(12)], spared={"w2", "w3"})  # to 5.0, in the grace
    # 3 s silent, past the 1 s timeout: held to it (READY) they would be lost at 3.25
    assert [(t, lost) for t, lost in got if lost] == []
    assert ticks(live, [5.25, 5.5, 5.75, 6.0, 6.25], spared={"w2", "w3"})[-1] == (
        6.25, [("w2", LOADING_SILENT), ("w3", LOADING_SILENT)])  # past 4 x 1 s after 2.0
