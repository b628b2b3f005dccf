"""scripts/spec_auto.py: a held-out row's error split into its parts (error_parts, from
hand-built room records and predictions; every expected figure worked out by hand in the
comments), and the calibration pinned like a --physical room (calibration_command)."""

import json
from pathlib import Path

import pytest

import scripts.spec_auto as S


def _bd(stage, hop, head, draft=None):
    out = [{"kind": "stage", "part": "a", "mean_s": stage / 2}, {"kind": "stage", "part": "b", "mean_s": stage / 2},
           {"kind": "hop", "part": "a->b", "mean_s": hop}, {"kind": "head", "part": "a", "mean_s": head}]
    if draft is not None:
        out.append({"kind": "draft", "part": "a", "mean_s": draft})
    return out


# predicted: 2 tokens a lap at 10 tok/s -> L_P = 0.2 s a lap; parts 0.10 + 0.06 + 0.02 = 0.18, gap 0.02
PRED = {"tokens_per_s": 10.0, "tokens_per_lap": 2.0, "breakdown": _bd(0.10, 0.06, 0.02)}


def test_parts_add_up_with_no_cross_term():
    # measured: 2.5 tokens a lap at 12.5 tok/s -> L_M = 0.2 s; stages 0.08, hops 0.08, head 0.02, gap 0.02
    run = {"tokens_per_s": 12.5, "tokens_per_lap": 2.5, "breakdown": _bd(0.08, 0.08, 0.02)}
    e = S.error_parts(PRED, [run])
    assert e["error"] == pytest.approx(-0.2)           # 10 / 12.5 - 1
    assert e["tokens_per_lap"] == pytest.approx(-0.2)  # 2 / 2.5 - 1
    assert e["stage"] == pytest.approx(-0.1)           # (0.08 - 0.10) / 0.2
    assert e["hop"] == pytest.approx(0.1)              # (0.08 - 0.06) / 0.2
    assert e["head"] == pytest.approx(0.0)
    assert e["draft"] == pytest.approx(0.0)
    assert e["gap"] == pytest.approx(0.0)
    assert e["rest"] == pytest.approx(0.0, abs=1e-12)
    assert e["stage_ms"] == pytest.approx(80.0) and e["stage_ms_predicted"] == pytest.approx(100.0)
    assert e["lap_ms"] == pytest.approx(200.0) and e["lap_ms_predicted"] == pytest.approx(200.0)


def test_the_rest_is_the_cross_term_of_one_run():
    # measured: 2.5 tokens a lap at 10 tok/s -> L_M = 0.25 s: stages 0.13, hops 0.07, head 0.02, gap 0.03
    run = {"tokens_per_s": 10.0, "tokens_per_lap": 2.5, "breakdown": _bd(0.13, 0.07, 0.02)}
    e = S.error_parts(PRED, [run])
    assert e["error"] == pytest.approx(0.0)
    assert e["tokens_per_lap"] == pytest.approx(-0.2)
    assert e["stage"] == pytest.approx(0.15)   # 0.03 / 0.2
    assert e["hop"] == pytest.approx(0.05)     # 0.01 / 0.2
    assert e["gap"] == pytest.approx(0.05)     # (0.03 - 0.02) / 0.2
    assert e["gap_ms"] == pytest.approx(30.0)
    # (2 / 2.5 - 1) * (0.25 / 0.2 - 1) = -0.2 * 0.25
    assert e["rest"] == pytest.approx(-0.05)


def test_medians_over_runs_and_a_drafter_the_prediction_lacks():
    # three runs: tok/s 8, 12, 9 -> median 9; tokens a lap 2 each; L = 0.25, 1/6, 2/9 -> median 2/9
    # drafter 0.01, 0.03, 0.02 s a lap -> median 0.02 (the prediction has no drafter part: 0)
    runs = [{"tokens_per_s": t, "tokens_per_lap": 2.0, "breakdown": _bd(0.10, 0.06, 0.02, d)}
            for t, d in ((8.0, 0.01), (12.0, 0.03), (9.0, 0.02))]
    e = S.error_parts(PRED, runs)
    assert e["error"] == pytest.approx(10.0 / 9.0 - 1)
    assert e["tokens_per_lap"] == pytest.approx(0.0)
    assert e["draft"] == pytest.approx(0.1)            # 0.02 / 0.2
    assert e["draft_ms_predicted"] == pytest.approx(0.0)
    assert e["stage"] == pytest.approx(0.0) and e["hop"] == pytest.approx(0.0)
    # gap: 2/9 - 0.20 measured against 0.02 predicted -> (2/9 - 0.2 - 0.02) / 0.2
    assert e["gap"] == pytest.approx((2 / 9 - 0.22) / 0.2)
    assert e["lap_ms"] == pytest.approx(2000 / 9)
    total = sum(e[k] for k in ("tokens_per_lap", "stage", "hop", "head", "draft", "gap", "rest"))
    assert total == pytest.approx(e["error"])


def test_no_runs_is_a_value_error():
    with pytest.raises(ValueError):
        S.error_parts(PRED, [])


def test_parts_table_of_a_record(tmp_path):
    run = {"tokens_per_s": 12.5, "tokens_per_lap": 2.5, "breakdown": _bd(0.08, 0.08, 0.02)}
    rec = {"rows": [{"name": "r1", "predicted": PRED, "measured_runs": [run]},
                    {"name": "not run", "predicted": PRED}]}
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(rec))
    lines = S.parts_table(p).splitlines()
    assert len(lines) == 3  # header, rule, the one row that ran
    assert lines[2].startswith("| r1 | -20.0% | -20.0 | -10.0 | +10.0 | +0.0 | +0.0 | +0.0 | +0.0 | 80 (100) / 80 (60)")


def _sysfs(tmp_path: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_calibration_on_the_first_rooms_physical_cores(tmp_path):
    # 8 cores x 2 threads, thread i and i+8 on one core: the first room of 3 is 0,1,2
    fs = _sysfs(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    cmd = S.calibration_command("p.yaml", 3, set(range(16)), fs)
    assert cmd[:3] == ["taskset", "-c", "0,1,2"]
    assert cmd[4].endswith("spec_auto.py") and cmd[5:7] == ["--calibrate", "p.yaml"]
    assert cmd[7] == "--placed" and cmd[8].startswith("taskset -c 0,1,2:")
    # threads 2j and 2j+1 on one core: 0, 2, 4
    fs2 = _sysfs(tmp_path / "b", {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(16)})
    assert S.calibration_command("p.yaml", 3, set(range(16)), fs2)[2] == "0,2,4"


def test_calibrate_physical_runs_pinned_and_not_again(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(S.subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    monkeypatch.setattr(S, "calibrate", lambda out, placed=None: seen.append(("calibrate", str(out), placed)))
    monkeypatch.setattr("sys.argv", ["spec_auto.py", "--calibrate", str(tmp_path / "p.yaml"), "--physical"])
    assert S.main() == 0
    assert seen[0][0] == "taskset" and "--placed" in seen[0]
    # the pinned run itself (--placed given) calibrates here, with the note
    monkeypatch.setattr("sys.argv", ["spec_auto.py", "--calibrate", str(tmp_path / "p.yaml"), "--physical",
                                     "--placed", "here"])
    assert S.main() == 0
    assert seen[1] == ("calibrate", str(tmp_path / "p.yaml"), "here")
    # without --physical: no taskset
    monkeypatch.setattr("sys.argv", ["spec_auto.py", "--calibrate", str(tmp_path / "q.yaml")])
    assert S.main() == 0
    assert seen[2] == ("calibrate", str(tmp_path / "q.yaml"), None) and len(seen) == 3
