"""Starting and ending a real room's processes on this machine (shared by
``splitroom run --real`` and ``splitroom serve``): the network they run on (namespaces
with the scenario's round trip, or loopback), the signalling relay, one
``python -m runtime.node`` process per device with its log, waiting for the model
host's process, ending them all, and reading what they wrote (traces, answers,
in-process delay records).

What each process is told to run is :mod:`splitroom.real_configs`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from planner.protocol import DeviceLost
from planner.room import Scenario
from splitroom.real_errors import DiedWhileLoading, RealRunError


def plan_network(scn: Scenario, devices: Sequence[str], netns: bool,
                 in_process_delay: bool = False) -> tuple[object | None, str, float]:
    """How a room of ``devices`` runs on this machine: ``(network, description, rtt_s)``.

    With ``netns`` and what runtime/testbed/netem.py needs (root, ip, iptables, NetfilterQueue),
    ``network`` is a :class:`runtime.testbed.netem.EmulatedNetwork` (not entered yet: enter it
    before :func:`start_relay`) applying the scenario's round trip ``rtt_s`` seconds and
    jitter. Otherwise ``network`` is None and the room runs on loopback: with
    ``in_process_delay`` and a round trip above 0, ``rtt_s`` is the scenario's and every
    device process holds what it sends ``rtt_s / 2`` (NodeConfig.emulate_one_way_s);
    else ``rtt_s`` is 0. The description says which, and why not namespaces.

    Raises:
        RealRunError: ``in_process_delay`` for a scenario with jitter (the in-process
            delay has none, and the prediction would count it).
    """
    if netns:
        try:
            from runtime.testbed import netem
            ok, why = netem.available()
        except ImportError as e:  # pragma: no cover
            ok, why = False, str(e)
    else:
        ok, why = False, "--loopback"
    if not ok:
        rtt_s = scn.network.rtt_s
        if not (in_process_delay and rtt_s > 0):
            return None, "loopback" if not netns else f"loopback (no network emulation: {why})", 0.0
        j = scn.network.jitter
        if j is not None and j.scale_s > 0:
            raise RealRunError(f"network.jitter {j.scale_s * 1000:g} ms: the in-process delay has no jitter "
                               "(set network.jitter to {distribution: none}, or run where namespaces are available)")
        return (None, f"loopback, {rtt_s * 1000:g} ms RTT emulated in process (each device holds what it sends "
                f"{rtt_s * 500:g} ms below SCTP; no namespaces: {why})", rtt_s)
    rtt_s = scn.network.rtt_s
    net = netem.EmulatedNetwork(list(devices), rtt_s=rtt_s,
                                jitter_s=scn.network.jitter.scale_s if scn.network.jitter else 0.0)
    return net, f"network namespaces, {rtt_s * 1000:.0f} ms RTT applied to packets", rtt_s


#: environment variable of a real room: each device process's wgpu adapter index, in the order
#: of the room's device processes (the deal's stages), e.g. ``0,1,2,3`` for one GPU each
ADAPTERS_ENV = "SPLITROOM_WGPU_ADAPTERS"


def adapter_indices(devices: Sequence[str]) -> dict[str, int]:
    """``{device: adapter index}`` from ``$SPLITROOM_WGPU_ADAPTERS`` (comma-separated indices,
    one per device process in ``devices``' order; the process gets it as
    ``SPLITROOM_WGPU_ADAPTER``, runtime.backends.wgpu_backend.get_device); empty when unset.

    Raises:
        RealRunError: not whole numbers, or fewer indices than device processes.
    """
    raw = os.environ.get(ADAPTERS_ENV, "").strip()
    if not raw:
        return {}
    parts = [p.strip() for p in raw.split(",")]
    if not all(p.isdigit() for p in parts):
        raise RealRunError(f"{ADAPTERS_ENV} must be adapter indices such as 0,1,2, got {raw!r}")
    if len(parts) < len(devices):
        raise RealRunError(f"{ADAPTERS_ENV}={raw} names {len(parts)} adapters for {len(devices)} device processes "
                           f"({', '.join(devices)})")
    return {d: int(p) for d, p in zip(devices, parts)}


def start_process(net, device: str, argv: Sequence[str], workdir: Path, env: dict, **popen) -> subprocess.Popen:
    """Start ``argv`` as ``device``'s process: in its namespace of ``net`` (an entered
    EmulatedNetwork), or on this machine when ``net`` is None; its output goes to
    WORKDIR/DEVICE.log (rotated: :func:`_rotated`). ``popen``: more :class:`subprocess.Popen`
    arguments (pass_fds).
    Raises OSError when the process cannot be started."""
    io = _logs(workdir, device)
    if net is not None:
        return _rotated(net.run_in(device, list(argv), env=env, **io, **popen), workdir, device)
    return _rotated(subprocess.Popen(list(argv), env=env, **io, **popen), workdir, device)


def start_relay(net, host: str, workdir: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """Start the signalling relay (in ``host``'s namespace when ``net`` is entered, else
    on 127.0.0.1 at a free port); returns ``(process, ws:// URL)`` after a second, once
    it is still running. Raises RealRunError when it exited (its log is WORKDIR/relay.log)."""
    if net is not None:
        addr, port = net.address(host), 8765
        relay = _rotated(net.run_in(host, _relay_argv(addr, port), env=env, **_logs(workdir, "relay")), workdir, "relay")
    else:
        addr, port = "127.0.0.1", _free_port()
        relay = _rotated(subprocess.Popen(_relay_argv(addr, port), env=env, **_logs(workdir, "relay")), workdir, "relay")
    time.sleep(1.0)
    if relay.poll() is not None:
        raise RealRunError("the signalling relay did not start")
    return relay, f"ws://{addr}:{port}"


def write_config(cfg, workdir: Path) -> Path:
    """Write a device's NodeConfig as WORKDIR/DEVICE.json; returns the path."""
    p = workdir / f"{cfg.device}.json"
    p.write_text(cfg.to_json())
    return p


def device_argv(config_path: Path, relay_url: str, room: str, timeout_s: float) -> list[str]:
    """The command line of one device process (``python -m runtime.node``)."""
    return [sys.executable, "-m", "runtime.node", str(config_path), relay_url, room, str(timeout_s)]


def _wait_host(procs: dict, host: str, joined: str, workdir: Path, timeout_s: float) -> int:
    """Wait for the model host's process to end; returns its exit status. Raises
    DiedWhileLoading for a worker whose process ends before the host's ``joined`` file
    exists (the room never started: runtime.node.JOINED_SUFFIX), RealRunError when the
    host has not ended 30 s after ``timeout_s`` seconds (its own timeout ends it first)."""
    end = time.monotonic() + timeout_s + 30
    while True:
        rc = procs[host].poll()
        if rc is not None:
            return rc
        if not os.path.exists(joined):
            for dev, p in procs.items():
                if dev != host and p.poll() is not None:
                    raise DiedWhileLoading(dev, ended_how(p.returncode, _last_log_line(workdir, dev)))
        if time.monotonic() >= end:
            raise RealRunError(f"the room did not finish within {timeout_s:.0f} s")
        time.sleep(0.1)


def stop_room(procs: dict, relay, net, grace_s: float = 20.0) -> None:
    """End a room's processes: SIGTERM every device process still running, wait up to
    ``grace_s`` seconds for each (then SIGKILL), end the relay, and leave the emulated
    network (which ends what is left in its namespaces and deletes them). Never raises
    for a process that already exited."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    if relay is not None and relay.poll() is None:
        relay.terminate()
        try:
            relay.wait(timeout=5)
        except subprocess.TimeoutExpired:
            relay.kill()
    if net is not None:
        net.__exit__(None, None, None)


def read_delay_stats(cfgs: Sequence) -> dict:
    """``{device: record}`` of the in-process delays the room's device processes wrote
    beside their traces (runtime.node.DELAY_SUFFIX; RtcTransport.delay_stats), for the
    devices that wrote one."""
    from runtime.node import DELAY_SUFFIX
    out = {}
    for c in cfgs:
        path = Path(c.trace_path + DELAY_SUFFIX) if c.trace_path else None
        if path is not None and path.exists():
            try:
                out[c.device] = json.loads(path.read_text())
            except ValueError:  # a process killed while writing: nothing to report
                continue
    return out


def ended_how(returncode: int, last_line: str) -> str:
    """How a device process ended, in words: ``killed by SIGKILL`` for a signal (its log
    then says nothing about why: its last line is older than the kill, so it is not
    given as the cause), else ``status N`` with the log's last line, which a process that
    exits by itself writes last (``status 3: could not join room ...``)."""
    import signal as _signal
    if returncode < 0:
        try:
            name = _signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"status {returncode}" + (f": {last_line}" if last_line else "")


def _last_log_line(workdir: Path, name: str) -> str:
    """The last non-empty line of WORKDIR/NAME.log (at most 300 characters), or "" (a
    child that ended: once its output is copied, waiting at most 2 s)."""
    copy = _LOG_COPIES.get(str(workdir / f"{name}.log"))
    if copy is not None:
        copy.join(timeout=2.0)
    try:
        lines = [ln for ln in (workdir / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def _logs(workdir: Path, name: str) -> dict:
    """Popen keyword arguments for a child whose output :func:`_rotated` keeps."""
    return {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}


def _rotated(proc: subprocess.Popen, workdir: Path, name: str) -> subprocess.Popen:
    """``proc``'s output (stdout and stderr) copied into WORKDIR/NAME.log, rotated at
    runtime.logs.LOG_FILE_BYTES with LOG_BACKUPS older files (NAME.log.1, ...); returns ``proc``."""
    from runtime import logs
    path = str(workdir / f"{name}.log")
    _LOG_COPIES[path] = logs.rotate_into(proc.stdout, path, logs.LOG_FILE_BYTES, logs.LOG_BACKUPS)
    return proc


#: log file -> the thread copying a child's output into it (see _rotated)
_LOG_COPIES: dict = {}


def _relay_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-c", f"from runtime.relay import main; main({host!r}, {port})"]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_room(cfgs: Sequence, colocated: set[str], net, network: str, host: str, workdir: Path, timeout_s: float,
             log) -> float:
    """Run a room of ``cfgs`` (NodeConfigs; the first is the model host ``host``'s) on
    ``net`` (an EmulatedNetwork, entered here and left when the room ends; None for
    loopback, which ``network`` describes): the relay, one process per device, except the
    ``colocated`` devices, whose configs the host's process also runs (``--also``). Waits
    for the model host's process to end, then ends every process; returns the wall-clock
    seconds from the start.

    Raises:
        DiedWhileLoading: a worker's process ended before the room started.
        RealRunError: the relay did not start, the model host's process ended with a
            status other than 0 (with the last line of its log), or the room did not
            finish within ``timeout_s`` seconds (30 s of grace).
    """
    room = "r" + secrets.token_hex(4)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs: dict[str, subprocess.Popen] = {}
    relay = None
    t_start = time.time()
    try:
        if net is not None:
            net.__enter__()
        relay, url = start_relay(net, host, workdir, env)
        adapters = adapter_indices([c.device for c in cfgs if c.device not in colocated])
        for c in cfgs:
            if c.device in colocated:
                continue
            argv = device_argv(write_config(c, workdir), url, room, timeout_s)
            if c.device == host:
                for t in sorted(colocated):
                    argv += ["--also", str(write_config(next(x for x in cfgs if x.device == t), workdir))]
            denv = env if c.device not in adapters else dict(env, SPLITROOM_WGPU_ADAPTER=str(adapters[c.device]))
            procs[c.device] = start_process(net, c.device, argv, workdir, denv)
        log(f"room {room}: {len(procs)} device processes on {network}"
            + (f" (the model host's process also runs {', '.join(sorted(colocated))})" if colocated else ""))
        from runtime.node import JOINED_SUFFIX
        rc = _wait_host(procs, host, cfgs[0].trace_path + JOINED_SUFFIX, workdir, timeout_s)
        if rc != 0:
            last = _last_log_line(workdir, host)
            raise RealRunError(f"the model host's process ended ({ended_how(rc, last)})")
    finally:
        stop_room(procs, relay, net)
    return time.time() - t_start


@dataclass
class RoomRun:
    """What a real room's processes wrote (:func:`read_room`).

    ``trace``: every device's trace merged, ``(seconds, event)`` in time order
    (runtime.room.merge_traces). ``losses``: ``(device, reason)`` of every device the
    model host declared lost, in order. ``answers``: the answered questions' records
    (``text``, ``token_ids``) in the order the host numbered them. ``aligned``: one record
    per question asked, in asking order, with ``ended`` added ("answered", "refused: ..."
    or "lost: ..."; ``text`` "" and no ``token_ids`` for a question not answered);
    ``ended``: those words alone. ``delays``: :func:`read_delay_stats`. ``wall_s``: the
    room's wall-clock seconds (:func:`run_room`)."""

    trace: list
    losses: list
    answers: list
    aligned: list
    ended: list
    delays: dict
    wall_s: float


def read_room(cfgs: Sequence, host: str, wall_s: float) -> RoomRun:
    """Read what the processes of ``cfgs`` wrote beside their traces (the first config is
    the model host ``host``'s, whose ``.answers.json`` says how each question ended).
    Raises OSError / ValueError when the model host wrote no answers file."""
    from runtime.room import merge_traces
    records, losses = [], []
    for c in cfgs:
        path = Path(c.trace_path)
        if path.exists():
            records.append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
            if c.device == host:
                losses = [(o.device, o.reason) for _, o in merge_traces(records[-1:]) if isinstance(o, DeviceLost)]
    trace = merge_traces(records)
    info = json.loads(Path(cfgs[0].trace_path + ".answers.json").read_text())
    answers = [info["answers"][k] for k in sorted(info["answers"], key=int)]
    asked = len(cfgs[0].prompts)
    how = info.get("ended", {})
    ended = [how.get(str(i), "lost: the model host ended without answering or refusing it") for i in range(asked)]
    aligned = [dict(info["answers"].get(str(i), {"text": "", "token_ids": []}), ended=ended[i])
               for i in range(asked)]
    return RoomRun(trace, losses, answers, aligned, ended, read_delay_stats(cfgs), wall_s)
