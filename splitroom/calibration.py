"""Calibration profiles as files: measure (``splitroom calibrate``), read, apply.

The profile's data model is :mod:`planner.profile`; the measuring is
:mod:`runtime.calibrate`, run as a child process so that it computes with one BLAS
thread, as a device process does. This module is the glue: it turns one measurement of
this machine into a profile for a scenario's devices (each device's compute times the
emulated slowdown its process would pad to), writes and reads the YAML, and applies a
profile to a scenario (:func:`apply_profile`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import yaml

from planner.profile import (Curve, DeviceProfile, DrafterProfile, PassCurve, Profile, ProfileError, SharedHost,
                             TransportProfile)
from planner.room import Scenario
from runtime.threads import one_blas_thread_env
from splitroom.input_limits import MAX_PROFILE_VALUES, read_text_capped, size_problem

__all__ = ["CalibrationError", "add_acceptance", "apply_profile", "build_profile", "check_covers", "load_profile",
           "measure", "measure_room_overheads", "measure_shared_room", "profiled_s_per_layer", "room_passes",
           "room_overheads", "save_profile", "stage_noise", "with_room_overheads", "with_shared_room"]


class CalibrationError(RuntimeError):
    """A profile that cannot be measured, read or used: the message is one line."""


def measure(backend: str = "numpy", quick: bool = False, log: Callable[[str], None] = print,
            timeout_s: float = 900.0, sample: Sequence[str] = (), acceptance_only: bool = False,
            model_dir: str | Path | None = None, weights: str = "f32", answer_tokens: int | None = None) -> dict:
    """Run ``python -m runtime.calibrate`` in a child process and return its mapping
    (see runtime.calibrate.measure_all; ``sample``: a scenario's ``workload.sample``
    prompts, walked too; ``acceptance_only``: only the sample's walks,
    runtime.calibrate.measure_acceptance, for :func:`add_acceptance`). ``model_dir``: the
    model measured (default the bundled SmolLM2, float32 safetensors; a scenario's own,
    splitroom.real_configs.real_model_dir), held as ``weights`` (runtime.precision.WEIGHTS);
    ``answer_tokens``: the scenario's answer cap, past which no drafter's walk follows an
    answer (runtime.calibrate.measure_walks). Progress lines
    go to ``log``. Raises CalibrationError when the child fails or runs past
    ``timeout_s`` seconds, or for ``acceptance_only`` without a sample."""
    if acceptance_only and not sample:
        raise CalibrationError("the acceptance step needs the scenario's workload.sample")
    from runtime.weights import ensure_safetensors
    model_dir = str(model_dir or ensure_safetensors())
    with tempfile.TemporaryDirectory(prefix="splitroom-cal-") as tmp:
        out = Path(tmp) / "cal.json"
        argv = [sys.executable, "-m", "runtime.calibrate", model_dir, str(out), backend] + (["quick"] if quick else [])
        if weights != "f32":
            argv += ["--weights", weights]
        if answer_tokens is not None:
            argv += ["--answer-tokens", str(int(answer_tokens))]
        if sample:
            (Path(tmp) / "sample.json").write_text(json.dumps(list(sample)), encoding="utf-8")
            argv += ["--sample", str(Path(tmp) / "sample.json")] + (["--acceptance-only"] if acceptance_only else [])
        env = dict(one_blas_thread_env(os.environ), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
        last = ""
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                line = line.rstrip()
                if line:
                    last = line
                    log(line)
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise CalibrationError(f"the measurement ran past {timeout_s:.0f} s") from None
        finally:  # Ctrl-C, or SIGINT to this process alone: never leave the child measuring
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc != 0 or not out.exists():
            raise CalibrationError(last or f"the measurement exited with status {rc}")
        return json.loads(out.read_text())


def build_profile(scn: Scenario, measured: dict) -> Profile:
    """A profile for ``scn``'s devices from one machine's measurement: every device
    that can hold layers gets the measured pass and head curves times its
    ``emulate.slowdown`` (1 when none), and the idle factors when measured (``idle``);
    drafters and transport as measured."""
    stage = PassCurve.from_mapping(measured["stage"], "stage")
    head = Curve.from_mapping(measured["head_s"], "head_s")
    idle = Curve.from_mapping(measured["idle"], "idle") if measured.get("idle") else None
    devices = {}
    for d in scn.devices:
        if not d.webgpu:
            continue
        f = float(d.emulate_slowdown or 1.0)
        devices[d.id] = DeviceProfile(stage.scaled(f), head.scaled(f), f, idle=idle)
    drafters = {k: DrafterProfile.from_mapping(v, f"drafters.{k}") for k, v in measured.get("drafters", {}).items()}
    tr = measured.get("transport")
    notes = dict(measured.get("notes", {}))
    notes["scenario"] = scn.name
    return Profile(devices, drafters, TransportProfile.from_mapping(tr, "transport") if tr else None, notes)


def add_acceptance(profile: Profile, measured: dict) -> Profile:
    """``profile`` with a sample's walks (runtime.calibrate.measure_acceptance's
    mapping) added to each drafter it measured (a drafter the profile lacks has no
    call times, so it is left out) and the sample's note. Raises CalibrationError for
    a malformed mapping."""
    drafters = dict(profile.drafters)
    try:
        for name, m in measured.get("drafters", {}).items():
            dr = drafters.get(name)
            if dr is None:
                continue
            merged = dr.to_mapping()
            merged.setdefault("workloads", {}).update(m["workloads"])
            merged.setdefault("walks", {}).update(m["walks"])
            drafters[name] = DrafterProfile.from_mapping(merged, f"drafters.{name}")
    except (ProfileError, KeyError, TypeError, AttributeError) as e:
        raise CalibrationError(f"the acceptance step's result is malformed ({e})") from None
    notes = dict(profile.notes)
    notes.update({str(k): str(v) for k, v in measured.get("notes", {}).items()})
    return dataclasses.replace(profile, drafters=drafters, notes=notes)


def _calibration_room(scn: Scenario, devs: Sequence, cuts: Sequence[int], answer_tokens: int) -> Scenario:
    """The calibration rooms' scenario: ``devs`` (Device, the first the model host) hold
    the layers ``[cuts[i], cuts[i + 1])`` in turn, with all the memory they need, on
    loopback with no jitter, episodes or per-link overrides, plain decoding one lap at a
    time, two calibration prompts of ``answer_tokens`` answer tokens each."""
    from planner.room import Jitter, PinnedStage
    from runtime.calibrate import CALIBRATION_PROMPTS
    stages = tuple(PinnedStage(d.id, cuts[i], cuts[i + 1]) for i, d in enumerate(devs))
    opts = dataclasses.replace(scn.options, host=devs[0].id, stages=stages, headroom=0.0)
    big = tuple(dataclasses.replace(d, lends_bytes=max(d.lends_bytes, 1 << 40)) for d in devs)
    return dataclasses.replace(
        scn, devices=big, options=opts,
        network=dataclasses.replace(scn.network, rtt_s=0.0, jitter=Jitter(), episodes=None, links=()),
        workload=dataclasses.replace(scn.workload, prompts=tuple(CALIBRATION_PROMPTS[:2]), questions=2,
                                     answer_tokens=answer_tokens, asked_by=()),
        decoding=dataclasses.replace(scn.decoding, speculative=None, async_laps=1))


def measure_room_overheads(scn: Scenario, profile: Profile, log: Callable[[str], None] = print,
                           answer_tokens: int = 32,
                           pingpong: Callable[[], TransportProfile] | None = None, backend: str = "numpy") -> dict:
    """What a real room adds to the parts measured alone, from one small room run.

    The room: the scenario's first two devices that can hold layers, the layers split
    in half, on loopback, plain decoding, two of the calibration prompts (not any
    scenario's), on ``backend`` (the backend the profile measured). The transport's ping-pong (``pingpong``: default
    runtime.calibrate.measure_transport, 30 round trips a frame size) is measured again
    right before and right after the room, so the hop correction compares the room's
    hops with a ping-pong at the room's own load, not with the one of the parts step
    minutes earlier. The held-out rooms (other device counts, round trips, drafters,
    laps, prompts) are never run here. Returns :func:`room_overheads`'s mapping plus
    ``laps``, ``tokens_per_s`` and ``stage_fold`` (how :func:`with_room_overheads` folds the
    stage's excess in: ``ratio`` on numpy, ``added`` on wgpu, see there). Raises
    CalibrationError when the room cannot run.
    """
    from planner.deal import DealError, deal_for
    from splitroom.real import run_real
    from splitroom.real_configs import prompt_token_counts
    from splitroom.real_errors import RealRunError
    devs = [d for d in scn.devices if d.webgpu and d.id in profile.devices][:2]
    if len(devs) < 2:
        raise CalibrationError("the room run needs two devices that can hold layers")
    half = scn.model.layers // 2
    room = _calibration_room(scn, devs, [0, half, scn.model.layers], answer_tokens)
    if pingpong is None:
        def pingpong() -> TransportProfile:
            from runtime.calibrate import measure_transport
            return measure_transport(scn.model.hidden, n=30, warmup=5)
    try:
        d = deal_for(room)
        log(f"room: {devs[0].id} layers 1-{half}, {devs[1].id} {half + 1}-{scn.model.layers}, loopback, plain "
            f"(the transport's ping-pong right before and after it)")
        before = pingpong()
        res = run_real(room, d, backend=backend, netns=False, timeout_s=300, log=lambda s: None)
        after = pingpong()
    except (DealError, RealRunError) as e:
        raise CalibrationError(f"the calibration room failed: {e}") from None
    except (OSError, RuntimeError, TimeoutError) as e:
        raise CalibrationError(f"the ping-pong beside the calibration room failed: {e}") from None
    from splitroom.real_configs import real_model_dir
    ctx = int(sum(prompt_token_counts(str(real_model_dir(room)), room.workload.prompts)) / 2) + answer_tokens // 2
    alone = {st.device: profile.devices[st.device].stage.pass_s(st.layers, 1, ctx)
             for st in d.stages if st.device in profile.devices}
    layers = {st.device: st.layers for st in d.stages}
    slowdowns = {k: v.slowdown for k, v in profile.devices.items()}
    chunks = res.calibration.get("chunk_s_per_layer") or {}
    alone_prefill = {dev: (int(chunks[dev][0]), profile.devices[dev].stage.pass_s(layers[dev], int(chunks[dev][0]), 0))
                     for dev in alone if dev in chunks} if backend != "wgpu" else None
    out = room_overheads(res.calibration, alone, layers, profile.devices[devs[0].id], before, after, slowdowns,
                         alone_prefill)
    out.update(laps=res.measured.get("laps", 0), tokens_per_s=res.measured.get("tokens_per_s", 0.0),
               stage_fold="added" if backend == "wgpu" else "ratio")
    gap = room_idle_s(res.calibration, res.measured, d.host)
    if gap is not None:
        out["idle_s"] = gap
    log(f"room: {out['laps']} laps; against the parts alone: stage x{out['stage_ratio']:.3f} "
        f"({out['stage_extra_s'] * 1e3:+.2f} ms a pass), "
        f"hop {out['hop_s'] * 1e3:+.2f} ms beyond the ping-pong beside it, head {out['head_s'] * 1e3:+.2f} ms; "
        f"stage time spread P10-P90 x{_pctl(out['stage_noise'], 10):.3f}-x{_pctl(out['stage_noise'], 90):.3f}"
        + (f"; prefill chunks x{out['prefill_ratio']:.3f} beyond that ratio" if out.get("prefill_ratio") else ""))
    return out


def _pctl(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``xs`` (1.0 for none), nearest-rank."""
    if not xs:
        return 1.0
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, int(round(q / 100 * (len(ys) - 1)))))]


def stage_noise(stage_s_each: dict[str, Sequence[float]]) -> tuple[float, ...]:
    """Each decode lap's stage time over its stage's mean, averaged over the stages
    of that lap, in lap order (the i-th time of every stage belongs to lap i; lists of
    unequal length are cut to the shortest). ``stage_s_each``: device -> seconds of
    its decode passes in order. Empty when no stage has a time above 0."""
    cols = []
    for xs in stage_s_each.values():
        xs = [float(x) for x in xs]
        if not xs:
            continue
        mean = sum(xs) / len(xs)
        if mean > 0:
            cols.append([x / mean for x in xs])
    if not cols:
        return ()
    n = min(len(c) for c in cols)
    return tuple(sum(c[i] for c in cols) / len(cols) for i in range(n))


def room_idle_s(cal: dict, measured: dict, host: str) -> float | None:
    """How long a worker of a room waits between its decode passes, seconds: the mean lap
    (``measured["lap_s"]["mean"]``, planner.metrics) less the worker's mean decode stage
    (``cal["stage_s_each"]``, planner.trace_fit), the mean over workers; None when the room
    recorded neither. :func:`with_room_overheads` takes a profile's ``idle`` factors relative
    to it: the room's own excess, folded in, already holds what that wait costs."""
    lap = (measured.get("lap_s") or {}).get("mean")
    gaps = [lap - sum(xs) / len(xs) for dev, xs in (cal.get("stage_s_each") or {}).items()
            if dev != host and xs] if lap else []
    if not gaps:
        return None
    return max(sum(gaps) / len(gaps), 0.0)


def room_passes(cal: dict, layers: dict[str, int], decode_s: dict[str, float],
                prefill_s: dict[str, tuple[int, float]], slowdowns: dict[str, float] | None = None,
                ) -> tuple[float, float | None]:
    """What a room's passes take beyond the expected ones: ``(decode excess, prefill ratio)``.

    ``cal``: planner.trace_fit.fit_trace's mapping of the room (``stage_s_each``: device ->
    its decode stage seconds; ``chunk_s_per_layer``: device -> (tokens of its most
    frequent prefill chunk, median seconds a layer of those chunks)); ``layers``: device
    -> its stage's layers; ``decode_s``: device -> the expected decode pass (seconds);
    ``prefill_s``: device -> (chunk tokens, the expected pass of that chunk, seconds);
    ``slowdowns``: device -> its emulated slowdown (default 1; the room's times hold the
    padding).

    The decode excess: the mean over devices of (the room's mean decode stage - the
    expected pass) / slowdown, seconds per pass per unit of slowdown. The prefill ratio:
    the mean over devices of the room's median chunk over the expected pass of a chunk
    that size (a device whose chunk size is not the expected one is left out; None when
    none is left). Raises CalibrationError when no device has a decode time."""
    sd = slowdowns or {}
    dec, pre = [], []
    for dev, expected in decode_s.items():
        xs = (cal.get("stage_s_each") or {}).get(dev) or []
        if xs:
            dec.append((sum(xs) / len(xs) - expected) / sd.get(dev, 1.0))
    for dev, (n, expected) in prefill_s.items():
        chunk = (cal.get("chunk_s_per_layer") or {}).get(dev)
        if chunk and int(chunk[0]) == int(n) and dev in layers and expected > 0:
            pre.append(float(chunk[1]) * layers[dev] / expected)
    if not dec:
        raise CalibrationError("the calibration room recorded no decode stage")
    return sum(dec) / len(dec), (sum(pre) / len(pre) if pre else None)


def room_overheads(cal: dict, alone_s: dict[str, float], layers: dict[str, int], host: DeviceProfile,
                   before: TransportProfile, after: TransportProfile,
                   slowdowns: dict[str, float] | None = None,
                   alone_prefill_s: dict[str, tuple[int, float]] | None = None) -> dict:
    """A calibration room's overheads from its measured parts (planner.trace_fit.fit_trace's
    mapping ``cal``) and the parts measured alone.

    ``alone_s``: device -> the profile's pass time of its stage (seconds, one token at
    the room's mean context); ``layers``: device -> its stage's layers; ``host``: the
    host's device profile (its head and slowdown); ``before`` / ``after``: the
    transport's ping-pong right before and right after the room (same frame sizes);
    ``slowdowns``: device -> its emulated slowdown (default 1); ``alone_prefill_s``:
    device -> (tokens of the room's prefill chunk, the profile's pass of that chunk at
    context 0, seconds), when given.

    A room's tokens per second follow the sum of its laps, so the folded figures are
    means, not medians: the room's mean decode stage time over the pass alone (mean
    over stages), and its mean decode hop. Returns ``{stage_ratio, stage_extra_s, hop_s,
    head_s, one_way_s, stage_noise, stage_ratio_p50, hop_p50_s}``: that stage ratio; the
    mean stage time beyond the pass alone per unit of slowdown (seconds, mean over
    stages); the mean
    hop minus the mean of the two ping-pongs' decode-frame one-way time (seconds); the
    head's time per row beyond the measured head, per unit of slowdown (seconds); the
    two ping-pongs' mean one-way curve (a :class:`Curve` mapping: bytes -> seconds);
    :func:`stage_noise`; and for the notes the same stage ratio and hop correction from
    medians. With ``alone_prefill_s`` also ``prefill_ratio``: the room's prefill chunk over
    the chunk's pass alone times that stage ratio (:func:`room_passes`; None when no chunk
    was timed). Raises
    CalibrationError when no decode stage was recorded or the two
    ping-pongs measured different frame sizes."""
    each = cal.get("stage_s_each", {})
    ratios, medians, extras = [], [], []
    for dev, alone in alone_s.items():
        s = cal["s_per_layer"].get(dev)
        if s is None or alone <= 0:
            continue
        xs = each.get(dev) or []
        medians.append(s * layers[dev] / alone)
        ratios.append(sum(xs) / len(xs) / alone if xs else medians[-1])
        extras.append((ratios[-1] - 1.0) * alone / (slowdowns or {}).get(dev, 1.0))
    if not ratios:
        raise CalibrationError("the calibration room recorded no decode stage")
    a, b = before.one_way_s, after.one_way_s
    if a.xs != b.xs:
        raise CalibrationError("the ping-pongs beside the room measured different frame sizes")
    beside = Curve(a.xs, tuple((x + y) / 2 for x, y in zip(a.ys, b.ys)))
    decode = beside(beside.xs[0])
    hop = cal["hop_s"] - decode if cal["hops"] else 0.0
    head = (cal["head_s_per_row"] - host.head(1)) / host.slowdown if cal["head_s_per_row"] else 0.0
    ratio = sum(ratios) / len(ratios)
    excess = {}
    if alone_prefill_s:
        excess = {"prefill_ratio": room_passes(cal, layers, {k: ratio * v for k, v in alone_s.items()},
                                               {k: (n, ratio * v) for k, (n, v) in alone_prefill_s.items()},
                                               slowdowns)[1]}
    return {"stage_ratio": ratio, "stage_extra_s": sum(extras) / len(extras), **excess,
            "hop_s": hop, "head_s": head,
            "one_way_s": beside.to_mapping(), "stage_noise": list(stage_noise(each)),
            "stage_ratio_p50": sum(medians) / len(medians),
            "hop_p50_s": cal["hop_p50_s"] - decode if cal["hops"] else 0.0}


def with_room_overheads(profile: Profile, room: dict) -> Profile:
    """``profile`` with a room run's measurements folded in: every device's pass curve
    times ``stage_ratio`` (the room's decode stage over the pass measured alone), or with
    ``stage_fold`` ``added`` plus ``stage_extra_s`` times its slowdown on every pass; its
    head curve plus ``head_s`` times its slowdown, the transport's one-way times (the
    ping-pong beside the room, ``one_way_s``, when the mapping has it, else the
    profile's) plus ``hop_s``, and ``stage_noise``; kept in the notes. With ``idle_s`` (the
    room's wait between a worker's passes, :func:`room_idle_s`) a device's ``idle`` factors
    become relative to that wait (each over the factor at ``idle_s``, at least 1): the folded
    excess already holds its cost. On the ratio fold a
    ``prefill_ratio`` is kept as ``shared_host[2]`` (no seconds per pass: the decode ratio
    holds them; that factor on prefill chunks): a prompt's chunks are pipelined, so the
    room's two processes computed at once on this machine's cores, which separate
    machines do not (:meth:`planner.profile.Profile.on_one_host` applies it).

    Why two folds: on numpy the compute shares the processor and its caches with the room's
    event loop and the other processes, so the excess grows with the pass (a ratio; the
    held-out CPU rooms of docs/validation.md were predicted so). On wgpu the pass runs on the
    GPU and what the room adds is the processor's side of a pass (the hand-off to the compute
    thread, the event loop, the submission), the same for a decode and a 5-token verify pass:
    on the H200 (2026-12-01) the ratio, measured on decode passes, put verify passes 23 % high."""
    added = room.get("stage_fold") == "added"

    prefill = room.get("prefill_ratio") if not added else None
    shared = dict(profile.shared_host)
    if prefill:  # the chunks' factor is the 2 processes' sharing of this machine's cores
        shared[2] = SharedHost(0.0, float(prefill))

    def stage(v):
        return v.stage.shifted(room["stage_extra_s"] * v.slowdown) if added else v.stage.scaled(room["stage_ratio"])
    g0 = room.get("idle_s")

    def idle(v):  # relative to the room's own gap, whose cost the folded excess already holds
        if v.idle is None or not g0:
            return v.idle
        f0 = v.idle_factor(g0)
        return Curve(v.idle.xs, tuple(max(y / f0, 1.0) for y in v.idle.ys))
    devices = {k: dataclasses.replace(v, stage=stage(v), head=v.head.shifted(room["head_s"] * v.slowdown),
                                      idle=idle(v))
               for k, v in profile.devices.items()}
    tr = profile.transport
    if tr is not None:
        curve = Curve.from_mapping(room["one_way_s"], "room.one_way_s") if room.get("one_way_s") else tr.one_way_s
        tr = dataclasses.replace(tr, one_way_s=curve.shifted(room["hop_s"]))
    notes = dict(profile.notes)
    beside = " beyond the ping-pong measured beside it" if room.get("one_way_s") else ""
    medians = (f"; from medians instead: stage x{room['stage_ratio_p50']:.4f}, hop "
               f"{room['hop_p50_s'] * 1e3:+.3f} ms (not used)") if "stage_ratio_p50" in room else ""
    fold = (f"stage passes +{room['stage_extra_s'] * 1e3:.3f} ms each" if added
            else f"stage times x{room['stage_ratio']:.4f}")
    if prefill:
        fold += (f"; prefill chunks x{prefill:.4f} beyond that (kept as shared_host 2: applied only when the "
                 "devices share one machine)")
    if g0 and any(v.idle is not None for v in profile.devices.values()):
        fold += f"; idle factors relative to the room's {g0 * 1e3:.2f} ms between a worker's passes"
    notes["room"] = (f"2-device room on loopback, plain, {room['laps']} laps: {fold}, per hop {room['hop_s'] * 1e3:+.3f} ms{beside}, per head "
                     f"{room['head_s'] * 1e3:+.3f} ms beyond the parts measured alone (means, folded in above)"
                     f"{medians}")
    noise = tuple(room.get("stage_noise") or ())
    if noise:
        notes["stage_noise"] = (f"{len(noise)} decode laps of the room: stage time over its mean "
                                f"P10 x{_pctl(noise, 10):.3f}, P90 x{_pctl(noise, 90):.3f}")
    return dataclasses.replace(profile, devices=devices, transport=tr, notes=notes,
                               stage_noise=noise or profile.stage_noise, shared_host=shared)


def measure_shared_room(scn: Scenario, profile: Profile, log: Callable[[str], None] = print,
                        answer_tokens: int = 32, backend: str = "numpy") -> dict | None:
    """What three device processes sharing this machine's cores add to a pass, from one
    more small room: the scenario's first three devices that can hold layers (in
    ``profile``), the layers in three near-equal parts, on loopback, plain, two of the
    calibration prompts, on this machine. ``profile``: the one the 2-device room was
    folded into (:func:`with_room_overheads`), so the excess measured is what the third
    process adds beyond that room. The held-out rooms (other splits, round trips,
    drafters, prompts) are never run here.

    Returns ``{"processes": 3, "pass_s": seconds, "prefill_ratio": ratio or None, "laps": N}``
    (:func:`room_passes` against the profile's passes: the decode excess, then the prefill
    chunk over the pass with that excess added) for :func:`with_shared_room`, or
    None when the scenario has fewer than three such devices or the backend is not
    numpy (on wgpu the passes run on the GPU; not measured). Raises CalibrationError when
    the room cannot run."""
    from planner.deal import DealError, deal_for
    from splitroom.real import run_real
    from splitroom.real_configs import prompt_token_counts, real_model_dir
    from splitroom.real_errors import RealRunError
    devs = [d for d in scn.devices if d.webgpu and d.id in profile.devices][:3]
    if len(devs) < 3 or backend != "numpy":
        return None
    n = scn.model.layers
    room = _calibration_room(scn, devs, [0, n // 3, 2 * n // 3, n], answer_tokens)
    try:
        d = deal_for(room)
        log("shared-core room: " + ", ".join(f"{st.device} layers {st.start + 1}-{st.end}" for st in d.stages)
            + ": 3 device processes on this machine, loopback, plain")
        res = run_real(room, d, backend=backend, netns=False, timeout_s=300, log=lambda s: None)
    except (DealError, RealRunError) as e:
        raise CalibrationError(f"the shared-core calibration room failed: {e}") from None
    ctx = int(sum(prompt_token_counts(str(real_model_dir(room)), room.workload.prompts)) / 2) + answer_tokens // 2
    layers = {st.device: st.layers for st in d.stages}
    chunks = res.calibration.get("chunk_s_per_layer") or {}
    sd = {k: v.slowdown for k, v in profile.devices.items()}
    decode = {dev: profile.devices[dev].stage.pass_s(L, 1, ctx) for dev, L in layers.items()}  # the decode fold
    extra, _ = room_passes(res.calibration, layers, decode, {}, sd)
    prefill = {dev: (int(chunks[dev][0]), profile.devices[dev].stage.pass_s(layers[dev], int(chunks[dev][0]), 0)
                     + extra * sd.get(dev, 1.0)) for dev in layers if dev in chunks}
    _, ratio = room_passes(res.calibration, layers, decode, prefill, sd)
    log(f"shared-core room: {res.measured.get('laps', 0)} laps; beyond the 2-device room's fold: every pass "
        f"{extra * 1e3:+.2f} ms a unit of slowdown" + (f", prefill chunks x{ratio:.3f}" if ratio else ""))
    return {"processes": 3, "pass_s": extra, "prefill_ratio": ratio, "laps": res.measured.get("laps", 0)}


def with_shared_room(profile: Profile, room: dict | None) -> Profile:
    """``profile`` with :func:`measure_shared_room`'s result kept as
    ``shared_host[processes]`` (applied only by :meth:`planner.profile.Profile.on_one_host`,
    for rooms whose device processes share this machine) and a note; unchanged for None."""
    if not room:
        return profile
    sh = SharedHost(float(room["pass_s"]), float(room.get("prefill_ratio") or 1.0))
    notes = dict(profile.notes)
    notes["shared_host"] = (f"{room['processes']}-device room on this machine, loopback, plain, {room['laps']} laps: "
                            f"every pass {sh.pass_s * 1e3:+.3f} ms a unit of slowdown beyond the 2-device room's "
                            f"fold, prefill chunks x{sh.prefill_ratio:.4f}"
                            + ("" if room.get("prefill_ratio") else " (no chunk timed: 1)")
                            + " (applied only when the devices share one machine: run --real)")
    return dataclasses.replace(profile, shared_host={**profile.shared_host, int(room["processes"]): sh},
                               notes=notes)


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as YAML with a header saying what it is.
    Raises CalibrationError when the file cannot be written."""
    head = ("# splitroom calibration profile (splitroom calibrate); format: docs/calibration.md\n"
            "# times in seconds; stage: pass_s = fixed_s[context][tokens] + layers * per_layer_s[context][tokens]\n")
    try:
        Path(path).write_text(head + yaml.safe_dump(profile.to_mapping(), sort_keys=False, width=120,
                                                   default_flow_style=None),
                              encoding="utf-8")
    except OSError as e:
        raise CalibrationError(f"{path}: cannot write ({e.strerror})") from None


#: deepest nesting a profile file may have (a profile's own is 6 levels)
PROFILE_MAX_DEPTH = 32


def load_profile(path: str | Path) -> Profile:
    """Read a profile file. Raises CalibrationError (one line naming the file and the
    key) when it cannot be read or is not a valid profile."""
    p = Path(path)
    try:
        data = yaml.safe_load(read_text_capped(p))
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise CalibrationError(f"{path}: not valid YAML ({getattr(e, 'problem', e)})") from None
    except RecursionError:
        raise CalibrationError(f"{path}: nested too deep to read") from None
    except (ValueError, OverflowError) as e:  # a NUL in the name; an integer of more than 4300 digits
        raise CalibrationError(f"{path}: cannot read ({str(e)[:200]})") from None
    problem = size_problem(data, MAX_PROFILE_VALUES, PROFILE_MAX_DEPTH)  # an alias bomb stops here, unwalked
    if problem is not None:
        raise CalibrationError(f"{path}: {problem}")
    try:
        return Profile.from_mapping(data)
    except ProfileError as e:
        raise CalibrationError(f"{path}: {e}") from None


def check_covers(scn: Scenario, profile: Profile, name: str = "profile") -> None:
    """Raise CalibrationError (one line starting with ``name``) when ``profile`` profiles
    none of ``scn``'s devices that can hold layers: a profile of another scenario, whose
    times would silently not be used (devices the profile lacks keep their roofline),
    or when the scenario drafts with a drafter the profile measured but not on the
    scenario's ``workload.kind`` of questions."""
    ids = [d.id for d in scn.devices if d.webgpu]
    if ids and not any(i in profile.devices for i in ids):
        has = ", ".join(sorted(profile.devices)) or "none"
        raise CalibrationError(f"{name}: profiles none of this scenario's devices ({', '.join(ids)}; the profile "
                               f"has: {has}); calibrate with this scenario (splitroom calibrate SCENARIO --out FILE)")
    spec = scn.decoding.speculative
    if spec is not None and spec.drafter in profile.drafters:
        try:
            profile.drafters[spec.drafter].for_workload(scn.workload.acceptance_workload)
        except ProfileError as e:
            raise CalibrationError(f"{name}: {e}") from None


def apply_profile(scn: Scenario, profile: Profile, name: str = "profile") -> Scenario:
    """``scn`` predicted with ``profile`` (see :meth:`planner.room.Scenario.with_profile`).
    Raises CalibrationError when the profile profiles none of the scenario's devices."""
    check_covers(scn, profile, name)
    return scn.with_profile(profile)


def profiled_s_per_layer(profile: Profile) -> dict[str, float]:
    """Each profiled device's decode seconds per layer (one token, the smallest
    context measured): what ``plan --redeal`` deals by."""
    out = {}
    for dev, dp in profile.devices.items():
        c = dp.stage.contexts[0]
        out[dev] = dp.stage.pass_s(1, 1, c) - dp.stage.pass_s(0, 1, c)
    return out
