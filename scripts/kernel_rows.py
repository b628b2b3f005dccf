"""Time the streaming float32 kernel (runtime/backends/kernels.py) over one token's
matrices of SmolLM2-135M (30 layers: q, k, v, o, gate, up, down; random weights of
the real shapes) for 1, 5 and 9 rows, beside a BLAS matrix-vector product for 1 row.

    python scripts/kernel_rows.py

Prints the median (and min) of 9 runs each and the GB/s of the weights streamed.
Run it alone: timings."""

from __future__ import annotations

import time

import numpy as np

from runtime.backends.kernels import _mm_f32

#: one layer's weight matrices [out, in], SmolLM2-135M, times 30 layers
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30


def main() -> None:
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    xs = {(k, r): rng.standard_normal((r, k)).astype(np.float32) for _, k in SHAPES for r in (1, 5, 9)}
    outs = {(m, r): np.empty((r, m), np.float32) for m, _ in SHAPES for r in (1, 5, 9)}
    nbytes = sum(w.nbytes for w in ws)

    def blas() -> None:
        for w in ws:
            xs[(w.shape[1], 1)] @ w.T  # one row: numpy calls sgemv

    def kernel(rows: int) -> None:
        for w in ws:
            _mm_f32(xs[(w.shape[1], rows)], w, outs[(w.shape[0], rows)])

    for name, fn in [("BLAS sgemv, 1 row", blas)] + [(f"kernel, {r} rows", lambda r=r: kernel(r)) for r in (1, 5, 9)]:
        fn()
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        med = float(np.median(ts))
        print(f"{name:<20} {med * 1e3:6.1f} ms (min {min(ts) * 1e3:.1f})  {nbytes / med / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    main()
