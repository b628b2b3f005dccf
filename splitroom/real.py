"""``splitroom run --real``: start a real room on this machine, measure it, and compare
with the simulator's prediction for the same scenario calibrated with what was measured.

One process per device (``python -m runtime.node``), a signalling relay, WebRTC data
channels between the processes. With root and the tools for it, each device runs in its
own network namespace and the scenario's round trip is applied to its packets
(runtime/netem.py); otherwise the room runs on loopback and says so.

Calibration (what the prediction takes from the measurement, nothing else):
* each device's seconds per layer: its median decode (or verify) stage time / its layers;
* the per-hop overhead: the mean decode hop time minus the emulated one-way delay;
* the host's output head per row, the drafter's cost per token, and the accepted
  length of every verify lap (replayed in order by the simulator's acceptance model);
* the workload: the measured prompt and answer lengths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.deal import Deal
from planner.metrics import compute as compute_metrics
from planner.protocol import FrameArrived, RunStage, SendFrame, StageFinished
from planner.room import Scenario

DEFAULT_PROMPTS = ("What is the capital of France?", "Name three colours of the rainbow.")


class RealRunError(RuntimeError):
    """The room could not be run (wrong model, a device that failed to start, a timeout)."""


@dataclass
class RealResult:
    """Measured and predicted numbers of one real run."""

    measured: dict
    predicted: dict
    error_pct: dict
    answers: list
    calibration: dict
    network: str
    emulated: list


def node_configs(scn: Scenario, deal: Deal, model_dir: str, workdir: Path, backend: str) -> list:
    """One runtime.room.NodeConfig per device that holds layers or hosts."""
    from runtime.room import NodeConfig
    spec = scn.decoding.speculative
    if spec is not None and spec.drafter not in ("ngram", "early_exit", "model"):
        raise RealRunError(f"drafter {spec.drafter!r} is not available in real runs; use ngram, early_exit or model")
    sched = dict(hidden=scn.model.hidden, prefill_chunk=scn.decoding.prefill_chunk,
                 draft_tokens=spec.draft_tokens if spec else 0,
                 async_laps=scn.decoding.async_laps if spec else 1, return_path=scn.decoding.return_path,
                 wake=scn.decoding.wake, phones=sorted(d.id for d in scn.devices if d.kind == "phone"),
                 eos_token=2, dtype=0)
    chain = [(s.device, s.start, s.end) for s in deal.stages]
    members = [deal.host] + [s.device for s in deal.stages if s.device != deal.host]
    prompts = list(scn.workload.prompts) or list(DEFAULT_PROMPTS)[:scn.workload.questions]
    out = []
    for dev in members:
        d = scn.device(dev)
        out.append(NodeConfig(device=dev, host=deal.host, stages=chain, scheduler=sched, model_dir=model_dir,
                              backend=backend, slowdown=d.emulate_slowdown or 1.0,
                              prompts=prompts if dev == deal.host else [],
                              max_new_tokens=scn.workload.answer_tokens,
                              trace_path=str(workdir / f"{dev}.trace.jsonl"),
                              peers=[m for m in members if m != dev],
                              drafter=spec.drafter if spec else "ngram"))
    return out


def calibrate(trace: list, deal: Deal) -> dict:
    """From a measured trace, over the decode/verify laps (prefill laps left out):
    seconds per layer per device (median stage time / layers, at the run's own lap
    size), mean and median hop seconds, the host's head seconds per row, drafting
    seconds per token, and the accepted drafts of every judged verify lap in order
    (for the simulator's recorded acceptance)."""
    prefill = {o.lap_id for _, o in trace if type(o).__name__ == "LapEnded" and o.kind == "prefill"}
    prefill |= {o.header.lap_id for _, o in trace if type(o).__name__ == "SendFrame" and o.header.kind.name == "PREFILL"}
    starts: dict = {}
    stage_s: dict[str, list[float]] = {}
    sends: dict = {}
    hops: list[float] = []
    heads: dict = {}
    head_per_row: list[float] = []
    drafts: dict = {}
    draft_s = 0.0
    drafted = 0
    accepted: list[int] = []
    for t, o in trace:
        name = type(o).__name__
        lap = getattr(o, "lap_id", None)
        if name == "RunStage" and lap not in prefill:
            starts[(o.device, lap)] = t
        elif name == "StageFinished" and (o.device, lap) in starts:
            stage_s.setdefault(o.device, []).append(t - starts.pop((o.device, lap)))
        elif name == "SendFrame" and o.header.lap_id not in prefill:
            sends[(o.src, o.dst, o.header.lap_id)] = t
        elif name == "FrameArrived" and (o.src, o.device, o.header.lap_id) in sends:
            hops.append(t - sends.pop((o.src, o.device, o.header.lap_id)))
        elif name == "RunHead" and lap not in prefill:
            heads[lap] = (t, o.rows)
        elif name == "HeadFinished" and lap in heads:
            t0, rows = heads.pop(lap)
            head_per_row.append((t - t0) / rows)
        elif name == "Draft":
            drafts[o.draft_id] = (t, o.k)
        elif name == "DraftReady" and o.draft_id in drafts:
            t0, k = drafts.pop(o.draft_id)
            draft_s += t - t0
            drafted += k
        elif name == "LapEnded" and o.kind == "verify" and not o.stale:
            accepted.append(max(o.kept - 1, 0))
    per_layer = {}
    for st in deal.stages:
        xs = stage_s.get(st.device)
        if xs and st.layers:
            per_layer[st.device] = float(np.median(xs)) / st.layers
    return {"s_per_layer": per_layer, "hop_s": float(np.mean(hops)) if hops else 0.0,
            "hop_p50_s": float(np.median(hops)) if hops else 0.0, "hops": len(hops),
            "head_s_per_row": float(np.median(head_per_row)) if head_per_row else None,
            "draft_s_per_token": draft_s / drafted if drafted else None, "accepted": accepted}


def calibrated_scenario(scn: Scenario, cal: dict, rtt_s: float, prompt_tokens: int, answer_tokens: int,
                        questions: int) -> Scenario:
    """``scn`` with measured seconds per layer, the measured hop overhead and workload."""
    # processes on one machine do not clock down like a phone's GPU: predict none
    devices = tuple(dataclasses.replace(d, s_per_layer=cal["s_per_layer"].get(d.id, d.s_per_layer), clocks_down=False)
                    for d in scn.devices)
    from planner.room import Jitter
    overhead = max(cal["hop_s"] - rtt_s / 2, 0.0)
    net = dataclasses.replace(scn.network, rtt_s=rtt_s, hop_overhead_s=overhead, jitter=Jitter(), episodes=None,
                              links=())
    wl = dataclasses.replace(scn.workload, prompt_tokens=max(prompt_tokens, 1), answer_tokens=max(answer_tokens, 1),
                             questions=questions, asked_by=())
    dec = scn.decoding
    if dec.speculative is not None:
        spec = dataclasses.replace(dec.speculative, accepted_sequence=tuple(cal.get("accepted") or ()),
                                   draft_s_per_token=cal.get("draft_s_per_token") or dec.speculative.draft_s_per_token)
        dec = dataclasses.replace(dec, speculative=spec)
    return dataclasses.replace(scn, devices=devices, network=net, workload=wl, decoding=dec,
                               measured_head_s_per_row=cal.get("head_s_per_row"))


def _error_pct(measured: dict, predicted: dict) -> dict:
    out = {}
    for k in ("tokens_per_s", "ttft_s", "tokens_per_lap"):
        m, p = measured.get(k, 0.0), predicted.get(k, 0.0)
        out[k] = 100.0 * (p - m) / m if m else 0.0
    for k in ("p50", "p99"):
        m, p = measured["inter_token_s"][k], predicted["inter_token_s"][k]
        out[f"inter_token_{k}"] = 100.0 * (p - m) / m if m else 0.0
    return out


def run_real(scn: Scenario, deal: Deal, backend: str = "numpy", netns: bool = True, timeout_s: float = 300.0,
             log=print) -> RealResult:
    """Run the room for real and predict it; see the module doc.

    Raises RealRunError when the scenario's model is not the bundled SmolLM2-135M, a
    device process fails, or the run exceeds ``timeout_s`` seconds.
    """
    if scn.model.id != "smollm2-135m":
        raise RealRunError(f"real runs serve the bundled smollm2-135m, not {scn.model.id!r}")
    from runtime.weights import ensure_safetensors
    model_dir = str(ensure_safetensors())
    workdir = Path(tempfile.mkdtemp(prefix="splitroom-real-"))
    cfgs = node_configs(scn, deal, model_dir, workdir, backend)
    room = "r" + secrets.token_hex(4)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    net = None
    network = "loopback"
    rtt_s = 0.0
    if netns:
        try:
            from runtime import netem
            ok, why = netem.available()
        except ImportError as e:  # pragma: no cover
            ok, why = False, str(e)
        if ok:
            rtt_s = scn.network.rtt_s
            net = netem.EmulatedNetwork([c.device for c in cfgs], rtt_s=rtt_s,
                                        jitter_s=scn.network.jitter.scale_s if scn.network.jitter else 0.0)
            network = f"network namespaces, {rtt_s * 1000:.0f} ms RTT applied to packets"
        else:
            network = f"loopback (no network emulation: {why})"
    procs: dict[str, subprocess.Popen] = {}
    relay = None
    t_start = time.time()
    try:
        if net is not None:
            net.__enter__()
            host_addr = net.address(deal.host)
            relay = net.run_in(deal.host, _relay_argv(host_addr, 8765), env=env, **_logs(workdir, "relay"))
            url = f"ws://{host_addr}:8765"
        else:
            port = _free_port()
            relay = subprocess.Popen(_relay_argv("127.0.0.1", port), env=env, **_logs(workdir, "relay"))
            url = f"ws://127.0.0.1:{port}"
        time.sleep(1.0)
        if relay.poll() is not None:
            raise RealRunError("the signalling relay did not start")
        for c in cfgs:
            p = workdir / f"{c.device}.json"
            p.write_text(c.to_json())
            argv = [sys.executable, "-m", "runtime.node", str(p), url, room, str(timeout_s)]
            io = _logs(workdir, c.device)
            procs[c.device] = (net.run_in(c.device, argv, env=env, **io) if net is not None
                               else subprocess.Popen(argv, env=env, **io))
        log(f"room {room}: {len(procs)} device processes on {network}")
        host = procs[deal.host]
        try:
            rc = host.wait(timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            raise RealRunError(f"the room did not finish within {timeout_s:.0f} s") from None
        if rc != 0:
            raise RealRunError(f"the model host exited with status {rc} (logs in {workdir})")
    finally:
        for dev, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for dev, p in procs.items():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if relay is not None and relay.poll() is None:
            relay.terminate()
            try:
                relay.wait(timeout=5)
            except subprocess.TimeoutExpired:
                relay.kill()
        if net is not None:
            net.__exit__(None, None, None)
    wall = time.time() - t_start
    from runtime.room import merge_traces
    records = []
    for c in cfgs:
        path = Path(c.trace_path)
        if path.exists():
            records.append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    trace = merge_traces(records)
    measured = compute_metrics(trace)
    info = json.loads(Path(cfgs[0].trace_path + ".answers.json").read_text())
    answers = [info["answers"][k] for k in sorted(info["answers"], key=int)]
    cal = calibrate(trace, deal)
    prompt_lens = [o.prompt_tokens for _, o in trace if type(o).__name__ == "BeginAnswer"]
    n_ans = [len(a["token_ids"]) for a in answers] or [1]
    pred_scn = calibrated_scenario(scn, cal, rtt_s, int(np.mean(prompt_lens)) if prompt_lens else 1,
                                   int(round(np.mean(n_ans))), len(answers) or 1)
    from sim.driver import simulate
    predicted = simulate(pred_scn, deal).metrics
    cal["wall_s"] = wall
    emulated = [f"{c.device}: compute padded {c.slowdown:g}x" for c in cfgs if c.slowdown > 1]
    return RealResult(measured, predicted, _error_pct(measured, predicted), answers, cal, network, emulated)


def _logs(workdir: Path, name: str) -> dict:
    """Popen keyword arguments sending a child's output to WORKDIR/NAME.log."""
    f = open(workdir / f"{name}.log", "wb")
    return {"stdout": f, "stderr": subprocess.STDOUT}


def _relay_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-c", f"from runtime.relay import main; main({host!r}, {port})"]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
