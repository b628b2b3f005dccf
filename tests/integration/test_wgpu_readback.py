"""Read-backs of the wgpu backend: each one waits for its own submission (its submission index),
with later submissions still queued, and reads that submission's bytes; on lavapipe in CI."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends.base import StageSpec
from runtime.config import ModelConfig
from tests.wgpu_models import random_checkpoint

wgpu_backend = pytest.importorskip("runtime.backends.wgpu_backend")
pytestmark = pytest.mark.slow

CFG = ModelConfig(n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=256, rope_theta=10000.0, rms_eps=1e-5)


@pytest.fixture(scope="module")
def stage():
    try:
        return wgpu_backend.WgpuStage(CFG, StageSpec(0, 1, True), random_checkpoint(CFG, 3), max_ctx=16)
    except wgpu_backend.WgpuUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("mode", ["index", "map"])
def test_each_read_gets_its_own_submission_while_later_ones_are_queued(stage, mode):
    """Five submissions each copy a different pattern through one source buffer into their own
    mappable buffer; all five are submitted before the first is read. Every read must give the
    pattern written before its own submission (queue order: a write_buffer lands before the next
    submit), in both wait modes, and the submission indices must increase."""
    import wgpu

    U = wgpu.BufferUsage
    dev, n = stage.device, 5
    src = dev.create_buffer(size=256, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    ring = [dev.create_buffer(size=256, usage=U.MAP_READ | U.COPY_DST) for _ in range(n)]
    want = [np.arange(64, dtype=np.uint32) * 7 + 1000 * k for k in range(n)]
    stage.wait_mode = mode
    try:
        indices = []
        for k in range(n):
            dev.queue.write_buffer(src, 0, want[k])
            enc = dev.create_command_encoder()
            enc.copy_buffer_to_buffer(src, 0, ring[k], 0, 256)
            indices.append(stage._submit([enc.finish()]))
        assert indices == sorted(indices) and len(set(indices)) == n
        for k in range(n):
            head, tail = stage._read_after(ring[k], indices[k], [(0, 16), (128, 128)])
            assert np.array_equal(np.frombuffer(head, np.uint32), want[k][:4])
            assert np.array_equal(np.frombuffer(tail, np.uint32), want[k][32:])
        # a buffer read once maps again (it was unmapped)
        (again,) = stage._read_after(ring[0], indices[0], [(0, 256)])
        assert np.array_equal(np.frombuffer(again, np.uint32), want[0])
    finally:
        stage.wait_mode = "index"


def test_wait_setting():
    assert wgpu_backend.wait_setting("index") == "index"
    assert wgpu_backend.wait_setting("") == "index"
    assert wgpu_backend.wait_setting(" map ") == "map"
    with pytest.raises(ValueError, match="SPLITROOM_WGPU_WAIT='poll': expected index or map"):
        wgpu_backend.wait_setting("poll")
