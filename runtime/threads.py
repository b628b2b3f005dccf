"""One BLAS thread per process: set before numpy loads.

Every process that computes on a shared machine (a device process, the model host's
serve process, the calibration child) asks its BLAS for one thread, so that N device
processes on one computer use N cores and none waits for another's thread pool; the
numba kernels follow the same count (runtime/backends/numba_threads.py). A variable already
set, by the person or by a parent process, is kept.

Call :func:`pin_one_blas_thread` before anything imports numpy: this module imports
only :mod:`os`.
"""

from __future__ import annotations

import os
from typing import Mapping

#: the thread-count variables of the BLAS builds numpy may use (OpenMP, OpenBLAS, MKL)
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_one_blas_thread() -> None:
    """Set each of :data:`BLAS_THREAD_VARS` to ``"1"`` unless it is set already."""
    for name in BLAS_THREAD_VARS:
        os.environ.setdefault(name, "1")


def one_blas_thread_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (a child process's environment) with each of :data:`BLAS_THREAD_VARS` set
    to ``"1"``, whatever it said."""
    return {**env, **{name: "1" for name in BLAS_THREAD_VARS}}
