"""A stage's KV cache slots (Stage.use_cache): one cache per question in flight.

Two questions decoded in turns on one stage, each on its own slot (with a rollback of
one while the other's cache is in use), give exactly the greedy tokens each gives
alone on a fresh stage; the reference is runtime.generate.generate_greedy over a stage
that never switches.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.protocol import RollbackKV, RunStage
from runtime.backends import StageSpec, make_stage
from runtime.generate import generate_greedy
from runtime.weights import ensure_safetensors
from runtime.work import run_work

PROMPTS = ([1, 4093, 198, 19556, 17, 2, 198], [1, 520, 9531, 198, 504])
STEPS = 6
LAYERS = 4


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


def _step(stage, slot: int, qid: int, seq: list[int], lap: int) -> int:
    """One lap of question ``qid`` on cache ``slot`` through run_work (as the drivers do)."""
    first = len(seq) - 1 if lap else 0
    inputs = tuple(seq[first:])
    _, out = run_work(stage, RunStage("h", lap, qid, first, len(inputs), inputs, slot), None, None, None)
    return int(np.argmax(stage.head(out[-1:])[0]))


@pytest.mark.parametrize("backend", ["numpy", pytest.param("wgpu", marks=pytest.mark.slow)])
def test_interleaved_questions_on_their_own_caches_answer_as_alone(model_dir, backend):
    # the model's first LAYERS layers and its head: a smaller model, the same code
    alone = [generate_greedy([make_stage(backend, model_dir, StageSpec(0, LAYERS, True), max_ctx=64)], p, STEPS,
                             stop_ids=frozenset()).ids for p in PROMPTS]
    stage = make_stage(backend, model_dir, StageSpec(0, LAYERS, True), max_ctx=64)
    seqs = [list(p) for p in PROMPTS]
    for lap in range(STEPS):
        for slot, seq in enumerate(seqs):
            seq.append(_step(stage, slot, 10 + slot, seq, lap))
        if lap == 2:  # question 0 rolls back two positions while question 1's cache is in use
            run_work(stage, RollbackKV("h", 10, len(seqs[0]) - 3, 0), None, None, None)
            del seqs[0][-2:]
            seqs[0].append(_step(stage, 0, 10, seqs[0], 1))
            seqs[0].append(_step(stage, 0, 10, seqs[0], 1))
    for seq, p, ref in zip(seqs, PROMPTS, alone):
        assert seq[len(p):] == list(ref)


def test_a_new_slot_starts_empty_and_slot_zero_is_the_first_cache(model_dir):
    stage = make_stage("numpy", model_dir, StageSpec(0, 2, True), max_ctx=64)
    stage.embed_forward([1, 2, 3], 0)
    assert stage.position == 3
    stage.use_cache(2)
    assert stage.position == 0
    stage.embed_forward([5], 0)
    stage.use_cache(0)
    assert stage.position == 3
    stage.use_cache(2)
    assert stage.position == 1
    with pytest.raises(ValueError):
        stage.use_cache(-1)
