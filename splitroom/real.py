"""``splitroom run --real``: start a real room on this machine, measure it, and compare
with the simulator's prediction for the same scenario calibrated with what was measured.

One process per device (``python -m runtime.node``), a signalling relay, WebRTC data
channels between the processes. With root and the tools for it, each device runs in its
own network namespace and the scenario's round trip is applied to its packets
(runtime/testbed/netem.py); otherwise the room runs on loopback and says so, or, with
``in_process_delay``, on loopback with each device process holding what it sends for half
the round trip (runtime.transport.emulate_delay: one delay for every pair, no jitter).

Calibration (what the prediction takes from the measurement, nothing else; the fitting
is :mod:`planner.trace_fit`, pure): each device's seconds per layer, the per-hop overhead
over the emulated one-way delay, the host's output head per row, the drafter's cost per
token and the accepted length of every verify lap, the measured prompt and answer
lengths, and the transport's initial congestion window (aiortc as tuned by
runtime.transport: 10 chunks of 1160 bytes), so large frames pay their slow-start round
trips.
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
from typing import Sequence

import numpy as np

from planner.deal import Deal
from planner.metrics import compute as compute_metrics
from planner.privacy import TAIL_SUFFIX
from planner.protocol import BeginAnswer, DeviceLost
from planner.room import RUNTIME_DRAFTERS, Scenario
from planner.trace_fit import calibrated_scenario, fit_trace

DEFAULT_PROMPTS = ("What is the capital of France?", "Name three colours of the rainbow.")


class RealRunError(RuntimeError):
    """The room could not be run (wrong model, a device that failed to start, a timeout)."""


class DiedWhileLoading(RealRunError):
    """A worker's process ended before the room started (before the model host's
    process joined the room): ``device`` and ``how`` it ended (:func:`ended_how`)."""

    def __init__(self, device: str, how: str):
        super().__init__(f"{device} died while loading ({how})")
        self.device = device
        self.how = how


@dataclass
class RealResult:
    """Measured and predicted numbers of one real run.

    ``predicted`` / ``error_pct``: the same-run figure (the simulator calibrated with
    this run's own measurements: it shows the model composes measured parts, it is
    not a prediction). ``profile_predicted`` / ``profile_error_pct``: the figure
    predicted before the run from a calibration profile, when one was given."""

    measured: dict
    predicted: dict
    error_pct: dict
    answers: list
    calibration: dict
    network: str
    emulated: list
    profile_predicted: dict | None = None
    profile_error_pct: dict | None = None
    #: per question, in asking order: "answered", "refused: REASON" or "lost: REASON"
    #: (``answers`` is aligned with it; a question that ended without an answer has "")
    ended: list = dataclasses.field(default_factory=list)
    #: every device the model host declared lost, in order: ``(device, reason)`` (the
    #: reason names the rule that fired, runtime.room.lost_reason)
    losses: list = dataclasses.field(default_factory=list)

    @property
    def unanswered(self) -> list[tuple[int, str]]:
        """``(question index, how it ended)`` of every question that was not answered."""
        return [(i, e) for i, e in enumerate(self.ended) if e != "answered"]


def real_model_dir(scn: Scenario) -> Path:
    """The model directory a real room of ``scn`` loads: the bundled SmolLM2 for the catalog
    id ``smollm2-135m``, else the checkpoint the scenario names (``model: {gguf: PATH}`` /
    ``{safetensors: DIR}``), converted once (``weights: gguf``: not converted, its blocks read as stored). Raises RealRunError (one line) for a model with no
    weights here or a checkpoint the runtime cannot use."""
    from splitroom.models import ModelError, model_dir
    try:
        d = model_dir(scn.model, stored=scn.weights == "gguf")
    except ModelError as e:
        raise RealRunError(str(e)) from None
    if not (d / "tokenizer.json").is_file():
        raise RealRunError(f"{scn.model.id} has no tokenizer here: a real room takes its questions as text "
                           "(splitroom generate --ids runs such a model on token ids)")
    return d


def node_configs(scn: Scenario, deal: Deal, model_dir: str, workdir: Path, backend: str) -> list:
    """One runtime.room.NodeConfig per device that holds layers or hosts. Raises
    RealRunError (one line) for what a real room cannot run: a drafter or KV storage the
    runtime lacks, a warm-up question (``workload.warm_up_tokens``, which only the
    simulator asks)."""
    from runtime.room import NodeConfig
    if scn.workload.warm_up_tokens:
        raise RealRunError("workload.warm_up_tokens: a real room asks no warm-up question; it is for predicting "
                           "a room measured after one (scripts/serve_load.py)")
    spec = scn.decoding.speculative
    if spec is not None and spec.drafter not in RUNTIME_DRAFTERS:
        raise RealRunError(f"drafter {spec.drafter!r} is not available in real runs; use ngram, early_exit or model")
    from planner.scheduler import SchedulerConfig
    if scn.options.kv_cache not in ("f32", "f16"):
        raise RealRunError(f"kv_cache {scn.options.kv_cache} is not stored by the runtime; use f32 or f16")
    from runtime.precision import BACKEND_SUPPORT
    weights, kv = scn.weights or "f32", scn.options.kv_cache
    has_w, has_kv = BACKEND_SUPPORT.get(backend, ((weights,), (kv,)))
    if weights not in has_w or kv not in has_kv:
        raise RealRunError(f"the {backend} backend stores weights as {', '.join(has_w)} and KV as "
                           f"{', '.join(has_kv)}; the scenario asks weights {weights}, kv_cache {kv} "
                           f"(choose what it stores with --set, e.g. kv_cache=f32, or use --backend numpy)")
    from runtime.config import ModelConfig
    mcfg = ModelConfig.load(model_dir)  # the checkpoint's own eos (SmolLM2: 2, <|im_end|>) and stop ids
    sched = SchedulerConfig.from_scenario(scn, eos_token=mcfg.eos_id if mcfg.eos_id >= 0 else None,
                                          stop_tokens=tuple(i for i in mcfg.stop_ids if i >= 0),
                                          deal=deal).to_json()
    chain = [(s.device, s.start, s.end) for s in deal.stages]
    members = [deal.host] + [s.device for s in deal.stages if s.device != deal.host]
    prompts = real_prompts(scn)
    check_prompts_fit(scn, deal, prompt_token_counts(model_dir, prompts) if prompts else [])
    crash, crash_s, redeals = _faults(scn, deal)
    key = secrets.token_urlsafe(24)  # signs the weights manifests the host hands out
    from planner.deal import usable_bytes
    opts = scn.options
    lent = {"usable_bytes": {d.id: usable_bytes(d, opts) for d in scn.devices if d.id in members},  # the host's re-deal check
            "layer_bytes": [scn.model.range_memory_bytes(i, i + 1, opts.context_tokens, opts.kv_cache)
                            for i in range(scn.model.layers)],
            "host_extra_bytes": scn.model.host_extra_bytes}
    out = []
    for dev in members:
        d = scn.device(dev)
        out.append(NodeConfig(device=dev, host=deal.host, stages=chain, scheduler=sched, model_dir=model_dir,
                              backend=backend, slowdown=d.emulate_slowdown or 1.0,
                              prompts=prompts if dev == deal.host else [],
                              max_new_tokens=scn.workload.answer_tokens,
                              trace_path=str(workdir / f"{dev}.trace.jsonl"),
                              peers=[m for m in members if m != dev],
                              drafter=spec.drafter if spec else "ngram",
                              crash_at_token=crash if dev == deal.host else [],
                              crash_at_s=crash_s if dev == deal.host else [],
                              crashable=any(f.device == dev for f in scn.faults),
                              redeals=redeals if dev == deal.host else {}, weights=weights, kv=kv,
                              weights_from_peer=bool(scn.faults), room_key=key,
                              ice_servers=list(scn.network.ice_servers),
                              **(lent if dev == deal.host else {})))
    return out


def with_draft_policy(cfgs: list, scn: Scenario, deal: Deal, profile, rtt_s: float,
                      prompt_tokens: Sequence[int]) -> list:
    """``cfgs`` (NodeConfigs) with the adaptive draft rule's settings
    (sim.draft_costs.draft_policy) in every scheduler: the room as this run runs it
    (:func:`real_run_scenario`), costed from ``profile`` when given, else from the
    scenario's rooflines."""
    from runtime.control import DraftPolicySettings
    from sim.draft_costs import draft_policy
    as_run = real_run_scenario(scn, rtt_s, prompt_tokens, scn.workload.answer_tokens)
    pol = draft_policy(as_run.with_profile(on_this_host(profile, deal)[0]) if profile is not None else as_run, deal)
    if pol is None:
        return cfgs
    settings = DraftPolicySettings(**pol.to_json())
    return [c.model_copy(update={"scheduler": c.scheduler.model_copy(update={"draft_policy": settings})})
            for c in cfgs]


def _faults(scn: Scenario, deal: Deal) -> tuple[list, list, dict]:
    """The host's fault injection for a scenario's ``faults:`` (``[(device, token N)]``
    and ``[(device, seconds)]``, the seconds counted from the host's start, when the
    first question is asked, as the simulator counts them) and the re-deal the planner's
    rules give for the loss of each worker of the chain, over the devices that run a
    process (the chain; the prediction re-deals over the same). Raises RealRunError for
    a fault the real room cannot inject: on the model host or on a device outside the
    chain."""
    if not scn.faults:
        return [], [], {}
    from planner.chain import redeal_rule_for
    chain = {s.device for s in deal.stages} - {deal.host}
    crash, crash_s = [], []
    for f in scn.faults:
        if f.device == deal.host or f.device not in chain or f.device.endswith(TAIL_SUFFIX):
            raise RealRunError(f"faults: {f.device} is not a worker of the chain; run --real can only kill a worker")
        if f.at_token is not None:
            crash.append((f.device, f.at_token))
        else:
            crash_s.append((f.device, f.at_s))
    rule = redeal_rule_for(scn, [d for d in scn.devices if d.id in chain | {deal.host}])
    redeals = {}
    for dev in sorted(chain):
        try:
            new = rule(deal, frozenset({dev}))
        except ValueError:  # the rest cannot hold the model: the host will refuse, with the reason
            redeals[dev] = []
            continue
        redeals[dev] = [(s.device, s.start, s.end) for s in new.stages]
    return crash, crash_s, redeals


def sctp_burst_bytes() -> int:
    """Bytes the room's tuned SCTP sender sends in one burst before an acknowledgement
    returns (runtime.transport: DEFAULT_MAX_BURST_CHUNKS chunks of SCTP_CHUNK_BYTES)."""
    from runtime.transport import DEFAULT_MAX_BURST_CHUNKS, SCTP_CHUNK_BYTES
    return DEFAULT_MAX_BURST_CHUNKS * SCTP_CHUNK_BYTES


def real_run_network(scn: Scenario, rtt_s: float):
    """``scn.network`` as a real room on this machine has it (a
    :class:`planner.room.Network`): the round trip ``rtt_s`` (0 on loopback) with the
    scenario's jitter scale as normal jitter (netem applies it; none at 0 ms), no stall
    episodes and no per-pair links (not emulated), no bandwidth limit (loopback has none to
    speak of: the transport's per-byte cost is in the profile) and the tuned SCTP sender's
    burst cap (:func:`sctp_burst_bytes`)."""
    from planner.room import Jitter
    j = scn.network.jitter
    jitter = Jitter("normal", j.scale_s) if (j is not None and j.scale_s > 0 and rtt_s > 0) else Jitter()
    return dataclasses.replace(scn.network, rtt_s=rtt_s, jitter=jitter, episodes=None, links=(), bandwidth_Bps=1e12,
                               burst_bytes=sctp_burst_bytes())


def with_late_hops(scn: Scenario, late_s: float) -> Scenario:
    """``scn`` with ``late_s`` seconds more on every hop (the in-process delay's lateness,
    planner.profile.TransportProfile.delay_late_s). Apply it after
    :meth:`planner.room.Scenario.with_profile`, which sets the hop overhead from the profile's
    transport."""
    if not late_s:
        return scn
    return dataclasses.replace(scn, network=dataclasses.replace(scn.network,
                                                                hop_overhead_s=scn.network.hop_overhead_s + late_s))


def real_run_scenario(scn: Scenario, rtt_s: float, prompt_tokens: Sequence[int], answer_tokens: int) -> Scenario:
    """``scn`` as a real run on this machine will run it, for a prediction made before
    the run: the network of :func:`real_run_network` at ``rtt_s``, the real prompts' token
    counts and the answer cap, asked by the host one after another."""
    net = real_run_network(scn, rtt_s)
    n = max(len(prompt_tokens), 1)
    wl = dataclasses.replace(scn.workload, prompt_tokens=max(int(round(sum(prompt_tokens) / n)), 1),
                             answer_tokens=max(answer_tokens, 1), questions=n, asked_by=())
    return dataclasses.replace(scn, network=net, workload=wl)


def check_prompts_fit(scn: Scenario, deal: Deal, prompt_tokens: Sequence[int]) -> None:
    """Raise RealRunError (one line, with the lengths) when a question's prompt
    (``prompt_tokens``, through the chat template) plus its answer cap
    (``workload.answer_tokens``) is longer than the room holds: the scenario's context,
    or less when the smallest stage's KV cache holds fewer positions
    (:attr:`planner.deal.Deal.max_context`)."""
    limits = [(scn.options.context_tokens, "the context")]
    if deal.max_context is not None:
        small = min((sh for sh in deal.shares if sh.max_context is not None
                     and (sh.layers > 0 or sh.role == "model host")), key=lambda sh: sh.max_context)
        limits.append((deal.max_context, f"{small.device}'s KV cache (the smallest stage's)"))
    limit, what = min(limits, key=lambda x: x[0])
    answer = scn.workload.answer_tokens
    for i, n in enumerate(prompt_tokens):
        if n + answer > limit:
            raise RealRunError(f"question {i + 1} does not fit: a prompt of {n:,} tokens + {answer:,} answer "
                               f"tokens > {limit:,} positions, what {what} holds")


def real_prompts(scn: Scenario) -> list[str]:
    """The questions a real run asks: the scenario's prompts, else the defaults."""
    return list(scn.workload.prompts) or list(DEFAULT_PROMPTS)[:scn.workload.questions]


def prompt_token_counts(model_dir: str, prompts: Sequence[str]) -> list[int]:
    """Token counts of ``prompts`` through the model's chat template."""
    from runtime.tokenizer import ChatTokenizer
    tok = ChatTokenizer.from_dir(model_dir)
    return [len(tok.encode_chat(p)) for p in prompts]


def on_this_host(profile, deal: Deal):
    """``(profile, line)``: ``profile`` for a real run of ``deal``, whose device processes
    (every device that holds layers, and the model host) all run on this machine
    (:meth:`planner.profile.Profile.on_one_host`; the line says what was applied, empty
    when nothing was)."""
    return profile.on_one_host(len({st.device for st in deal.stages if st.layers} | {deal.host}))


def predict_real_run(scn: Scenario, deal: Deal, profile, rtt_s: float, prompt_tokens: Sequence[int],
                     in_process_delay: bool = False) -> dict:
    """Metrics the simulator predicts for a real run of ``scn`` from ``profile`` (a
    :class:`planner.profile.Profile`), before the run: every device process on this
    machine, so with the profile's shared-core excess (:func:`on_this_host`; ``shared_host``
    in the metrics says what was applied). ``in_process_delay``: the round trip ``rtt_s``
    is applied in the device processes, so every hop also pays the profile's
    ``transport.delay_late_s`` when it has one (``delay_late_s`` in the metrics). Raises
    RealRunError when the predicted room answers fewer questions than it is asked (never a
    silent 0.0)."""
    from sim.driver import simulate
    from splitroom.ranges import acceptance_source, predict_range
    profile, shared = on_this_host(profile, deal)
    tr = profile.transport
    late = (tr.delay_late_s or 0.0) if (in_process_delay and rtt_s > 0 and tr is not None) else 0.0
    pred_scn = with_late_hops(real_run_scenario(scn, rtt_s, prompt_tokens, scn.workload.answer_tokens)
                              .with_profile(profile), late)
    m = simulate(pred_scn, deal, trace=False).metrics
    _check_answered(m, "the prediction from the profile")
    m["range"] = predict_range(pred_scn, deal, m)
    if pred_scn.decoding.speculative is not None:  # the same room plain, for the warning (speculation_check)
        from splitroom.speculation_check import plain_scenario, speculation_summary
        plain = simulate(plain_scenario(pred_scn), deal, trace=False).metrics
        m["speculation"] = speculation_summary(pred_scn, m["tokens_per_s"], plain["tokens_per_s"])
    source = acceptance_source(pred_scn)
    if source:
        m["acceptance_from"] = source
    if shared:
        m["shared_host"] = shared
    if late:
        m["delay_late_s"] = late
    return m


def _check_answered(m: dict, what: str) -> None:
    if m.get("answered", 0) < m.get("questions", 0) or m.get("tokens", 1) == 0:
        raise RealRunError(f"{what} answered {m.get('answered', 0)} of {m.get('questions', 0)} questions: "
                           "the simulated room stalled; this is a bug, please report it with the scenario")


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
             log=print, profile=None, in_process_delay: bool = False) -> RealResult:
    """Run the room for real and predict it; see the module doc. With ``profile`` (a
    :class:`planner.profile.Profile`) the room is also predicted from it before it
    runs (``RealResult.profile_predicted``). ``RealResult.ended`` says how each
    question ended (answered, or refused/lost with the reason). ``in_process_delay``:
    when the room does not run in namespaces (``netns`` False, or this machine cannot),
    its round trip is applied in the device processes (:func:`plan_network`); what
    that delay really did per device is ``RealResult.calibration["in_process_delay"]``.

    The work folder (device configs, traces, logs) is a temporary directory removed
    when the run ends, failed or not (``SPLITROOM_KEEP_WORKDIR=1`` keeps it).

    A worker whose process ends before the room started (it died while loading: before
    the model host's process joined the room) makes the room start again without it
    when the devices left can hold the model (:func:`redeal_without`, said on ``log``).

    Raises RealRunError when the scenario's model has no weights here (see
    :func:`real_model_dir`), a device process fails (with the last line of its log), a
    worker dies while loading and the devices left cannot hold the model ("cannot start:
    DEVICE died while loading (how; why)"), or the run exceeds ``timeout_s`` seconds.
    """
    import shutil
    gone: set[str] = set()
    while True:
        workdir = Path(tempfile.mkdtemp(prefix="splitroom-real-"))
        try:
            return _run_real(scn, deal, backend, netns, timeout_s, log, profile, workdir, in_process_delay)
        except DiedWhileLoading as e:  # the room never started: without that device, or a one-line error
            gone.add(e.device)
            new, why = redeal_without(scn, deal, gone)
            if new is None:
                raise RealRunError(f"cannot start: {e.device} died while loading ({e.how}; {why})") from None
            deal = new
            log(f"{e.device} died while loading: re-dealt without it: "
                + ", ".join(f"{s.device} {s.shown}" for s in deal.stages))
        finally:
            if os.environ.get("SPLITROOM_KEEP_WORKDIR") != "1":
                shutil.rmtree(workdir, ignore_errors=True)


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


def _run_real(scn: Scenario, deal: Deal, backend: str, netns: bool, timeout_s: float, log, profile,
              workdir: Path, in_process_delay: bool = False) -> RealResult:
    model_dir = str(real_model_dir(scn))
    cfgs = node_configs(scn, deal, model_dir, workdir, backend)
    room = "r" + secrets.token_hex(4)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # a device the host's own machine runs (its ends-local tail) shares the host's process
    colocated = {c.device for c in cfgs if c.device.endswith(TAIL_SUFFIX)}
    net, network, rtt_s = plan_network(scn, [c.device for c in cfgs if c.device not in colocated], netns,
                                       in_process_delay)
    if net is None and rtt_s > 0:  # in-process delay: every device process holds what it sends rtt/2
        cfgs = [c.model_copy(update={"emulate_one_way_s": rtt_s / 2}) for c in cfgs]
    spec = scn.decoding.speculative
    counts = prompt_token_counts(model_dir, real_prompts(scn)) if (profile is not None or (spec and spec.adaptive)) \
        else []
    if spec is not None and spec.adaptive:  # draft_tokens: auto: the host's rule gets this room's lap costs
        cfgs = with_draft_policy(cfgs, scn, deal, profile, rtt_s, counts)
    profile_predicted = None
    if profile is not None:
        profile_predicted = predict_real_run(scn, deal, profile, rtt_s, counts, in_process_delay=net is None)
        rg = profile_predicted["range"]
        spread = (f" (P10-P90 {rg['tokens_per_s']['p10']:.2f}-{rg['tokens_per_s']['p90']:.2f}, "
                  f"{', '.join(rg['sources'])})" if rg["replicas"] else " (one point: nothing varies)")
        log(f"predicted from the profile before running: {profile_predicted['tokens_per_s']:.2f} tok/s{spread}, "
            f"first token {profile_predicted['ttft_s'] * 1000:.0f} ms"
            + (f"; acceptance from {profile_predicted['acceptance_from']}"
               if profile_predicted.get("acceptance_from") else "")
            + (f"; {profile_predicted['shared_host']}" if profile_predicted.get("shared_host") else ""))
        from splitroom.speculation_check import warning_line
        warning = warning_line(profile_predicted.get("speculation"))
        if warning:
            log(warning)
    procs: dict[str, subprocess.Popen] = {}
    relay = None
    t_start = time.time()
    try:
        if net is not None:
            net.__enter__()
        relay, url = start_relay(net, deal.host, workdir, env)
        adapters = adapter_indices([c.device for c in cfgs if c.device not in colocated])
        for c in cfgs:
            if c.device in colocated:
                continue
            argv = device_argv(write_config(c, workdir), url, room, timeout_s)
            if c.device == deal.host:
                for t in sorted(colocated):
                    argv += ["--also", str(write_config(next(x for x in cfgs if x.device == t), workdir))]
            denv = env if c.device not in adapters else dict(env, SPLITROOM_WGPU_ADAPTER=str(adapters[c.device]))
            procs[c.device] = start_process(net, c.device, argv, workdir, denv)
        log(f"room {room}: {len(procs)} device processes on {network}"
            + (f" (the model host's process also runs {', '.join(sorted(colocated))})" if colocated else ""))
        from runtime.node import JOINED_SUFFIX
        rc = _wait_host(procs, deal.host, cfgs[0].trace_path + JOINED_SUFFIX, workdir, timeout_s)
        if rc != 0:
            last = _last_log_line(workdir, deal.host)
            raise RealRunError(f"the model host's process ended ({ended_how(rc, last)})")
    finally:
        stop_room(procs, relay, net)
    wall = time.time() - t_start
    from runtime.room import merge_traces
    records, losses = [], []
    for c in cfgs:
        path = Path(c.trace_path)
        if path.exists():
            records.append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
            if c.device == deal.host:
                losses = [(o.device, o.reason) for _, o in merge_traces(records[-1:]) if isinstance(o, DeviceLost)]
    trace = merge_traces(records)
    measured = compute_metrics(trace)
    info = json.loads(Path(cfgs[0].trace_path + ".answers.json").read_text())
    answers = [info["answers"][k] for k in sorted(info["answers"], key=int)]
    asked = len(cfgs[0].prompts)
    how = info.get("ended", {})
    ended = [how.get(str(i), "lost: the model host ended without answering or refusing it") for i in range(asked)]
    aligned = [dict(info["answers"].get(str(i), {"text": "", "token_ids": []}), ended=ended[i])
               for i in range(asked)]
    cal = fit_trace(trace, deal)
    delays = read_delay_stats(cfgs)
    if delays:
        cal["in_process_delay"] = delays
    prompt_lens = [o.prompt_tokens for _, o in trace if isinstance(o, BeginAnswer)]
    n_ans = [len(a["token_ids"]) for a in answers] or [1]
    from runtime.transport import INITIAL_WINDOW_BYTES
    pred_scn = calibrated_scenario(scn, cal, rtt_s, int(np.mean(prompt_lens)) if prompt_lens else 1,
                                   int(round(np.mean(n_ans))), len(answers) or 1, INITIAL_WINDOW_BYTES,
                                   sctp_burst_bytes())
    from sim.driver import simulate
    if scn.faults:  # only the devices that run a process can take a lost range, as in the real room
        pred_scn = dataclasses.replace(pred_scn, devices=tuple(
            d for d in pred_scn.devices if d.id == deal.host or any(s.device == d.id for s in deal.stages)))
    predicted = simulate(pred_scn, deal, trace=False).metrics
    cal["wall_s"] = wall
    emulated = [f"{c.device}: compute padded {c.slowdown:g}x" for c in cfgs if c.slowdown > 1]
    _check_answered(predicted, "the same-run prediction")
    return RealResult(measured, predicted, _error_pct(measured, predicted), aligned, cal, network, emulated,
                      profile_predicted, _error_pct(measured, profile_predicted) if profile_predicted else None,
                      ended, losses)


# -- starting and ending a room's processes (shared by run --real and splitroom serve) --


def redeal_without(scn: Scenario, deal: Deal, dead: set[str]) -> tuple[Deal | None, str]:
    """The deal of a room that lost ``dead`` before it started: ``(new deal, "")`` when
    the devices left can hold the model (dealt again by the scenario's rules, the host
    kept; a pinned room merges the lost ranges into their neighbours, checked against
    what each lends: :func:`planner.chain.redeal_rule`), else ``(None, why)``. The model
    host among ``dead`` is never re-dealt."""
    from planner.chain import redeal_rule
    if deal.host in dead:
        return None, "the model host is gone"
    try:
        new = redeal_rule(scn.devices, scn.model, scn.options)(deal, frozenset(dead))
    except ValueError as e:
        return None, str(e)
    return new, ""



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
