"""runtime.testbed.netem: namespaces joined by a bridge, per-pair RTT applied to the packets.

A tiny UDP echo (bounded: it serves a fixed number of packets, then exits, and has a
socket timeout) runs in one namespace, a pinger in the other; every packet goes only
between this run's namespaces (addresses in 198.18.0.0/24 that exist only there)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.testbed.netem import EARLY_MAX_S, EmulatedNetwork, NetemError, available, cleanup_stale

OK, WHY = available()
pytestmark = pytest.mark.skipif(not OK, reason=f"network emulation unavailable: {WHY}")

# this process's own prefix (8 characters at most): two suites on one machine at once (two
# clones, a clone beside a user's room) must not count, or clean up, each other's namespaces
PREFIX = f"st{os.getpid() % 0xFFFFFF:06x}"
ROOT = str(Path(__file__).resolve().parents[2])

# An owner that builds a network, prints its helpers' pids and waits to be killed (at most 30 s).
OWNER = r"""
import json, sys, time
from runtime.testbed.netem import EmulatedNetwork
net = EmulatedNetwork(["a", "b"], rtt_s=0.002, name_prefix=sys.argv[1]).__enter__()
print(json.dumps([p.pid for p in net._helpers.values()]), flush=True)
time.sleep(30)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

# Both ends of an exchange: big receive buffers and one core.
# - A burst of 200 echoes must not overflow a socket's receive buffer while its process waits
#   for a core on a loaded machine: the kernel would drop the tail, and a lost packet is not
#   the emulator's doing. SO_RCVBUFFORCE goes past rmem_max as root.
# - A sender that migrates between cores mid-burst puts its packets on two cores' backlogs,
#   and the kernel can hand them on out of order before the emulator sees them.
SOCKETS = r"""
import os, socket
def big_buffers(s):
    for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
            return
        except OSError:
            pass
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
"""

# Echo: serves exactly N datagrams (or stops after TIMEOUT s of silence), then exits.
ECHO = SOCKETS + r"""
import socket, sys
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
big_buffers(s)
s.bind((addr, port))
s.settimeout(10.0)
print("listening", flush=True)
for _ in range(n):
    try:
        data, peer = s.recvfrom(2048)
    except socket.timeout:
        break
    s.sendto(data, peer)
"""

# Pinger: mode "pingpong" sends one, waits for its echo, N times, and prints the RTTs;
# mode "burst" sends N back to back and prints the order the echoes came back in.
PING = SOCKETS + r"""
import json, socket, sys, time
addr, port, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5.0)
big_buffers(s)
out = []
if mode == "pingpong":
    for i in range(n):
        t0 = time.perf_counter()
        s.sendto(i.to_bytes(4, "big") + b"x" * 60, (addr, port))
        data, _ = s.recvfrom(2048)
        out.append(time.perf_counter() - t0)
        time.sleep(0.002)
else:
    # one echo first, so the burst does not meet an unresolved neighbour: the kernel
    # holds only about 200 KB of packets per address while ARP resolves and drops the rest
    s.sendto((2**32 - 1).to_bytes(4, "big"), (addr, port))
    s.recvfrom(2048)
    for i in range(n):
        s.sendto(i.to_bytes(4, "big") + b"y" * 200, (addr, port))
    for _ in range(n):
        try:
            data, _ = s.recvfrom(2048)
        except socket.timeout:
            break
        out.append(int.from_bytes(data[:4], "big"))
print(json.dumps(out), flush=True)
"""


def _ours() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(PREFIX + "-")]


def _exchange(net: EmulatedNetwork, n: int, mode: str, port: int = 47000) -> list:
    server = net.address("a")
    echoes = n + 1 if mode == "burst" else n  # the burst's warm-up echo
    echo = net.run_in("a", [sys.executable, "-c", ECHO, server, str(port), str(echoes)],
                      stdout=subprocess.PIPE, text=True)
    assert echo.stdout.readline().strip() == "listening"
    ping = net.run_in("b", [sys.executable, "-c", PING, server, str(port), str(n), mode],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = ping.communicate(timeout=30)
    assert ping.returncode == 0, err
    echo.wait(timeout=15)
    return json.loads(out)


def _stats_ms(rtts: list[float]) -> tuple[float, float, float]:
    ms = sorted(r * 1e3 for r in rtts)
    return statistics.fmean(ms), ms[len(ms) // 2], ms[min(len(ms) - 1, int(0.99 * len(ms)))]


@pytest.fixture(autouse=True)
def _no_leftovers():
    cleanup_stale(PREFIX)
    yield
    assert _ours() == [], "namespaces left behind"


def _held_once_each_way(net: EmulatedNetwork, pairs: dict[tuple[str, str], tuple[int, float]]) -> None:
    """Each (receiver, sender) pair's packets were held by the receiver's helper, each
    exactly its one-way delay (the RTT's half: no jitter, and pings one at a time never
    wait for the one ahead), and no other pair's packets were held. Counts and the
    helper's planned holds, not times measured on a machine that may be loaded."""
    if net.method != "nfqueue":  # the kernel's netem qdisc delays: no helper, no record
        return
    holds = net.helper_holds()
    got = {(d, src): (h["packets"], h["min_s"], h["max_s"]) for d, by in holds.items() for src, h in by.items()}
    assert set(got) == set(pairs), holds
    for key, (packets, one_way_s) in pairs.items():
        assert got[key] == (packets, pytest.approx(one_way_s, abs=1e-9), pytest.approx(one_way_s, abs=1e-9)), key


@pytest.mark.parametrize("rtt_ms", [20.0, 80.0])
def test_rtt_applied(rtt_ms):
    """n pings one at a time: each helper held the other's n packets rtt/2 each, and no
    round trip was shorter than the RTT less what the two helpers may release early
    (EARLY_MAX_S each). A loaded machine only makes a round trip longer, so no upper
    bound is asserted; the measured figures are printed."""
    with EmulatedNetwork(["a", "b"], rtt_s=rtt_ms / 1e3, name_prefix=PREFIX) as net:
        assert set(_ours()) == {net.namespace("a"), net.namespace("b"), net.bridge_ns}
        n = 50 if rtt_ms < 50 else 25
        rtts = _exchange(net, n, "pingpong")
        cpu = net.helper_cpu_s()
    assert len(rtts) == n
    mean, p50, p99 = _stats_ms(rtts)
    print(f"rtt {rtt_ms} ms via {net.method}: min {min(rtts) * 1e3:.2f} mean {mean:.2f} p50 {p50:.2f} "
          f"p99 {p99:.2f} ms; helper cpu {cpu}")
    assert min(rtts) >= rtt_ms / 1e3 - 2 * EARLY_MAX_S, (min(rtts), mean, p50, p99)
    _held_once_each_way(net, {("a", "b"): (n, rtt_ms / 2e3), ("b", "a"): (n, rtt_ms / 2e3)})


def test_order_kept_with_jitter():
    with EmulatedNetwork(["a", "b"], rtt_s=0.010, jitter_s=0.003, name_prefix=PREFIX) as net:
        order = _exchange(net, 200, "burst", port=47001)
    assert sorted(order) == list(range(200)), f"lost: {sorted(set(range(200)) - set(order))}"
    assert order == list(range(200)), [(i, o) for i, o in enumerate(order) if i != o][:10]


def test_per_pair_rtt_and_three_devices():
    rtt = {frozenset(("a", "b")): 0.030, frozenset(("a", "c")): 0.006, frozenset(("b", "c")): 0.012}
    with EmulatedNetwork(["a", "b", "c"], rtt_s=rtt, name_prefix=PREFIX) as net:
        assert len({net.address(d) for d in "abc"}) == 3
        ab = _exchange(net, 20, "pingpong", port=47002)
        # c pings a: reuse the helpers with c as the client
        server = net.address("a")
        echo = net.run_in("a", [sys.executable, "-c", ECHO, server, "47003", "20"], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "listening"
        out = subprocess.run(["ip", "netns", "exec", net.namespace("c"), sys.executable, "-c", PING, server,
                              "47003", "20", "pingpong"], capture_output=True, text=True, timeout=30, check=True)
        ac = json.loads(out.stdout)
        echo.wait(timeout=15)
    print(f"p50 a-b {_stats_ms(ab)[1]:.2f} ms (30), a-c {_stats_ms(ac)[1]:.2f} ms (6)")
    assert len(ab) == len(ac) == 20
    assert min(ab) >= 0.030 - 2 * EARLY_MAX_S and min(ac) >= 0.006 - 2 * EARLY_MAX_S, (min(ab), min(ac))
    # a holds b's packets 15 ms and c's 3 ms; b and c hold a's; b and c never spoke
    _held_once_each_way(net, {("a", "b"): (20, 0.015), ("b", "a"): (20, 0.015),
                              ("a", "c"): (20, 0.003), ("c", "a"): (20, 0.003)})


def test_cleanup_on_exception_and_stale():
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedNetwork(["a", "b"], rtt_s=0.002, name_prefix=PREFIX) as net:
            sleeper = net.run_in("a", ["sleep", "30"])
            raise RuntimeError("boom")
    assert sleeper.poll() is not None
    assert _ours() == []
    with pytest.raises(KeyboardInterrupt):
        with EmulatedNetwork(["a", "b"], rtt_s=0.002, name_prefix=PREFIX):
            raise KeyboardInterrupt
    assert _ours() == []
    # An owner killed with SIGKILL: its helpers end by themselves, cleanup_stale removes the rest.
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, PREFIX], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        helpers = json.loads(owner.stdout.readline())
        assert len(helpers) == 2 and len(_ours()) == 3
    finally:
        owner.kill()
        owner.wait(timeout=10)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(p) for p in helpers):
        time.sleep(0.1)
    assert not any(_alive(p) for p in helpers)
    assert len(cleanup_stale(PREFIX)) == 3
    assert _ours() == []
    # A leftover with no live owner is removed by cleanup_stale, a live run's is not.
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-abcdef-x"], check=True)
    with EmulatedNetwork(["a", "b"], rtt_s=0.002, name_prefix=PREFIX) as net:
        removed = cleanup_stale(PREFIX)
        assert removed == [f"{PREFIX}-abcdef-x"]
        assert set(_ours()) == {net.namespace("a"), net.namespace("b"), net.bridge_ns}


def test_bad_arguments():
    with pytest.raises(ValueError):
        EmulatedNetwork(["a", "a"], rtt_s=0.01)
    with pytest.raises(ValueError):
        EmulatedNetwork(["a", "b", "c"], rtt_s={frozenset(("a", "b")): 0.01})
    with pytest.raises(ValueError):
        EmulatedNetwork(["a", "b"], rtt_s=-1.0)
    with pytest.raises(ValueError):
        EmulatedNetwork(["a b", "c"], rtt_s=0.01)
    net = EmulatedNetwork(["a", "b"], rtt_s=0.01, name_prefix=PREFIX)
    with pytest.raises(NetemError):
        net.run_in("a", ["true"])
