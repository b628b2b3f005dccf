"""Scenario error paths through the CLI, ``--set`` overrides, and unit parsing (issue 2).

Every bad file or value must print ONE line on stderr naming the file, the key path and
the problem, exit with status 2, and show no traceback (SCENARIO.md, "Errors").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from splitroom.cli import app
from splitroom.units import QuantityError, parse

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
name: errors
model: smollm2-135m
context: 2048
devices:
  - id: big
    lends: 1 GiB
  - id: small
    lends: 300 MB
"""


def run_plan(tmp_path: Path, text: str, *args: str, name: str = "room.yaml"):
    """Write ``text`` to ``tmp_path/name`` and run ``splitroom plan`` on it."""
    f = tmp_path / name
    f.write_text(text)
    return CliRunner().invoke(app, ["plan", str(f), *args])


def assert_one_line_error(result, *parts: str, name: str = "room.yaml") -> str:
    """Exit 2, one stderr line starting with the file name and holding ``parts``."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)
    err = result.stderr.strip()
    assert "\n" not in err, err
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{name}: " in err, err
    for p in parts:
        assert p in err, (p, err)
    return err


def test_base_file_is_valid(tmp_path):
    r = run_plan(tmp_path, BASE, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["host"] == "big"


@pytest.mark.parametrize("text, parts", [
    # missing key
    (BASE.replace("    lends: 1 GiB\n", ""), ["devices[0].lends", "missing"]),
    # wrong unit: a time for a size
    (BASE.replace("lends: 1 GiB", "lends: 20 ms"), ["devices[0].lends", "expected a size", "'20 ms'"]),
    # bare number where a unit is expected
    (BASE.replace("lends: 300 MB", "lends: 96"), ["devices[1].lends", "expected a size", "got 96"]),
    # negative size, with and without a unit (SCENARIO.md's own example: got -3)
    (BASE.replace("lends: 300 MB", "lends: -3"), ["devices[1].lends", "expected a size like '24 GiB', got -3"]),
    (BASE.replace("lends: 300 MB", "lends: -3 GiB"), ["devices[1].lends", "not negative", "-3 GiB"]),
    # a unit with no number
    (BASE.replace("lends: 300 MB", "lends: GiB"), ["devices[1].lends", "expected a size"]),
    # duplicate device id
    (BASE.replace("id: small", "id: big"), ["devices[1].id", "duplicate", "big"]),
    # unknown model id
    (BASE.replace("smollm2-135m", "smollm9-1t"), ["model:", "smollm9-1t", "unknown model"]),
    # host that is not a device
    (BASE + "host: spark\n", ["host:", "spark", "not a device"]),
    # empty device list
    (BASE.split("devices:")[0] + "devices: []\n", ["devices:", "at least 1"]),
    # unknown keys (typos), at the top, in a device, in a nested section, capitalised
    (BASE + "contxt: 4096\n", ["contxt", "unknown key"]),
    (BASE.replace("lends: 1 GiB", "lends: 1 GiB\n    lend: 2 GiB"), ["devices[0].lend", "unknown key"]),
    (BASE + "decoding: {prefil_chunk: 8}\n", ["decoding.prefil_chunk", "unknown key"]),
    (BASE + "Devices: []\n", ["Devices", "unknown key"]),
    # a device id outside [a-z0-9_-]: the pattern must survive printing
    (BASE.replace("id: small", "id: Small One"), ["devices[1].id", "[a-z0-9_-]"]),
    # wrong kinds of value elsewhere
    (BASE + "split: fast\n", ["split:", "speed", "memory"]),
    (BASE + "context: many\n", ["context:"]),
    (BASE + "network: {rtt: 4}\n", ["network.rtt", "expected a time", "got 4"]),
    (BASE + "network: {bandwidth: 1 GiB}\n", ["network.bandwidth", "expected a rate"]),
    (BASE + "decoding: {speculative: fast}\n", ["decoding.speculative", "expected a mapping"]),
    (BASE + "network: {links: [{between: [big, phone]}]}\n", ["network.links[0]", "phone", "not a device"]),
])
def test_bad_file_is_one_line_exit_2(tmp_path, text, parts):
    assert_one_line_error(run_plan(tmp_path, text), *parts)


def test_malformed_yaml(tmp_path):
    r = run_plan(tmp_path, BASE.replace("lends: 1 GiB", "lends: [1 GiB"))
    assert_one_line_error(r, "line", "not valid YAML")


def test_top_level_not_a_mapping(tmp_path):
    assert_one_line_error(run_plan(tmp_path, "- a\n- b\n"), "mapping")


def test_missing_file(tmp_path):
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "nowhere.yaml")])
    assert_one_line_error(r, "cannot read", name="nowhere.yaml")


def test_room_that_cannot_be_dealt_names_each_device(tmp_path):
    text = BASE.replace("lends: 1 GiB", "lends: 1 MiB").replace("lends: 300 MB", "lends: 2 MiB")
    err = assert_one_line_error(run_plan(tmp_path, text), "cannot deal")
    assert "big" in err and "small" in err


# --- --set ------------------------------------------------------------------------------

@pytest.mark.parametrize("sets, host, stages", [
    (["host=small"], "small", None),
    (["devices[1].lends=2 GiB"], "small", None),       # now lends the most
    (["devices.1.lends=2 GiB"], "small", None),        # dotted index form
    (["split=memory", "devices[1].lends=1 GiB"], "big", 2),
    (["decoding.speculative=null"], "big", None),
    (["decoding.speculative={drafter: ngram, draft_tokens: 4}"], "big", None),
    (["decoding.speculative.draft_tokens=8"], "big", None),
])
def test_set_valid(tmp_path, sets, host, stages):
    args = [a for s in sets for a in ("--set", s)]
    r = run_plan(tmp_path, BASE, *args, "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["host"] == host
    if stages is not None:
        assert len(out["stages"]) == stages


def test_set_speculative_reaches_the_scenario(tmp_path):
    from splitroom.scenario import load
    f = tmp_path / "room.yaml"
    f.write_text(BASE + "decoding: {speculative: {drafter: draft_layer, draft_tokens: 2}}\n")
    assert load(f).decoding.speculative.draft_tokens == 2
    assert load(f, ["decoding.speculative=null"]).decoding.speculative is None
    s = load(f, ["decoding.speculative={drafter: ngram, draft_tokens: 4}"]).decoding.speculative
    assert (s.drafter, s.draft_tokens) == ("ngram", 4)


@pytest.mark.parametrize("sets, parts", [
    (["host=phone"], ["host:", "phone", "not a device"]),
    (["devices[0].lends=20 ms"], ["devices[0].lends", "expected a size"]),
    (["devices[0].lends=96"], ["devices[0].lends", "got 96"]),
    (["decoding.speculative={drafter: ngram, draft_tokens: 0}"], ["decoding.speculative.draft_tokens"]),
    (["decoding.speculative={drafter: ngram, draft_tokn: 4}"], ["decoding.speculative.draft_tokn", "unknown key"]),
    (["contxt=4096"], ["contxt", "unknown key"]),
    (["devices[7].lends=1 GiB"], ["--set devices[7].lends", "no item 7"]),
    (["no-equals-sign"], ["--set no-equals-sign", "KEY=VALUE"]),
    (["split=[speed"], ["--set split=[speed", "not YAML"]),
    (["name.first=x"], ["--set name.first", "not inside a mapping"]),
])
def test_set_invalid(tmp_path, sets, parts):
    args = [a for s in sets for a in ("--set", s)]
    assert_one_line_error(run_plan(tmp_path, BASE, *args), *parts)


def test_real_command_exits_2_with_one_line(tmp_path):
    """The installed console script, not the in-process runner."""
    f = tmp_path / "room.yaml"
    f.write_text(BASE.replace("lends: 300 MB", "lends: -3"))
    exe = Path(sys.executable).with_name("splitroom")
    p = subprocess.run([str(exe), "plan", str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert lines[0].endswith("room.yaml: devices[1].lends: expected a size like '24 GiB', got -3")


# --- unit parsing, against hand values -----------------------------------------------------

@pytest.mark.parametrize("text, kind, value", [
    ("96 GiB", "size", 96 * 2**30),
    ("4 GB", "size", 4_000_000_000),
    ("512 MiB", "size", 512 * 2**20),
    ("10 KB", "size", 10_000),
    ("0 B", "size", 0),
    ("1 Gbit/s", "rate", 125e6),
    ("100 Mbit/s", "rate", 12.5e6),
    ("273 GB/s", "rate", 273e9),
    ("250 us", "time", 250e-6),
    ("20 ms", "time", 0.020),
    ("1.5 s", "time", 1.5),
    ("100 TFLOPS", "compute", 1e14),
    ("1.20 USD/h", "price", 1.20),
])
def test_units_parse(text, kind, value):
    assert parse(text, kind) == pytest.approx(value, rel=1e-12, abs=0)


@pytest.mark.parametrize("value, kind", [
    (96, "size"), ("96", "size"), ("20 ms", "size"), ("1 GiB", "time"), ("-3 GiB", "size"),
    ("GiB", "size"), ("nan GiB", "size"), ("inf s", "time"), ("", "size"), (None, "size"),
    (True, "size"), ("3 ms", "rate"), ("1 GiB/s", "size"), ("twelve GiB", "size"),
])
def test_units_reject(value, kind):
    with pytest.raises(QuantityError):
        parse(value, kind)


def test_calibration_file_feeds_measured_and_redeal(tmp_path):
    """A calibration file's measured ms per layer reaches the scenario; plan --redeal
    deals with it: the laptop measured 4x faster than the desktop fills first."""
    import shutil
    from typer.testing import CliRunner

    from splitroom.cli import app
    from splitroom.scenario import load
    src = Path(__file__).resolve().parents[2] / "scenarios" / "home.yaml"
    scn_path = tmp_path / "home.yaml"
    shutil.copy(src, scn_path)
    (tmp_path / "cal.yaml").write_text("measured:\n  ms_per_layer: {desktop: 2 ms, laptop: 0.5 ms, phone: 6 ms}\n")
    with open(scn_path, "a") as f:
        f.write("\ncalibration: cal.yaml\n")
    scn = load(scn_path)
    assert scn.measured_s_per_layer == {"desktop": 0.002, "laptop": 0.0005, "phone": 0.006}
    # the laptop lends less than half the desktop's, so the 1.5x speed rule (issue 12:
    # bandwidth or ms per layer when no copy speed is given) keeps the desktop as host
    big = ["--set", "devices[0].lends=2 GB", "--set", "devices[1].lends=0.9 GB"]
    before = CliRunner().invoke(app, ["plan", str(scn_path), "--json", *big])
    after = CliRunner().invoke(app, ["plan", str(scn_path), "--redeal", "--json", *big])
    assert before.exit_code == 0 and after.exit_code == 0, after.output
    import json as _json
    # unmeasured: fewest hops, the desktop (host, holds all 30) alone
    def ranges(p):
        return [{k: s[k] for k in ("device", "start", "end")} for s in p["stages"]]
    assert ranges(_json.loads(before.stdout)) == [{"device": "desktop", "start": 0, "end": 30}]
    # measured: the laptop (4x faster per layer) fills first, the host keeps one layer
    plan = _json.loads(after.stdout)
    assert ranges(plan) == [{"device": "desktop", "start": 0, "end": 1}, {"device": "laptop", "start": 1, "end": 30}]
    assert any("re-deal" in n for n in plan["notes"])


def test_a_missing_file_is_named_as_typed_with_its_folder(tmp_path):
    from typer.testing import CliRunner
    from splitroom.cli import app
    typed = str(tmp_path / "scenarios" / "hom.yaml")
    r = CliRunner().invoke(app, ["plan", typed])
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {typed}: cannot read (No such file or directory)"
    r = CliRunner().invoke(app, ["plan", "scenarios/home.yaml", "--calibration", typed])
    assert r.exit_code == 2 and f"--calibration {typed}: cannot read" in r.stderr


def test_a_pinned_range_error_speaks_the_1_based_ranges_people_type(tmp_path):
    from typer.testing import CliRunner
    from splitroom.cli import app
    r = CliRunner().invoke(app, ["plan", "scenarios/home.yaml", "--set",
                                 "stages=[{device: desktop, layers: '1-21'}, {device: laptop, layers: '23-30'}]"])
    assert r.exit_code == 2
    assert ("stages[1]: 'laptop' layers 23-30 must start at layer 22 (the stages before it end at layer 21)"
            in r.stderr), r.stderr
    r = CliRunner().invoke(app, ["plan", "scenarios/home.yaml", "--set", "stages=[{device: desktop, layers: '22-30'}]"])
    assert r.exit_code == 2 and "'desktop' layers 22-30 must start at layer 1 " in r.stderr, r.stderr
    assert "[21, 30)" not in r.stderr


def _capped_cli(*args: str) -> subprocess.CompletedProcess:
    """``splitroom ARGS`` in a child held to 1.5 GB of address space and 120 s: a file
    read whole into memory ends there in a MemoryError traceback (or the timeout), not
    by filling the machine."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))
    env = {**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'splitroom'; "
                               "from splitroom.cli import main; main()", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=cap, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"splitroom {' '.join(args)}: still reading after 120 s")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("args, line", [
    (["plan", "/dev/zero"], "error: /dev/zero: cannot read (larger than 16,000,000 bytes)"),
    (["plan", "scenarios/home.yaml", "--calibration", "/dev/zero"],
     "error: --calibration /dev/zero: cannot read (larger than 16,000,000 bytes)"),
    (["simulate", "scenarios/home.yaml", "--no-range", "--set", "workload.sample=/dev/zero"],
     "error: scenarios/home.yaml: workload.sample: '/dev/zero': cannot read (larger than 4,000,000 bytes)"),
])
def test_a_file_that_never_ends_is_refused_after_its_cap_not_read_into_memory(args, line):
    # /dev/zero's st_size is 0, so a size check before reading passes it; 2026-12-04
    # (session 13) each of these three ended in a MemoryError traceback (or filled memory)
    r = _capped_cli(*args)
    assert (r.returncode, r.stderr.strip()) == (2, line), (r.returncode, r.stderr[-600:])


def test_an_alias_bomb_in_a_profile_is_refused_before_anything_walks_it(tmp_path):
    # 10 ** 9 leaves once expanded (nine levels of ten aliases); the profile's notes were
    # turned into text whole (2026-12-04: still running after 60 s)
    lines = ["splitroom_profile: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines + ["notes: {x: *a9}", "devices: {}"]) + "\n")
    r = _capped_cli("plan", "scenarios/home.yaml", "--calibration", str(bomb))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr[-600:])
    assert r.stderr.startswith(f"error: --calibration {bomb}: more than 2000000 values once YAML aliases are expanded")


@pytest.mark.parametrize("text, words", [
    ("splitroom_profile: 1\nnotes: {a: " + "9" * 5000 + "}\n", "Exceeds the limit (4300 digits)"),
    ("splitroom_profile: 1\nnotes: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep to read"),
])
def test_a_profile_yaml_cannot_turn_into_values_is_one_line(tmp_path, text, words):
    # both were tracebacks from yaml.safe_load in load_profile (2026-12-04, session 13)
    prof = tmp_path / "p.yaml"
    prof.write_text(text)
    r = CliRunner().invoke(app, ["plan", "scenarios/home.yaml", "--calibration", str(prof)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exit_code, repr(r.exception))
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith(f"error: --calibration {prof}: ") and words in err, err
