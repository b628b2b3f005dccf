"""CI's small held-out validation (issue 9): calibrate (quick), write predictions for
two configurations before running them, run them for real, compare. No accuracy bound:
a CI machine is noisy and the quick profile is a small sample, so accuracy is a measured
figure (docs/validation.md has the full table, measured alone), not a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_small_heldout_run_writes_predictions_before_running(tmp_path):
    out = tmp_path / "heldout.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_heldout.py"), "--small", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rec = json.loads(out.read_text())
    # the predictions were written before the runs, from a profile of its own
    assert rec["predicted_at"] <= rec["summary"]["finished_at"]
    assert Path(str(out.with_suffix(".profile.yaml"))).exists()
    for c in rec["configurations"]:
        assert c["predicted"]["answered"] == c["predicted"]["questions"] == 2
        assert all(m["answered"] == 2 for m in c["measured_runs"])
        # accuracy depends on the machine's load (a shared CI machine swings): measured figures
        # live in docs/validation.md. The figures are timings, so nothing here bounds them;
        # the formula that derives them (judge: median of the runs, signed error of the
        # median) is checked with hand numbers in tests/unit/test_derived_figures.py
        for key in ("measured_tokens_per_s", "error_pct_tokens_per_s", "error_pct_ttft", "spread_tokens_per_s"):
            assert key in c, key
        # the first token split into parts, predicted and measured in every run
        # (planner.metrics.first_token_parts), each adding up to its first-token time
        for parts in [c["predicted"]["first_token_parts"]] + [m["first_token_parts"] for m in c["measured_runs"]]:
            assert sum(parts[f"{k}_s"] for k in ("stage", "hop", "head", "other")) == pytest.approx(parts["ttft_s"])
            assert parts["stage_s"] > 0 and parts["head_s"] > 0
    assert "RMS error" in r.stdout
    assert "| row | first token measured (predicted) |" in r.stdout


def test_calibrate_cli_quick_writes_a_profile_that_simulate_reads(tmp_path):
    from typer.testing import CliRunner

    from splitroom.calibration import load_profile
    from splitroom.cli import app
    prof = tmp_path / "p.yaml"
    r = CliRunner().invoke(app, ["calibrate", "scenarios/home.yaml", "--out", str(prof), "--quick"])
    assert r.exit_code == 0, r.output
    p = load_profile(prof)
    assert set(p.devices) == {"desktop", "laptop", "phone"}
    # the phone's process pads to 3x (emulate: {slowdown: 3}): so does its profile
    assert p.devices["phone"].stage.pass_s(5, 1, 16) == pytest.approx(3 * p.devices["desktop"].stage.pass_s(5, 1, 16))
    assert p.drafters["ngram"].accepted and p.transport is not None and p.transport.weights_Bps > 0
    # the calibration room's hops against the ping-pong measured beside it, and its laps' compute noise
    assert "beside it" in p.notes["room"] and len(p.stage_noise) >= 8
    # the grounded walk copies a given passage: prompt lookup is right more often than on chat
    ngram = p.drafters["ngram"]
    chat, grounded = ngram.accepted_lengths(4), ngram.for_workload("grounded").accepted_lengths(4)
    assert sum(grounded) / len(grounded) > sum(chat) / len(chat)
    r = CliRunner().invoke(app, ["simulate", "scenarios/home.yaml", "--calibration", str(prof), "--json",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["answered"] == 2


@pytest.mark.parametrize("text", [None, "not json", "{}", '{"configurations": 3}'])
def test_table_of_a_missing_or_foreign_record_is_one_line_and_exit_2(tmp_path, text):
    path = tmp_path / "record.json"
    if text is not None:
        path.write_text(text)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_heldout.py"), "--table", str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: --table {path}: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
