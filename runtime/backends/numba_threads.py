"""numba's thread count from the process's BLAS setting: import this before numba loads.

A process that asked its BLAS for N threads (runtime.node, calibrate and join set 1, one per
device process sharing a machine) gets N kernel threads too; numba would otherwise start one
per core in every process, and parallel regions whose threads are descheduled wait a whole
time slice. ``NUMBA_NUM_THREADS``, when set, wins. Only effective before numba loads; this
module imports only :mod:`os`.
"""

from __future__ import annotations

import os

if "NUMBA_NUM_THREADS" not in os.environ:
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(_v, "").isdigit() and int(os.environ[_v]) >= 1:
            os.environ["NUMBA_NUM_THREADS"] = os.environ[_v]
            break
