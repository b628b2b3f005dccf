"""The shared scheduler driving the real model (numpy), every stage in one process:
plain and speculative answers, cut 2 and 3 ways, equal token for token to plain
greedy decoding computed without the scheduler (runtime.generate)."""

from __future__ import annotations

import pytest

from runtime.backends import StageSpec, make_stage
from runtime.generate import generate_greedy
from runtime.local_room import LocalRoom, chain_deal, ngram_draft, scheduler_config
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "List the numbers from 1 to 12, separated by commas.",
    "Write a Python function that returns the square of x.",
    "What is 12 times 7? Answer with the number.",
    "Name three colours of the rainbow, as a bulleted list.",
]
MAX_NEW = 16


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def prompts(model_dir):
    tok = ChatTokenizer.from_dir(model_dir)
    return [tok.encode_chat(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(model_dir, prompts):
    whole = make_stage("numpy", model_dir, StageSpec(0, 30, True))
    out = []
    for ids in prompts:
        whole.rollback(0)
        r = generate_greedy([whole], ids, MAX_NEW).ids
        out.append([t for t in r if t != 2])
    return out


def room(model_dir, cuts, **cfg):
    bounds = (0, *cuts, 30)
    names = ["host"] + [f"w{i}" for i in range(1, len(bounds) - 1)]
    ranges = [(n, a, b) for n, a, b in zip(names, bounds, bounds[1:])]
    stages = {n: make_stage("numpy", model_dir, StageSpec(a, b, host=(n == "host"))) for n, a, b in ranges}
    return LocalRoom(stages, chain_deal("host", ranges), scheduler_config(576, **cfg))


@pytest.mark.parametrize("cuts,cfg", [
    ((13,), {}),
    ((13,), {"draft_tokens": 3}),
    ((9, 21), {"draft_tokens": 4, "async_laps": 2}),
    ((9, 21), {"draft_tokens": 2, "async_laps": 3, "return_path": "via_stages"}),
])
def test_scheduled_answers_equal_plain_greedy(model_dir, prompts, reference, cuts, cfg):
    r = room(model_dir, cuts, **cfg)
    for qid, ids in enumerate(prompts):
        r.ask(qid, ids, MAX_NEW, device=f"asker{qid}")  # one asker each: at most 2 wait per device
    answers = r.run()
    for qid in range(len(prompts)):
        assert answers[qid] == reference[qid], (qid, cfg)
    if cfg.get("draft_tokens"):
        # speculation really happened: some laps kept drafts, some drafts were rejected
        laps = [x for _, x in r.trace if type(x).__name__ == "LapEnded" and x.kind == "verify" and not x.stale]
        assert sum(x.kept for x in laps) > len(laps)
        assert any(x.kept < len(laps) and x.kept <= cfg["draft_tokens"] for x in laps)


def test_ngram_drafter_proposes_the_continuation_of_the_latest_match():
    assert ngram_draft([5, 6, 7, 8, 5, 6], 2) == [7, 8]
    assert ngram_draft([1, 2, 3], 2) == [3, 3]  # nothing repeats: the last token
    # longest suffix [9, 4, 9] matches at 0; what follows is [4, 9], padded with its last
    assert ngram_draft([9, 4, 9, 4, 9], 3) == [4, 9, 9]
