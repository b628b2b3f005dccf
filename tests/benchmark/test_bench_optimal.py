"""Benchmark: ``split: optimal`` for 12 devices x 80 layers (issue 12: goal under 1 s).

12 devices is the exact search's limit (Held-Karp over every subset for every host).
Run with ``make bench`` or ``pytest tests/benchmark --benchmark-enable``; with the
default ``--benchmark-disable`` it runs once as a plain test.
"""

from __future__ import annotations

from planner.model import ModelSpec
from planner.optimal import EXACT_MAX_DEVICES, optimal_deal
from planner.room import DealOptions, Device, LinkSpec, Network

GiB = 2**30


def room12() -> tuple[list[Device], Network]:
    """12 measured devices lending 4-15 GiB; every pair its own RTT (1-45 ms)."""
    devs = [Device(f"d{i:02d}", lends_bytes=(4 + i) * GiB, s_per_layer=1e-3 * (1 + (i * 7) % 5))
            for i in range(12)]
    links = tuple(LinkSpec(between=(a.id, b.id), rtt_s=1e-3 * (1 + (i * 13 + j * 7) % 45))
                  for i, a in enumerate(devs) for j, b in enumerate(devs) if i < j)
    return devs, Network(rtt_s=5e-3, hop_overhead_s=3.5e-3, links=links)


MODEL = ModelSpec(id="bench-80", name="bench-80", layers=80, hidden=8192, layer_bytes=GiB,
                  layer_active_bytes=GiB, layer_flops_per_token=0.0, kv_bytes_per_token=0,
                  embedding_bytes=GiB, residual_bytes_per_token=16384)


def test_bench_optimal_12_devices_80_layers(benchmark):
    devs, net = room12()
    assert len(devs) == EXACT_MAX_DEVICES
    d = benchmark(optimal_deal, devs, MODEL, DealOptions(), net)
    assert d.stages[-1].end == 80 and d.predicted["exact"]
