"""What a measured room's trace says about its devices, links and drafter, and the
scenario that predicts the same room from it: the fitting step of ``run --real``'s
plan -> run -> fit -> predict -> compare (splitroom/real.py).

:func:`fit_trace` reads a merged trace (``[(t_s, record)]``, the records of
:mod:`planner.protocol`, as the device processes wrote them) and returns the measured
parts as a JSON-ready mapping (the ``calibration`` of ``run --real --json``):

* ``s_per_layer``: per device, the median of its decode/verify stage times
  (``Computed`` records, queue wait excluded) divided by its layers, seconds;
* ``lap_tokens``: the median positions of a decode/verify stage pass;
* ``chunk_s_per_layer``: per device, ``(chunk, seconds per layer)`` of its most frequent
  prefill chunk size (the median over those passes);
* ``stage_s_each``: every decode/verify stage time per device, in trace order, seconds;
* ``hop_s`` / ``hop_p50_s`` / ``hops``: the mean and median time from a decode/verify
  ``SendFrame`` to its ``FrameArrived`` (seconds), and how many hops;
* ``head_s_per_row``: the host's median output-head seconds per row (None: none ran);
* ``draft_s_per_token``: drafting seconds per drafted token (None: no draft);
* ``accepted``: for each draft made on a correct assumption, in order, how many of its
  leading tokens the answer kept (the sequence the simulator's recorded acceptance
  replays, :func:`accepted_per_draft`).

:func:`calibrated_scenario` turns a scenario and such a fit into the scenario that
predicts the measured room: measured seconds per layer (and a compute rate that puts
the roofline's knee where the prefill chunk's time says), the hop overhead over the
emulated one-way delay, the measured workload and acceptance.

Pure: no clock, no file; times come in the trace.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from planner.deal import Deal
from planner.frames import FrameKind
from planner.protocol import (BeginAnswer, Computed, Draft, DraftReady, EmitToken, FrameArrived, LapEnded, LapKind,
                              RunHead, RunStage, SendFrame)
from planner.room import DEFAULT_BANDWIDTH_BPS, Device, Jitter, Scenario

__all__ = ["accepted_per_draft", "calibrated_device", "calibrated_scenario", "fit_trace"]


def fit_trace(trace: Sequence[tuple[float, object]], deal: Deal) -> dict:
    """The measured parts of a room's trace (module doc for each key).

    ``trace``: ``[(t_s, record)]`` in time order, records of :mod:`planner.protocol`
    (others are skipped); ``deal``: the room's deal (each stage's layers divide its
    stage times). Prefill laps (a ``LapEnded`` of kind prefill, or a ``SendFrame`` of a
    PREFILL frame) count only towards ``chunk_s_per_layer``."""
    prefill = {o.lap_id for _, o in trace if isinstance(o, LapEnded) and o.kind == LapKind.PREFILL}
    prefill |= {o.header.lap_id for _, o in trace if isinstance(o, SendFrame) and o.header.kind == FrameKind.PREFILL}
    tokens: dict = {}
    rows: dict = {}
    ks: dict = {}
    stage_s: dict[str, list[float]] = {}
    pre_s: dict[str, dict[int, list[float]]] = {}
    lap_tokens: list[int] = []
    sends: dict = {}
    hops: list[float] = []
    head_per_row: list[float] = []
    draft_s = 0.0
    drafted = 0
    draft_cmds: list[Draft] = []
    ready: dict[int, tuple[int, ...]] = {}
    prompt_len: dict[int, int] = {}
    answer: dict[int, dict[int, int]] = {}
    for t, o in trace:
        if isinstance(o, RunStage):
            tokens[(o.device, o.lap_id)] = o.tokens
            if o.lap_id not in prefill:
                lap_tokens.append(o.tokens)
        elif isinstance(o, RunHead):
            rows[o.lap_id] = o.rows
        elif isinstance(o, Draft):
            ks[o.draft_id] = o.k
            draft_cmds.append(o)
        elif isinstance(o, DraftReady):
            ready[o.draft_id] = o.tokens
        elif isinstance(o, Computed):
            if o.command == "RunStage" and (o.device, o.ref) in tokens:
                if o.ref in prefill:
                    pre_s.setdefault(o.device, {}).setdefault(tokens[(o.device, o.ref)], []).append(o.seconds)
                else:
                    stage_s.setdefault(o.device, []).append(o.seconds)
            elif o.command == "RunHead" and o.ref in rows and o.ref not in prefill:
                head_per_row.append(o.seconds / rows[o.ref])
            elif o.command == "Draft" and o.ref in ks:
                draft_s += o.seconds
                drafted += ks[o.ref]
        elif isinstance(o, SendFrame) and o.header.lap_id not in prefill:
            sends[(o.src, o.dst, o.header.lap_id)] = t
        elif isinstance(o, FrameArrived) and (o.src, o.device, o.header.lap_id) in sends:
            hops.append(t - sends.pop((o.src, o.device, o.header.lap_id)))
        elif isinstance(o, BeginAnswer):
            prompt_len[o.question_id] = o.prompt_tokens
        elif isinstance(o, EmitToken):
            answer.setdefault(o.question_id, {})[o.index] = o.token
    per_layer = {}
    chunk = {}
    for st in deal.stages:
        xs = stage_s.get(st.device)
        if xs and st.layers:
            per_layer[st.device] = float(np.median(xs)) / st.layers
        by_n = pre_s.get(st.device)
        if by_n and st.layers:
            n = max(by_n, key=lambda k: (len(by_n[k]), k))
            chunk[st.device] = (n, float(np.median(by_n[n])) / st.layers)
    return {"s_per_layer": per_layer, "lap_tokens": int(np.median(lap_tokens)) if lap_tokens else 1,
            "chunk_s_per_layer": chunk, "stage_s_each": {k: list(v) for k, v in stage_s.items()},
            "hop_s": float(np.mean(hops)) if hops else 0.0,
            "hop_p50_s": float(np.median(hops)) if hops else 0.0, "hops": len(hops),
            "head_s_per_row": float(np.median(head_per_row)) if head_per_row else None,
            "draft_s_per_token": draft_s / drafted if drafted else None,
            "accepted": accepted_per_draft(draft_cmds, ready, prompt_len, answer)}


def accepted_per_draft(draft_cmds: Sequence[Draft], ready: dict[int, tuple[int, ...]], prompt_len: dict[int, int],
                       answer: dict[int, dict[int, int]]) -> list[int]:
    """For each draft made on a correct assumption, in order, how many of its leading
    tokens equal the committed answer: the sequence the simulator's recorded-acceptance
    model replays (it draws exactly for such drafts, so the two runs stay in step).

    ``ready``: draft id -> proposed token ids; ``prompt_len``: question -> prompt
    tokens; ``answer``: question -> {answer index: token id}. A draft whose proposal or
    question is unknown, or whose assumed tokens are not what was committed, is left out."""
    out = []
    for c in draft_cmds:
        toks = ready.get(c.draft_id)
        ans = answer.get(c.question_id, {})
        p = prompt_len.get(c.question_id)
        if toks is None or p is None:
            continue

        def committed(pos: int):
            return ans.get(pos - p)
        if any(committed(c.base_len + i) != a for i, a in enumerate(c.assumed)):
            continue  # drafted on a wrong assumption: the simulator draws nothing here either
        j = c.base_len + len(c.assumed)
        n = 0
        while n < len(toks) and committed(j + n) == toks[n]:
            n += 1
        out.append(n)
    return out


def calibrated_device(d: Device, scn: Scenario, fit: dict) -> Device:
    """``d`` with its measured seconds per layer, and an effective compute rate that
    makes the simulator's roofline give the measured prefill-chunk time too; a device
    the fit did not measure comes back unchanged but for clocking down.

    Model: t(n) = t_a * max(1, n / n0) per layer, memory bound up to the knee n0, where
    t_a is measured at the run's lap size a and t_c at the prefill chunk size c, so
    n0 = c * t_a / t_c (kept >= a); the roofline has its knee where n0 * flops / compute
    equals bytes / bandwidth, so compute = n0 * flops * bandwidth / bytes (FLOP/s).
    Processes on one machine do not clock down like a phone's GPU: none is predicted.
    """
    s = fit["s_per_layer"].get(d.id)
    if s is None:
        return dataclasses.replace(d, clocks_down=False)
    out = dataclasses.replace(d, s_per_layer=s, clocks_down=False)
    c_meas = fit.get("chunk_s_per_layer", {}).get(d.id)
    a = fit.get("lap_tokens", 1)
    if c_meas is not None and c_meas[0] > a and c_meas[1] > s:
        c, t_c = c_meas
        n0 = max(c * s / t_c, float(a))
        bw = d.memory_bandwidth_Bps or DEFAULT_BANDWIDTH_BPS.get(d.kind, DEFAULT_BANDWIDTH_BPS["computer"])
        m = scn.model
        out = dataclasses.replace(out, memory_bandwidth_Bps=bw,
                                  compute_flops=n0 * m.layer_flops_per_token * bw / m.layer_active_bytes)
    return out


def calibrated_scenario(scn: Scenario, fit: dict, rtt_s: float, prompt_tokens: int, answer_tokens: int,
                        questions: int, window_bytes: int, burst_bytes: int | None = None) -> Scenario:
    """``scn`` as the measured room ran it: each device from :func:`calibrated_device`;
    the network at ``rtt_s`` (seconds) with hop overhead ``max(hop_s - rtt_s / 2, 0)``,
    no jitter, episodes or per-link overrides, and the transport's initial congestion
    window ``window_bytes`` and burst cap ``burst_bytes`` (None: none); ``questions`` questions of ``prompt_tokens`` prompt and
    ``answer_tokens`` answer tokens (each at least 1); speculation replaying the fit's
    accepted lengths at its measured drafting seconds per token."""
    devices = tuple(calibrated_device(d, scn, fit) for d in scn.devices)
    overhead = max(fit["hop_s"] - rtt_s / 2, 0.0)
    net = dataclasses.replace(scn.network, rtt_s=rtt_s, hop_overhead_s=overhead, jitter=Jitter(), episodes=None,
                              links=(), window_bytes=window_bytes, burst_bytes=burst_bytes)
    wl = dataclasses.replace(scn.workload, prompt_tokens=max(prompt_tokens, 1), answer_tokens=max(answer_tokens, 1),
                             questions=questions, asked_by=())
    dec = scn.decoding
    if dec.speculative is not None:
        spec = dataclasses.replace(dec.speculative, accepted_sequence=tuple(fit.get("accepted") or ()),
                                   draft_s_per_token=fit.get("draft_s_per_token") or dec.speculative.draft_s_per_token)
        dec = dataclasses.replace(dec, speculative=spec)
    return dataclasses.replace(scn, devices=devices, network=net, workload=wl, decoding=dec,
                               measured_head_s_per_row=fit.get("head_s_per_row"))
