#!/usr/bin/env python3
"""Resident memory of a numpy stage holding a GGUF's blocks as stored (weights: gguf), against
the file's bytes for its range: one fresh process per range, VmRSS (Linux /proc/self/status)
read before the stage is built and after (every import and kernel compiled before the first
reading, so the difference is what the stage holds). Prints one JSON line per range.

Usage: ``python scripts/native_rss.py [--gguf PATH] [--ranges 1-30:host,1-10:host,11-30]``
(ranges 1-based inclusive; ``:host`` adds the embedding and head).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = r"""
import gc, json, sys
import numpy as np
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
from runtime.backends import StageSpec, make_stage
from runtime.backends.kernels import Linear
from runtime.precision import Precision
from runtime.weights import prepare_native
from runtime import gguf_blocks as gb
import gguf
src, a, b, host = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1'
d = prepare_native(src, progress=None)
# compile every kernel on a throwaway matrix first, so the readings hold no compiler memory
for f in gb.FORMATS:
    _, bs, nb = gb.FORMATS[f]
    q = gb.QTensor(f, (4, 256), np.zeros((4, 256 // bs * nb), np.uint8))
    Linear.stored(q).apply(np.ones((1, 256), np.float32))
    Linear.stored(q).apply(np.ones((20, 256), np.float32))
gc.collect()
r0 = rss()
st = make_stage('numpy', d, StageSpec(a, b, host), max_ctx=64, precision=Precision(weights='gguf'))
gc.collect()
r1 = rss()
table = gb.tensor_table(gguf.GGUFReader(src))
sizes, emb, head = gb.stored_sizes(table, st.cfg.n_layers)
want = sum(sizes[a:b]) + ((emb + head + table['output_norm.weight'].nbytes) if host else 0)
print(json.dumps({'range': f'{a + 1}-{b}' + (':host' if host else ''), 'file_bytes': want, 'rss_growth_bytes': r1 - r0,
                  'ratio': (r1 - r0) / want}))
"""


def main(argv=None) -> int:
    from runtime.weights import find_gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--ranges", default="1-30:host,1-10:host,11-30,21-30")
    a = ap.parse_args(argv)
    src = a.gguf or str(find_gguf())
    for r in a.ranges.split(","):
        span, _, host = r.partition(":")
        lo, hi = (int(x) for x in span.split("-"))
        out = subprocess.run([sys.executable, "-c", CHILD, src, str(lo - 1), str(hi), "1" if host else "0"],
                             capture_output=True, text=True, timeout=600)
        print(out.stdout.strip() or out.stderr.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
