"""The scheduler's loud states: the HostState a room passes through, Ignored records with
their reasons, DriverError for what only a wrong driver can send, the bounded memory of
question ids; the driver kernel's table; the worker's Verdict."""

from __future__ import annotations

import pytest

from planner import protocol
from planner.chain import Chain
from planner.deal import Deal, Stage
from planner.drive import COMMAND_METHODS, Driver, NoOpExecutor
from planner.frames import FrameHeader, FrameKind
from planner.protocol import (ChainReady, DeviceLost, DraftReady, DriverError, FrameArrived, HeadFinished,
                              QuestionAsked, QuestionWithdrawn, RunHead, RunStage, SendFrame, StageFinished)
from planner.scheduler import SEEN_QUESTIONS, HostScheduler, HostState, SchedulerConfig, Verdict, WorkerMachine
from tests.harness import Harness, truth

DEAL = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 2)), guests=(), fits=True, notes=())


def test_a_question_walks_idle_filling_decoding_idle():
    """Prompt of 5 in chunks of 2 (3 prefill laps), 2 answer tokens: the host is
    FILLING until the last chunk's head gives the first token, DECODING for the second."""
    h = Harness(DEAL, SchedulerConfig(hidden=4, prefill_chunk=2))
    seen = [h.host.state]
    h.ask(0, "h", 5, 2)
    while h.step():
        if seen[-1] != h.host.state:
            seen.append(h.host.state)
    assert seen == [HostState.IDLE, HostState.FILLING, HostState.DECODING, HostState.IDLE]
    assert h.answers() == {0: [truth(5), truth(6)]}


def test_a_lost_worker_without_a_redeal_rule_stops_the_host_and_a_rule_makes_it_recover():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    s.handle(DeviceLost("w"), 0.0)
    assert s.state == HostState.STOPPED
    merged = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2),), guests=(), fits=True, notes=())
    r = HostScheduler(DEAL, SchedulerConfig(hidden=4), redeal=lambda d, lost: merged)
    r.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    out = r.handle(DeviceLost("w"), 0.0)
    assert r.state == HostState.RECOVERING
    r.handle(ChainReady(out[-1].first_lap), 0.0)
    assert r.state == HostState.FILLING


def test_events_only_a_wrong_driver_sends_raise():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2))
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)  # launches lap 0
    with pytest.raises(DriverError, match="lap 5"):
        s.handle(HeadFinished(5, (1,)), 0.0)
    with pytest.raises(DriverError, match="lap 9"):
        s.handle(StageFinished("h", 9), 0.0)
    with pytest.raises(DriverError, match="draft 0"):
        s.handle(DraftReady(0, (1, 2)), 0.0)  # no draft asked for yet


def test_a_second_head_result_is_a_bug_and_a_peers_unknown_lap_is_unknown():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    back = FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)
    assert isinstance(s.handle(FrameArrived("h", "w", back), 0.0)[0], RunHead)
    s.handle(HeadFinished(0, (truth(2),)), 0.0)  # the first token; lap 1 (decode) launched
    assert s.handle(HeadFinished(0, (truth(2),)), 0.0) == []  # lap 0 is over now: stale
    s.handle(StageFinished("h", 1), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 1, 2, 1, 4)), 0.0)
    s.handle(HeadFinished(1, (truth(3),)), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 1, 2, 1, 4)), 0.0)  # lap 1 ended: stale
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 77, 2, 1, 4)), 0.0)  # never launched
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.PREFILL, 0, 2, 3, 1, 4)), 0.0)  # not a kind for the host
    s.handle(QuestionWithdrawn(42), 0.0)
    s.handle(DeviceLost("g"), 0.0)
    s.handle(DeviceLost("g"), 0.0)
    got = [(x.event, x.reason) for x in s.ignored]
    assert got == [("HeadFinished", "stale"), ("FrameArrived", "stale"), ("FrameArrived", "unknown"),
                   ("FrameArrived", "bug"), ("QuestionWithdrawn", "unknown"), ("DeviceLost", "repeated")]
    assert all(x.device == "h" for x in s.ignored)


def test_a_frame_that_comes_back_twice_is_recorded_as_a_bug():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "h", (7,), 3), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    back = FrameHeader(FrameKind.RESULT, 0, 0, 0, 1, 4)
    assert isinstance(s.handle(FrameArrived("h", "w", back), 0.0)[0], RunHead)
    assert s.handle(FrameArrived("h", "w", back), 0.0) == []  # the lap is waiting for its head: a duplicate
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [("FrameArrived", "bug", "lap 0 came back twice")]


def test_a_chain_records_events_for_machines_it_does_not_run():
    chain = Chain(DEAL, SchedulerConfig(hidden=4), runs={"w"})
    h = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 1, 4)
    assert chain.handle(QuestionAsked(0, "h", (7,), 3), 0.0) == []
    assert chain.handle(FrameArrived("g", "h", h), 0.0) == []
    assert [(x.device, x.event, x.reason) for x in chain.take_ignored()] == [
        ("h", "QuestionAsked", "not_here"), ("g", "FrameArrived", "not_here")]
    assert chain.ignored == []


def test_a_long_lived_host_keeps_no_lap_of_an_answered_question():
    """Prompts of 7 in chunks of 2: 3 chunks per question do not come back; after 50
    questions the host holds no lap (each question's laps went when it ended)."""
    h = Harness(DEAL, SchedulerConfig(hidden=4, prefill_chunk=2))
    for q in range(50):
        h.ask(q, "h", 7, 2)
        h.run()
    assert h.ended() == {q: "answered" for q in range(50)}
    assert h.host.laps == {}


def test_question_ids_are_remembered_up_to_the_bound():
    s = HostScheduler(Deal(host="h", split="pinned", stages=(Stage("h", 0, 2),), guests=(), fits=True, notes=()),
                      SchedulerConfig(hidden=4))
    n = SEEN_QUESTIONS + 10
    for q in range(n):
        s.handle(QuestionAsked(q, "h", (), 1), 0.0)  # refused (empty prompt), but remembered
    assert len(s.seen_questions) == SEEN_QUESTIONS
    assert 0 not in s.seen_questions and n - 1 in s.seen_questions
    out = s.handle(QuestionAsked(n - 1, "h", (5,), 1), 0.0)
    assert out[0].reason == f"question id {n - 1} was already asked"


def test_the_driver_table_names_an_executor_method_for_every_command():
    assert set(COMMAND_METHODS) == set(protocol.COMMANDS)
    bookkeeping = {cls for cls, name in COMMAND_METHODS.items() if name is None}
    assert bookkeeping == {protocol.BeginAnswer, protocol.LapEnded}

    class Partial:
        def run_stage(self, c): ...
    with pytest.raises(TypeError, match="send_frame"):
        Driver(Chain(DEAL, SchedulerConfig(hidden=4)), Partial())


def test_the_driver_drops_events_at_dead_devices_and_records_in_order():
    seen, done = [], []

    class Ex(NoOpExecutor):
        def run_stage(self, c):
            done.append(c)

    d = Driver(Chain(DEAL, SchedulerConfig(hidden=4)), Ex(), lambda t, ev, cmds, ign: seen.append((t, ev, cmds, ign)))
    cmds = d.dispatch(QuestionAsked(0, "h", (7, 8), 3), 1.5)
    assert [type(c).__name__ for c in cmds] == ["BeginAnswer", "RunStage"] and done == [cmds[1]]
    d.dead.add("w")
    assert d.dispatch(FrameArrived("w", "h", FrameHeader(FrameKind.PREFILL, 0, 0, 0, 2, 4)), 2.0) == []
    assert d.dispatch(DeviceLost("x"), 3.0) == []
    d.dispatch(DeviceLost("x"), 4.0)
    assert [(t, type(ev).__name__, [x.reason for x in ign]) for t, ev, _, ign in seen] == [
        (1.5, "QuestionAsked", []), (3.0, "DeviceLost", []), (4.0, "DeviceLost", ["repeated"])]


def test_worker_verdicts_say_whether_the_stage_runs():
    assert [v.is_run for v in Verdict] == [True, True, False, False, False]
    w = WorkerMachine("w", DEAL)
    h0 = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 2, 4)
    assert w.accept(h0) == (Verdict.RUN, None)
    assert w.accept(FrameHeader(FrameKind.DECODE, 0, 1, 1, 1, 4, returns=True)) == (Verdict.ROLLBACK_RUN, None)
    verdict, why = w.accept(FrameHeader(FrameKind.DECODE, 0, 2, 9, 1, 4))
    assert verdict is Verdict.DROP and "starts at 9, cache holds 2" in why
    assert w.handle(FrameArrived("w", "h", FrameHeader(FrameKind.RESULT, 0, 3, 0, 1, 4)), 0.0) == []
    assert w.handle(StageFinished("w", 1), 0.0) == [
        SendFrame("w", "h", FrameHeader(FrameKind.RESULT, 0, 1, 1, 1, 4, returns=True))]
    assert w.handle(StageFinished("w", 1), 0.0) == []
    assert [(x.event, x.reason) for x in w.ignored] == [("FrameArrived", "bug"), ("StageFinished", "stale")]


# --- the worker's refusals and drops, each record spelled out ---------------------------

W_DEAL = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2), Stage("w1", 2, 4), Stage("w2", 4, 6)),
              guests=(), fits=True, notes=())


def frame(kind=FrameKind.PREFILL, question=0, lap=0, first=0, tokens=4, slot=0):
    return FrameHeader(kind, question, lap, first, tokens, 8, slot=slot)


def test_only_a_worker_of_the_deal_gets_a_worker_machine():
    for device in ("h", "x"):
        with pytest.raises(ValueError) as e:
            WorkerMachine(device, W_DEAL)
        assert str(e.value) == f"{device} is not a worker of this deal"


def test_a_worker_records_each_event_it_does_not_act_on_with_its_reason():
    from planner.protocol import Ignored, QuestionAsked, StageFinished
    w = WorkerMachine("w1", W_DEAL)
    q = QuestionAsked(0, "h", (1,), 3)
    res = frame(FrameKind.RESULT, lap=5)
    assert w.handle(q, 0.0) == []
    assert w.handle(FrameArrived("w2", "w1", frame()), 0.0) == []  # another device's frame
    assert w.handle(FrameArrived("w1", "h", res), 0.0) == []
    assert w.handle(StageFinished("w1", 9), 0.0) == []
    assert w.ignored == [Ignored("w1", "QuestionAsked", "bug", "not an event for this worker"),
                         Ignored("w1", "FrameArrived", "bug", "not an event for this worker"),
                         Ignored("w1", "FrameArrived", "bug", "a RESULT frame at a worker (lap 5)"),
                         Ignored("w1", "StageFinished", "stale", "no frame of lap 9 pending here")]
    assert w.release(9) is None


def test_a_worker_keeps_the_newest_ignored_records_up_to_its_bound():
    from planner.protocol import QuestionAsked
    from planner.scheduler.worker import MAX_IGNORED, note_ignored
    sink: list = []
    for i in range(MAX_IGNORED + 1):
        note_ignored(sink, "w1", QuestionAsked(i, "h", (1,), 3), "bug", str(i))
    assert len(sink) == MAX_IGNORED and (sink[0].detail, sink[-1].detail) == ("1", str(MAX_IGNORED))
    note_ignored(sink, "w1", QuestionAsked(0, "h", (1,), 3), "bug")
    assert (sink[0].detail, sink[-1].detail) == ("2", "")


def test_a_worker_drops_a_stale_frame_or_a_question_it_does_not_serve_and_goes_on():
    from planner.protocol import DropFrame
    w = WorkerMachine("w1", W_DEAL)
    assert w.handle(FrameArrived("w1", "h", frame()), 0.0) == [RunStage("w1", 0, 0, 0, 4, (), 0)]
    stale = frame(FrameKind.DECODE, lap=1, first=6, tokens=1)  # the cache holds positions 0-3
    assert w.handle(FrameArrived("w1", "h", stale), 0.0) == [DropFrame("w1", stale, "stale: starts at 6, cache holds 4")]
    mid = frame(FrameKind.DECODE, question=7, lap=2, first=3, tokens=1, slot=1)  # q7 never began here
    assert w.handle(FrameArrived("w1", "h", mid), 0.0) == [
        DropFrame("w1", mid, "frame of a question this stage is not serving")]
    nxt = frame(FrameKind.DECODE, lap=3, first=4, tokens=1)
    assert w.handle(FrameArrived("w1", "h", nxt), 0.0) == [RunStage("w1", 3, 0, 4, 1, (), 0)]
    assert w.commands_for(nxt, Verdict.DROP, None) == [DropFrame("w1", nxt, "")]


def test_a_worker_records_into_the_list_its_driver_gives_it():
    from planner.protocol import QuestionAsked
    sink: list = []
    w = WorkerMachine("w1", W_DEAL, ignored=sink)
    w.handle(QuestionAsked(0, "h", (1,), 3), 0.0)
    assert w.ignored is sink and [r.detail for r in sink] == ["not an event for this worker"]


# --- the host's answers to a withdrawal and to a lost asker -----------------------------

def three_asked() -> HostScheduler:
    """q0 (asker g1) answered, q1 (g2) and q2 (g1) waiting: one question in flight."""
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    for qid, dev in ((0, "g1"), (1, "g2"), (2, "g1")):
        s.handle(QuestionAsked(qid, dev, (7, 8), 3), 0.0)
    return s


def test_a_withdrawn_question_leaves_the_queue_or_ends_now_and_the_next_begins():
    from planner.protocol import AnswerDone, BeginAnswer, Refuse
    s = three_asked()
    assert s.handle(QuestionWithdrawn(2), 0.0) == [Refuse(2, "g1", "withdrawn by the asker")]
    out = s.handle(QuestionWithdrawn(0), 0.0)
    assert AnswerDone(0, "g1", 0, "withdrawn") in out and BeginAnswer(1, "g2", 2) in out
    assert s.handle(QuestionWithdrawn(2), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [
        ("QuestionWithdrawn", "unknown", "question 2 is neither waiting nor being answered")]


def test_an_asker_that_leaves_has_its_questions_refused_and_the_next_begins():
    from planner.protocol import BeginAnswer, Refuse
    s = three_asked()
    out = s.handle(DeviceLost("g1"), 0.0)
    assert [c for c in out if isinstance(c, Refuse)] == [Refuse(2, "g1", "g1 left the room"),
                                                         Refuse(0, "g1", "g1 left the room")]
    assert BeginAnswer(1, "g2", 2) in out
    assert s.handle(DeviceLost("g1"), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [("DeviceLost", "repeated", "g1 was already lost")]


def test_a_re_deal_that_keeps_the_lost_worker_stops_the_room_and_a_good_one_remembers_the_loss():
    keep_w = HostScheduler(DEAL, SchedulerConfig(hidden=4), redeal=lambda d, lost: DEAL)
    keep_w.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    keep_w.handle(DeviceLost("w"), 0.0)
    assert keep_w.stopped == ("w left the room and the others cannot take its layers: "
                              "the re-deal gives layers to w, which left")
    merged = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2),), guests=(), fits=True, notes=())
    r = HostScheduler(DEAL, SchedulerConfig(hidden=4), redeal=lambda d, lost: merged)
    r.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    r.handle(DeviceLost("w"), 0.0)
    assert r.handle(DeviceLost("w"), 0.0) == [] and r.ignored[-1].detail == "w was already lost"


DEAL3 = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 2), Stage("v", 2, 3)),
             guests=(), fits=True, notes=())


def pinned3(*rows, host="h") -> Deal:
    return Deal(host=host, split="pinned", stages=tuple(Stage(*r) for r in rows), guests=(), fits=True, notes=())


@pytest.mark.parametrize("bad,why", [
    (pinned3(("v", 0, 3), host="v"), "the re-deal moved the model host to v"),
    (pinned3(("h", 0, 1), ("v", 2, 3)), "the re-deal does not tile the layers at layer 2"),
    (pinned3(("h", 0, 1), ("v", 1, 2)), "the re-deal holds 2 layers, the model has 3"),
])
def test_a_re_deal_the_host_cannot_take_stops_the_room_saying_why(bad, why):
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4), redeal=lambda d, lost: bad)
    s.handle(DeviceLost("w"), 0.0)
    assert s.stopped == "w left the room and the others cannot take its layers: " + why


def test_a_re_deal_that_gives_layers_back_to_two_lost_devices_names_both():
    good = pinned3(("h", 0, 1), ("w", 1, 3))
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4), redeal=lambda d, lost: good if lost == {"v"} else DEAL3)
    s.handle(DeviceLost("v"), 0.0)
    assert s.stopped is None
    s.handle(DeviceLost("w"), 0.0)
    assert s.stopped == ("w left the room and the others cannot take its layers: "
                         "the re-deal gives layers to v, w, which left")


def test_a_stopped_room_refuses_the_answered_and_the_waiting_questions_to_their_askers():
    from planner.protocol import Refuse
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "g1", (7, 8), 3), 0.0)
    s.handle(QuestionAsked(1, "g2", (7, 8), 3), 0.0)
    out = s.handle(DeviceLost("w"), 0.0)
    why = "w left the room; the model must be re-dealt"
    assert [c for c in out if isinstance(c, Refuse)] == [Refuse(0, "g1", why), Refuse(1, "g2", why)]


def test_the_host_records_why_it_took_no_action_on_each_frame_and_chain_ready():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)  # lap 0: the prompt
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)), 0.0)
    s.handle(HeadFinished(0, (truth(2),)), 0.0)  # lap 0 over; lap 1 (decode) launched, lap 2 not yet
    for ev in (FrameArrived("w", "h", FrameHeader(FrameKind.RESULT, 0, 1, 2, 1, 4)),
               FrameArrived("h", "w", FrameHeader(FrameKind.PREFILL, 0, 1, 2, 1, 4)),
               FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 77, 2, 1, 4)),
               FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)),
               ChainReady(0), ChainReady(2)):
        assert s.handle(ev, 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [
        ("FrameArrived", "bug", "a frame for w reached the host's machine"),
        ("FrameArrived", "bug", "a PREFILL frame from w at the host"),
        ("FrameArrived", "unknown", "lap 77 from w was never launched"),
        ("FrameArrived", "stale", "lap 0 is over"),
        ("ChainReady", "stale", "no re-deal with first lap 0 is awaited"),
        ("ChainReady", "unknown", "no re-deal with first lap 2 is awaited")]


def test_a_re_deal_refuses_the_lost_askers_questions_and_those_its_chain_has_no_kv_cache_for():
    from dataclasses import replace
    from planner.protocol import Redeal, Refuse
    # three questions in flight (q0 of g1, q1 of w, q2 of g2) and q3 of w waiting; the
    # re-deal without w holds 1 KV cache. w's questions are refused (the waiting one
    # first), q0 is kept and replayed (its 2 prompt tokens), q2 finds no cache left.
    merged = replace(pinned3(("h", 0, 2), ("v", 2, 3)), kv_caches=1)
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4, questions_in_flight=3), redeal=lambda d, lost: merged)
    for qid, dev in ((0, "g1"), (1, "w"), (2, "g2"), (3, "w")):
        s.handle(QuestionAsked(qid, dev, (7, 8), 3), 0.0)
    out = s.handle(DeviceLost("w"), 0.0)
    assert [c for c in out if isinstance(c, Refuse)] == [
        Refuse(3, "w", "w left the room"), Refuse(1, "w", "w left the room"),
        Refuse(2, "g2", "w left the room and the devices left hold the KV caches of 1 question at once")]
    (r,) = [c for c in out if isinstance(c, Redeal)]
    assert (r.lost, r.host, r.stages, r.question_id, r.replay_tokens) == ("w", "h", (("h", 0, 2), ("v", 2, 3)), 0, 2)


def test_the_kv_caches_a_re_deal_holds_are_counted_in_its_refusal():
    from dataclasses import replace
    from planner.protocol import Refuse
    merged = replace(pinned3(("h", 0, 2), ("v", 2, 3)), kv_caches=2)
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4, questions_in_flight=3), redeal=lambda d, lost: merged)
    for qid, dev in ((0, "g1"), (1, "g2"), (2, "g3")):
        s.handle(QuestionAsked(qid, dev, (7, 8), 3), 0.0)
    out = s.handle(DeviceLost("w"), 0.0)
    assert [c for c in out if isinstance(c, Refuse)] == [
        Refuse(2, "g3", "w left the room and the devices left hold the KV caches of 2 questions at once")]


def test_a_drafter_that_returns_nothing_ends_the_answer_and_a_late_draft_is_recorded():
    from planner.protocol import Refuse
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2))
    s.handle(QuestionAsked(0, "g1", (7, 8), 5), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)), 0.0)
    s.handle(HeadFinished(0, (truth(2),)), 0.0)  # the first token: draft 0 asked for
    out = s.handle(DraftReady(0, ()), 0.0)
    assert [c for c in out if isinstance(c, Refuse)] == [Refuse(0, "g1", "the drafter returned no tokens")]
    assert s.handle(DraftReady(0, (1, 2)), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [
        ("DraftReady", "stale", "draft 0 is no longer awaited")]


def test_a_stopped_room_ends_each_lap_in_flight_as_stale():
    from planner.protocol import LapEnded, LapKind, Refuse
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4))
    s.handle(QuestionAsked(0, "g1", (7, 8), 3), 0.0)  # lap 0: the prompt
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)), 0.0)
    s.handle(HeadFinished(0, (truth(2),)), 0.0)  # the first token; lap 1 (decode) in flight
    out = s.handle(DeviceLost("w"), 0.0)
    why = "w left the room; the model must be re-dealt"
    assert out == [Refuse(0, "g1", why), LapEnded(1, 0, LapKind.DECODE, 0, 0, True)]


def test_a_stopped_rooms_prefill_chunk_ends_at_the_hosts_stage_and_sends_no_frame():
    """Prompt chunks of 1: lap 0 (the first chunk, not the last: it does not return) is on
    the host's stage when w is lost with no re-deal rule. The room stops and refuses the
    question; when the host's stage finishes lap 0, the lap ends there (stale) and no frame
    goes on to w, the lost device (before: a SendFrame to w)."""
    from planner.protocol import LapEnded, LapKind, Refuse
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, prefill_chunk=1))
    s.handle(QuestionAsked(0, "g1", (7, 8, 9), 3), 0.0)
    assert s.handle(DeviceLost("w"), 0.0) == [Refuse(0, "g1", "w left the room; the model must be re-dealt")]
    assert s.handle(StageFinished("h", 0), 0.0) == [LapEnded(0, 0, LapKind.PREFILL, 0, 0, True)]
    assert s.laps == {} and s.handle(StageFinished("h", 0), 0.0) == []  # over: a repeat is stale
    assert [(x.event, x.reason) for x in s.ignored] == [("StageFinished", "stale")]


def test_a_worker_lost_for_good_is_remembered_after_its_re_deal_failed():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4), redeal=lambda d, lost: DEAL)  # keeps w: refused
    s.handle(DeviceLost("w"), 0.0)
    assert s.stopped is not None and s.lost == {"w"}
    assert s.handle(DeviceLost("w"), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [("DeviceLost", "repeated", "w was already lost")]


def test_questions_asked_during_a_re_deal_all_begin_when_the_new_chain_is_ready():
    from dataclasses import replace
    from planner.protocol import BeginAnswer, RunStage
    merged = replace(pinned3(("h", 0, 2), ("v", 2, 3)), kv_caches=2)
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4, questions_in_flight=2), redeal=lambda d, lost: merged)
    (r,) = s.handle(DeviceLost("w"), 0.0)  # nothing in flight: the Redeal alone
    assert s.handle(QuestionAsked(0, "g1", (7, 8), 3), 0.0) == []  # both wait for the new chain
    assert s.handle(QuestionAsked(1, "g2", (9,), 3), 0.0) == []
    out = s.handle(ChainReady(r.first_lap), 0.0)
    assert [c for c in out if isinstance(c, BeginAnswer)] == [BeginAnswer(0, "g1", 2), BeginAnswer(1, "g2", 1)]
    assert [(c.question_id, c.inputs, c.slot) for c in out if isinstance(c, RunStage)] == [(0, (7, 8), 0),
                                                                                             (1, (9,), 1)]


def test_a_device_that_comes_back_to_a_chain_of_fewer_kv_caches_is_named_in_the_refusal():
    """v is lost (its layers merged into w, 2 KV caches) with q0 and q1 in flight, then
    comes back; the rejoin rule's deal holds 1 KV cache: q1, begun last, is refused, and
    the Redeal names v as back, with no device lost."""
    from dataclasses import replace
    from planner.protocol import DeviceBack, Redeal, Refuse
    merged = replace(pinned3(("h", 0, 1), ("w", 1, 3)), kv_caches=2)
    again = replace(DEAL3, kv_caches=1)
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4, questions_in_flight=2), redeal=lambda d, lost: merged,
                      rejoin=lambda d, still, measured: again)
    s.handle(QuestionAsked(0, "g1", (7, 8), 3), 0.0)
    s.handle(QuestionAsked(1, "g2", (9,), 3), 0.0)
    first = [c for c in s.handle(DeviceLost("v"), 0.0) if isinstance(c, Redeal)][0]
    s.handle(ChainReady(first.first_lap), 0.0)
    out = s.handle(DeviceBack("v"), 0.0)
    assert [c for c in out if isinstance(c, Refuse)] == [
        Refuse(1, "g2", "v came back and the re-dealt chain hold the KV caches of 1 question at once")]
    (r,) = [c for c in out if isinstance(c, Redeal)]
    # q0 replays its 2 prompt tokens (no answer token yet)
    assert (r.lost, r.host, r.stages, r.question_id, r.replay_tokens, r.back) == (
        "", "h", (("h", 0, 1), ("w", 1, 2), ("v", 2, 3)), 0, 2, "v")


def test_an_ended_question_takes_only_its_own_laps_with_it():
    """Prompt chunks of 1: q0's only chunk (lap 0) is on its way; q1's first chunk
    (lap 1) has left the host (it does not come back: not the last chunk) and its second
    (lap 2) is queued. Withdrawing q0 leaves every lap: lap 0 is still on its way (it
    ends as stale when it comes back) and laps 1 and 2 are q1's."""
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, prefill_chunk=1, questions_in_flight=2))
    s.handle(QuestionAsked(0, "g1", (7,), 3), 0.0)
    s.handle(QuestionAsked(1, "g2", (7, 8, 9), 3), 0.0)
    s.handle(StageFinished("h", 1), 0.0)  # q1's first chunk sent on; its second (lap 2) launched
    s.handle(QuestionWithdrawn(0), 0.0)
    assert sorted(s.laps) == [0, 1, 2]


def test_a_rejoin_into_a_chain_that_held_no_layers_is_refused_with_the_counts():
    """A host whose chain holds no layer (stages ()) is told a device came back; the
    rejoin rule deals it 2 layers: the re-deal does not match the 0 layers of the chain
    before, and the DeviceBack is recorded with why."""
    from planner.protocol import DeviceBack
    empty = Deal(host="h", split="pinned", stages=(), guests=("g",), fits=True, notes=())
    s = HostScheduler(empty, SchedulerConfig(hidden=4), rejoin=lambda d, still, measured: pinned3(("h", 0, 2)))
    s.handle(DeviceLost("g"), 0.0)
    assert s.handle(DeviceBack("g"), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [
        ("DeviceBack", "stale", "g is back but not re-dealt: the re-deal holds 2 layers, the model has 0")]


def test_a_re_deals_empty_stage_holds_no_layer_and_breaks_no_tiling():
    """Only a reversed range (end before start) or a gap breaks the tiling: a stage of
    no layers between two others (u holds layers [1, 1): none) is taken."""
    from planner.protocol import Redeal
    new = pinned3(("h", 0, 1), ("u", 1, 1), ("v", 1, 3))
    s = HostScheduler(DEAL3, SchedulerConfig(hidden=4), redeal=lambda d, lost: new)
    out = s.handle(DeviceLost("w"), 0.0)
    assert s.stopped is None
    assert [c.stages for c in out if isinstance(c, Redeal)] == [(("h", 0, 1), ("u", 1, 1), ("v", 1, 3))]


def test_a_scenarios_scheduler_settings_keep_its_stop_tokens_less_the_end_token():
    from splitroom.scenario import load
    cfg = SchedulerConfig.from_scenario(load("scenarios/home.yaml"), eos_token=2, stop_tokens=(9, 2, 5, 9))
    assert (cfg.eos_token, cfg.stop_tokens) == (2, (5, 9))


def test_the_scheduler_settings_as_json_carry_the_draft_policy():
    from planner.draft_policy import DraftPolicy
    pol = DraftPolicy(lap_s=(0.01, 0.0125, 0.015), prior=(0.5, 0.25), probe_every=3)
    j = SchedulerConfig(hidden=4, draft_tokens=2, draft_policy=pol).to_json()
    assert j["draft_policy"] == {"lap_s": [0.01, 0.0125, 0.015], "prior": [0.5, 0.25], "prior_weight": 4.0,
                                 "probe_every": 3, "probe_tokens": 1, "by_k": []}
    assert SchedulerConfig(hidden=4).to_json()["draft_policy"] is None


def test_the_driver_hands_each_command_to_after_and_names_what_it_cannot_carry_out():
    from planner.protocol import StageFinished
    done = []

    class Ex(NoOpExecutor):
        def run_stage(self, c):
            done.append(("ran", c.lap_id))

    chain = Chain(DEAL, SchedulerConfig(hidden=4))
    d = Driver(chain, Ex(), after=lambda c: done.append(("after", type(c).__name__)))
    d.dispatch(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    # each command carried out, then handed to after, in order (BeginAnswer is bookkeeping)
    assert done == [("after", "BeginAnswer"), ("ran", 0), ("after", "RunStage")]
    d.dead.add("h")
    assert d.dispatch(StageFinished("h", 0), 0.0) == []  # a stage at a dead device: dropped unseen
    assert len(done) == 3 and chain.host.laps[0].sent is False

    class Partial:
        def run_stage(self, c): ...
    with pytest.raises(TypeError) as e:
        Driver(chain, Partial())
    assert str(e.value) == "Partial has no send_frame() for SendFrame"

    class Unknown:
        pass
    chain.handle = lambda ev, now_s: [Unknown()]
    with pytest.raises(TypeError) as e:
        Driver(chain, NoOpExecutor()).dispatch(QuestionAsked(1, "h", (7,), 1), 0.0)
    assert str(e.value) == "no executor method for Unknown: add a row to COMMAND_METHODS"


def test_the_synthetic_head_and_drafter_follow_the_truth_by_position():
    from planner.drive import synthetic_draft, synthetic_head
    from planner.protocol import Draft
    ten = lambda p: 10 * p  # noqa: E731
    # a lap of 3 positions from 4 (4, 5, 6) whose last 2 rows predict positions 6 and 7
    assert synthetic_head(ten, 4, 3, 2) == (60, 70)
    # 3 drafts after 5 committed and 2 assumed tokens (positions 7, 8, 9): the first right,
    # the others one more than the truth
    assert synthetic_draft(ten, Draft(0, 0, 5, (1, 2), 3), 1) == (70, 81, 91)
    assert synthetic_draft(ten, Draft(0, 0, 5, (), 2), 2) == (50, 60)


def test_a_scenarios_scheduler_settings_carry_its_decoding_section_and_seed():
    """home.yaml with prefill chunks of 5, no wake, sampling at temperature 0.7 / top-k 40
    without a seed of its own, the scenario's seed 31, and 2 async laps asked without
    speculation: the settings hold chunks of 5, wake False, that sampling with seed 31
    (docstring: a sampling section without a seed takes the scenario's), and 1 async lap
    (async laps are only for speculative laps). A sampling section with its own seed 5
    keeps 5; greedy takes no seed."""
    from planner.sampling import Sampling
    from splitroom.scenario import load
    cfg = SchedulerConfig.from_scenario(load("scenarios/home.yaml", [
        "decoding.prefill_chunk=5", "decoding.wake=false", "decoding.sampling={temperature: 0.7, top_k: 40}",
        "seed=31", "decoding.async_laps=2", "decoding.speculative=null"]))
    assert (cfg.prefill_chunk, cfg.wake, cfg.async_laps) == (5, False, 1)
    assert cfg.sampling == Sampling(0.7, 1.0, 40, 31)
    own = SchedulerConfig.from_scenario(load("scenarios/home.yaml", [
        "decoding.sampling={temperature: 0.7, seed: 5}", "seed=31"]))
    assert own.sampling == Sampling(0.7, 1.0, 0, 5)
    greedy = SchedulerConfig.from_scenario(load("scenarios/home.yaml", ["seed=31"]))
    assert greedy.sampling.greedy and greedy.sampling.seed is None


def test_capped_lowers_the_context_to_a_stage_cache_and_never_raises_it():
    """capped(positions): None leaves the settings as they are (context 100 stays 100);
    a cache of 50 positions lowers 100 to 50 and sets an unset context to 50; a cache of
    200 does not raise 100 (the smallest cache bounds the room)."""
    cfg = SchedulerConfig(hidden=4, context=100)
    assert cfg.capped(None).context == 100 and cfg.capped(None) == cfg
    assert cfg.capped(50).context == 50 and cfg.capped(50).hidden == 4
    assert SchedulerConfig(hidden=4).capped(50).context == 50
    assert SchedulerConfig(hidden=4).capped(None).context is None
    assert cfg.capped(200).context == 100
