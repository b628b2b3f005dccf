"""Questions longer than the cache (issue 11): the host refuses a question whose prompt
+ max new tokens does not fit the context, naming the lengths, and answers the next;
verify laps never reach past the last position of the cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.deal import Deal, Stage
from planner.protocol import Refuse, RunStage
from planner.scheduler import HostScheduler, SchedulerConfig
from planner.protocol import QuestionAsked
from tests.harness import Harness, truth


def two_stages() -> Deal:
    return Deal(host="h", split="speed", stages=(Stage("h", 0, 2), Stage("w", 2, 4)), guests=(), fits=True,
                notes=())


def test_too_long_is_refused_with_its_lengths_and_the_next_is_answered():
    h = Harness(two_stages(), SchedulerConfig(hidden=8, prefill_chunk=4, context=48))
    h.ask(0, "h", prompt_len=47, max_new=5)   # 52 positions > 48
    h.ask(1, "h", prompt_len=10, max_new=6)   # 16 positions
    h.run()
    ended = h.ended()
    assert ended[0].startswith("refused: ")
    for part in ("47", "5", "48"):
        assert part in ended[0]
    assert ended[1] == "answered"
    assert h.answers()[1] == [truth(10 + i) for i in range(6)]
    assert 0 not in h.answers()
    # the refused question never reached a stage
    assert all(c.question_id == 1 for c in h.log if isinstance(c, RunStage))


def test_exactly_full_fits():
    h = Harness(two_stages(), SchedulerConfig(hidden=8, prefill_chunk=4, context=16))
    h.ask(0, "h", prompt_len=10, max_new=6)  # 10 + 6 = 16: the last token is never fed back
    h.run()
    assert h.ended() == {0: "answered"}
    last = max(c.first_pos + c.tokens for c in h.log if isinstance(c, RunStage))
    assert last == 15  # positions 0..14 used: 10 prompt + 5 fed-back answer tokens


def test_refused_while_another_is_answered():
    s = HostScheduler(two_stages(), SchedulerConfig(hidden=8, context=20))
    assert not any(isinstance(c, Refuse) for c in s.handle(QuestionAsked(0, "h", (5,) * 4, 4), 0.0))
    cmds = s.handle(QuestionAsked(1, "g", (5,) * 19, 2), 0.0)
    assert cmds == [Refuse(1, "g", "does not fit the context: a prompt of 19 tokens + 2 answer tokens "
                                   "> 20 positions")]
    assert len(s.queue) == 0


def test_no_context_means_no_limit():
    h = Harness(two_stages(), SchedulerConfig(hidden=8, prefill_chunk=8))
    h.ask(0, "h", prompt_len=300, max_new=3)
    h.run()
    assert h.ended() == {0: "answered"}


@settings(max_examples=150, deadline=None)
@given(context=st.integers(2, 40), prompt=st.integers(1, 30), max_new=st.integers(1, 20),
       k=st.integers(1, 6), laps=st.integers(1, 4), accept=st.integers(0, 6), order=st.integers(0, 5))
def test_speculative_laps_stay_inside_the_cache(context, prompt, max_new, k, laps, accept, order):
    """Any draft length, async laps and acceptance: no stage is asked for a position at
    or past ``context``; a question that fits is answered with the greedy tokens."""
    h = Harness(two_stages(), SchedulerConfig(hidden=8, prefill_chunk=4, draft_tokens=k, async_laps=laps,
                                              context=context), accept=lambda kk: accept)
    h.ask(0, "h", prompt_len=prompt, max_new=max_new)
    h.run(choose=lambda n: order % n)
    fits = prompt + max_new <= context
    assert h.ended()[0] == "answered" if fits else h.ended()[0].startswith("refused: does not fit")
    for c in h.log:
        if isinstance(c, RunStage):
            assert c.first_pos + c.tokens <= context, (c, context)
    if fits:
        assert h.answers()[0] == [truth(prompt + i) for i in range(max_new)]


def test_context_below_one_is_an_error():
    with pytest.raises(ValueError):
        SchedulerConfig(hidden=8, context=0)
