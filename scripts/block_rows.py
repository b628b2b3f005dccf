"""Time one-token products of GGUF blocks (runtime/backends/block_kernels.py) against the int8
per-row kernel (q8), interleaved: each round multiplies one activation row by a matrix of each
format in turn, so every format sees the same minute of a shared machine, and the figure kept is
each format's time over q8's time in the same round.

    python scripts/block_rows.py [--shape 8192x3072] [--rows 1] [--rounds 40] [--out FILE.json]

Random codes and float16 scales (in +-0.05), the shape [out, in]; the matrices are larger than
the last-level cache together, so each product reads its weights from memory. Prints, per format,
the median time and the median, 10th and 90th percentile of its ratio to q8, and /proc/loadavg
before and after. Timings: run it alone (under the project's timing lock)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from runtime import gguf_blocks as gb
from runtime.backends.kernels import Linear


def random_blocks(fmt: str, out: int, n_in: int, rng) -> gb.QTensor:
    _, bs, nb = gb.FORMATS[fmt]
    data = rng.integers(0, 256, size=(out * n_in // bs, nb), dtype=np.uint8)
    for off in gb._SCALE_OFFSETS[fmt]:
        data[:, off:off + 2] = rng.uniform(-0.05, 0.05, size=(data.shape[0], 1)).astype("<f2").view(np.uint8)
    return gb.QTensor(fmt, (out, n_in), data.reshape(out, -1))


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x3072")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--formats", default=",".join(gb.FORMATS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    try:
        m, k = (int(v) for v in a.shape.split("x"))
    except ValueError:
        ap.error(f"--shape: ROWSxCOLUMNS of whole numbers, got {a.shape!r}")
    if m < 1 or k < 1 or a.rows < 1 or a.rounds < 1:
        ap.error("--shape's sizes, --rows and --rounds must be at least 1")
    formats = [f for f in a.formats.split(",") if f]
    unknown = [f for f in formats if f not in gb.FORMATS]
    if unknown or not formats:
        what = f"no format {unknown[0]!r}" if unknown else "none given"
        ap.error(f"--formats: {what}; formats are {', '.join(gb.FORMATS)}")
    rng = np.random.default_rng(0)
    lins = {"q8": Linear.of(rng.standard_normal((m, k), dtype=np.float32), "q8")}
    for fmt in formats:
        try:
            gb.row_bytes(fmt, k)
        except gb.BlockError as e:
            ap.error(f"--shape {a.shape}: {e}")
        lins[fmt] = Linear.stored(random_blocks(fmt, m, k, rng))
    x = rng.standard_normal((a.rows, k)).astype(np.float32)
    for L in lins.values():  # compile (or load from numba's cache) before timing
        L.apply(x)
    before = load()
    t0 = time.time()
    times = {f: [] for f in lins}
    cpu = {f: [] for f in lins}
    for _ in range(a.rounds):
        for f, L in lins.items():
            c, s = time.process_time(), time.perf_counter()
            L.apply(x)
            times[f].append(time.perf_counter() - s)
            cpu[f].append(time.process_time() - c)
    res = {"shape": [m, k], "rows": a.rows, "rounds": a.rounds, "load_before": before, "load_after": load(),
           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
           "weight_bytes": {f: L.nbytes for f, L in lins.items()}, "formats": {}}
    q8, q8c = np.array(times["q8"]), np.array(cpu["q8"])
    for f, ts in times.items():
        t, c = np.array(ts), np.array(cpu[f])
        r = t / q8
        rc = np.median(c) / np.median(q8c)
        res["formats"][f] = {"median_ms": float(np.median(t) * 1e3), "min_ms": float(t.min() * 1e3),
                             "over_q8_median": float(np.median(r)), "over_q8_p10": float(np.percentile(r, 10)),
                             "over_q8_p90": float(np.percentile(r, 90)), "over_q8_min": float(t.min() / q8.min()),
                             "cpu_median_ms": float(np.median(c) * 1e3), "cpu_over_q8": float(rc)}
        print(f"{f:<5} {np.median(t) * 1e3:7.2f} ms (min {t.min() * 1e3:6.2f})  over q8: median {np.median(r):.2f}"
              f" (p10 {np.percentile(r, 10):.2f}, p90 {np.percentile(r, 90):.2f}; of minima {t.min() / q8.min():.2f};"
              f" CPU time {rc:.2f})  {lins[f].nbytes / 1e6:.1f} MB")
    print("load before", before, "after", res["load_after"])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
