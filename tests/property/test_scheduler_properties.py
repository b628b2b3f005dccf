"""Scheduler state-machine properties under random rooms, questions, acceptance and
delivery orders (hypothesis). Any order a room can produce is allowed: each device's
work and each link keep FIFO order, everything else interleaves freely."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.deal import Deal, Stage
from planner.protocol import AnswerDone, DeviceLost, EmitToken, QuestionAsked, Refuse
from planner.scheduler import MAX_WAITING, MAX_WAITING_PER_DEVICE, SchedulerConfig
from tests.harness import Harness, truth


@st.composite
def rooms(draw):
    n_stages = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_stages, max_size=n_stages))
    coordinator = draw(st.booleans()) and n_stages > 1
    names = [f"s{i}" for i in range(n_stages)]
    host = "c" if coordinator else names[0]
    at, stages = 0, []
    for n, s in zip(names, sizes):
        stages.append(Stage(n, at, at + s))
        at += s
    deal = Deal(host=host, split="pinned", stages=tuple(stages), guests=(), fits=True, notes=())
    k = draw(st.sampled_from([0, 0, 1, 2, 4]))
    config = SchedulerConfig(
        hidden=4, prefill_chunk=draw(st.integers(1, 6)), draft_tokens=k,
        async_laps=draw(st.integers(1, 4)) if k else 1,
        return_path=draw(st.sampled_from(["direct", "via_stages"])),
        phones=frozenset(draw(st.sets(st.sampled_from(names)))),
        eos_token=draw(st.sampled_from([None, None, truth(9)])))
    return deal, config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(room=rooms(), data=st.data())
def test_any_event_order_answers_every_question_with_the_greedy_tokens(room, data):
    deal, config = room
    accepts = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=20))
    counter = iter(range(10**9))
    h = Harness(deal, config, accept=lambda k: accepts[next(counter) % len(accepts)])
    questions = data.draw(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "s0"]), st.integers(0, 8),
                                             st.integers(0, 12)), min_size=1, max_size=14))
    for qid, (dev, plen, max_new) in enumerate(questions):
        h.ask(qid, dev, plen, max_new)
    lose = data.draw(st.sampled_from([None, None, None, "s0", "a"]))
    lose_at = data.draw(st.integers(0, 200))
    choices = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=64))
    steps = 0
    while h.pending():
        if lose is not None and steps == lose_at:
            h.dispatch(DeviceLost(lose, "test"))
        h.step(choices[steps % len(choices)])
        steps += 1
        assert steps < 100_000
    ended = h.ended()
    # every question ends answered or refused, exactly once
    assert set(ended) == set(range(len(questions)))
    # and each end is the one product page 001's queue rule gives, replayed from the log
    # on its own: a question is refused only for a reason it has
    _check_ends_against_the_queue_rule(h.log, ended)
    ends = [x for x in h.log if type(x).__name__ in ("AnswerDone", "Refuse")]
    assert len(ends) == len(questions)
    # the queue limits hold at every step
    assert h.max_waiting_seen <= MAX_WAITING
    assert h.max_waiting_per_device_seen <= MAX_WAITING_PER_DEVICE
    # every answered question got exactly the greedy tokens: speculation never changes the text
    answers = h.answers()
    for qid, (dev, plen, max_new) in enumerate(questions):
        toks = answers.get(qid, [])
        ref = [truth(plen + i) for i in range(max_new)]
        if config.eos_token is not None and config.eos_token in ref:
            ref = ref[:ref.index(config.eos_token)]
        assert toks == ref[:len(toks)]
        if ended[qid] == "answered":
            assert toks == ref
    # tokens emitted equal tokens accepted: each emit is counted once, indices in order
    emits = [x for x in h.log if isinstance(x, EmitToken)]
    assert h.host.emitted == len(emits)
    for qid, toks in answers.items():
        idx = [x.index for x in emits if x.question_id == qid]
        assert idx == list(range(len(toks)))
    # nothing the machines ignored was a driver's mistake (the reasons: planner.protocol.IgnoreReason)
    assert not [x for x in h.ignored if x.reason == "bug"]


def _check_ends_against_the_queue_rule(log: list, ended: dict[int, str]) -> None:
    """Replay the asks in ``log`` against the queue rule of product page 001, kept here
    apart from the scheduler: one question answered at a time, up to MAX_WAITING waiting,
    at most MAX_WAITING_PER_DEVICE waiting per asker; an empty prompt or a request for no
    tokens refused. Until a device is lost, each question must end as the rule says
    (answered, or refused with the rule's reason); after a loss only "left the room"
    reasons may refuse a question the rule took. A scheduler that refuses questions it
    should answer fails here, where ``toks == ref[:len(toks)]`` alone holds for ``[]``."""
    in_room: list[QuestionAsked] = []  # accepted and not yet ended, oldest (the active one) first
    lost = False
    for x in log:
        if isinstance(x, DeviceLost):
            lost = True
        elif isinstance(x, (AnswerDone, Refuse)):
            in_room = [q for q in in_room if q.question_id != x.question_id]
        elif isinstance(x, QuestionAsked) and not lost:
            got = ended[x.question_id]
            waiting = in_room[1:]
            if not x.prompt:
                want = "refused: empty prompt"
            elif x.max_new_tokens < 1:
                want = "refused: asks for no answer tokens"
            elif in_room and len(waiting) >= MAX_WAITING:
                want = "refused: queue full"
            elif in_room and sum(1 for q in waiting if q.device == x.device) >= MAX_WAITING_PER_DEVICE:
                want = f"refused: {x.device} already has {MAX_WAITING_PER_DEVICE} questions waiting"
            else:
                in_room.append(x)
                want = "answered"
            if want == "answered":
                assert got == "answered" or (any(isinstance(y, DeviceLost) for y in log)
                                             and "left the room" in got), (x, got)
            else:
                assert got.startswith(want), (x, got, want)
