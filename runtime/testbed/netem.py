"""An emulated network for a room run: one network namespace per device, with each
pair's round-trip time (and jitter) applied to the packets between them.

Topology. Every device gets its own namespace ``{prefix}-{run}-{device}`` (``run`` is
a 6-hex-digit id drawn per :class:`EmulatedNetwork`, so parallel runs never collide)
holding ``lo`` (up) and ``eth0``, one end of a veth pair. The other ends sit in a
bridge namespace ``{prefix}-{run}-bridge`` (no device may be named ``bridge``),
enslaved to the bridge ``br0``; so every device reaches every other in one hop. The veth pairs
are created directly inside the namespaces (``ip link add ... netns``), so no
interface of this run ever appears in the root namespace.

Addresses. Device ``i`` (0-based, in the order given) is ``198.18.0.{i+1}/24``.
``198.18.0.0/15`` is the range RFC 2544 sets aside for benchmarking network devices;
it is routed nowhere, and here it exists only on the ``eth0`` of this run's
namespaces (parallel runs reuse it, each in its own namespaces). IPv6 is switched
off on ``eth0`` so that nothing (aioice's link-local candidates, for one) can go
around the delay. Neighbour (ARP) entries are static, so the first packet pays no
ARP round trip.

Delay. This kernel has no ``netem`` qdisc (``tc qdisc add ... netem`` answers
"Specified qdisc kind is unknown"); :class:`EmulatedNetwork` tries it first and uses
it when it works: one netem qdisc per ``eth0``, delaying departures by ``rtt/2``; netem
delays per interface, not per destination, and reorders jittered packets, so it is
used only when every pair has the same RTT and either no jitter or ``reorder=True``.
Otherwise the delay is done in userspace through NFQUEUE: one ``iptables-legacy``
rule in each device namespace, ``-A INPUT -i eth0 -j NFQUEUE --queue-num 0``, hands
every IPv4 packet *arriving* at the device to a helper process in that namespace
(runtime/testbed/netem_helper.py run as a script), which holds it for the pair's
one-way delay ``rtt/2 + jitter`` (looked up by the packet's source address) and then
accepts it. Each direction is delayed once, at its receiver, so a round trip takes
``rtt``. Delaying on arrival rather than on departure matters for throughput: the
kernel has orphaned the packet from its sending socket by then (``ip_rcv``), so the
held packets do not count against the sender's socket buffer or TCP small queues,
as they would on ``OUTPUT``, and a long RTT does not throttle the sender by itself.

Jitter is netem's ``normal``: ``sigma * t`` with ``t ~ N(0, 1)`` limited to
``[-4, 4]`` and the delay clamped at 0 (see ``sim/jitter.py``, which models the same).
Order is kept per (source, destination) pair unless ``reorder=True``: a packet is
never released before the one ahead of it from the same source, which lifts the mean
delay a little when jitter is large against the packet spacing.

Bounds. Each helper exits when its parent (the process that entered the
:class:`EmulatedNetwork`) is gone, when its lifetime ``max_lifetime_s`` has passed, or
on SIGTERM; its queue holds at most :data:`QUEUE_MAX_LEN` packets (the kernel drops
beyond that, as a full router buffer would).

Cleanup. On exit, also on an exception or KeyboardInterrupt, :meth:`EmulatedNetwork.close`
ends the processes started with :meth:`~EmulatedNetwork.run_in` that are still
running (SIGTERM, then SIGKILL after ``stop_timeout_s``), ends the helpers, ends any
other process still inside this run's namespaces (only this run's code put them
there), and deletes the namespaces by name; deleting a namespace removes its veth
ends, the bridge and its iptables rules with it. :func:`cleanup_stale` removes what
a crashed run left behind, telling live runs from dead ones by the state file that
each run keeps in :data:`STATE_DIR`.

Nothing here sends traffic anywhere but between this run's namespaces.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.testbed.netem_helper import EARLY_MAX_S, QUEUE_MAX_LEN  # noqa: F401 (named here too: the helper owns them)

__all__ = [
    "ADDRESS_NETWORK",
    "EmulatedNetwork",
    "NetemError",
    "available",
    "cleanup_stale",
]

#: The private test range the devices' addresses come from (RFC 2544 benchmarking range).
ADDRESS_NETWORK = ipaddress.IPv4Network("198.18.0.0/24")
#: Where each live run writes ``{prefix}-{run}.json`` (owner pid and start time).
STATE_DIR = Path("/run/splitroom-netem")
#: Allowed device names: letters, digits, ``_`` and single ``-``, 1..32 characters.
DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_]|-(?!-)){0,31}$")
#: Allowed prefixes: lower-case letters and digits, 1..8 characters.
PREFIX_RE = re.compile(r"^[a-z0-9]{1,8}$")
#: The delay helper program, run by path inside each device namespace.
HELPER = Path(__file__).resolve().with_name("netem_helper.py")
#: The NFQUEUE number used inside every device namespace (queues are per namespace).
QUEUE_NUM = 0
#: Last part of the bridge namespace's name; no device may have this name.
BRIDGE_SUFFIX = "bridge"
_DEV_IF = "eth0"
_RUN_ID_HEX = 6
_NS_RE_TEMPLATE = r"^{prefix}-([0-9a-f]{{%d}})-(.+)$" % _RUN_ID_HEX


class NetemError(RuntimeError):
    """A step of building or running the emulated network failed (the message says which)."""


# ----------------------------------------------------------------------------- checks


def _netfilterqueue_importable() -> tuple[bool, str]:
    try:
        import netfilterqueue  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build (OSError)
        return False, f"Python package NetfilterQueue not importable ({exc}); pip install NetfilterQueue"
    return True, ""


def available(probe: bool = True) -> tuple[bool, str]:
    """Whether this machine can build an :class:`EmulatedNetwork`, and why not.

    Checks: Linux, running as root, ``ip`` (iproute2) and ``iptables-legacy`` on the
    PATH, the ``netfilterqueue`` module importable, and (with ``probe``) that a network
    namespace can really be created and removed and NFQUEUE rules added inside it
    (a container may be root without those rights). The probe takes about 50 ms and
    leaves nothing behind.

    Returns:
        ``(True, "")`` when it can; ``(False, reason)`` otherwise, the reason naming
        what is missing and how to get it. Never raises.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces need root (running as uid %d)" % os.geteuid()
    if shutil.which("ip") is None:
        return False, "`ip` not found; apt-get install iproute2"
    if shutil.which("iptables-legacy") is None:
        return False, "`iptables-legacy` not found; apt-get install iptables"
    ok, why = _netfilterqueue_importable()
    if not ok:
        return False, why
    if probe:
        ns = f"srprobe-{secrets.token_hex(_RUN_ID_HEX // 2)}-x"
        try:
            r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=10)
            if r.returncode != 0:
                return False, f"cannot create a network namespace: {r.stderr.strip()}"
            r = subprocess.run(
                ["ip", "netns", "exec", ns, "iptables-legacy", "-w", "-A", "INPUT", "-i", "lo",
                 "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)],
                capture_output=True, text=True, timeout=10,
            )
            if r.returncode != 0:
                return False, f"cannot add an NFQUEUE rule in a namespace: {r.stderr.strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"probing network namespaces failed: {exc}"
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)
    return True, ""


def _netem_qdisc_works() -> bool:
    """Whether ``tc qdisc add ... netem`` works here (tried in a throwaway namespace)."""
    if shutil.which("tc") is None:
        return False
    ns = f"srprobe-{secrets.token_hex(_RUN_ID_HEX // 2)}-q"
    try:
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True, timeout=10).returncode != 0:
            return False
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], capture_output=True, timeout=10)
        r = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True, timeout=10,
        )
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)


# ----------------------------------------------------------------------------- shell helpers


def _run(argv: Sequence[str], *, input: str | None = None, timeout: float = 20.0) -> str:
    """Run a command; raise :class:`NetemError` with its stderr when it fails."""
    try:
        r = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetemError(f"{' '.join(argv)}: {exc}") from exc
    if r.returncode != 0:
        raise NetemError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def _list_netns() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def _kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        if pid == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _delete_netns(ns: str) -> None:
    """End every process inside ``ns`` (all put there by this module's caller) and delete it."""
    for _ in range(3):  # bounded: a process may fork once more while we kill
        pids = _netns_pids(ns)
        if not pids:
            break
        _kill_pids(pids)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)


def _proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cleanup_stale(prefix: str = "sr") -> list[str]:
    """Remove the namespaces (and so the veths, bridge, rules) and helper processes left
    by earlier runs with this prefix whose owning process is gone.

    A run is live while its state file ``STATE_DIR/{prefix}-{run}.json`` names a
    process that still exists with the same start time; namespaces of live runs are
    left alone, so this is safe to call while other runs go on. A namespace
    ``{prefix}-{run}-...`` with no state file is taken as stale.

    Returns:
        The names of the namespaces removed.

    Raises:
        ValueError: ``prefix`` is not 1..8 lower-case letters or digits.
    """
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"prefix must match {PREFIX_RE.pattern}, got {prefix!r}")
    if shutil.which("ip") is None:
        return []
    ns_re = re.compile(_NS_RE_TEMPLATE.format(prefix=re.escape(prefix)))
    by_run: dict[str, list[str]] = {}
    for ns in _list_netns():
        m = ns_re.match(ns)
        if m:
            by_run.setdefault(m.group(1), []).append(ns)
    state_files = {p.stem.split("-", 1)[1]: p for p in STATE_DIR.glob(f"{prefix}-*.json")} if STATE_DIR.is_dir() else {}
    removed: list[str] = []
    for run_id in sorted(set(by_run) | set(state_files)):
        state = state_files.get(run_id)
        if state is not None and _state_is_live(state):
            continue
        for ns in by_run.get(run_id, []):
            _delete_netns(ns)
            removed.append(ns)
        if state is not None:
            with contextlib.suppress(OSError):
                state.unlink()
    return removed


def _state_is_live(path: Path) -> bool:
    try:
        st = json.loads(path.read_text())
        pid, start = int(st["pid"]), int(st["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return _proc_start_time(pid) == start


# ----------------------------------------------------------------------------- the network


@dataclass(frozen=True)
class _Link:
    delay_s: float  # one-way base delay, rtt/2
    jitter_s: float  # netem-style normal sigma


def _pair_table(
    what: str, value: Mapping[frozenset[str], float] | float, devices: Sequence[str], *, required: bool
) -> dict[frozenset[str], float]:
    pairs = [frozenset((a, b)) for i, a in enumerate(devices) for b in devices[i + 1:]]
    if isinstance(value, Mapping):
        out: dict[frozenset[str], float] = {}
        for k, v in value.items():
            key = frozenset(k)
            if len(key) != 2 or not key <= set(devices):
                raise ValueError(f"{what}: key {sorted(key)} is not a pair of known devices {list(devices)}")
            out[key] = float(v)
        missing = [sorted(p) for p in pairs if p not in out]
        if missing:
            if required:
                raise ValueError(f"{what}: no value for pairs {missing}")
            for p in pairs:
                out.setdefault(p, 0.0)
    else:
        out = {p: float(value) for p in pairs}
    for k, v in out.items():
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{what} for {sorted(k)} must be finite and >= 0 seconds, got {v}")
    return out


class EmulatedNetwork:
    """Namespaces, veths, a bridge and per-pair packet delay for one room run.

    Use as a context manager::

        with EmulatedNetwork(["host", "phone"], rtt_s=0.020) as net:
            srv = net.run_in("host", [sys.executable, "server.py", net.address("host")])
            cli = net.run_in("phone", [sys.executable, "client.py", net.address("host")])

    Args:
        devices: device names, unique, each matching :data:`DEVICE_NAME_RE` and not
            ``bridge``; at most 253.
        rtt_s: round-trip time in seconds, one for every pair, or a mapping
            ``frozenset({a, b}) -> seconds`` that must name every pair.
        jitter_s: one-way delay jitter (netem normal sigma) in seconds, for every pair
            or per pair (pairs not named get 0).
        name_prefix: first part of every namespace name (1..8 lower-case letters/digits).
        reorder: let jittered packets overtake each other (default keeps order per pair).
        seed: seed of the jitter draws (each helper derives its own from it).
        max_lifetime_s: the helpers exit by themselves after this long, in seconds.
        stop_timeout_s: how long, in seconds, a process gets after SIGTERM before SIGKILL.
        use_qdisc: ``None`` tries ``tc ... netem`` first and falls back to NFQUEUE;
            ``False`` always uses NFQUEUE; ``True`` requires netem (NetemError if it fails).

    Raises:
        ValueError: a bad device name, prefix, RTT or jitter (at construction).
        NetemError: on entering, when :func:`available` says no or a setup step fails;
            everything created up to then has been removed.
    """

    def __init__(
        self,
        devices: list[str],
        rtt_s: Mapping[frozenset[str], float] | float,
        jitter_s: Mapping[frozenset[str], float] | float = 0.0,
        name_prefix: str = "sr",
        *,
        reorder: bool = False,
        seed: int = 1,
        max_lifetime_s: float = 6 * 3600.0,
        stop_timeout_s: float = 2.0,
        use_qdisc: bool | None = None,
    ) -> None:
        devices = list(devices)
        if not devices:
            raise ValueError("devices must not be empty")
        if len(set(devices)) != len(devices):
            raise ValueError(f"device names must be unique: {devices}")
        if len(devices) > ADDRESS_NETWORK.num_addresses - 3:
            raise ValueError(f"at most {ADDRESS_NETWORK.num_addresses - 3} devices")
        for d in devices:
            if not isinstance(d, str) or not DEVICE_NAME_RE.match(d) or d == BRIDGE_SUFFIX:
                raise ValueError(f"bad device name {d!r}: must match {DEVICE_NAME_RE.pattern} and not be {BRIDGE_SUFFIX!r}")
        if not PREFIX_RE.match(name_prefix):
            raise ValueError(f"name_prefix must match {PREFIX_RE.pattern}, got {name_prefix!r}")
        if not (max_lifetime_s > 0 and math.isfinite(max_lifetime_s)):
            raise ValueError(f"max_lifetime_s must be finite and > 0, got {max_lifetime_s}")
        self.devices = devices
        self.prefix = name_prefix
        self.rtt = _pair_table("rtt_s", rtt_s, devices, required=True)
        self.jitter = _pair_table("jitter_s", jitter_s, devices, required=False)
        self.reorder = reorder
        self.seed = seed
        self.max_lifetime_s = max_lifetime_s
        self.stop_timeout_s = stop_timeout_s
        self.use_qdisc = use_qdisc
        self.run_id = secrets.token_hex(_RUN_ID_HEX // 2)
        hosts = list(ADDRESS_NETWORK.hosts())
        self._addr = {d: str(hosts[i]) for i, d in enumerate(devices)}
        self._ns = {d: f"{self.prefix}-{self.run_id}-{d}" for d in devices}
        self.bridge_ns = f"{self.prefix}-{self.run_id}-{BRIDGE_SUFFIX}"
        self._created_ns: list[str] = []
        self._helpers: dict[str, subprocess.Popen] = {}
        self._helper_cpu_s: dict[str, float] = {}
        self._helper_holds: dict[str, dict[str, dict[str, float]]] = {}
        self._children: list[subprocess.Popen] = []
        self._state_file = STATE_DIR / f"{self.prefix}-{self.run_id}.json"
        self._entered = False
        self._closed = False
        #: "netem" or "nfqueue" once entered; how the delay is applied.
        self.method: str | None = None

    # -- public API

    def address(self, device: str) -> str:
        """The device's IPv4 address (dotted quad, in :data:`ADDRESS_NETWORK`).

        Raises:
            KeyError: unknown device.
        """
        return self._addr[device]

    def namespace(self, device: str) -> str:
        """The name of the device's network namespace.

        Raises:
            KeyError: unknown device.
        """
        return self._ns[device]

    def run_in(self, device: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside the device's namespace (``ip netns exec NS argv...``).

        The process is ended on :meth:`close` if it is still running then.

        Args:
            device: one of ``devices``.
            argv: the command and its arguments.
            **popen_kwargs: passed to :class:`subprocess.Popen` (stdout, env, cwd, ...).

        Raises:
            KeyError: unknown device.
            NetemError: the network is not entered (or already closed).
        """
        ns = self._ns[device]
        if not self._entered or self._closed:
            raise NetemError("run_in needs an entered, open EmulatedNetwork")
        p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **popen_kwargs)
        self._children.append(p)
        return p

    def helper_cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each device's delay helper has used so far.

        After :meth:`close`, the values measured just before the helpers were ended.
        Empty when the netem qdisc does the delay (kernel time, not attributable).
        """
        if self._closed:
            return dict(self._helper_cpu_s)
        out = {}
        for d, p in self._helpers.items():
            c = _proc_cpu_s(p.pid)
            if c is not None:
                out[d] = c
        return out

    def helper_holds(self) -> dict[str, dict[str, dict[str, float]]]:
        """What each device's delay helper held, known after :meth:`close`.

        ``{device: {source device: {"packets": n, "min_s": s, "max_s": s}}}``: the IPv4
        packets from that source the helper held, and the shortest and longest hold it
        planned (seconds from the kernel's arrival stamp to the planned release: the
        pair's one-way delay plus jitter, or later to keep order). A source it held
        nothing from is absent. Empty before close, when the netem qdisc does the delay,
        or for a helper that had to be killed (it writes its record on a clean exit).
        """
        return {d: {src: dict(h) for src, h in by_src.items()} for d, by_src in self._helper_holds.items()}

    def __enter__(self) -> EmulatedNetwork:
        if self._entered:
            raise NetemError("an EmulatedNetwork can be entered once")
        ok, why = available()
        if not ok:
            raise NetemError(f"cannot emulate the network here: {why}")
        self._entered = True
        atexit.register(self.close)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- setup

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        start = _proc_start_time(os.getpid())
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "start_time": start, "namespaces": [self.bridge_ns, *self._ns.values()]}))
        tmp.replace(self._state_file)

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created_ns.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _setup(self) -> None:
        self._write_state()  # before any namespace, so cleanup_stale sees this run as live
        self._add_ns(self.bridge_ns)
        _run(["ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "up"])
        macs: dict[str, str] = {}
        for i, d in enumerate(self.devices):
            ns = self._ns[d]
            self._add_ns(ns)
            # Switch IPv6 off before eth0 exists, so it never gets a link-local address.
            for key in ("all", "default"):
                _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"])
            port = f"p{i}"
            _run(["ip", "link", "add", "name", port, "netns", self.bridge_ns, "type", "veth",
                  "peer", "name", _DEV_IF, "netns", ns])
            _run(["ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", self.bridge_ns, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self._addr[d]}/{ADDRESS_NETWORK.prefixlen}", "dev", _DEV_IF])
            _run(["ip", "-n", ns, "link", "set", _DEV_IF, "up"])
            info = json.loads(_run(["ip", "-n", ns, "-j", "link", "show", _DEV_IF]))
            macs[d] = info[0]["address"]
        for d in self.devices:
            batch = "".join(
                f"neigh replace {self._addr[o]} lladdr {macs[o]} dev {_DEV_IF} nud permanent\n"
                for o in self.devices if o != d
            )
            if batch:
                _run(["ip", "-n", self._ns[d], "-batch", "-"], input=batch)
        self._apply_delay()

    def _links_into(self, d: str) -> dict[str, _Link]:
        """Source address -> link, for the packets arriving at device ``d``."""
        return {
            self._addr[o]: _Link(self.rtt[frozenset((d, o))] / 2.0, self.jitter[frozenset((d, o))])
            for o in self.devices if o != d
        }

    def _apply_delay(self) -> None:
        links = {frozenset((a, b)): (self.rtt[frozenset((a, b))], self.jitter[frozenset((a, b))]) for a, b in
                 (tuple(p) for p in self.rtt)}
        uniform = len(set(links.values())) <= 1
        ordered_ok = self.reorder or all(j == 0 for _, j in links.values())
        want_qdisc = self.use_qdisc
        if want_qdisc is None:
            want_qdisc = uniform and ordered_ok and _netem_qdisc_works()
        elif want_qdisc and not (uniform and ordered_ok):
            raise NetemError("use_qdisc=True needs one RTT and jitter for every pair (netem delays per interface) "
                             "and no jitter unless reorder=True (netem reorders jittered packets)")
        if want_qdisc:
            rtt, jit = next(iter(links.values()), (0.0, 0.0))
            for d in self.devices:
                argv = ["ip", "netns", "exec", self._ns[d], "tc", "qdisc", "add", "dev", _DEV_IF, "root", "netem",
                        "delay", f"{rtt / 2 * 1e6:.0f}us"]
                if jit > 0:
                    argv += [f"{jit * 1e6:.0f}us", "distribution", "normal"]
                _run(argv)
            self.method = "netem"
            return
        self.method = "nfqueue"
        for i, d in enumerate(self.devices):
            links_in = self._links_into(d)
            if not any(l.delay_s > 0 or l.jitter_s > 0 for l in links_in.values()):
                continue
            ns = self._ns[d]
            cfg = {
                "links": {src: [l.delay_s, l.jitter_s] for src, l in links_in.items()},
                "queue": QUEUE_NUM,
                "reorder": self.reorder,
                "seed": self.seed * 1000003 + i,
                "max_lifetime_s": self.max_lifetime_s,
                "parent": os.getpid(),
            }
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-P", str(HELPER), "--helper",
                 json.dumps(cfg)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True,  # a terminal's ^C goes to the owner, which then ends the helper
            )
            self._helpers[d] = p
            ready, _, _ = select.select([p.stdout], [], [], 15.0)
            line = p.stdout.readline() if ready else ""
            if line.strip() != "ready":
                p.kill()
                err = p.stderr.read() if p.poll() is not None else "(no answer in 15 s)"
                raise NetemError(f"delay helper for {d} did not start: {line.strip()} {err.strip()}")
            # Only now that a listener is bound: without one, NFQUEUE drops every packet.
            _run(["ip", "netns", "exec", ns, "iptables-legacy", "-w", "-A", "INPUT", "-i", _DEV_IF,
                  "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)])

    # -- teardown

    def close(self) -> None:
        """Remove everything this network created; safe to call more than once.

        Ends :meth:`run_in` processes still running, the helpers and any other process
        inside this run's namespaces, then deletes the namespaces (with their veths,
        bridge and rules) and the state file. Never raises for a part already gone.
        """
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        self._helper_cpu_s = {}
        for d, p in self._helpers.items():
            c = _proc_cpu_s(p.pid)
            if c is not None:
                self._helper_cpu_s[d] = c
        procs = [p for p in (*self._children, *self._helpers.values()) if p.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        deadline = time.monotonic() + self.stop_timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=2.0)
        device_of = {a: d for d, a in self._addr.items()}
        for d, p in self._helpers.items():
            with contextlib.suppress(Exception):  # its last line, written on a clean exit
                if p.poll() is not None:
                    last = json.loads(p.stdout.read().splitlines()[-1])
                    self._helper_holds[d] = {device_of[src]: dict(zip(("packets", "min_s", "max_s"), h))
                                             for src, h in last["held"].items()}
        for p in self._helpers.values():
            for f in (p.stdout, p.stderr):
                with contextlib.suppress(Exception):
                    f.close()
        for ns in reversed(self._created_ns):
            _delete_netns(ns)
        with contextlib.suppress(OSError):
            self._state_file.unlink()
