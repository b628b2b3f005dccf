"""``python -m runtime.transport bench`` / ``echo URL N`` (see runtime/transport/bench.py)."""

import sys

from .bench import _bench_main

_bench_main(sys.argv[1:])
