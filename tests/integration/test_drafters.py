"""Drafters (ngram, early_exit, model) in the shared scheduler over the real model:
answers equal plain greedy whatever the drafter; better drafters keep more per lap."""

from __future__ import annotations

import pytest

from runtime.backends import StageSpec, make_stage
from runtime.drafters import make_drafter
from runtime.generate import generate_greedy
from tests.local_room import LocalRoom, chain_deal, scheduler_config
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Count from 1 to 8."]
MAX_NEW = 14


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def setup(model_dir):
    tok = ChatTokenizer.from_dir(model_dir)
    prompts = [tok.encode_chat(p) for p in PROMPTS]
    whole = make_stage("numpy", model_dir, StageSpec(0, 30, True))
    ref = []
    for ids in prompts:
        whole.rollback(0)
        ref.append([t for t in generate_greedy([whole], ids, MAX_NEW).ids if t != 2])
    return prompts, ref


@pytest.mark.parametrize("kind", ["ngram", "early_exit", "model"])
def test_every_drafter_gives_the_greedy_answer(model_dir, setup, kind):
    prompts, ref = setup
    drafter = make_drafter(kind, str(model_dir), early_exit_layers=10)
    ranges = [("host", 0, 15), ("w1", 15, 30)]
    stages = {n: make_stage("numpy", model_dir, StageSpec(a, b, host=(n == "host"))) for n, a, b in ranges}
    room = LocalRoom(stages, chain_deal("host", ranges), scheduler_config(576, draft_tokens=3), drafter=drafter)
    for qid, ids in enumerate(prompts):
        room.ask(qid, ids, MAX_NEW)
    answers = room.run()
    assert [answers[i] for i in range(len(prompts))] == ref
    laps = [x for _, x in room.trace if type(x).__name__ == "LapEnded" and x.kind == "verify" and not x.stale]
    per_lap = sum(x.kept for x in laps) / len(laps)
    assert drafter.drafted > 0 and drafter.cost_s_per_token >= 0
    if kind == "model":
        # the float16-rounded copy of the same model agrees almost always: near k+1 per lap
        assert per_lap > 3.0
    assert per_lap >= 1.0
