"""CPU (numpy) figures of issue 14, each next to a same-run limit (runtime/bench.py says how).

Run: ``make bench`` or ``.venv/bin/python -m pytest tests/benchmark/test_bench_cpu.py --benchmark-enable``.
Without ``--benchmark-enable`` each body runs once, untimed, as a smoke test (and the
limit's matrix is small). ``extra_info`` carries the ratios; docs/benchmarks.md records a run.
``make test`` leaves this file out (speed only: tests/benchmark/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends import StageSpec, make_stage
from runtime.bench import _time, mv_limit, weight_bytes
from runtime.precision import Precision
from runtime.weights import ensure_safetensors

pytestmark = pytest.mark.slow

PROMPT = 64


def _median_s(fn, reps=5):
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up (runtime.bench's timer)."""
    return _time(fn, reps)["median"]


@pytest.fixture(scope="module")
def limit_gbps(request):
    on = request.config.getoption("benchmark_enable", False)
    return mv_limit(mib=512 if on else 16, reps=5 if on else 1)["gbps"]


@pytest.fixture(scope="module", params=["f32", "f16", "q8"])
def stage(request):
    st = make_stage("numpy", ensure_safetensors(), StageSpec(0, 30, True), max_ctx=512,
                    precision=Precision(weights=request.param))
    ids = np.random.default_rng(0).integers(3, st.cfg.vocab, PROMPT).tolist()
    st.h0 = st.embed_forward(ids, 0)
    return st


def test_matvec_limit(benchmark):
    """BLAS sgemv over a 512 MiB float32 matrix: the memory-bound limit the others are put against."""
    cols = 4096
    a = np.ones(((512 if benchmark.enabled else 16) * 2**20 // (4 * cols), cols), np.float32)
    x = np.ones(cols, np.float32)
    y = benchmark.pedantic(lambda: a @ x, rounds=7 if benchmark.enabled else 1, iterations=1, warmup_rounds=1)
    assert y[0] == cols
    if benchmark.stats:
        benchmark.extra_info["gbps"] = a.nbytes / 1e9 / benchmark.stats.stats.median


def test_decode_step(benchmark, stage, limit_gbps):
    """One greedy step (head + arg-max + embed + 30 layers) in this weight precision."""
    def step():
        stage.rollback(PROMPT)
        return stage.head_embed_forward(stage.h0, PROMPT)

    tok, out = benchmark.pedantic(step, rounds=20 if benchmark.enabled else 1, iterations=1, warmup_rounds=1)
    assert 0 <= tok < stage.cfg.vocab and out.dtype == np.float32
    if benchmark.stats:
        s = benchmark.stats.stats.median
        benchmark.extra_info["tok_s"] = 1.0 / s
        benchmark.extra_info["of_limit"] = weight_bytes(stage) / (limit_gbps * 1e9) / s


@pytest.mark.parametrize("k", [4, 8])
def test_verify_pass_over_one_token(benchmark, stage, k):
    """A verify pass of k+1 positions through 30 layers; extra_info: its time over a one-token pass."""
    x = np.random.default_rng(1).standard_normal((k + 1, stage.cfg.hidden)).astype(np.float32)

    def fwd(n=k + 1):
        stage.rollback(PROMPT)
        return stage.forward(x[:n], PROMPT)

    out = benchmark.pedantic(fwd, rounds=10 if benchmark.enabled else 1, iterations=1, warmup_rounds=1)
    assert out.shape == (k + 1, stage.cfg.hidden)
    if benchmark.stats:
        benchmark.extra_info["over_one_token"] = benchmark.stats.stats.median / _median_s(lambda: fwd(1))


@pytest.mark.parametrize("rows", [1, 5])
def test_head_rows(benchmark, stage, rows, limit_gbps):
    """The output head (final norm + [49152, 576] product) over ``rows`` rows; extra_info: the
    share of the limit (head bytes / limit / time)."""
    x = np.random.default_rng(2).standard_normal((rows, stage.cfg.hidden)).astype(np.float32)
    out = benchmark.pedantic(lambda: stage.head(x), rounds=10 if benchmark.enabled else 1, iterations=1,
                             warmup_rounds=1)
    assert out.shape == (rows, stage.cfg.vocab)
    if benchmark.stats:
        benchmark.extra_info["ms"] = benchmark.stats.stats.median * 1e3
        benchmark.extra_info["of_limit"] = stage.lm_head.nbytes / (limit_gbps * 1e9) / benchmark.stats.stats.median
