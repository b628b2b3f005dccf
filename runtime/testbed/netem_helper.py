"""The delay helper of :mod:`runtime.testbed.netem`: a program run by path
(``python -P netem_helper.py --helper CFG``) inside one device namespace, which takes
every IPv4 packet arriving at the device from NFQUEUE, holds it for its pair's one-way
delay (``rtt/2`` and netem-style normal jitter) and then accepts it. It imports only the
standard library and NetfilterQueue, so it runs with nothing of this checkout on its path.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import json
import math
import os
import random
import select
import signal
import socket
import sys
import time

#: Most packets one helper holds at once; the kernel drops arrivals beyond it.
QUEUE_MAX_LEN = 16384
#: The most, in seconds, a helper releases a packet before its time: it aims early by
#: the lateness of its timer wake-ups it has seen, capped at this. So a round trip
#: through two helpers is never shorter than the pair's RTT less twice this.
EARLY_MAX_S = 1e-3


def _normal_t(rng: random.Random) -> float:
    """netem's normal table draw: N(0, 1) limited to [-4, 4]."""
    return max(-4.0, min(4.0, rng.gauss(0.0, 1.0)))


def main(cfg: dict) -> int:
    """The delaying loop, run inside one device namespace (``python netem_helper.py --helper CFG``).

    ``cfg``: ``links`` (source IPv4 -> [one-way delay s, jitter sigma s]), ``queue``,
    ``reorder``, ``seed``, ``max_lifetime_s``, ``parent`` (pid). Packets from sources not
    in ``links`` pass at once. Prints ``ready`` once bound; exits 0 when the parent is
    gone, the lifetime is over, or on SIGTERM (held packets are then accepted), after a
    last line ``{"held": {source IPv4: [packets, shortest hold s, longest hold s]}}``
    (read by :meth:`runtime.testbed.netem.EmulatedNetwork.helper_holds`).
    """
    from netfilterqueue import COPY_PACKET, NetfilterQueue

    links = {bytes(ipaddress.IPv4Address(k).packed): (float(v[0]), float(v[1])) for k, v in cfg["links"].items()}
    reorder = bool(cfg["reorder"])
    rng = random.Random(cfg["seed"])
    parent = int(cfg["parent"])
    deadline = time.monotonic() + float(cfg["max_lifetime_s"])
    heap: list[tuple[float, int, object]] = []
    last: dict[bytes, float] = {}
    held: dict[bytes, list[float]] = {}  # source -> [packets, shortest hold, longest hold]
    seq = 0
    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    def on_packet(pkt) -> None:
        nonlocal seq
        now = time.monotonic()
        # The kernel stamped the packet on arrival (see the socket below): count the
        # delay from then, not from when this process woke up to read it.
        ts = pkt.get_timestamp()
        if ts:
            lag = time.time() - ts
            if 0.0 < lag < 0.05:
                now -= lag
        hdr = pkt.get_payload()
        src = hdr[12:16]
        link = links.get(src)
        if link is None:
            pkt.accept()
            return
        delay, jit = link
        if jit > 0:
            delay = max(0.0, delay + jit * _normal_t(rng))
        t = now + delay
        if not reorder:
            t = max(t, last.get(src, 0.0))
            last[src] = t
        h = held.setdefault(src, [0, math.inf, 0.0])
        h[0] += 1
        h[1], h[2] = min(h[1], t - now), max(h[2], t - now)
        seq += 1
        heapq.heappush(heap, (t, seq, pkt))

    # Any socket with SO_TIMESTAMPNS switches on the kernel's receive timestamps
    # (net_enable_timestamp), which NFQUEUE then passes with each packet. It sends nothing.
    stamp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        stamp_sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
    # Timer wake-ups come late (~0.1-0.2 ms on a VM); aim that much early, learning
    # the lateness as an exponential moving average of what was observed.
    early = 150e-6
    nfq = NetfilterQueue()
    # Copy only the IPv4 header's first 20 bytes: the source address is all we read.
    nfq.bind(int(cfg["queue"]), on_packet, max_len=QUEUE_MAX_LEN, mode=COPY_PACKET, range=20)
    fd = nfq.get_fd()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    next_check = 0.0
    try:
        while not stop:
            now = time.monotonic()
            while heap and heap[0][0] <= now + early:
                heapq.heappop(heap)[2].accept()
            if now >= next_check:  # bounded: parent gone or lifetime over ends the loop
                if os.getppid() != parent or now >= deadline:
                    break
                next_check = now + 0.25
            timeout = 0.25 if not heap else max(0.0, min(0.25, heap[0][0] - early - now))
            try:
                r, _, _ = select.select([fd], [], [], timeout)
            except InterruptedError:
                continue
            if r:
                nfq.run(block=False)
            elif heap and timeout < 0.25:
                late = time.monotonic() - (now + timeout)
                early = min(EARLY_MAX_S, max(0.0, 0.9 * early + 0.1 * late))
    finally:
        while heap:
            with contextlib.suppress(Exception):
                heapq.heappop(heap)[2].accept()
        nfq.unbind()
        record = {str(ipaddress.IPv4Address(src)): h for src, h in held.items()}
        sys.stdout.write(json.dumps({"held": record}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--helper":
    sys.exit(main(json.loads(sys.argv[2])))
