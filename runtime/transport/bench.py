"""``python -m runtime.transport bench``: the measurements of docs/transport.md
(``echo`` is the far side of the two-process benchmark)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Sequence

from .patches import tune_sctp
from .webrtc import connect_room, emulate_delay

async def _bench_pair(n: int, sizes: Sequence[int], one_way_s: float, tuned: bool) -> dict:
    """Two peers in this process through a local relay: ping-pong ``n`` messages of
    each size on the residual channel; returns one-way times (RTT/2) in ms."""
    from runtime.relay import run_relay

    if tuned:
        tune_sctp()
    else:
        tune_sctp(None, None)
    runner, url = await run_relay("127.0.0.1", 0)
    try:
        a, b = await asyncio.gather(
            connect_room(url, "bench", "a", ["b"], host_addresses=["127.0.0.1"], sctp_tuning=False),
            connect_room(url, "bench", "b", ["a"], host_addresses=["127.0.0.1"], sctp_tuning=False))
        try:
            emulate_delay(a, one_way_s)
            emulate_delay(b, one_way_s)
            b.set_handler(lambda src, ch, d: asyncio.ensure_future(b.send(src, ch, d)))
            q: asyncio.Queue = asyncio.Queue()
            a.set_handler(lambda src, ch, d: q.put_nowait(time.perf_counter()))
            out = {}
            for size in sizes:
                payload = bytes(size)
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await a.send("b", "residual", payload)
                    t1 = await asyncio.wait_for(q.get(), 30)
                    samples.append((t1 - t0) / 2 * 1e3)
                out[size] = samples
            return out
        finally:
            await a.close()
            await b.close()
    finally:
        await runner.cleanup()


def _pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def _bench_echo(url: str, n_expected: int) -> None:
    """The far side of the two-process benchmark: echo every residual back."""
    t = await connect_room(url, "bench2", "b", ["a"], host_addresses=["127.0.0.1"])
    done = asyncio.Event()
    count = [0]
    cpu0 = time.process_time()

    def on(src: str, ch: str, d: bytes) -> None:
        asyncio.ensure_future(t.send(src, ch, d))
        count[0] += 1
        if count[0] >= n_expected:
            done.set()

    t.set_handler(on)
    await asyncio.wait_for(done.wait(), 120)
    cpu = time.process_time() - cpu0
    await asyncio.sleep(0.2)
    print(json.dumps({"echo_cpu_ms_per_frame": cpu / n_expected * 1e3}), flush=True)
    await t.close()


async def _bench_two_process(n: int, size: int, warmup: int) -> dict:
    """Host side of the two-process ping-pong: this process and a child echo peer."""
    import sys

    from runtime.relay import run_relay

    runner, url = await run_relay("127.0.0.1", 0)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "runtime.transport", "echo", url,
                                                str(n + warmup), stdout=asyncio.subprocess.PIPE)
    try:
        a = await connect_room(url, "bench2", "a", ["b"], host_addresses=["127.0.0.1"])
        q: asyncio.Queue = asyncio.Queue()
        a.set_handler(lambda src, ch, d: q.put_nowait(time.perf_counter()))
        payload = bytes(size)
        samples = []
        cpu0 = 0.0
        for i in range(n + warmup):
            if i == warmup:
                cpu0 = time.process_time()
            t0 = time.perf_counter()
            await a.send("b", "residual", payload)
            t1 = await asyncio.wait_for(q.get(), 30)
            if i >= warmup:
                samples.append((t1 - t0) / 2 * 1e3)
        cpu = time.process_time() - cpu0
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        await a.close()
        await asyncio.wait_for(proc.wait(), 30)
        echo = json.loads(line) if line.strip() else {}
        return {"one_way_ms": samples, "host_cpu_ms_per_frame": cpu / n * 1e3, **echo}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()


def _bench_main(argv: Sequence[str]) -> None:  # pragma: no cover - manual measurement
    """``python -m runtime.transport bench``: the numbers of docs/transport.md."""
    import sys

    if argv and argv[0] == "echo":
        asyncio.run(_bench_echo(argv[1], int(argv[2])))
        return
    logging.basicConfig(level=logging.ERROR)
    decode = 32 + 576 * 4  # one decode frame of SmolLM2-135M (hidden 576, float32)
    for size in (decode, 10_000):
        r = asyncio.run(_bench_two_process(200, size, 20))
        ow = r["one_way_ms"]
        print(f"two processes, {size} B frames, N=200: one-way ms p50 {_pct(ow, 50):.3f} p90 {_pct(ow, 90):.3f} "
              f"p99 {_pct(ow, 99):.3f} max {max(ow):.3f} mean {sum(ow) / len(ow):.3f}; Python CPU ms per "
              f"ping-pong (one frame sent + one received) host {r['host_cpu_ms_per_frame']:.3f} "
              f"echo {r.get('echo_cpu_ms_per_frame', float('nan')):.3f}", flush=True)
    sizes = [1000, decode, 10_000, 100_000]
    for one_way in (0.0, 0.010):
        for tuned in (False, True):
            res = asyncio.run(_bench_pair(30, sizes, one_way, tuned))
            cells = ", ".join(f"{s} B p50 {_pct(v, 50):.2f}" for s, v in res.items())
            print(f"one process, one-way delay {one_way * 1e3:g} ms, "
                  f"{'tuned' if tuned else 'aiortc'}: one-way ms {cells}", flush=True)
    sys.stdout.flush()

