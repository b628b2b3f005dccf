"""Relay memory under many clients: the relay's resident memory (VmRSS of its
process) before, with CLIENTS websocket clients connected (each says hello in one of
ROOMS rooms, then sends one SDP offer to another device), and after they all left,
for several rounds; and the relay's own bookkeeping after the last round (audit log
entries, rooms, connections per address).

    .venv/bin/python scripts/relay_memory.py [--clients 500] [--rounds 5]

Prints one JSON object. The relay runs in a child process with the per-address cap
raised (every client here comes from 127.0.0.1) and everything else as shipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

RELAY = """
import asyncio, sys
from runtime.relay import Relay, run_relay
async def main():
    relay = Relay(max_clients_per_address=100000)
    runner, url = await run_relay("127.0.0.1", 0, relay)
    print(url, flush=True)
    while True:
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        print(len(relay.audit), len(relay.rooms), sum(relay.connections.values()), relay.dropped, flush=True)
asyncio.run(main())
"""

OFFER = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
         "c=IN IP4 127.0.0.1\r\na=mid:0\r\na=sctp-port:5000\r\na=ice-ufrag:abcd\r\n"
         "a=ice-pwd:abcdefghijklmnopqrstuv\r\na=setup:actpass\r\n")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def run(clients: int, rounds: int, rooms: int) -> dict:
    import aiohttp
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    p = subprocess.Popen([sys.executable, "-c", RELAY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    try:
        url = p.stdout.readline().strip()
        time.sleep(0.5)
        out = {"clients": clients, "rooms": rooms, "rounds": [], "baseline_kib": rss_kib(p.pid)}
        for _ in range(rounds):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                socks = []
                for i in range(clients):
                    ws = await s.ws_connect(f"{url}/room/r{i % rooms}")
                    await ws.send_json({"type": "hello", "device": f"d{i}"})
                    socks.append(ws)
                for i, ws in enumerate(socks):
                    await ws.send_json({"type": "signal", "to": f"d{(i + rooms) % clients}",
                                        "data": {"type": "offer", "sdp": OFFER}})
                await asyncio.sleep(1.0)
                peak = rss_kib(p.pid)
                for ws in socks:
                    await ws.close()
            await asyncio.sleep(1.0)
            out["rounds"].append({"connected_kib": peak, "after_kib": rss_kib(p.pid)})
        p.stdin.write("stats\n")
        p.stdin.flush()
        audit, n_rooms, conns, dropped = map(int, p.stdout.readline().split())
        out.update(audit_entries=audit, audit_dropped=dropped, rooms_left=n_rooms, connections_left=conns)
        return out
    finally:
        p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rooms", type=int, default=10)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.clients, a.rounds, a.rooms)), indent=1))


if __name__ == "__main__":
    main()
