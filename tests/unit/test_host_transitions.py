"""The model host's transition table walked pair by pair, as h2's state-machine tests
walk every (state, input): each HostState is reached by a short hand-written room
(deal h 1 layer, w 1 layer; 2 drafted tokens; a re-deal rule that gives w's layer to h,
or none), every event type is fed once, and what happens is compared with the outcome
worked out by hand below. The pairs with no transition are listed by hand too and
checked against planner.scheduler.host.TRANSITIONS."""

from __future__ import annotations

import numpy as np
import pytest

from planner.deal import Deal, Stage
from planner.draft_policy import DraftPolicy
from planner.frames import FrameHeader, FrameKind
from planner.hops import Measured
from planner.protocol import (AnswerDone, BeginAnswer, ChainReady, DeviceBack, DeviceLost, Draft, DraftReady,
                              DriverError, EmitToken, FrameArrived, HeadFinished, LapEnded, LapFailed, LapKind,
                              QuestionAsked, QuestionWithdrawn, Redeal, Refuse, RunHead, RunStage, SendFrame, StageFinished)
from planner.sampling import Sampling
from planner.scheduler import HostScheduler, HostState, SchedulerConfig
from planner.scheduler import host as host_module
from tests.harness import truth

IDLE, FILLING, DECODING, RECOVERING, STOPPED = (HostState.IDLE, HostState.FILLING, HostState.DECODING,
                                                HostState.RECOVERING, HostState.STOPPED)
DEAL = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 2)), guests=(), fits=True, notes=())
MERGED = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2),), guests=(), fits=True, notes=())
CFG = SchedulerConfig(hidden=4, draft_tokens=2)
PROMPT = (7, 8)  # truth(2) follows it


def _host(redeal: bool = True) -> HostScheduler:
    return HostScheduler(DEAL, CFG, redeal=(lambda d, lost: MERGED) if redeal else None)


def _first_token(s: HostScheduler) -> None:
    """Lap 0 (the prompt) through the host's stage, back, and its head: the first token."""
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4, returns=True)), 0.0)
    s.handle(HeadFinished(0, (truth(2),)), 0.0)


def idle() -> tuple[HostScheduler, int]:
    """Question 0 asked for one token and answered: lap 0 is over, nothing in flight."""
    s = _host()
    s.handle(QuestionAsked(0, "g", PROMPT, 1), 0.0)
    _first_token(s)
    return s, 0


def filling() -> tuple[HostScheduler, int]:
    """Question 0 asked: lap 0 (the prompt, 2 tokens) on the host's stage."""
    s = _host()
    s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0)
    return s, 0


def decoding() -> tuple[HostScheduler, int]:
    """The first token is out, draft 0 came back: verify lap 1 on the host's stage."""
    s, _ = filling()
    _first_token(s)
    s.handle(DraftReady(0, (truth(3), truth(4))), 0.0)
    return s, 1


def recovering() -> tuple[HostScheduler, int]:
    """w lost while lap 0 was on the host's stage: the re-deal (first lap 1) announced."""
    s, _ = filling()
    s.handle(DeviceLost("w"), 0.0)
    return s, 0


def stopped() -> tuple[HostScheduler, int]:
    """As ``recovering`` with no re-deal rule: the room stopped (lap 0 kept, stale)."""
    s = _host(redeal=False)
    s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0)
    s.handle(DeviceLost("w"), 0.0)
    return s, 0


ROOMS = {IDLE: idle, FILLING: filling, DECODING: decoding, RECOVERING: recovering, STOPPED: stopped}

# one event of each type, about the state's lap (``lap``), question 0, draft 0 and w
EVENTS = {
    "QuestionAsked": lambda lap: QuestionAsked(5, "g", (1, 2), 2),
    "StageFinished": lambda lap: StageFinished("h", lap),
    "FrameArrived": lambda lap: FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, lap, 1 if lap else 0,
                                                                   3 if lap else 2, 4, returns=True)),
    "HeadFinished": lambda lap: HeadFinished(lap, (truth(2),)),
    "DraftReady": lambda lap: DraftReady(0, (truth(3), truth(4))),
    "DeviceLost": lambda lap: DeviceLost("w"),
    "DeviceBack": lambda lap: DeviceBack("w"),
    "ChainReady": lambda lap: ChainReady(1 if lap == 0 else lap),
    "QuestionWithdrawn": lambda lap: QuestionWithdrawn(0),
    "LapFailed": lambda lap: LapFailed(lap, "w", "nan"),
}

RAISES = "raises"
OVER = "lap 0 is over"
NO_REDEAL = "no re-deal with first lap 1 is awaited"
NOT_ASKED = "question 0 is neither waiting nor being answered"
# (state, event type) -> what the host does, worked out by hand: the state it moves to
# with the types of the commands it returns, ("ignored", reason, detail) with no command
# and no move (the host's Ignored record), or RAISES (DriverError)
EXPECTED = {
    IDLE: {
        "QuestionAsked": (FILLING, ["BeginAnswer", "RunStage"]),
        "StageFinished": ("ignored", "stale", OVER),
        "FrameArrived": ("ignored", "stale", OVER),
        "HeadFinished": ("ignored", "stale", OVER),
        "DraftReady": RAISES,  # no draft was ever asked for
        "DeviceLost": (RECOVERING, ["Redeal"]),
        "DeviceBack": ("ignored", "repeated", "w was not lost"),
        "ChainReady": ("ignored", "unknown", NO_REDEAL),  # ChainReady(1): only lap 0 was ever launched
        "QuestionWithdrawn": ("ignored", "unknown", NOT_ASKED),
        "LapFailed": ("ignored", "stale", OVER),
    },
    FILLING: {
        "QuestionAsked": (FILLING, []),  # waits: one question at a time
        "StageFinished": (FILLING, ["SendFrame"]),
        "FrameArrived": (FILLING, ["RunHead"]),
        "HeadFinished": RAISES,  # lap 0 has not come back: no RunHead was given
        "DraftReady": RAISES,
        "DeviceLost": (RECOVERING, ["LapEnded", "Redeal"]),
        "DeviceBack": ("ignored", "repeated", "w was not lost"),
        "ChainReady": ("ignored", "unknown", NO_REDEAL),
        "QuestionWithdrawn": (IDLE, ["AnswerDone"]),
        "LapFailed": (IDLE, ["LapEnded", "Refuse"]),
    },
    DECODING: {
        "QuestionAsked": (DECODING, []),
        "StageFinished": (DECODING, ["SendFrame"]),
        "FrameArrived": (DECODING, ["RunHead"]),
        "HeadFinished": RAISES,
        "DraftReady": ("ignored", "stale", "draft 0 is no longer awaited"),  # draft 0 was taken already
        "DeviceLost": (RECOVERING, ["LapEnded", "Redeal"]),
        "DeviceBack": ("ignored", "repeated", "w was not lost"),
        "ChainReady": ("ignored", "stale", NO_REDEAL),  # ChainReady(1): lap 1 is a lap, not a re-deal
        "QuestionWithdrawn": (IDLE, ["LapEnded", "AnswerDone"]),
        "LapFailed": (IDLE, ["Refuse", "LapEnded"]),
    },
    RECOVERING: {
        "QuestionAsked": (RECOVERING, []),  # waits for the new chain
        "StageFinished": ("ignored", "stale", OVER),
        "FrameArrived": ("ignored", "stale", OVER),
        "HeadFinished": ("ignored", "stale", OVER),
        "DraftReady": RAISES,
        "DeviceLost": ("ignored", "repeated", "w was already lost"),
        "DeviceBack": (RECOVERING, []),  # w is no longer lost; no rejoin rule: it waits outside
        "ChainReady": (FILLING, ["RunStage"]),  # question 0's prompt again, on the new chain
        "QuestionWithdrawn": (RECOVERING, ["AnswerDone"]),
        "LapFailed": ("ignored", "stale", OVER),
    },
    STOPPED: {
        "QuestionAsked": (STOPPED, ["Refuse"]),
        "StageFinished": (STOPPED, ["LapEnded"]),  # lap 0, stale, ends at the host's stage: no frame goes on
        "FrameArrived": (STOPPED, ["LapEnded"]),
        "HeadFinished": RAISES,
        "DraftReady": RAISES,
        "DeviceLost": ("ignored", "repeated", "w was already lost"),
        "DeviceBack": ("ignored", "stale", "the room has stopped: w left the room; the model must be re-dealt"),
        "ChainReady": ("ignored", "unknown", NO_REDEAL),  # no re-deal was ever announced: lap 1 never launched
        "QuestionWithdrawn": ("ignored", "unknown", NOT_ASKED),
        "LapFailed": ("ignored", "stale", OVER),
    },
}

# the pairs with no transition (HostScheduler.MISSES takes them), by hand
NO_TRANSITION = {
    IDLE: {"DraftReady", "ChainReady", "QuestionWithdrawn", "LapFailed"},
    FILLING: {"DraftReady", "ChainReady"},
    DECODING: {"ChainReady"},
    RECOVERING: {"StageFinished", "FrameArrived", "HeadFinished", "DraftReady", "LapFailed"},
    STOPPED: {"DraftReady", "DeviceBack", "ChainReady", "QuestionWithdrawn", "LapFailed"},
}


def test_each_room_reaches_the_state_it_is_named_for():
    assert {state: room()[0].state for state, room in ROOMS.items()} == {s: s for s in ROOMS}


def test_the_table_has_no_transition_exactly_for_the_pairs_listed_by_hand():
    table = host_module.TRANSITIONS
    assert set(table) == set(HostState)
    for state in HostState:
        got = {name for name in EVENTS if name not in {cls.__name__ for cls in table[state]}}
        assert got == NO_TRANSITION[state], state
    assert set(host_module.HostScheduler.HANDLERS) | set(host_module.HostScheduler.MISSES) == {
        type(make(0)) for make in EVENTS.values()}


@pytest.mark.parametrize("state", list(HostState))
@pytest.mark.parametrize("name", list(EVENTS))
def test_every_state_and_event_pair(state, name):
    s, lap = ROOMS[state]()
    event = EVENTS[name](lap)
    ignored_before = len(s.ignored)
    want = EXPECTED[state][name]
    if want == RAISES:
        with pytest.raises(DriverError):
            s.handle(event, 0.0)
        assert name in NO_TRANSITION[state] or name in {"HeadFinished", "DraftReady", "StageFinished"}
        return
    cmds = s.handle(event, 0.0)
    new = [(x.device, x.event, x.reason, x.detail) for x in s.ignored[ignored_before:]]
    if want[0] == "ignored":
        assert (cmds, s.state, new) == ([], state, [("h", name, want[1], want[2])])
        return
    to, kinds = want
    assert name not in NO_TRANSITION[state]
    assert (s.state, [type(c).__name__ for c in cmds], new) == (to, kinds, [])
    assert to in host_module.TRANSITIONS[state][type(event)]


def test_a_miss_names_what_it_was_and_the_driver_s_own_mistakes_raise():
    """The branches of the misses that the walk above does not reach, in the recovering
    room (lap ids 0, the prompt, and 1, the re-deal's own id, are taken; 2 is the first
    never launched; no draft asked): a peer's
    event for a lap never launched, or of the wrong kind, is an Ignored record saying
    so; the driver's own event for such a lap raises, naming the event and the lap."""
    s, _ = recovering()
    ignored = [
        (StageFinished("w", 0), "bug", "a stage of w reached the host's machine"),
        (FrameArrived("w", "h", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4)), "bug",
         "a frame for w reached the host's machine"),
        (FrameArrived("h", "w", FrameHeader(FrameKind.DECODE, 0, 0, 0, 2, 4)), "bug", "a DECODE frame from w at the host"),
        (FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 2, 0, 2, 4)), "unknown",
         "lap 2 from w was never launched"),
        (FrameArrived("h", "w", FrameHeader(FrameKind.RETURN, 0, 0, 0, 2, 4)), "stale", "lap 0 is over"),
        (LapFailed(2, "w", "nan"), "unknown", "lap 2 was never launched"),
        (LapFailed(-1, "w", "nan"), "unknown", "lap -1 was never launched"),
        (ChainReady(0), "stale", "no re-deal with first lap 0 is awaited"),  # a lap's id, not the re-deal's 1
        (ChainReady(2), "unknown", "no re-deal with first lap 2 is awaited"),
    ]
    for event, reason, detail in ignored:
        n = len(s.ignored)
        assert s.handle(event, 0.0) == [] and s.state == RECOVERING
        assert [(x.device, x.event, x.reason, x.detail) for x in s.ignored[n:]] == [
            ("h", type(event).__name__, reason, detail)], event
    for event, message in [
            (StageFinished("h", 2), "StageFinished for lap 2, which the host never launched"),
            (StageFinished("h", -1), "StageFinished for lap -1, which the host never launched"),
            (HeadFinished(2, (truth(2),)), "HeadFinished for lap 2, which the host never launched"),
            (DraftReady(0, (truth(3),)), "DraftReady for draft 0, which the host never asked for")]:
        n = len(s.ignored)
        with pytest.raises(DriverError) as e:
            s.handle(event, 0.0)
        assert str(e.value) == message and len(s.ignored) == n and s.state == RECOVERING


def test_a_device_back_is_judged_on_nothing_measured_when_the_host_times_nothing():
    """A host given a rejoin rule but no StageSpeeds hands the rule an empty Measured
    (no device, head or link timed), as its docstring says; the rule keeps the deal, so
    w waits outside the chain and the answer goes on."""
    seen = []

    def stay(deal, still_lost, measured):
        seen.append((deal, still_lost, measured))
        return None

    s = HostScheduler(DEAL, CFG, redeal=lambda d, lost: MERGED, rejoin=stay)
    s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0)
    s.handle(DeviceLost("w"), 0.0)
    s.handle(ChainReady(1), 0.0)
    assert s.state == FILLING and s.lost == {"w"}
    assert s.handle(DeviceBack("w"), 0.0) == [] and s.lost == set() and s.state == FILLING
    assert seen == [(MERGED, frozenset(), Measured({}))]
    assert seen[0][2].s_per_layer == {} and seen[0][2].head_s is None and seen[0][2].hop_s is None


def test_a_pair_with_no_transition_changes_nothing():
    """An Ignored miss leaves the host as it was: the same event again is ignored again."""
    for state, names in NO_TRANSITION.items():
        for name in names:
            if EXPECTED[state][name] == RAISES:
                continue
            s, lap = ROOMS[state]()
            event = EVENTS[name](lap)
            first, second = s.handle(event, 0.0), s.handle(event, 0.0)
            assert (first, second, s.state) == ([], [], state)
            assert s.ignored[-1] == s.ignored[-2]


def test_a_handler_that_moves_where_the_table_does_not_allow_raises(monkeypatch):
    monkeypatch.setitem(host_module.TRANSITIONS[IDLE], QuestionAsked, frozenset({IDLE}))
    s = _host()
    with pytest.raises(RuntimeError, match="the host went from idle to filling on QuestionAsked"):
        s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0)


def test_a_stopped_room_records_a_later_loss_and_the_chain_ready_of_a_re_deal_it_abandoned():
    """w lost: re-dealt (first lap 1); h itself lost: the room stops. The awaited
    ChainReady(1) and a guest's loss afterwards take no action and are recorded."""
    s, _ = filling()
    out = s.handle(DeviceLost("w"), 0.0)
    assert [type(c) for c in out] == [LapEnded, Redeal] and out[-1].first_lap == 1
    s.handle(DeviceLost("h"), 0.0)
    assert s.state == STOPPED and s.recovering is None and s.stopped == "h left the room; the model must be re-dealt"
    assert s.handle(ChainReady(1), 0.0) == [] and s.handle(DeviceLost("g"), 0.0) == []
    assert s.lost == {"w", "h", "g"}  # the guest's loss is remembered: a second one is a repeat
    assert s.handle(DeviceLost("g"), 0.0) == []
    assert [(x.event, x.reason, x.detail) for x in s.ignored] == [
        ("ChainReady", "stale", "no re-deal with first lap 1 is awaited"),
        ("DeviceLost", "stale", "the room has stopped: h left the room; the model must be re-dealt"),
        ("DeviceLost", "repeated", "g was already lost")]


def test_a_numerical_fault_refuses_its_question_naming_the_device():
    """LapFailed (a residual went NaN or inf at w) refuses the question, naming the device
    and the fault, and ends the failed lap as stale. In the filling room the prompt's lap
    0 is on the host's stage, not in flight: it is ended first, then the Refuse. In the
    decoding room verify lap 1 (2 drafts) is in flight: the Refuse, then the in-flight lap
    dropped. A LapFailed for a lap never launched (1, in the filling room) is ignored."""
    s, _ = filling()
    assert s.handle(LapFailed(0, "w", "nan"), 0.0) == [LapEnded(0, 0, LapKind.PREFILL, 0, 0, True),
                                                      Refuse(0, "g", "numerical fault on w: nan")]
    assert s.state == IDLE and s.laps == {}
    s, _ = decoding()
    assert s.handle(LapFailed(1, "w", "inf"), 0.0) == [Refuse(0, "g", "numerical fault on w: inf"),
                                                      LapEnded(1, 0, LapKind.VERIFY, 2, 0, True)]
    assert s.state == IDLE and s.laps == {}
    s, _ = filling()
    assert s.handle(LapFailed(1, "w", "nan"), 0.0) == [] and s.state == FILLING
    assert [(x.device, x.event, x.reason, x.detail) for x in s.ignored] == [
        ("h", "LapFailed", "unknown", "lap 1 was never launched")]


def test_a_head_result_for_a_lap_given_no_run_head_raises():
    s, _ = filling()
    s.handle(StageFinished("h", 0), 0.0)  # the frame is at w, not back
    with pytest.raises(DriverError, match="lap 0, whose frame has not come back"):
        s.handle(HeadFinished(0, (truth(2),)), 0.0)


def test_a_room_walks_its_states_with_the_commands_of_each_transition():
    """A whole answer by hand: FILLING (prompt), DECODING (a verify lap keeps both
    drafts and the head's bonus token), then IDLE once 3 tokens are out."""
    s = _host()
    assert s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0) == [BeginAnswer(0, "g", 2),
                                                             RunStage("h", 0, 0, 0, 2, PROMPT)]
    assert s.state == FILLING
    _first_token(s)
    assert s.state == DECODING
    out = s.handle(DraftReady(0, (truth(3), truth(4))), 0.0)
    assert [type(c) for c in out] == [RunStage] and s.state == DECODING
    s.handle(StageFinished("h", 1), 0.0)
    back = s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 1, 1, 3, 4, returns=True)), 0.0)
    assert back == [RunHead(1, 0, 3)]
    out = s.handle(HeadFinished(1, (truth(3), truth(4), truth(5))), 0.0)
    assert [c for c in out if isinstance(c, EmitToken)] == [EmitToken(0, "g", 1, truth(3)),
                                                            EmitToken(0, "g", 2, truth(4))]
    assert out[-1] == AnswerDone(0, "g", 3, "length") and s.state == IDLE
    assert not [c for c in out if isinstance(c, (Draft, SendFrame, Refuse))]


def test_a_re_deal_replays_every_question_in_flight_each_in_its_own_slot():
    """Two questions in flight: q0 (prompt 7 8, its first token out: decode lap 2 in flight)
    in slot 0 and q1 (prompt 5 6 4, its prefill lap 1 at w) in slot 1. w is lost: laps 1
    and 2 end stale, the re-deal takes lap id 3. Its ChainReady replays both, by hand: q0
    its 3 tokens so far (a replay lap, 4, slot 0), then q1 its prompt (still a prefill,
    lap 5, slot 1), each from position 0 of its own cache."""
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, questions_in_flight=2), redeal=lambda d, lost: MERGED)
    s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0)
    assert s.handle(QuestionAsked(1, "g2", (5, 6, 4), 2), 0.0) == [BeginAnswer(1, "g2", 3),
                                                                  RunStage("h", 1, 1, 0, 3, (5, 6, 4), 1)]
    s.handle(StageFinished("h", 1), 0.0)  # q1's prompt goes on to w
    _first_token(s)
    out = s.handle(DeviceLost("w"), 0.0)
    assert [c.lap_id for c in out if isinstance(c, LapEnded)] == [1, 2] and out[-1].first_lap == 3
    assert s.handle(ChainReady(3), 0.0) == [RunStage("h", 4, 0, 0, 3, (7, 8, truth(2)), 0),
                                            RunStage("h", 5, 1, 0, 3, (5, 6, 4), 1)]
    assert s.state == FILLING


def _back(s: HostScheduler, lap: int) -> list:
    """Lap ``lap`` through the host's stage and back from w: the commands of its return."""
    s.handle(StageFinished("h", lap), 0.0)
    return s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, lap, 0, 1, 4, returns=True)), 0.0)


def test_a_stage_of_another_device_is_ignored_even_for_a_lap_in_flight():
    """In the filling room lap 0 is on the host's stage. A StageFinished naming w for lap
    0 is not the host's own (only the host's stage reports to it): Ignored as a bug, and
    lap 0 is left as it was, so the host's own StageFinished still sends its frame on."""
    s, _ = filling()
    assert s.handle(StageFinished("w", 0), 0.0) == [] and s.state == FILLING
    assert [(x.device, x.event, x.reason, x.detail) for x in s.ignored] == [
        ("h", "StageFinished", "bug", "a stage of w reached the host's machine")]
    assert [type(c) for c in s.handle(StageFinished("h", 0), 0.0)] == [SendFrame]


def test_a_lap_of_a_withdrawn_question_ends_stale_when_it_comes_back():
    """Question 0 withdrawn while its prompt's lap 0 (the whole 2-token prompt, so it
    returns) is out: the answer ends at once (AnswerDone, 0 tokens), and lap 0, whose
    question is gone, ends as stale (LapEnded, kept 0, stale True) where it comes back:
    (a) withdrawn on the host's stage, it ends when its frame comes back; (b) withdrawn
    after its RunHead, it ends at its head result. (c) With 1-token chunks, chunk 0
    (which does not return) of a question withdrawn while it is on the host's stage is
    forgotten once the host's stage has finished it: no lap is left."""
    stale_lap0 = [LapEnded(0, 0, LapKind.PREFILL, 0, 0, True)]
    s, _ = filling()  # (a)
    assert s.handle(QuestionWithdrawn(0), 0.0) == [AnswerDone(0, "g", 0, "withdrawn")] and s.state == IDLE
    assert _back(s, 0) == stale_lap0 and s.laps == {} and s.state == IDLE
    s, _ = filling()  # (b)
    assert _back(s, 0) == [RunHead(0, 0, 1)]
    assert s.handle(QuestionWithdrawn(0), 0.0) == [AnswerDone(0, "g", 0, "withdrawn")]
    assert s.handle(HeadFinished(0, (truth(2),)), 0.0) == stale_lap0 and s.laps == {} and s.state == IDLE
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2, prefill_chunk=1))  # (c)
    assert s.handle(QuestionAsked(0, "g", PROMPT, 3), 0.0) == [BeginAnswer(0, "g", 2), RunStage("h", 0, 0, 0, 1, (7,))]
    assert s.handle(QuestionWithdrawn(0), 0.0) == [AnswerDone(0, "g", 0, "withdrawn")]
    s.handle(StageFinished("h", 0), 0.0)
    assert s.laps == {} and s.state == IDLE


def test_a_head_result_with_no_prediction_refuses_its_question_and_the_next_begins():
    """The head returned nothing for lap 0 (the prompt): lap 0 ends stale (LapEnded, kept
    0) and is forgotten, so a faulty head cannot grow the room's laps; question 0 is
    refused with the reason, naming the lap, and question 1, waiting, begins (lap 1,
    slot 0 again): the only lap left is lap 1."""
    s, _ = filling()
    assert s.handle(QuestionAsked(1, "g2", (5, 6), 2), 0.0) == []
    assert _back(s, 0) == [RunHead(0, 0, 1)]
    assert s.handle(HeadFinished(0, ()), 0.0) == [
        LapEnded(0, 0, LapKind.PREFILL, 0, 0, True),
        Refuse(0, "g", "the output head returned no prediction for lap 0"),
        BeginAnswer(1, "g2", 2), RunStage("h", 1, 1, 0, 2, (5, 6), 0)]
    assert s.state == FILLING and s.in_flight == 1 and list(s.laps) == [1]


def test_two_laps_in_flight_are_judged_in_launch_order_and_a_second_head_result_is_ignored():
    """async_laps 2, k 2, question 0 asks for 6 tokens. After the first token t2 (lap 0),
    lap 1 verifies (t2, t3, t4) from position 2, and lap 2 is launched assuming lap 1 is
    taken in full: its drafts (t5, t6, t7) from position 5, t5 guessing lap 1's bonus
    token. Lap 2's head result comes first: it waits for lap 1 (no command); the same
    result again is Ignored as a bug. Lap 1's result then judges both, in launch order:
    lap 1 keeps t3 t4 and the bonus t5 (= lap 2's guess, so lap 2 stays valid), lap 2
    keeps t6 t7 t8, of which t6 t7 fit the 6 tokens asked. 2 + 2 drafts accepted."""
    t = truth
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2, async_laps=2))
    s.handle(QuestionAsked(0, "g", PROMPT, 6), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4, returns=True)), 0.0)
    assert s.handle(HeadFinished(0, (t(2),)), 0.0) == [LapEnded(0, 0, LapKind.PREFILL, 0, 1, False),
                                                       EmitToken(0, "g", 0, t(2)), Draft(0, 0, 3, (), 2)]
    assert s.handle(DraftReady(0, (t(3), t(4))), 0.0) == [RunStage("h", 1, 0, 2, 3, (t(2), t(3), t(4))),
                                                          Draft(1, 0, 3, (t(3), t(4)), 3)]
    assert s.handle(DraftReady(1, (t(5), t(6), t(7))), 0.0) == [RunStage("h", 2, 0, 5, 3, (t(5), t(6), t(7)))]
    assert _back(s, 1) == [RunHead(1, 0, 3)] and _back(s, 2) == [RunHead(2, 0, 3)]
    assert s.handle(HeadFinished(2, (t(6), t(7), t(8))), 0.0) == [] and s.ignored == []
    assert s.handle(HeadFinished(2, (t(6), t(7), t(8))), 0.0) == []
    assert [(x.device, x.event, x.reason, x.detail) for x in s.ignored] == [
        ("h", "HeadFinished", "bug", "a second head result for lap 2")]
    assert s.handle(HeadFinished(1, (t(3), t(4), t(5))), 0.0) == [
        LapEnded(1, 0, LapKind.VERIFY, 2, 3, False),
        EmitToken(0, "g", 1, t(3)), EmitToken(0, "g", 2, t(4)), EmitToken(0, "g", 3, t(5)),
        LapEnded(2, 0, LapKind.VERIFY, 2, 3, False),
        EmitToken(0, "g", 4, t(6)), EmitToken(0, "g", 5, t(7)), AnswerDone(0, "g", 6, "length")]
    assert (s.accepted, s.emitted, s.state, s.laps) == (4, 6, IDLE, {})


def test_a_head_result_shorter_than_its_lap_keeps_only_the_drafts_it_confirms():
    """HeadFinished should carry one prediction per RunHead row; the judge still takes a
    shorter one (it reads no row the head did not give). In the decoding room lap 1
    verifies (t2, t3, t4) from position 2 and the head gives only t3: draft t3 is
    confirmed, and with no further prediction there is no correction or bonus token, so
    1 token is kept (1 draft accepted). The assumed t4 is then forgotten: the next draft
    continues the 4 committed tokens with nothing assumed (k 2)."""
    s, lap = decoding()
    assert _back(s, lap) == [RunHead(1, 0, 3)]
    assert s.handle(HeadFinished(1, (truth(3),)), 0.0) == [LapEnded(1, 0, LapKind.VERIFY, 2, 1, False),
                                                           EmitToken(0, "g", 1, truth(3)), Draft(1, 0, 4, (), 2)]
    assert (s.accepted, s.emitted) == (1, 2)


def test_an_adaptive_question_drafts_no_further_than_the_context_allows():
    """draft_tokens: auto with lap costs 1, 2, 2 s for k = 0, 1, 2 and a prior of 1.0 at
    both positions (no lap judged yet, so the rates are the prior): rate(k) =
    (1 + expected accepted) / lap_s[k] = 1/1, 2/2, 3/2 tokens a second, so k = 2 is
    best, and k = 0 wins a tie with k = 1 when at most 1 draft fits.
    (a) context 4, prompt 2, 2 tokens asked: after the first token 1 position is left,
    so the lap is plain (k 0: lap 1, t2 from position 2), not a draft.
    (b) context 5, 3 tokens asked: 2 positions left, a draft of 2; once its 2 tokens are
    assumed none are left, so no plain lap starts beside the verify lap in flight. Its
    head gives only t3 (one row): t3 is kept and t4, still assumed, leaves no position
    for a draft, so the next lap is plain (t3 from position 3) and t4 is forgotten."""
    t = truth
    policy = DraftPolicy(lap_s=(1.0, 2.0, 2.0), prior=(1.0, 1.0))

    def room(context: int, max_new: int) -> HostScheduler:
        s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2, draft_policy=policy, context=context))
        s.handle(QuestionAsked(0, "g", PROMPT, max_new), 0.0)
        s.handle(StageFinished("h", 0), 0.0)
        s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4, returns=True)), 0.0)
        return s

    s = room(4, 2)  # (a)
    assert s.handle(HeadFinished(0, (t(2),)), 0.0) == [LapEnded(0, 0, LapKind.PREFILL, 0, 1, False),
                                                       EmitToken(0, "g", 0, t(2)), RunStage("h", 1, 0, 2, 1, (t(2),))]
    s = room(5, 3)  # (b)
    assert s.handle(HeadFinished(0, (t(2),)), 0.0)[-1] == Draft(0, 0, 3, (), 2)
    assert s.handle(DraftReady(0, (t(3), t(4))), 0.0) == [RunStage("h", 1, 0, 2, 3, (t(2), t(3), t(4)))]
    assert _back(s, 1) == [RunHead(1, 0, 3)]
    assert s.handle(HeadFinished(1, (t(3),)), 0.0) == [LapEnded(1, 0, LapKind.VERIFY, 2, 1, False),
                                                       EmitToken(0, "g", 1, t(3)), RunStage("h", 2, 0, 3, 1, (t(3),))]


def test_a_sampled_question_without_a_seed_draws_from_its_question_id_s_stream():
    """A question that samples with no seed of its own (nor the room's) gets the stream
    seeded with its question id's absolute value: question -3's prompt lap returns a
    RunHead for question -3, 1 row, its sampling and the pair of answer token 0, the
    first two uniforms of numpy's PCG64 generator seeded with 3 (planner.sampling.Uniforms'
    documented stream, drawn here from numpy itself)."""
    hot = Sampling(temperature=0.7)
    s = HostScheduler(DEAL, CFG)
    assert s.handle(QuestionAsked(-3, "g", PROMPT, 3, sampling=hot), 0.0) == [BeginAnswer(-3, "g", 2),
                                                                            RunStage("h", 0, -3, 0, 2, PROMPT)]
    u, v = np.random.Generator(np.random.PCG64(3)).random(2)
    assert _back(s, 0) == [RunHead(0, -3, 1, hot, ((float(u), float(v)),))]


def test_a_lap_launched_on_drafts_a_short_head_result_did_not_confirm_ends_stale():
    """async_laps 2, k 2, as in the test of two laps in flight, but the drafter guessed
    t3 (not t5) for lap 1's bonus token: lap 2 verifies (t3, t6, t7) from position 5.
    Lap 2's head result comes first and waits. Lap 1's head then gives only t3 (one
    row): t3 is kept (1 draft accepted), so 4 tokens are committed and the last is t3
    at position 3. Lap 2 starts at position 5, not 3: it is not judged (its first token
    t3 equals the last committed one, but its position does not follow on) and ends
    stale, kept 0. Nothing is in flight: the assumed t4 t3 t6 t7 are forgotten and the
    next draft continues the 4 committed tokens with nothing assumed."""
    t = truth
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=2, async_laps=2))
    s.handle(QuestionAsked(0, "g", PROMPT, 6), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4, returns=True)), 0.0)
    assert s.handle(HeadFinished(0, (t(2),)), 0.0)[-1] == Draft(0, 0, 3, (), 2)
    assert s.handle(DraftReady(0, (t(3), t(4))), 0.0)[-1] == Draft(1, 0, 3, (t(3), t(4)), 3)
    assert s.handle(DraftReady(1, (t(3), t(6), t(7))), 0.0) == [RunStage("h", 2, 0, 5, 3, (t(3), t(6), t(7)))]
    _back(s, 1)
    _back(s, 2)
    assert s.handle(HeadFinished(2, (t(6), t(7), t(8))), 0.0) == []
    assert s.handle(HeadFinished(1, (t(3),)), 0.0) == [
        LapEnded(1, 0, LapKind.VERIFY, 2, 1, False), EmitToken(0, "g", 1, t(3)),
        LapEnded(2, 0, LapKind.VERIFY, 2, 0, True), Draft(2, 0, 4, (), 2)]
    assert (s.accepted, s.emitted, s.laps) == (1, 2, {})


def test_an_adaptive_question_going_plain_forgets_the_drafts_a_short_head_result_left():
    """draft_tokens: auto, up to 3 drafts, lap costs 1, 2, 2, 2 s, a prior of 1.0 at every
    position, context 7, prompt 2, 5 tokens asked. After t2, 4 positions are left: rates
    1/1, 2/2, 3/2, 4/2, so lap 1 drafts 3 (t3 t4 t5 from position 2); with them assumed 1
    position is left (k 1 ties k 0 at 1 token a second: no lap beside it). Its head gives
    only t3: t3 kept, and position 2 was tried and wrong, so its rate is (4 * 1 + 0) /
    (4 + 1) = 0.8. t4 t5 are still assumed, 1 position is left: a plain lap (lap 2, t3 from
    position 3), and t4 t5 are forgotten. Lap 2 commits t4: 5 tokens, nothing assumed, so
    2 positions are left and k 2 is worth (1 + 1 + 1 * 0.8) / 2 = 1.4 > 1: a draft of 2."""
    t = truth
    policy = DraftPolicy(lap_s=(1.0, 2.0, 2.0, 2.0), prior=(1.0, 1.0, 1.0))
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4, draft_tokens=3, draft_policy=policy, context=7))
    s.handle(QuestionAsked(0, "g", PROMPT, 5), 0.0)
    s.handle(StageFinished("h", 0), 0.0)
    s.handle(FrameArrived("h", "w", FrameHeader(FrameKind.RESULT, 0, 0, 0, 2, 4, returns=True)), 0.0)
    assert s.handle(HeadFinished(0, (t(2),)), 0.0)[-1] == Draft(0, 0, 3, (), 3)
    assert s.handle(DraftReady(0, (t(3), t(4), t(5))), 0.0) == [RunStage("h", 1, 0, 2, 4, (t(2), t(3), t(4), t(5)))]
    assert _back(s, 1) == [RunHead(1, 0, 4)]
    assert s.handle(HeadFinished(1, (t(3),)), 0.0) == [LapEnded(1, 0, LapKind.VERIFY, 3, 1, False),
                                                       EmitToken(0, "g", 1, t(3)), RunStage("h", 2, 0, 3, 1, (t(3),))]
    assert _back(s, 2) == [RunHead(2, 0, 1)]
    assert s.handle(HeadFinished(2, (t(4),)), 0.0) == [LapEnded(2, 0, LapKind.DECODE, 0, 1, False),
                                                       EmitToken(0, "g", 2, t(4)), Draft(1, 0, 5, (), 2)]
