"""Sampling with the bundled SmolLM2: ``splitroom generate --temperature --seed`` and
the scheduler's room (split, with speculation) give the answer the seed stands for,
computed independently (tests/sampled.py), and greedy stays greedy."""

from __future__ import annotations

import io

import pytest

from planner.sampling import Sampling
from runtime.backends import StageSpec, make_stage
from tests.local_room import LocalRoom, chain_deal, scheduler_config
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors
from splitroom.generate_cmd import run_generate
from tests.sampled import sampled_reference

pytestmark = pytest.mark.slow

PROMPT = "Write a haiku about rain."
MAX_NEW = 14


@pytest.fixture(scope="module")
def want():
    return sampled_reference(PROMPT, 0.8, 3, MAX_NEW)


def test_generate_with_a_seed_gives_the_seeds_answer_split_or_not(want):
    tok = ChatTokenizer.from_dir(ensure_safetensors())
    for layers in (None, "1-13"):
        out, err = io.StringIO(), io.StringIO()
        assert run_generate(PROMPT, layers=layers, max_new_tokens=MAX_NEW, temperature=0.8, seed=3, out=out,
                            err=err) == 0
        text, footer = out.getvalue().rsplit("-- ", 1)
        assert text == tok.decode(want) + "\n"
        assert "sampled, seed 3" in footer


def test_room_with_speculation_samples_the_seeds_answer(want):
    md = ensure_safetensors()
    tok = ChatTokenizer.from_dir(md)
    ranges = [("host", 0, 11), ("w1", 11, 30)]
    stages = {n: make_stage("numpy", md, StageSpec(a, b, host=(n == "host"))) for n, a, b in ranges}
    room = LocalRoom(stages, chain_deal("host", ranges),
                     scheduler_config(576, draft_tokens=3, sampling=Sampling(temperature=0.8, seed=3)))
    room.ask(0, tok.encode_chat(PROMPT), MAX_NEW)
    assert room.run()[0] == want
    assert any(type(o).__name__ == "LapEnded" and o.drafted for _, o in room.trace)
