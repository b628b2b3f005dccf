"""Models whose layers differ in size (``layer_bytes`` as a list, issue 12): a stage's
memory-bound time follows the bytes its own layers hold, not layers x the mean size.
Hand calculation: layers of 3, 1, 1, 1 GiB (mean 1.5 GiB), no KV cache, 100 GB/s, compute
far above the memory bound; device ``a`` holds layer 1 (3 GiB), ``b`` layers 2-4 (3 GiB):
a one-token decode pass reads 3 GiB on each, 3 x 2^30 / 1e11 = 32.2 ms -- not 1.5 GiB on
``a`` and 4.5 GiB on ``b`` as with every layer at the mean."""

from __future__ import annotations

import pytest

from sim.devices import DeviceModel
from sim.driver import simulate
from splitroom.scenario import from_mapping

GiB = 2**30
BW = 100e9
SCN = {"model": {"name": "uneven", "layers": 4, "hidden": 64, "kv_bytes_per_token": "0 B",
                 "layer_bytes": ["3 GiB", "1 GiB", "1 GiB", "1 GiB"]},
       "devices": [{"id": "a", "lends": "10 GiB", "memory_bandwidth": "100 GB/s", "compute": "1000 TFLOPS"},
                   {"id": "b", "lends": "10 GiB", "memory_bandwidth": "100 GB/s", "compute": "1000 TFLOPS"}],
       "host": "a", "stages": [{"device": "a", "layers": "1"}, {"device": "b", "layers": "2-4"}],
       "network": {"rtt": "1 ms"}, "workload": {"questions": 1, "prompt_tokens": 16, "answer_tokens": 20}}


def test_the_device_model_reads_the_stage_bytes():
    scn = from_mapping(SCN)
    assert scn.model.layer_bytes == 1.5 * GiB and scn.model.layer_sizes == (3 * GiB, GiB, GiB, GiB)
    dm = DeviceModel(scn.device("b"), scn.model)
    assert dm.stage_scale(1, 4) == pytest.approx(3 / 4.5)
    assert dm.stage_scale(0, 1) == pytest.approx(3 / 1.5)
    assert dm.pass_s(3, 1, 0, dm.stage_scale(1, 4)) == pytest.approx(3 * GiB / BW)
    assert dm.pass_s(1, 1, 0, dm.stage_scale(0, 1)) == pytest.approx(3 * GiB / BW)
    assert dm.pass_s(3, 1, 0) == pytest.approx(4.5 * GiB / BW)  # what every-layer-at-the-mean gives


def test_simulated_stage_times_follow_the_layer_sizes():
    res = simulate(from_mapping(SCN), trace=False)
    stage = {r["part"]: r["mean_s"] for r in res.metrics["breakdown"] if r["kind"] == "stage"}
    assert res.metrics["answered"] == 1
    assert stage["b"] == pytest.approx(3 * GiB / BW, rel=1e-9)  # plain decode: one lap at a time, no queue
    # the host also embeds its one input token (a 2 x hidden byte row): microseconds at most
    assert stage["a"] == pytest.approx(3 * GiB / BW, rel=1e-4)
