"""A NAT test bed in network namespaces: an "internet" with a STUN/TURN server (Debian's
coturn) and the signalling relay, and homes behind NAT routers, each kind of NAT a
home router may be.

Topology (``{prefix}-{run}-NAME`` namespaces; ``run`` is 6 random hex digits)::

    pub   198.19.0.2    coturn (STUN and TURN, port 3478) and `splitroom relay` (8765)
    inet  198.19.0.1    a bridge joining pub and every NAT router's WAN side; the
                        default route of pub and the routers, forwarding nothing
    natK  198.19.0.1K   home K's router: WAN 198.19.0.1K, LAN 10.0.K.1, iptables NAT
    homeK 10.0.K.2      a device of home K, default route via 10.0.K.1
    guestK 10.0.K.3     (homes named in ``lan_guests``) another machine on home K's LAN:
                        the router's LAN side is a bridge, so guestK reaches homeK directly

``198.19.0.0/24`` lies in the range RFC 2544 sets aside for benchmarking (routed
nowhere), ``10.0.K.0/24`` in RFC 1918's private space; both exist only on this run's
namespaces, whose only routes lead to each other. A packet for an address that is not
there (a peer's private host candidate) goes to inet's default route and is dropped
silently, as the internet drops it; without that route coturn's relay socket would get
"network unreachable" and coturn would end the allocation. IPv6 is off everywhere.

Kinds of NAT (RFC 4787's terms), both Linux ``iptables -t nat ... -j MASQUERADE`` on
the WAN side, with a FORWARD policy that lets in only what conntrack has seen leave:

- ``"port-restricted"``: MASQUERADE keeps the device's source port when it is free, so
  the mapping is endpoint-independent (the address STUN saw is the one every peer
  sees) while the filter lets in only replies from an address and port the device
  sent to. Two such homes reach each other with STUN's server-reflexive candidates
  (hole punching: each side's checks open its own filter for the other).
- ``"symmetric"``: ``MASQUERADE --random-fully`` draws a new source port for every new
  (destination address, port), so the port STUN saw is not the one a peer would see;
  with a port-restricted peer STUN cannot help and only TURN's relay gets through.

Bounds and cleanup: every process started here (coturn, the relay, :meth:`NatBed.run_in`)
is ended on :meth:`NatBed.close` (SIGTERM, then SIGKILL after 3 s), then every process
still inside the namespaces, then the namespaces; a state file in
runtime.testbed.netem's ``STATE_DIR`` lets ``runtime.testbed.netem.cleanup_stale(prefix)`` remove what a
crashed run left. coturn's relay ports are bounded to a range of 200. Nothing here sends a packet outside the namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from runtime.testbed import netem

PUBLIC_ADDRESS = "198.19.0.2"
RELAY_PORT = 8765
TURN_PORT = 3478
KINDS = ("port-restricted", "symmetric")
#: the realm coturn names in its 401 challenges (any string; RFC 5389 section 15.7)
REALM = "splitroom.test"


class NatBedError(RuntimeError):
    """The bed cannot be built here, or a step failed (the message names what)."""


def missing() -> str:
    """What this machine lacks for a :class:`NatBed` ("" when nothing): root, iproute2,
    iptables, coturn's ``turnserver``, or the right to make namespaces."""
    ok, why = netem.available(probe=False)
    if not ok and "NetfilterQueue" not in why:
        return why
    if shutil.which("turnserver") is None:
        return "coturn's turnserver not found; apt-get install coturn (scripts/setup.sh installs it)"
    return ""


class NatBed:
    """Homes behind NATs, coturn and the relay in namespaces; a context manager.

    Args:
        homes: the kind of NAT of each home, in order (home 1, home 2, ...), each one of
            :data:`KINDS`; at most 9.
        turn_secret: coturn's ``static-auth-secret`` (time-limited credentials,
            runtime.transport.ice.turn_rest_credentials); a fresh random one by default.
        prefix: first part of every namespace name (netem's prefix rules).
        lan_guests: the homes (1-based) that get a second machine, ``guestK``, on their LAN.
        relay_args: extra arguments for ``splitroom relay``, which is always started
            with the bed's STUN server and TURN secret (``--stun-url``, ``--turn-url``,
            ``--turn-secret-file``): it issues credentials to a device that asks.
    Raises:
        ValueError: an unknown kind or more than 9 homes.
        NatBedError: on entering, when :func:`missing` names something or a step fails
            (what was made is removed first).
    """

    def __init__(self, homes: Sequence[str], turn_secret: str | None = None, prefix: str = "srnat",
                 relay_args: Sequence[str] = (), lan_guests: Sequence[int] = ()):
        homes = list(homes)
        if not 1 <= len(homes) <= 9 or any(k not in KINDS for k in homes):
            raise ValueError(f"homes: 1 to 9 of {KINDS}, got {homes}")
        self.homes = homes
        self.lan_guests = [int(k) for k in lan_guests]
        if any(not 1 <= k <= len(homes) for k in self.lan_guests):
            raise ValueError(f"lan_guests name homes 1 to {len(homes)}, got {self.lan_guests}")
        self.turn_secret = turn_secret or secrets.token_hex(16)
        self.run_id = secrets.token_hex(3)
        self.prefix = prefix
        self.relay_args = list(relay_args)
        self._made: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._state = netem.STATE_DIR / f"{prefix}-{self.run_id}.json"
        self.turn_log: Path | None = None
        self.relay_url = f"ws://{PUBLIC_ADDRESS}:{RELAY_PORT}"
        self._relay: subprocess.Popen | None = None

    # -- names

    def ns(self, name: str) -> str:
        """The namespace name of ``pub``, ``inet``, ``natK``, ``homeK`` or ``guestK``."""
        return f"{self.prefix}-{self.run_id}-{name}"

    @staticmethod
    def home_address(k: int) -> str:
        """The device address of home ``k`` (1-based)."""
        return f"10.0.{k}.2"

    @staticmethod
    def wan_address(k: int) -> str:
        """The public (WAN) address of home ``k``'s router."""
        return f"198.19.0.{10 + k}"

    @property
    def stun_url(self) -> str:
        return f"stun:{PUBLIC_ADDRESS}:{TURN_PORT}"

    def forward(self, k: int, port: int) -> None:
        """Open TCP ``port`` on home ``k``'s router to its device (a port forward, the
        way a host lets guests from outside load its page): DNAT on the WAN side."""
        ipt = ["ip", "netns", "exec", self.ns(f"nat{k}"), "iptables-legacy", "-w"]
        netem._run(ipt + ["-t", "nat", "-A", "PREROUTING", "-i", "wan0", "-p", "tcp", "--dport", str(port),
                          "-j", "DNAT", "--to-destination", f"{self.home_address(k)}:{port}"])
        netem._run(ipt + ["-I", "FORWARD", "1", "-i", "wan0", "-o", "brlan", "-p", "tcp", "--dport", str(port),
                          "-d", self.home_address(k), "-j", "ACCEPT"])

    # -- running things

    def run_in(self, name: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` in namespace ``name`` (``home1``, ``pub``, ...); ended on close."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(name), *argv], **popen_kwargs)
        self._procs.append(p)
        return p

    def relay_log(self) -> str:
        """What the relay printed so far (once it has ended: all of it)."""
        return self._relay_out.read_text() if self._relay is not None else ""

    # -- building

    def __enter__(self) -> "NatBed":
        why = missing()
        if why:
            raise NatBedError(f"cannot build the NAT test bed: {why}")
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ns_add(self, name: str) -> str:
        ns = self.ns(name)
        netem._run(["ip", "netns", "add", ns])
        self._made.append(ns)
        for key in ("all", "default"):
            netem._run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"])
        netem._run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return ns

    def _veth(self, a: str, a_if: str, b: str, b_if: str) -> None:
        netem._run(["ip", "link", "add", "name", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b])
        netem._run(["ip", "-n", a, "link", "set", a_if, "up"])
        netem._run(["ip", "-n", b, "link", "set", b_if, "up"])

    def _build(self) -> None:
        netem.STATE_DIR.mkdir(parents=True, exist_ok=True)
        names = (["inet", "pub"] + [f"{w}{k}" for k in range(1, len(self.homes) + 1) for w in ("nat", "home")]
                 + [f"guest{k}" for k in self.lan_guests])
        self._state.write_text(json.dumps({"pid": os.getpid(), "start_time": netem._proc_start_time(os.getpid()),
                                           "namespaces": [self.ns(n) for n in names]}))
        inet = self._ns_add("inet")
        netem._run(["ip", "-n", inet, "link", "add", "br0", "type", "bridge"])
        netem._run(["ip", "-n", inet, "link", "set", "br0", "up"])
        netem._run(["ip", "-n", inet, "addr", "add", "198.19.0.1/24", "dev", "br0"])
        pub = self._ns_add("pub")
        self._veth(inet, "pub", pub, "eth0")
        netem._run(["ip", "-n", inet, "link", "set", "pub", "master", "br0"])
        netem._run(["ip", "-n", pub, "addr", "add", f"{PUBLIC_ADDRESS}/24", "dev", "eth0"])
        netem._run(["ip", "-n", pub, "route", "add", "default", "via", "198.19.0.1"])
        for k, kind in enumerate(self.homes, start=1):
            nat, home = self._ns_add(f"nat{k}"), self._ns_add(f"home{k}")
            self._veth(inet, f"nat{k}", nat, "wan0")
            netem._run(["ip", "-n", inet, "link", "set", f"nat{k}", "master", "br0"])
            netem._run(["ip", "-n", nat, "addr", "add", f"{self.wan_address(k)}/24", "dev", "wan0"])
            netem._run(["ip", "-n", nat, "route", "add", "default", "via", "198.19.0.1"])
            netem._run(["ip", "-n", nat, "link", "add", "brlan", "type", "bridge"])
            netem._run(["ip", "-n", nat, "link", "set", "brlan", "up"])
            netem._run(["ip", "-n", nat, "addr", "add", f"10.0.{k}.1/24", "dev", "brlan"])
            lan = [(home, f"h{k}", self.home_address(k))]
            if k in self.lan_guests:
                lan.append((self._ns_add(f"guest{k}"), f"g{k}", f"10.0.{k}.3"))
            for ns, port, addr in lan:
                self._veth(nat, port, ns, "eth0")
                netem._run(["ip", "-n", nat, "link", "set", port, "master", "brlan"])
                netem._run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
                netem._run(["ip", "-n", ns, "route", "add", "default", "via", f"10.0.{k}.1"])
            netem._run(["ip", "netns", "exec", nat, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
            ipt = ["ip", "netns", "exec", nat, "iptables-legacy", "-w"]
            masq = ["-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"]
            netem._run(ipt + masq + (["--random-fully"] if kind == "symmetric" else []))
            netem._run(ipt + ["-P", "FORWARD", "DROP"])
            netem._run(ipt + ["-A", "FORWARD", "-i", "brlan", "-o", "wan0", "-j", "ACCEPT"])
            # machines of one LAN talk directly (where br_netfilter sends bridged frames through FORWARD)
            netem._run(ipt + ["-A", "FORWARD", "-i", "brlan", "-o", "brlan", "-j", "ACCEPT"])
            netem._run(ipt + ["-A", "FORWARD", "-i", "wan0", "-o", "brlan", "-m", "conntrack", "--ctstate",
                              "ESTABLISHED,RELATED", "-j", "ACCEPT"])
            netem._run(ipt + ["-A", "INPUT", "-i", "wan0", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                              "-j", "ACCEPT"])
            netem._run(ipt + ["-A", "INPUT", "-i", "wan0", "-j", "DROP"])
        self._start_turn()
        self._start_relay()

    def _start_turn(self) -> None:
        tmp = Path(f"/tmp/{self.prefix}-{self.run_id}-turn")
        tmp.mkdir(exist_ok=True)
        self.turn_log = tmp / "turn.log"
        conf = tmp / "turnserver.conf"  # the secret in a file, not on a command line others can read
        conf.write_text(f"static-auth-secret={self.turn_secret}\n")
        conf.chmod(0o600)
        argv = ["turnserver", "-c", str(conf), "--listening-ip", PUBLIC_ADDRESS, "--relay-ip", PUBLIC_ADDRESS,
                "--listening-port", str(TURN_PORT), "--use-auth-secret", "--realm", REALM, "--no-cli", "--no-tls",
                "--no-dtls", "--min-port", "49152", "--max-port", "49351",
                "--pidfile", str(tmp / "turn.pid"), "--log-file", str(self.turn_log), "--simple-log",
                "--no-stdout-log", "--verbose"]
        self.run_in("pub", argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            out = subprocess.run(["ip", "netns", "exec", self.ns("pub"), "ss", "-Hlun", f"sport = :{TURN_PORT}"],
                                 capture_output=True, text=True, timeout=10).stdout
            if out.strip():
                return
            if self._procs[-1].poll() is not None:
                break
            time.sleep(0.1)
        raise NatBedError(f"coturn did not start: {self._tail(self.turn_log)}")

    def _start_relay(self) -> None:
        self._relay_out = Path(f"/tmp/{self.prefix}-{self.run_id}-turn/relay.log")
        f = self._relay_out.open("w")
        secret = self._relay_out.with_name("relay-turn-secret")
        secret.write_text(self.turn_secret + "\n")
        secret.chmod(0o600)
        cmd = [sys.executable, "-c", "from splitroom.cli import main; main()", "relay", "--host", PUBLIC_ADDRESS,
               "--port", str(RELAY_PORT), "--stun-url", self.stun_url,
               "--turn-url", f"turn:{PUBLIC_ADDRESS}:{TURN_PORT}", "--turn-secret-file", str(secret),
               "--turn-ttl", "600", *self.relay_args]
        self._relay = self.run_in("pub", cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, PYTHONUNBUFFERED="1"))
        f.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if "listening on" in self.relay_log():
                return
            if self._relay.poll() is not None:
                break
            time.sleep(0.1)
        raise NatBedError(f"the relay did not start: {self.relay_log()[-400:]}")

    @staticmethod
    def _tail(path: Path | None, n: int = 400) -> str:
        try:
            return path.read_text()[-n:] if path is not None else ""
        except OSError:
            return ""

    def turn_log_text(self) -> str:
        """coturn's log so far."""
        return self._tail(self.turn_log, 10**7)

    # -- teardown

    def close(self) -> None:
        """End what was started, then delete the namespaces and the state file; idempotent."""
        live = [p for p in self._procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=2)
        self._procs.clear()
        for ns in reversed(self._made):
            netem._delete_netns(ns)
        self._made.clear()
        with contextlib.suppress(OSError):
            self._state.unlink()
        shutil.rmtree(f"/tmp/{self.prefix}-{self.run_id}-turn", ignore_errors=True)
