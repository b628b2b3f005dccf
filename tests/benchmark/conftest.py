"""Which benchmarks ``make test`` runs.

The speed-only benchmarks (:data:`SPEED_ONLY`: numpy and wgpu decode, prefill, the head,
the head's token choice) check nothing but shapes, dtypes and ranges, which the model
tests check against references (tests/integration/test_model_reference.py,
test_model_wgpu.py, tests/unit/test_sampling.py); untimed (``make test`` disables
pytest-benchmark) they measure nothing either. So they are collected only with
``--benchmark-enable`` (``make bench``), or when a file is named on the command line
(``pytest tests/benchmark/test_bench_cpu.py`` runs each body once, untimed). The
benchmarks that also assert a result (a deal covering every layer, the exact optimal
search, 10,000 simulated tokens) stay in ``make test``.
"""

from __future__ import annotations

#: the files whose tests only time (module doc)
SPEED_ONLY = frozenset({"test_bench_cpu.py", "test_bench_model.py", "test_bench_sampling.py"})


def pytest_ignore_collect(collection_path, config):
    """Leave out :data:`SPEED_ONLY` unless timing (``--benchmark-enable``); None: no opinion."""
    if collection_path.name in SPEED_ONLY and not config.getoption("benchmark_enable", False):
        return True
    return None
