"""The simulator with a calibration profile: predictions computed by hand from a
profile written here (not measured), through the scenario key and the CLI."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from splitroom.cli import app

FLAT = {"tokens": [1, 16], "contexts": [0, 4096],
        "fixed_s": [[0.001, 0.001], [0.001, 0.001]], "per_layer_s": [[0.0005, 0.0005], [0.0005, 0.0005]]}


def _profile(tmp_path, drafters=None, transport=None):
    dev = {"slowdown": 1.0, "stage": FLAT, "head_s": {1: 0.004, 16: 0.004}}
    prof = {"splitroom_profile": 1, "notes": {"machine": "by hand"}, "devices": {"a": dev, "b": dev},
            "drafters": drafters or {}, "transport": transport}
    p = tmp_path / "prof.yaml"
    p.write_text(yaml.safe_dump(prof))
    return p


def _scenario(tmp_path, devices, extra=""):
    s = tmp_path / "room.yaml"
    s.write_text(f"""
name: hand
seed: 3
model: smollm2-135m
context: 2048
devices: {json.dumps(devices)}
network: {{rtt: 10 ms, bandwidth: 1000 Gbit/s, hop_overhead: 3 ms}}
workload: {{questions: 1, prompt_tokens: 16, answer_tokens: 41}}
{extra}
""")
    return s


def _simulate(scn, *args):
    r = CliRunner().invoke(app, ["simulate", str(scn), "--json", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["metrics"]


def test_one_device_decodes_at_the_profiled_pass_plus_head(tmp_path):
    prof = _profile(tmp_path)
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}])
    m = _simulate(scn, "--calibration", str(prof))
    # a decode lap: 1 ms + 30 layers x 0.5 ms, then the head's 4 ms (+ an embedding
    # row: 2.3 KB at the default 100 GB/s, 23 ns)
    assert 1 / m["tokens_per_s"] == pytest.approx(0.001 + 30 * 0.0005 + 0.004, rel=1e-4)


def test_two_devices_pay_the_profiled_hop_for_each_frame_size(tmp_path):
    transport = {"one_way_s": {2336: 0.002, 36896: 0.004}, "window_bytes": None}
    prof = _profile(tmp_path, transport=transport)
    devs = [{"id": "a", "lends": "2 GB"}, {"id": "b", "lends": "2 GB"}]
    pins = 'host: a\nstages: [{device: a, layers: "1-15"}, {device: b, layers: "16-30"}]'
    m = _simulate(_scenario(tmp_path, devs, pins), "--calibration", str(prof))
    slope = 0.002 / (36896 - 2336)
    hop = 0.010 / 2 + 0.002  # the decode frame (2,336 B) is where the line is pinned
    stage = 0.001 + 15 * 0.0005
    assert 1 / m["tokens_per_s"] == pytest.approx(stage + hop + stage + hop + 0.004, rel=1e-4)
    assert slope > 0
    # the scenario's 3 ms hop_overhead guess is replaced by the profile's transport
    unprofiled = _simulate(_scenario(tmp_path, devs, pins))
    assert unprofiled["tokens_per_s"] != m["tokens_per_s"]


def test_a_profiled_drafter_sets_cost_and_acceptance(tmp_path):
    drafters = {"ngram": {"call_s": {1: 0.002, 8: 0.002}, "accepted": {4: [4, 4, 4]}}}
    prof = _profile(tmp_path, drafters=drafters)
    spec = "decoding: {speculative: {drafter: ngram, draft_tokens: 4}}"
    # the profile may come from the scenario key too (path relative to the scenario)
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}], spec + f"\ncalibration: {prof.name}")
    m = _simulate(scn)
    assert m["tokens_per_lap"] == pytest.approx(5.0)
    # each verify lap: draft 2 ms, a 5-token pass (flat: 16 ms), head on 5 rows (4 ms)
    assert 5 / m["tokens_per_s"] == pytest.approx(0.002 + 0.016 + 0.004, rel=1e-3)


def test_bad_profiles_are_one_line_and_exit_2(tmp_path):
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}])
    bad = tmp_path / "bad.yaml"
    bad.write_text("splitroom_profile: 99\n")
    for path in (bad, tmp_path / "missing.yaml"):
        r = CliRunner().invoke(app, ["simulate", str(scn), "--calibration", str(path)])
        assert r.exit_code == 2
        assert "Traceback" not in r.output and path.name in r.output


def test_pinned_host_that_is_not_the_first_stage_is_refused_by_plan_and_simulate(tmp_path):
    devs = [{"id": "a", "lends": "2 GB"}, {"id": "b", "lends": "2 GB"}]
    pins = 'host: a\nstages: [{device: b, layers: "1-15"}, {device: a, layers: "16-30"}]'
    scn = _scenario(tmp_path, devs, pins)
    for cmd in ("plan", "simulate"):
        r = CliRunner().invoke(app, [cmd, str(scn)])
        assert r.exit_code == 2, r.output
        assert "not the first stage" in r.output


def test_unknown_drafter_is_refused(tmp_path):
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}], "decoding: {speculative: {drafter: bogus}}")
    r = CliRunner().invoke(app, ["simulate", str(scn)])
    assert r.exit_code == 2 and "drafter" in r.output


def test_an_engine_preset_scales_the_roofline_by_its_efficiency(tmp_path):
    from sim.engines import ENGINES
    plain = _simulate(_scenario(tmp_path, [{"id": "a", "lends": "2 GB", "memory_bandwidth": "50 GB/s"}]))
    metal = _simulate(_scenario(tmp_path, [{"id": "a", "lends": "2 GB", "memory_bandwidth": "50 GB/s",
                                            "engine": "llama.cpp-metal"}]))
    # decode here is memory bound: stages and head read at 55.5% of 50 GB/s; the
    # embedding row, sampling (0.1 ms) are not scaled
    eff = ENGINES["llama.cpp-metal"].efficiency
    assert eff == pytest.approx(7.16e9 * 62.05 / 800e9, rel=0.01)  # the cited figure
    sample = 1e-4
    t_plain = 1 / plain["tokens_per_s"] - sample
    t_metal = 1 / metal["tokens_per_s"] - sample
    assert t_metal == pytest.approx(t_plain / eff, rel=1e-3)
    r = CliRunner().invoke(app, ["simulate", str(_scenario(tmp_path, [{"id": "a", "lends": "2 GB",
                                                                      "engine": "vllm-magic"}]))])
    assert r.exit_code == 2 and "engine" in r.output


def test_plan_redeal_deals_by_the_profiled_decode_time(tmp_path):
    slow = dict(FLAT, per_layer_s=[[0.0015, 0.0015], [0.0015, 0.0015]])
    prof = {"splitroom_profile": 1, "devices": {
        "a": {"stage": FLAT, "head_s": {1: 0.004}}, "b": {"stage": slow, "head_s": {1: 0.004}}}}
    p = tmp_path / "prof.yaml"
    p.write_text(yaml.safe_dump(prof))
    # each lends enough for 20 of the 30 layers (14.2 MB each) and no more
    devs = [{"id": "a", "lends": "420 MB"}, {"id": "b", "lends": "420 MB"}]
    scn = _scenario(tmp_path, devs, "split: speed\nhost: b")
    r = CliRunner().invoke(app, ["plan", str(scn), "--json", "--redeal", "--calibration", str(p)])
    assert r.exit_code == 0, r.output
    stages = {s["device"]: s["end"] - s["start"] for s in json.loads(r.stdout)["stages"]}
    # a is 3x faster per layer: a speed deal gives it as many layers as it can hold
    assert stages["a"] > stages["b"]
    r = CliRunner().invoke(app, ["plan", str(scn), "--redeal"])
    assert r.exit_code == 2 and "calibration profile" in r.output


def test_a_profile_of_another_scenario_is_one_line_and_exit_2(tmp_path):
    """A profile naming none of the scenario's devices (calibrated for another
    scenario) was silently ignored: every device kept its roofline. Now every command
    that takes --calibration (and the scenario key) refuses it with one line."""
    prof = _profile(tmp_path)  # devices a and b
    scn = _scenario(tmp_path, [{"id": "x", "lends": "2 GB"}, {"id": "y", "lends": "2 GB"}])
    for args in (["simulate", str(scn), "--calibration", str(prof)],
                 ["plan", str(scn), "--redeal", "--calibration", str(prof)],
                 ["sweep", str(scn), "--calibration", str(prof), "--vary", "network.rtt=0ms,5ms", "--jobs", "1"],
                 ["run", "--real", str(scn), "--calibration", str(prof)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output and "none of this scenario's devices (x, y" in r.output, r.output
    keyed = _scenario(tmp_path, [{"id": "x", "lends": "2 GB"}], f"calibration: {prof.name}")
    r = CliRunner().invoke(app, ["simulate", str(keyed)])
    assert r.exit_code == 2 and "none of this scenario's devices" in r.output, r.output


def test_sweep_with_a_bad_profile_is_one_line_and_exit_2(tmp_path):
    """sweep loaded the profile only in its workers: a missing or malformed file was a
    CalibrationError traceback with exit 1."""
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}])
    bad = tmp_path / "bad.yaml"
    bad.write_text("splitroom_profile: 1\ndevices: {a: {stage: [1, 2\n")
    for path in (bad, tmp_path / "missing.yaml"):
        r = CliRunner().invoke(app, ["sweep", str(scn), "--calibration", str(path), "--vary", "network.rtt=0ms,5ms",
                                     "--jobs", "1"])
        assert r.exit_code == 2, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert path.name in r.output


def test_a_profile_window_of_zero_or_less_is_one_line_and_exit_2(tmp_path):
    """transport.window_bytes: -1 passed the profile reader and was a ValueError
    traceback in the simulator's link."""
    scn = _scenario(tmp_path, [{"id": "a", "lends": "2 GB"}])
    for w in (-1, 0):
        prof = _profile(tmp_path, transport={"one_way_s": {2336: 0.002, 36896: 0.004}, "window_bytes": w})
        r = CliRunner().invoke(app, ["simulate", str(scn), "--calibration", str(prof)])
        assert r.exit_code == 2, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert "transport.window_bytes" in r.output
