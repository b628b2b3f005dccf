"""Simulator speed: a six-device WAN room, speculation on, async_laps 4, 10,000 answer
tokens. Goal: at least 20,000 simulated tokens per second of wall time on one core
(docs/benchmarks.md records what it does). Two figures: a run that keeps only the
metrics (``simulate`` without --trace/--plot, ``sweep``), and one that keeps the trace."""

import pytest

from sim.driver import simulate
from splitroom.scenario import load


@pytest.mark.parametrize("keep_trace", [False, True], ids=["metrics-only", "with-trace"])
def test_bench_wan_room_10k_tokens(benchmark, keep_trace):
    scn = load("scenarios/wan_glm.yaml", [
        "decoding.speculative={drafter: model, draft_tokens: 4, acceptance: 0.8, draft_cost: 13 ms}",
        "decoding.async_laps=4", "decoding.return=direct", "workload.answer_tokens=10000",
        "context=10240"])  # prompt 128 + 10,000 answer tokens must fit the context
    result = benchmark.pedantic(simulate, args=(scn,), kwargs={"trace": keep_trace}, rounds=5, iterations=1)
    assert result.metrics["tokens"] == 10000
    if benchmark.stats is not None:  # None when run with --benchmark-disable (the test suite)
        benchmark.extra_info["simulated_tokens_per_wall_s"] = 10000 / benchmark.stats.stats.median
