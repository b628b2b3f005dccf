"""Is a row's result independent of the rows beside it? The numpy backend's products, bit for bit.

    python scripts/row_independence.py --out row-independence.json

A stage could run the laps of several questions waiting for it as one pass of several
rows only if every row came out bit for bit as it does in a pass of its own: otherwise an
answer is no longer token for token what it is alone. For each storage format
(:class:`runtime.backends.kernels.Linear`: f32, f16, q8 and GGUF blocks Q8_0, Q4_K, Q6_K)
and each of SmolLM2-135M's matrix shapes (random weights, seed 1), it applies the
matrix to passes of n = 2..16 rows and compares each row's float32 bits with the same row
applied alone; and the same for the per-row parts of a layer (RMSNorm, SiLU). Prints and
writes, per format and shape, the row counts at which some row differs, which rows, how
many output values, and the largest relative difference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from runtime.backends.kernels import STREAM_MAX_ROWS, Linear
from runtime.backends.numpy_backend import rms_norm, silu
from runtime.gguf_blocks import QTensor, row_bytes

#: one layer's fused matrices [out, in] of SmolLM2-135M (q+k+v, o, gate+up, down)
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
KINDS = ["f32", "f16", "q8", "q8_0", "q4_k", "q6_k"]
MAX_ROWS = 16


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _matrix(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> Linear:
    if kind in ("f32", "f16", "q8"):
        return Linear.of(rng.standard_normal(shape).astype(np.float32) * np.float32(0.05), kind)
    return Linear.stored(QTensor(kind, shape, rng.integers(0, 256, (shape[0], row_bytes(kind, shape[1])),
                                                           dtype=np.uint8)))


def compare(fn, x: np.ndarray) -> dict:
    """``{n: {...}}`` for each row count n at which some row of ``fn(x[:n])`` differs in
    its bits from ``fn(x[r:r+1])``; empty when every row is independent."""
    alone = np.stack([fn(x[r:r + 1])[0] for r in range(x.shape[0])])
    bad = {}
    for n in range(2, x.shape[0] + 1):
        out = fn(x[:n])
        rows = [r for r in range(n) if not np.array_equal(_bits(out[r]), _bits(alone[r]))]
        if rows:
            a = alone[:n]
            bad[n] = {"rows_differing": rows, "values_differing": int(np.sum(_bits(out) != _bits(a))),
                      "values": int(out.size),
                      "max_rel_diff": float(np.max(np.abs(out - a) / np.maximum(np.abs(a), 1e-30)))}
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    res = {"numba_threads": os.environ.get("NUMBA_NUM_THREADS"), "stream_max_rows": STREAM_MAX_ROWS,
           "products": {}, "per_row": {}}
    for kind in KINDS:
        for name, (o, i) in SHAPES.items():
            if kind in ("q4_k", "q6_k") and i % 256:
                continue  # super-blocks of 256: only the down matrix's 1,536 columns divide
            w = _matrix(kind, (o, i), rng)
            bad = compare(w.apply, rng.standard_normal((MAX_ROWS, i)).astype(np.float32))
            res["products"][f"{kind} {name}"] = bad
            print(f"{kind:5} {name:8}", "every row independent at n = 2..16" if not bad else
                  "rows differ at n = " + ", ".join(f"{n} (rows {v['rows_differing'][0]}-{v['rows_differing'][-1]})"
                                                    for n, v in bad.items()), flush=True)
    x = rng.standard_normal((MAX_ROWS, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    for name, fn in [("rms_norm", lambda h: rms_norm(h, w, 1e-5)), ("silu", silu)]:
        res["per_row"][name] = compare(fn, x)
        print(f"{name:14}", "every row independent" if not res["per_row"][name] else "rows differ")
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
