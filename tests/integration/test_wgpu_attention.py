"""The one-token attention kernels of runtime/backends/wgsl.py against softmax attention in numpy
(float64), on lavapipe in CI: causal GQA over a cache of ``T`` positions, with and without a
sliding window, for the chunked kernel and the key-group kernel (every keys-a-round count tried)."""

from __future__ import annotations

import math

import numpy as np
import pytest

wgpu_backend = pytest.importorskip("runtime.backends.wgpu_backend")

from runtime.backends import wgsl  # noqa: E402
from tests.wgpu_models import run_compute  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def device():
    try:
        adapter, dev = wgpu_backend.get_device()
    except wgpu_backend.WgpuUnavailable as e:
        pytest.skip(str(e))
    if "subgroup" not in dev.features:
        pytest.skip("adapter without subgroup operations")
    return dev


def reference(q, k, v, T: int, window: int) -> np.ndarray:
    """``softmax(q_h . K_j / sqrt(D)) V_j`` over keys ``j < T`` (the last ``window`` if > 0), each
    query head ``h`` reading KV head ``h // (NH / KV)``; float64. q ``[NH, D]``, k/v ``[ctx, KV, D]``."""
    NH, D = q.shape
    KV = k.shape[1]
    lo = T - window if 0 < window < T else 0
    out = np.empty((NH, D))
    for h in range(NH):
        kh, vh = k[lo:T, h // (NH // KV)].astype(np.float64), v[lo:T, h // (NH // KV)].astype(np.float64)
        s = kh @ q[h].astype(np.float64) / math.sqrt(D)
        p = np.exp(s - s.max())
        out[h] = p @ vh / p.sum()
    return out


def run(device, src: str, q, k, v, T: int) -> np.ndarray:
    NH, D = q.shape
    bufs = {0: q.astype(np.float32), 1: k.astype(np.float32), 2: v.astype(np.float32),
            4: np.array([1, T - 1, 0, 0], np.uint32)}
    return run_compute(device, src, bufs, 3, NH * D * 4, NH, uniform=frozenset({4})).reshape(NH, D)


# (head dim, keys a round; 0 = the chunked kernel): D = 128 gives 8 lanes a key group with 4 vec4s
# each, D = 64 8 lanes with 2, D = 16 4 lanes with 1
FORMS = [(128, 0), (128, 1), (128, 2), (128, 4), (64, 3), (16, 2)]


@pytest.mark.parametrize("D,keys", FORMS)
@pytest.mark.parametrize("T,window", [(1, 0), (5, 0), (70, 0), (300, 0), (300, 16), (9, 16)])
def test_one_token_attention_matches_numpy(device, D, keys, T, window):
    NH, KV, ctx = 6, 2, 320
    rng = np.random.default_rng(T + D + keys)
    q = rng.standard_normal((NH, D)) * 2.0  # scores spread over several units: the softmax is not flat
    k, v = rng.standard_normal((ctx, KV, D)), rng.standard_normal((ctx, KV, D))
    if keys:
        src = wgsl.attention_groups_src(NH, KV, D, 64, keys, window)
    else:
        src = wgsl.attention1_src(NH, KV, D, 64, 128, window)  # chunks of 128: 300 keys take three
    got = run(device, src, q, k, v, T)
    np.testing.assert_allclose(got, reference(q, k, v, T, window), rtol=0, atol=2e-5)
