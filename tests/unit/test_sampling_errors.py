"""planner.sampling.Sampling refuses each bad field with a one-line message naming it
(the API's 400 passes the message on): one case per rule of the OpenAI parameters'
ranges that the room honours (temperature >= 0, top_p in (0, 1], top_k >= 0, an
integer seed). A mutant that blanks any message (``ValueError(None)``) fails here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.sampling import MAX_SEED, MIN_TEMPERATURE, Sampling


@pytest.mark.parametrize("kw,msg", [
    ({"temperature": -1}, "temperature must be a finite number >= 0, got -1"),
    ({"temperature": math.inf}, "temperature must be a finite number >= 0, got inf"),
    ({"temperature": True}, "temperature must be a finite number >= 0, got True"),
    ({"temperature": "1"}, "temperature must be a finite number >= 0, got '1'"),
    ({"temperature": 5e-324}, f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got 5e-324"),
    ({"top_p": 0}, "top_p must be a number in (0, 1], got 0"),
    ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    ({"top_k": -1}, "top_k must be an integer >= 0, got -1"),
    ({"top_k": 2.0}, "top_k must be an integer >= 0, got 2.0"),
    ({"seed": -1}, f"seed must be an integer 0..{MAX_SEED}, got -1"),
    ({"seed": MAX_SEED + 1}, f"seed must be an integer 0..{MAX_SEED}, got {MAX_SEED + 1}"),
])
def test_each_bad_field_is_refused_with_a_message_naming_it(kw, msg):
    with pytest.raises(ValueError) as e:
        Sampling(**kw)
    assert str(e.value) == msg and "\n" not in str(e.value)


def test_the_edges_of_each_range_are_accepted():
    s = Sampling(temperature=0, top_p=1, top_k=0, seed=0)
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.0, 1.0, 0, 0) and s.greedy
    assert Sampling(temperature=MIN_TEMPERATURE, top_p=1e-9, seed=MAX_SEED).temperature == MIN_TEMPERATURE


def _nucleus_by_full_sort(p: np.ndarray, top_p: float) -> np.ndarray:
    """transformers' TopPLogitsWarper rule on probabilities, with every token sorted:
    ascending order, drop the tokens whose cumulative mass is <= 1 - top_p (the most
    likely always kept), renormalise."""
    order = np.argsort(p, kind="stable")
    drop = np.cumsum(p[order]) <= 1.0 - top_p
    drop[-1] = False
    out = np.zeros_like(p)
    out[order[~drop]] = p[order[~drop]]
    return out / out.sum()


@pytest.mark.parametrize("vocab,alpha,top_p", [(5000, 50.0, 0.9), (49152, 1.0, 0.95), (300, 0.05, 0.5),
                                               (2100, 5.0, 0.999)])
def test_the_nucleus_matches_a_full_sort_when_the_top_256_hold_too_little_mass(vocab, alpha, top_p):
    # a flat distribution: the 256 most likely tokens hold far less than top_p, so the
    # candidate window must grow (256, 2048, ... all); a window that stopped early
    # would keep only its 256
    from planner.sampling import _nucleus
    p = np.random.default_rng(vocab).dirichlet(np.full(vocab, alpha))
    got, want = _nucleus(p, top_p), _nucleus_by_full_sort(p, top_p)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert (got > 0).sum() == (want > 0).sum()


def test_a_boolean_or_text_top_p_is_refused():
    for bad in (True, "0.5"):
        with pytest.raises(ValueError) as e:
            Sampling(temperature=1.0, top_p=bad)
        assert str(e.value) == f"top_p must be a number in (0, 1], got {bad!r}"


def test_integer_temperature_and_top_p_are_kept_as_floats():
    s = Sampling(temperature=1, top_p=1)
    assert type(s.temperature) is float and type(s.top_p) is float
    assert s.to_json() == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None}
