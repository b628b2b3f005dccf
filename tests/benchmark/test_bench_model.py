"""Real-model speed: decode tokens/s, ms per layer, prefill tokens/s, per backend.

Run: ``.venv/bin/python -m pytest tests/benchmark/test_bench_model.py --benchmark-enable``.
Without ``--benchmark-enable`` (the default addopts) each body runs once, as a smoke test.
``extra_info`` carries the derived numbers (tok/s, ms/layer); docs/benchmarks.md records them.
``make test`` leaves this file out (speed only: tests/benchmark/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends import StageSpec, make_stage
from runtime.weights import ensure_safetensors

pytestmark = pytest.mark.slow

PROMPT_LEN = 8


@pytest.fixture(scope="module", params=["numpy", "wgpu"])
def stage(request):
    return make_stage(request.param, ensure_safetensors(), StageSpec(0, 30, host=True), max_ctx=512)


def _prime(stage):
    stage.rollback(0)
    ids = np.random.default_rng(0).integers(3, stage.cfg.vocab, PROMPT_LEN).tolist()
    return stage.embed_forward(ids, 0)


def test_decode_step(benchmark, stage):
    """One greedy decode step on one device: head + argmax + embed + 30 layers (one submit on wgpu)."""
    h = _prime(stage)

    def step():
        stage.rollback(PROMPT_LEN)
        return stage.head_embed_forward(h, PROMPT_LEN)

    tok, out = benchmark.pedantic(step, rounds=5 if stage.__class__.__name__ == "WgpuStage" else 30, iterations=1, warmup_rounds=1)
    assert out.dtype == np.float32 and 0 <= tok < stage.cfg.vocab
    if benchmark.stats:
        benchmark.extra_info["decode_tok_per_s"] = 1.0 / benchmark.stats.stats.mean


def test_forward_one_token_per_layer(benchmark, stage):
    """One-token forward through all 30 layers (no head); ms per layer = mean / 30."""
    _prime(stage)
    x = np.random.default_rng(1).standard_normal((1, 576)).astype(np.float32)

    def fwd():
        stage.rollback(PROMPT_LEN)
        return stage.forward(x, PROMPT_LEN)

    out = benchmark.pedantic(fwd, rounds=5 if stage.__class__.__name__ == "WgpuStage" else 30, iterations=1, warmup_rounds=1)
    assert out.dtype == np.float32
    if benchmark.stats:
        benchmark.extra_info["ms_per_layer"] = benchmark.stats.stats.mean * 1e3 / 30


def test_prefill_chunk16(benchmark, stage):
    """A 16-token prefill chunk (the room's default) from position 0."""
    ids = np.random.default_rng(2).integers(3, stage.cfg.vocab, 16).tolist()

    def pre():
        stage.rollback(0)
        return stage.embed_forward(ids, 0)

    out = benchmark.pedantic(pre, rounds=3 if stage.__class__.__name__ == "WgpuStage" else 20, iterations=1, warmup_rounds=1)
    assert out.shape == (16, 576)
    if benchmark.stats:
        benchmark.extra_info["prefill_tok_per_s"] = 16 / benchmark.stats.stats.mean
