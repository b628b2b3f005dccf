"""Layer ranges composed in sequence, verify batches, rollback: numpy backend on the real model."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends import StageSpec, make_stage
from runtime.backends.base import PositionError
from runtime.generate import generate_greedy
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors

pytestmark = pytest.mark.slow

PROMPT = "Give me two facts about the Moon."


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def prompt_ids(model_dir):
    return ChatTokenizer.from_dir(model_dir).encode_chat(PROMPT)


@pytest.fixture(scope="module")
def whole_ids(model_dir, prompt_ids):
    return generate_greedy([make_stage("numpy", model_dir, StageSpec(0, 30, True))], prompt_ids, 12).ids


@pytest.mark.parametrize("cuts", [(12,), (7, 19), (1, 29)])
def test_cut_model_gives_identical_ids(model_dir, prompt_ids, whole_ids, cuts):
    bounds = (0, *cuts, 30)
    stages = [
        make_stage("numpy", model_dir, StageSpec(a, b, host=(i == 0))) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))
    ]
    assert generate_greedy(stages, prompt_ids, 12).ids == whole_ids


def test_host_with_no_layers(model_dir, prompt_ids, whole_ids):
    stages = [make_stage("numpy", model_dir, StageSpec(0, 0, True)), make_stage("numpy", model_dir, StageSpec(0, 30))]
    assert generate_greedy(stages, prompt_ids, 12).ids == whole_ids


def test_verify_batch_equals_single_steps(model_dir, prompt_ids):
    """k+1 positions in one forward give the logits of k+1 one-token forwards (then rollback)."""
    s = make_stage("numpy", model_dir, StageSpec(0, 30, True))
    s.embed_forward(prompt_ids, 0)
    p = s.position
    draft = [504, 3575, 282, 4649, 314]  # k+1 = 5 tokens
    batch = s.head(s.embed_forward(draft, p))
    assert s.position == p + 5
    s.rollback(p)
    singles = np.concatenate([s.head(s.embed_forward([t], p + i)) for i, t in enumerate(draft)])
    assert batch.dtype == np.float32
    np.testing.assert_allclose(batch, singles, rtol=0, atol=2e-4 * np.abs(singles).max())
    assert (batch.argmax(-1) == singles.argmax(-1)).all()


def test_position_must_match_cache(model_dir):
    s = make_stage("numpy", model_dir, StageSpec(3, 5))
    x = np.zeros((2, 576), np.float32)
    s.forward(x, 0)
    with pytest.raises(PositionError):
        s.forward(x, 0)
    with pytest.raises(PositionError):
        s.rollback(3)
    s.rollback(1)
    assert s.forward(x[:1], 1).shape == (1, 576)
    with pytest.raises(TypeError):
        s.forward(x.astype(np.float64), 2)
    with pytest.raises(RuntimeError):
        s.embed([1])
