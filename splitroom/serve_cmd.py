"""``splitroom serve SCENARIO [--port 8000]``: start the room as ``run --real`` does and
keep it up, serving an OpenAI-compatible API on the model host, until Ctrl-C or SIGTERM.

What it starts (the pieces of :mod:`splitroom.real_procs`): the signalling relay and one
process per device that holds layers, each in its own network namespace with the
scenario's round trip applied when it can (root and the tools; else on loopback, and it
says so; with ``--in-process-delay`` the round trip is then applied in the device
processes, as for ``run --real``). The model host's process is ``python -m runtime.serve`` (runtime/serve/): it
serves HTTP from the start (503 until every device has loaded its layers and connected)
on a listening socket this process binds on ``BIND:PORT`` and hands down, so the API is
on this machine's address even when the host runs in a namespace. The workers are
``python -m runtime.node``.

A device process that ends before the room is ready (it died while loading) makes the
room start again without it when the devices left can hold the model (dealt by the
scenario's rules, the host kept), else the API answers every request with 503 "cannot
start: DEVICE died while loading (why)" and no Retry-After until Ctrl-C.

Ctrl-C (SIGINT) or SIGTERM ends every process it started (SIGTERM, then SIGKILL after a
grace period), removes the network namespaces and the temporary work folder (device
configurations and logs; ``SPLITROOM_KEEP_WORKDIR=1`` keeps it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from planner.deal import Deal
from planner.room import Scenario

#: the device processes' own bound on a served room's life, seconds (30 days)
LIFETIME_S = 30 * 86400.0
#: a served room declares a device lost after this long without a heartbeat, seconds
#: (``run --real`` uses 1 s). A room that lives for days on shared machines meets
#: pauses of more than a second (the CPU taken by other work), and a device declared
#: lost is gone for good, so a served room waits longer before it says so.
HEARTBEAT_TIMEOUT_S = 5.0


class ServeError(RuntimeError):
    """The room cannot be served: a model other than the bundled one, a port that
    cannot be listened on, or a process that failed to start (with its log's last line)."""


def room_info(scn: Scenario, deal: Deal) -> dict:
    """Facts about the room for ``/health`` and the room page: its name, the model, the
    devices (id, name, kind, bytes lent), the deal (stages 0-based half-open with their
    1-based label, each device's role, bytes used and why, notes), the simulator's
    predicted tokens per second (or None), and the memory of each layer (weights + KV at
    the context, ``layer_bytes``) and of the host's extras (``host_extra_bytes``)."""
    pred = None
    try:
        from sim.driver import simulate
        pred = simulate(scn, deal, trace=False).metrics.get("tokens_per_s")
    except Exception:  # a prediction is a nicety: serving does not depend on it
        pred = None
    return {"name": scn.name, "model": {"id": scn.model.id, "name": scn.model.name, "layers": scn.model.layers},
            "devices": [{"id": d.id, "name": d.name, "kind": d.kind, "lends_bytes": d.lends_bytes}
                        for d in scn.devices],
            "host": deal.host,
            "stages": [{"device": s.device, "start": s.start, "end": s.end, "shown": s.shown} for s in deal.stages],
            "shares": [{"device": sh.device, "role": sh.role, "used_bytes": sh.used_bytes, "why": sh.why}
                       for sh in deal.shares],
            "notes": list(deal.notes), "predicted_tokens_per_s": pred,
            # what each layer and the host's extras take, so the page can show a re-deal's memory
            "layer_bytes": [scn.model.range_memory_bytes(i, i + 1, scn.options.context_tokens, scn.options.kv_cache)
                            for i in range(scn.model.layers)],
            "host_extra_bytes": scn.model.host_extra_bytes}


def _refuse_until_stopped(sock: socket.socket, model_id: str, reason: str, stopped: Callable[[], bool]) -> int:
    """Answer every request on ``sock`` with 503 and ``reason`` (no Retry-After: waiting
    will not help) until ``stopped()``; returns 1 (the room never served)."""
    import asyncio
    from runtime.serve.host import start_api
    from runtime.serve.server import RoomServer

    async def main() -> None:
        server = RoomServer(model_id)
        server.set_phase("failed", reason)
        _, runner = await start_api(sock, model_id, None, server)
        try:
            while not stopped():
                await asyncio.sleep(0.2)
        finally:
            await runner.cleanup()
    asyncio.run(main())
    return 1


def _listen(bind: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((bind, port))
    except OSError as e:
        raise ServeError(f"cannot listen on {bind}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _health(url: str) -> Optional[dict]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def serve_room(scn: Scenario, deal: Deal, port: int = 8000, bind: str = "127.0.0.1", backend: str = "numpy",
               netns: bool = True, log: Callable[[str], None] = print,
               should_stop: Optional[Callable[[], bool]] = None, open_timeout_s: float = 120.0,
               in_process_delay: bool = False) -> int:
    """Serve the room until SIGINT/SIGTERM (or ``should_stop()`` returns True, polled
    every 0.2 s); see the module doc. Returns 0 when stopped that way, 1 when the
    model host's process ended by itself (its log's last line is logged).

    Args:
        port: TCP port of the API (0: any free port; the URL is logged).
        bind: the address it listens on (``0.0.0.0`` for a LAN).
        open_timeout_s: how long every device gets to load its layers and connect, seconds.
        in_process_delay: without namespaces, every device process (the model host's
            too) holds what it sends half the scenario's round trip
            (:func:`splitroom.real_procs.plan_network`; NodeConfig.emulate_one_way_s).
    Raises:
        ServeError: see the class; nothing is left running when it is raised.
        RealRunError: ``in_process_delay`` for a scenario with jitter (before anything starts).
    """
    from splitroom.real_configs import node_configs, real_model_dir, redeal_without
    from splitroom.real_errors import RealRunError
    from splitroom.real_procs import (_last_log_line, device_argv, ended_how, plan_network, start_process, start_relay,
                                      stop_room, write_config)
    from splitroom.report import in_flight_line
    try:
        model_dir = str(real_model_dir(scn))  # before anything starts: a bad model leaves nothing running
    except RealRunError as e:
        raise ServeError(str(e)) from None
    sock = _listen(bind, port)
    port = sock.getsockname()[1]
    url = f"http://{'127.0.0.1' if bind in ('0.0.0.0', '') else bind}:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="splitroom-serve-"))
    procs: dict[str, subprocess.Popen] = {}
    relay = net = None
    stopping = {"signal": None}
    old = {}

    def on_signal(signum, frame):
        stopping["signal"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (tests): should_stop does it
            pass
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        all_devices = [s.device for s in deal.stages] + [deal.host]
        net, network, rtt_s = plan_network(scn, sorted(set(all_devices)), netns, in_process_delay)
        one_way_s = rtt_s / 2 if net is None else 0.0  # the in-process delay, when planned
        if net is not None:
            net.__enter__()
        relay, relay_url = start_relay(net, deal.host, workdir, env)
        info_path = workdir / "room.json"

        def start(deal_: Deal) -> None:
            cfgs = [c.model_copy(update={"prompts": [], "trace_path": "", "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
                                         "emulate_one_way_s": one_way_s})
                    for c in node_configs(scn, deal_, model_dir, workdir, backend)]
            room = "r" + secrets.token_hex(4)
            info_path.write_text(json.dumps(room_info(scn, deal_)))
            for c in cfgs:
                path = write_config(c, workdir)
                if c.device == deal_.host:
                    argv = [sys.executable, "-m", "runtime.serve", str(path), relay_url, room,
                            "--listen-fd", str(sock.fileno()), "--model-id", scn.model.id,
                            "--room-info", str(info_path), "--open-timeout", str(open_timeout_s),
                            "--lifetime", str(LIFETIME_S)] + (["--guests"] if net is None else [])
                    procs[c.device] = start_process(net, c.device, argv, workdir, env, pass_fds=(sock.fileno(),))
                else:
                    procs[c.device] = start_process(net, c.device, device_argv(path, relay_url, room, LIFETIME_S),
                                                    workdir, env)
            log(f"room {room}: {len(procs)} device processes on {network}")
            in_flight = in_flight_line(scn.decoding.questions_in_flight, deal_.kv_caches)
            if in_flight:
                log(in_flight)

        start(deal)  # the parent keeps the listening socket: a room started again hands it down again
        log(f"serving {scn.model.id} at {url}/v1 (OpenAI API; {url}/health, {url}/metrics); Ctrl-C ends the room")
        told_ready = False
        gone: set[str] = set()
        next_check = time.monotonic() + 1.0
        while stopping["signal"] is None and not (should_stop is not None and should_stop()):
            host = procs[deal.host]
            if host.poll() is not None:
                last = _last_log_line(workdir, deal.host)
                log(f"the model host's process ended ({ended_how(host.returncode, last)})")
                return 1
            for dev, p in list(procs.items()):
                if dev not in gone and p.poll() is not None:
                    gone.add(dev)
                    last = _last_log_line(workdir, dev)
                    log(f"{dev}'s process ended ({ended_how(p.returncode, last)})")
                    if told_ready:
                        continue  # the room's own recovery handles a lost worker
                    new, why = redeal_without(scn, deal, gone)
                    stop_room(procs, None, None)
                    procs.clear()
                    if new is None:
                        reason = f"cannot start: {dev} died while loading ({why})"
                        log(reason)
                        return _refuse_until_stopped(sock, scn.model.id, reason,
                                                     lambda: stopping["signal"] is not None
                                                     or (should_stop is not None and should_stop()))
                    deal = new
                    log(f"{dev} died while loading: re-dealt without it: "
                        + ", ".join(f"{s.device} {s.shown}" for s in deal.stages))
                    start(deal)
                    break
            if not told_ready and time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                h = _health(url)
                if h is not None and h.get("ready"):
                    told_ready = True
                    log("ready: every device loaded its layers and connected")
            time.sleep(0.2)
        log("stopping the room")
        return 0
    finally:
        try:
            sock.close()
        except OSError:
            pass
        stop_room(procs, relay, net)
        for sig, h in old.items():
            signal.signal(sig, h)
        if os.environ.get("SPLITROOM_KEEP_WORKDIR") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
