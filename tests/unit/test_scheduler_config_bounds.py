"""SchedulerConfig's checks at their edges: each bound taken alone, the value at the bound
accepted and one past it refused with the message a caller reads, a plain return path
converted to its enum. The bounds are the attribute docs' (planner/scheduler/config.py):
hidden, prefill_chunk and async_laps >= 1, draft_tokens >= 0, questions_in_flight 1 ..
MAX_SLOTS, context >= 1 or None, a draft policy's max_draft_tokens equal to draft_tokens."""

from __future__ import annotations

import pytest

from planner.draft_policy import DraftPolicy
from planner.frames import MAX_SLOTS
from planner.protocol import ReturnPath
from planner.scheduler.config import SchedulerConfig

RANGE_MSG = "prefill_chunk, async_laps and hidden must be >= 1 and draft_tokens >= 0"


def _refused(**kw) -> str:
    with pytest.raises(ValueError) as e:
        SchedulerConfig(**({"hidden": 8} | kw))
    return str(e.value)


@pytest.mark.parametrize("field,bad", [("prefill_chunk", 0), ("async_laps", 0), ("draft_tokens", -1), ("hidden", 0)])
def test_each_lower_bound_alone_is_refused_with_the_one_message(field, bad):
    # one field out of range, every other at its default: each condition counts alone
    assert _refused(**{field: bad}) == RANGE_MSG


def test_the_smallest_allowed_values_are_accepted():
    cfg = SchedulerConfig(hidden=1, prefill_chunk=1, async_laps=1, draft_tokens=0, context=1,
                          questions_in_flight=MAX_SLOTS)
    assert (cfg.hidden, cfg.context, cfg.questions_in_flight) == (1, 1, MAX_SLOTS)


def test_questions_in_flight_outside_one_to_max_slots_is_refused():
    assert _refused(questions_in_flight=0) == f"questions_in_flight must be 1-{MAX_SLOTS}, got 0"
    assert _refused(questions_in_flight=MAX_SLOTS + 1) == \
        f"questions_in_flight must be 1-{MAX_SLOTS}, got {MAX_SLOTS + 1}"


def test_a_context_below_one_position_is_refused():
    assert _refused(context=0) == "context must be >= 1 position or None, got 0"
    assert SchedulerConfig(hidden=8, context=None).context is None


def test_a_plain_return_path_becomes_the_enum_and_an_unknown_one_is_refused():
    cfg = SchedulerConfig(hidden=8, return_path="via_stages")
    # ReturnPath is a StrEnum, so == "via_stages" holds for the plain string too: the type is the check
    assert type(cfg.return_path) is ReturnPath and cfg.return_path is ReturnPath.VIA_STAGES
    assert _refused(return_path="sideways") == "return_path must be direct or via_stages, got 'sideways'"


def test_sampling_that_is_not_a_sampling_is_refused_naming_its_type():
    assert _refused(sampling="greedy") == "sampling must be a planner.sampling.Sampling, got str"


def test_a_draft_policy_of_another_length_is_refused():
    pol = DraftPolicy(lap_s=(0.1, 0.11, 0.12, 0.13), prior=(0.8, 0.8, 0.8))  # up to 3 drafts
    assert SchedulerConfig(hidden=8, draft_tokens=3, draft_policy=pol).draft_policy is pol
    assert _refused(draft_tokens=4, draft_policy=pol) == "draft_policy chooses up to 3 drafts, draft_tokens is 4"
