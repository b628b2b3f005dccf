"""The head's token choice per verify lap (5 rows of SmolLM2's 49,152 logits): argmax
against sampling (temperature, top-k, top-p). Logits are random normal x 3, flatter than
a language model's, so top-p's nucleus is wide: a pessimistic case.

Run: ``.venv/bin/python -m pytest tests/benchmark/test_bench_sampling.py --benchmark-enable``;
docs/benchmarks.md records the figures. ``make test`` leaves this file out (speed only:
tests/benchmark/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.sampling import Sampling, Uniforms, head_tokens

LOGITS = np.random.default_rng(0).standard_normal((5, 49152)).astype(np.float32) * 3
PAIRS = Uniforms(1).pairs(0, 5)


@pytest.mark.parametrize("sampling", [None, Sampling(0.8), Sampling(0.8, top_k=40), Sampling(0.8, top_p=0.9)],
                         ids=["argmax", "temperature", "top_k_40", "top_p_0.9"])
def test_head_tokens_per_lap(benchmark, sampling):
    toks = benchmark.pedantic(head_tokens, args=(LOGITS, sampling, PAIRS), rounds=7, iterations=1, warmup_rounds=1)
    assert len(toks) == 5 and all(0 <= t < 49152 for t in toks)
