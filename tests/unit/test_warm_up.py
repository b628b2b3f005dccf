"""A device runs each lap shape once before it says it is ready (Stage.warm_up): the
warm-up must leave no trace in what the stage computes afterwards. The reference is a
stage of the same weights that was never warmed."""

from __future__ import annotations

import numpy as np
import pytest

from planner.scheduler import SchedulerConfig
from runtime.backends.base import StageSpec
from runtime.backends.numpy_backend import NumpyStage
from runtime.node import lap_rows
from tests.unit.test_sampled_room import TINY, W


@pytest.mark.parametrize("host,start,end", [(True, 0, 2), (False, 2, 4), (True, 0, 0)])
def test_a_warmed_stage_computes_what_a_fresh_one_does(host, start, end):
    fresh = NumpyStage(TINY, StageSpec(start, end, host=host), dict(W), max_ctx=64)
    warmed = NumpyStage(TINY, StageSpec(start, end, host=host), dict(W), max_ctx=64)
    warmed.warm_up((1, 5, 16, 100))  # 100 > max_ctx: skipped
    assert warmed.position == 0
    x = np.random.default_rng(1).standard_normal((7, TINY.hidden)).astype(np.float32)
    a, b = fresh.forward(x, 0), warmed.forward(x, 0)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fresh.forward(a[-1:], 7), warmed.forward(b[-1:], 7))
    if host:
        np.testing.assert_array_equal(fresh.head(a), warmed.head(b))


@pytest.mark.parametrize("host", [True, False])
def test_a_warm_up_runs_each_lap_shape_once(host):
    # rows (1, 5, 16, 100, 5) with max_ctx 64: 100 is skipped and 5 repeated, so forwards of
    # 1, 5 and 16 rows at position 0, in that order, each once; on the host the embedding
    # and the head on as many rows
    st = NumpyStage(TINY, StageSpec(0, 2, host=host), dict(W), max_ctx=64)
    calls = []
    forward, head, embed = st.forward, st.head, st.embed
    st.forward = lambda x, pos: (calls.append(("forward", len(x), pos)), forward(x, pos))[1]
    st.head = lambda h: (calls.append(("head", len(h))), head(h))[1]
    st.embed = lambda ids: (calls.append(("embed", len(ids))), embed(ids))[1]
    st.warm_up((1, 5, 16, 100, 5))
    shape = [[("embed", n), ("forward", n, 0), ("head", n)] if host else [("forward", n, 0)] for n in (1, 5, 16)]
    assert calls == [c for three in shape for c in three]
    assert st.position == 0


def test_a_warm_up_empties_a_cache_that_held_positions():
    st = NumpyStage(TINY, StageSpec(0, 4, host=True), dict(W), max_ctx=64)
    st.forward(st.embed([1, 2, 3]), 0)
    st.warm_up((2,))
    assert st.position == 0


def test_lap_rows_are_a_prefill_chunk_a_verify_lap_and_a_decode_step():
    # by hand: chunk 16, k=4 -> verify 5 rows, decode 1; plain -> {1, 16}; chunk 1 and k=0 -> {1}
    assert lap_rows(SchedulerConfig(hidden=16, prefill_chunk=16, draft_tokens=4)) == (1, 5, 16)
    assert lap_rows(SchedulerConfig(hidden=16, prefill_chunk=16, draft_tokens=0)) == (1, 16)
    assert lap_rows(SchedulerConfig(hidden=16, prefill_chunk=1, draft_tokens=0)) == (1,)
