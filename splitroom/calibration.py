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
from typing import Callable

import yaml

from planner.profile import DeviceProfile, DrafterProfile, PassCurve, Profile, ProfileError, TransportProfile
from planner.room import Scenario

__all__ = ["CalibrationError", "apply_profile", "build_profile", "load_profile", "measure", "profiled_s_per_layer",
           "save_profile"]


class CalibrationError(RuntimeError):
    """A profile that cannot be measured, read or used: the message is one line."""


def measure(backend: str = "numpy", quick: bool = False, log: Callable[[str], None] = print,
            timeout_s: float = 900.0) -> dict:
    """Run ``python -m runtime.calibrate`` in a child process and return its mapping
    (see runtime.calibrate.measure_all). Progress lines go to ``log``.
    Raises CalibrationError when the child fails or runs past ``timeout_s`` seconds."""
    from runtime.weights import ensure_safetensors
    model_dir = str(ensure_safetensors())
    with tempfile.TemporaryDirectory(prefix="splitroom-cal-") as tmp:
        out = Path(tmp) / "cal.json"
        argv = [sys.executable, "-m", "runtime.calibrate", model_dir, str(out), backend] + (["quick"] if quick else [])
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
        if rc != 0 or not out.exists():
            raise CalibrationError(last or f"the measurement exited with status {rc}")
        return json.loads(out.read_text())


def build_profile(scn: Scenario, measured: dict) -> Profile:
    """A profile for ``scn``'s devices from one machine's measurement: every device
    that can hold layers gets the measured pass and head curves times its
    ``emulate.slowdown`` (1 when none); drafters and transport as measured."""
    stage = PassCurve.from_mapping(measured["stage"], "stage")
    from planner.profile import Curve
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


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as YAML with a header saying what it is.
    Raises CalibrationError when the file cannot be written."""
    head = ("# splitroom calibration profile (splitroom calibrate); format: docs/calibration.md\n"
            "# times in seconds; stage: pass_s = fixed_s[context][tokens] + layers * per_layer_s[context][tokens]\n")
    try:
        Path(path).write_text(head + yaml.safe_dump(profile.to_mapping(), sort_keys=False, width=120),
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
        raise CalibrationError(f"{p.name}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise CalibrationError(f"{p.name}: not valid YAML ({getattr(e, 'problem', e)})") from None
    try:
        return Profile.from_mapping(data)
    except ProfileError as e:
        raise CalibrationError(f"{p.name}: {e}") from None


def apply_profile(scn: Scenario, profile: Profile) -> Scenario:
    """``scn`` predicted with ``profile``: the simulator then takes each profiled
    device's stage and head times, each profiled drafter's cost and acceptance from
    it, and the transport's measured per-frame cost as the hop overhead (fixed part)
    plus a cost per byte, replacing the scenario's ``hop_overhead`` guess; the
    profile's congestion window applies unless the scenario sets ``network.window``.
    Devices the profile lacks keep their roofline."""
    net = scn.network
    if profile.transport is not None:
        fixed, per_byte = profile.transport.fit
        net = dataclasses.replace(net, hop_overhead_s=fixed, hop_s_per_byte=per_byte,
                                  window_bytes=net.window_bytes if net.window_bytes is not None
                                  else profile.transport.window_bytes)
    return dataclasses.replace(scn, profile=profile, network=net)


def profiled_s_per_layer(profile: Profile) -> dict[str, float]:
    """Each profiled device's decode seconds per layer (one token, the smallest
    context measured): what ``plan --redeal`` deals by."""
    out = {}
    for dev, dp in profile.devices.items():
        c = dp.stage.contexts[0]
        out[dev] = dp.stage.pass_s(1, 1, c) - dp.stage.pass_s(0, 1, c)
    return out
