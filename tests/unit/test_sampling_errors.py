"""planner.sampling.Sampling refuses each bad field with a one-line message naming it
(the API's 400 passes the message on): one case per rule of the OpenAI parameters'
ranges that the room honours (temperature >= 0, top_p in (0, 1], top_k >= 0, an
integer seed). A mutant that blanks any message (``ValueError(None)``) fails here."""

from __future__ import annotations

import math

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
