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

from planner.profile import Curve, DeviceProfile, DrafterProfile, PassCurve, Profile, ProfileError, TransportProfile
from planner.room import Scenario

__all__ = ["CalibrationError", "add_acceptance", "apply_profile", "build_profile", "check_covers", "load_profile", "measure", "measure_room_overheads",
           "profiled_s_per_layer", "room_overheads", "save_profile", "stage_noise",
           "with_room_overheads"]


class CalibrationError(RuntimeError):
    """A profile that cannot be measured, read or used: the message is one line."""


def measure(backend: str = "numpy", quick: bool = False, log: Callable[[str], None] = print,
            timeout_s: float = 900.0, sample: Sequence[str] = (), acceptance_only: bool = False,
            model_dir: str | Path | None = None, weights: str = "f32") -> dict:
    """Run ``python -m runtime.calibrate`` in a child process and return its mapping
    (see runtime.calibrate.measure_all; ``sample``: a scenario's ``workload.sample``
    prompts, walked too; ``acceptance_only``: only the sample's walks,
    runtime.calibrate.measure_acceptance, for :func:`add_acceptance`). ``model_dir``: the
    model measured (default the bundled SmolLM2, float32 safetensors; a scenario's own,
    splitroom.real.real_model_dir), held as ``weights`` (runtime.precision.WEIGHTS). Progress lines
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
        if sample:
            (Path(tmp) / "sample.json").write_text(json.dumps(list(sample)), encoding="utf-8")
            argv += ["--sample", str(Path(tmp) / "sample.json")] + (["--acceptance-only"] if acceptance_only else [])
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
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
    ``emulate.slowdown`` (1 when none); drafters and transport as measured."""
    stage = PassCurve.from_mapping(measured["stage"], "stage")
    head = Curve.from_mapping(measured["head_s"], "head_s")
    devices = {}
    for d in scn.devices:
        if not d.webgpu:
            continue
        f = float(d.emulate_slowdown or 1.0)
        devices[d.id] = DeviceProfile(stage.scaled(f), head.scaled(f), f)
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
    from planner.room import PinnedStage
    from runtime.calibrate import CALIBRATION_PROMPTS
    from splitroom.real import RealRunError, prompt_token_counts, run_real
    devs = [d for d in scn.devices if d.webgpu and d.id in profile.devices][:2]
    if len(devs) < 2:
        raise CalibrationError("the room run needs two devices that can hold layers")
    half = scn.model.layers // 2
    opts = dataclasses.replace(scn.options, host=devs[0].id, stages=(
        PinnedStage(devs[0].id, 0, half), PinnedStage(devs[1].id, half, scn.model.layers)), headroom=0.0)
    big = tuple(dataclasses.replace(d, lends_bytes=max(d.lends_bytes, 1 << 40)) for d in devs)
    from planner.room import Jitter
    room = dataclasses.replace(
        scn, devices=big, options=opts,
        network=dataclasses.replace(scn.network, rtt_s=0.0, jitter=Jitter(), episodes=None, links=()),
        workload=dataclasses.replace(scn.workload, prompts=tuple(CALIBRATION_PROMPTS[:2]), questions=2,
                                     answer_tokens=answer_tokens, asked_by=()),
        decoding=dataclasses.replace(scn.decoding, speculative=None, async_laps=1))
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
    from splitroom.real import real_model_dir
    ctx = int(sum(prompt_token_counts(str(real_model_dir(room)), room.workload.prompts)) / 2) + answer_tokens // 2
    alone = {st.device: profile.devices[st.device].stage.pass_s(st.layers, 1, ctx)
             for st in d.stages if st.device in profile.devices}
    layers = {st.device: st.layers for st in d.stages}
    slowdowns = {k: v.slowdown for k, v in profile.devices.items()}
    out = room_overheads(res.calibration, alone, layers, profile.devices[devs[0].id], before, after, slowdowns)
    out.update(laps=res.measured.get("laps", 0), tokens_per_s=res.measured.get("tokens_per_s", 0.0),
               stage_fold="added" if backend == "wgpu" else "ratio")
    log(f"room: {out['laps']} laps; against the parts alone: stage x{out['stage_ratio']:.3f} "
        f"({out['stage_extra_s'] * 1e3:+.2f} ms a pass), "
        f"hop {out['hop_s'] * 1e3:+.2f} ms beyond the ping-pong beside it, head {out['head_s'] * 1e3:+.2f} ms; "
        f"stage time spread P10-P90 x{_pctl(out['stage_noise'], 10):.3f}-x{_pctl(out['stage_noise'], 90):.3f}")
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


def room_overheads(cal: dict, alone_s: dict[str, float], layers: dict[str, int], host: DeviceProfile,
                   before: TransportProfile, after: TransportProfile,
                   slowdowns: dict[str, float] | None = None) -> dict:
    """A calibration room's overheads from its measured parts (planner.trace_fit.fit_trace's
    mapping ``cal``) and the parts measured alone.

    ``alone_s``: device -> the profile's pass time of its stage (seconds, one token at
    the room's mean context); ``layers``: device -> its stage's layers; ``host``: the
    host's device profile (its head and slowdown); ``before`` / ``after``: the
    transport's ping-pong right before and right after the room (same frame sizes);
    ``slowdowns``: device -> its emulated slowdown (default 1).

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
    medians. Raises CalibrationError when no decode stage was recorded or the two
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
    return {"stage_ratio": sum(ratios) / len(ratios), "stage_extra_s": sum(extras) / len(extras),
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
    profile's) plus ``hop_s``, and ``stage_noise``; kept in the notes.

    Why two folds: on numpy the compute shares the processor and its caches with the room's
    event loop and the other processes, so the excess grows with the pass (a ratio; the
    held-out CPU rooms of docs/validation.md were predicted so). On wgpu the pass runs on the
    GPU and what the room adds is the processor's side of a pass (the hand-off to the compute
    thread, the event loop, the submission), the same for a decode and a 5-token verify pass:
    on the H200 (2026-12-01) the ratio, measured on decode passes, put verify passes 23 % high."""
    added = room.get("stage_fold") == "added"

    def stage(v):
        return v.stage.shifted(room["stage_extra_s"] * v.slowdown) if added else v.stage.scaled(room["stage_ratio"])
    devices = {k: DeviceProfile(stage(v), v.head.shifted(room["head_s"] * v.slowdown), v.slowdown)
               for k, v in profile.devices.items()}
    tr = profile.transport
    if tr is not None:
        curve = Curve.from_mapping(room["one_way_s"], "room.one_way_s") if room.get("one_way_s") else tr.one_way_s
        tr = TransportProfile(curve.shifted(room["hop_s"]), tr.window_bytes, tr.weights_Bps)
    notes = dict(profile.notes)
    beside = " beyond the ping-pong measured beside it" if room.get("one_way_s") else ""
    medians = (f"; from medians instead: stage x{room['stage_ratio_p50']:.4f}, hop "
               f"{room['hop_p50_s'] * 1e3:+.3f} ms (not used)") if "stage_ratio_p50" in room else ""
    fold = (f"stage passes +{room['stage_extra_s'] * 1e3:.3f} ms each" if added
            else f"stage times x{room['stage_ratio']:.4f}")
    notes["room"] = (f"2-device room on loopback, plain, {room['laps']} laps: {fold}, per hop {room['hop_s'] * 1e3:+.3f} ms{beside}, per head "
                     f"{room['head_s'] * 1e3:+.3f} ms beyond the parts measured alone (means, folded in above)"
                     f"{medians}")
    noise = tuple(room.get("stage_noise") or ())
    if noise:
        notes["stage_noise"] = (f"{len(noise)} decode laps of the room: stage time over its mean "
                                f"P10 x{_pctl(noise, 10):.3f}, P90 x{_pctl(noise, 90):.3f}")
    return dataclasses.replace(profile, devices=devices, transport=tr, notes=notes,
                               stage_noise=noise or profile.stage_noise)


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


def load_profile(path: str | Path) -> Profile:
    """Read a profile file. Raises CalibrationError (one line naming the file and the
    key) when it cannot be read or is not a valid profile."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise CalibrationError(f"{path}: not valid YAML ({getattr(e, 'problem', e)})") from None
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
