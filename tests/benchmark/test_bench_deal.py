"""Benchmark: a deal for 1,000 devices x 128 layers (issue 2: goal under 10 ms).

Run with ``make bench`` or ``pytest tests/benchmark --benchmark-enable``; with the
default ``--benchmark-disable`` it runs once as a plain test.
"""

from __future__ import annotations

import pytest

from planner.deal import deal
from planner.model import ModelSpec
from planner.room import DealOptions, Device

GiB = 2**30


def big_room(n: int = 1000) -> list[Device]:
    """``n`` devices: a mix of computers and phones, measured and not, lending 0-7.5 GiB."""
    out = []
    for i in range(n):
        kind = "phone" if i % 5 == 0 else "computer"
        ms = None if i % 3 else 1e-3 * (1 + i % 7)
        out.append(Device(id=f"d{i:04d}", kind=kind, lends_bytes=(i % 16) * GiB // 2, s_per_layer=ms,
                          copy_speed_Bps=float(100e9 + (i % 11) * 10e9)))
    return out


MODEL = ModelSpec(id="bench-128", name="bench-128", layers=128, hidden=4096, layer_bytes=GiB,
                  layer_active_bytes=GiB, layer_flops_per_token=0.0, kv_bytes_per_token=0,
                  embedding_bytes=GiB)


@pytest.mark.parametrize("split", ["speed", "memory"])
def test_bench_deal_1000_devices_128_layers(benchmark, split):
    room = big_room()
    opts = DealOptions(split=split)
    d = benchmark(deal, room, MODEL, opts)
    assert d.stages[-1].end == 128
