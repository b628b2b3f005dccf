"""splitroom sweep on Ray (issue 14): a local Ray instance started by the test runs the
same combinations as the process pool and gives identical rows, in the same order."""

from __future__ import annotations

import pytest
import ray

from splitroom.sweep import combinations, run_sweep


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_sweep_equals_the_process_pool(local_ray):
    combos = combinations(["network.rtt=1ms,40ms", "decoding.async_laps=1,2"])
    base = ["decoding.speculative={drafter: ngram, draft_tokens: 3, acceptance: 0.6}",
            "devices[0].price={per_hour: 1.5 USD}"]
    pool = run_sweep("scenarios/home.yaml", base, combos, jobs=2)
    on_ray = run_sweep("scenarios/home.yaml", base, combos, executor="ray")
    assert ray.is_initialized()  # it used the instance this test started and left it running
    assert on_ray == pool
    assert len(pool) == 4 and all(r["error"] is None and r["answered"] == r["questions"] for r in pool)
    assert all(r["usd_per_million_tokens"] is not None for r in pool)


def test_a_bad_combination_is_a_row_with_its_error_on_ray_too(local_ray):
    combos = combinations(["workload.answer_tokens=8,100000"])
    rows = run_sweep("scenarios/home.yaml", ["context=64"], combos, executor="ray")
    assert rows == run_sweep("scenarios/home.yaml", ["context=64"], combos, jobs=1)
    assert rows[0]["error"] is None and rows[1]["error"]
