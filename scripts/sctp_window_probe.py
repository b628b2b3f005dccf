#!/usr/bin/env python3
"""How aiortc's SCTP sender grows its congestion window, frame by frame: two peers in
this process through a local relay, ``--one-way-ms`` of in-process delay on each side
(runtime.transport.emulate_delay: a round trip of twice that), SCTP tuned as a room tunes
it (runtime.transport.tune_sctp: initial window 10 chunks, bursts of 32). Sends frames of
each ``--sizes`` bytes from a to b, ``--frames`` of each, one every ``--gap-s``, and prints
each frame's one-way time and the sender's window before and after it, in chunks of 1160 B
(the sender's ``_cwnd``). sim.link.sctp_frame_rounds models what this shows
(tests/unit/test_sim_window.py; docs/benchmarks.md, 2026-12-03).

    .venv/bin/python scripts/sctp_window_probe.py --sizes 20801,36897 --frames 6
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def probe(sizes: list[int], frames: int, gap_s: float, one_way_s: float) -> None:
    from runtime.relay import run_relay
    from runtime.transport import connect_room, emulate_delay
    runner, url = await run_relay("127.0.0.1", 0)
    try:
        a, b = await asyncio.gather(connect_room(url, "probe", "a", ["b"], host_addresses=["127.0.0.1"]),
                                    connect_room(url, "probe", "b", ["a"], host_addresses=["127.0.0.1"]))
        try:
            emulate_delay(a, one_way_s)
            emulate_delay(b, one_way_s)
            got: asyncio.Queue = asyncio.Queue()
            b.set_handler(lambda src, ch, data: got.put_nowait(time.perf_counter()))
            sctp = a._links["b"].pc.sctp
            for size in sizes:
                for i in range(frames):
                    before = sctp._cwnd
                    t0 = time.perf_counter()
                    await a.send("b", "residual", bytes(size))
                    t1 = await asyncio.wait_for(got.get(), 30)
                    await asyncio.sleep(0.01)  # the last acknowledgements
                    print(f"{size} B frame {i + 1}: {1e3 * (t1 - t0):6.1f} ms one way, window "
                          f"{before / 1160:.0f} -> {sctp._cwnd / 1160:.0f} chunks", flush=True)
                    await asyncio.sleep(gap_s)
        finally:
            await a.close()
            await b.close()
    finally:
        await runner.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20801,36897", help="frame sizes in bytes, comma-separated")
    ap.add_argument("--frames", type=int, default=6, help="frames of each size")
    ap.add_argument("--gap-s", type=float, default=0.25, help="seconds between frames")
    ap.add_argument("--one-way-ms", type=float, default=40.0, help="in-process delay on each side")
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        print(f"error: --sizes: expected byte counts separated by commas, got {a.sizes!r}", file=sys.stderr)
        return 2
    if a.frames < 1 or any(x < 1 for x in sizes):
        print("error: --frames and every size must be at least 1", file=sys.stderr)
        return 2
    asyncio.run(probe(sizes, a.frames, a.gap_s, a.one_way_ms / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
