"""The queue rules `splitroom serve` relies on, in the sans-IO scheduler (zero-time
harness): a withdrawn question frees its place; withdrawing the active one ends it and
the next begins with the same greedy answer as if it had been asked alone."""

from __future__ import annotations

from planner.deal import Deal, Stage
from planner.protocol import AnswerDone, BeginAnswer, QuestionWithdrawn, Refuse
from planner.scheduler import MAX_WAITING, MAX_WAITING_PER_DEVICE, SchedulerConfig
from tests.harness import Harness, truth

DEAL = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2), Stage("w", 2, 4)), guests=(), fits=True, notes=())
CFG = SchedulerConfig(hidden=4, prefill_chunk=4)


def _asked(hz: Harness, qid: int, device: str, prompt_len: int = 3, max_new: int = 4) -> list:
    from planner.protocol import QuestionAsked
    return hz.chain.handle(QuestionAsked(qid, device, tuple(truth(p) for p in range(prompt_len)), max_new), 0.0)


def test_a_withdrawn_waiting_question_frees_its_place():
    hz = Harness(DEAL, CFG)
    _asked(hz, 0, "api:a")  # answered now
    assert _asked(hz, 1, "api:b") == [] and _asked(hz, 2, "api:b") == []  # two waiting: b's limit
    third = _asked(hz, 3, "api:b")
    assert [type(c) for c in third] == [Refuse] and f"{MAX_WAITING_PER_DEVICE} questions waiting" in third[0].reason
    assert hz.chain.handle(QuestionWithdrawn(1), 0.0) == [Refuse(1, "api:b", "withdrawn by the asker")]
    assert _asked(hz, 4, "api:b") == []  # the place is free again
    assert [w.question_id for w in hz.host.queue] == [2, 4]
    assert hz.chain.handle(QuestionWithdrawn(99), 0.0) == []  # unknown: nothing


def test_the_queue_holds_ten_whoever_withdraws():
    hz = Harness(DEAL, CFG)
    _asked(hz, 0, "api:0")
    for i in range(1, MAX_WAITING + 1):
        assert _asked(hz, i, f"api:{i}") == []
    full = _asked(hz, 100, "api:x")
    assert isinstance(full[0], Refuse) and full[0].reason.startswith("queue full")
    hz.chain.handle(QuestionWithdrawn(5), 0.0)
    assert _asked(hz, 101, "api:x") == [] and len(hz.host.queue) == MAX_WAITING


def test_withdrawing_the_active_question_ends_it_and_the_next_answers_alone():
    hz = Harness(DEAL, CFG)
    hz.ask(0, "api:a", 5, 6)
    hz.ask(1, "api:b", 5, 6)
    for _ in range(12):  # part of question 0's answer (both asked, prefill under way)
        hz.step()
    assert 0 not in hz.ended()
    n = len(hz.log)
    hz.dispatch(QuestionWithdrawn(0))
    cmds = hz.log[n + 1:]
    done = [c for c in cmds if isinstance(c, AnswerDone)]
    assert done and done[0].question_id == 0 and done[0].reason == "withdrawn"
    assert any(isinstance(c, BeginAnswer) and c.question_id == 1 for c in cmds)
    hz.run()
    alone = Harness(DEAL, CFG)
    alone.ask(1, "api:b", 5, 6)
    alone.run()
    assert hz.answers()[1] == alone.answers()[1] == [truth(p) for p in range(5, 11)]
    assert hz.ended() == {0: "answered", 1: "answered"}
