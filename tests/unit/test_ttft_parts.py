"""The first token split into its parts: planner.metrics.first_token_parts on a hand-built
trace, scripts/spec_auto.py's ttft_error_parts on hand-made records (measured parts, and
parts estimated from the decode laps for records made before they were recorded), and
that what spec_auto records for a study carries the parts (predicted and measured).
Every expected figure is worked out by hand in the comments."""

import json
import sys

import pytest

import scripts.spec_auto as S
from planner.frames import FrameHeader, FrameKind
from planner.metrics import compute, first_token_parts
from planner.protocol import (BeginAnswer, EmitToken, FrameArrived, HeadFinished, LapEnded, LapKind, RunHead, RunStage,
                              SendFrame, StageFinished)


def _hdr(lap, pos, tokens, returns, kind=FrameKind.PREFILL):
    return FrameHeader(kind, 0, lap, pos, tokens, 8, returns=returns)


def _trace():
    """Host h, worker w; a 20-token prompt in two chunks (laps 0 and 1, lap 1 returns)."""
    h0, h1 = _hdr(0, 0, 16, False), _hdr(1, 16, 4, True)
    r1 = _hdr(1, 16, 4, True, FrameKind.RESULT)
    return [
        (1.00, BeginAnswer(0, "h", 20)),
        (1.01, RunStage("h", 0, 0, 0, 16, tuple(range(16)))),   # the host starts 10 ms after BeginAnswer
        (1.11, StageFinished("h", 0)),
        (1.11, SendFrame("h", "w", h0)),
        (1.11, RunStage("h", 1, 0, 16, 4, (16, 17, 18, 19))),
        (1.14, StageFinished("h", 1)),
        (1.14, SendFrame("h", "w", h1)),
        (1.21, FrameArrived("w", "h", h0)),
        (1.21, RunStage("w", 0, 0, 0, 16)),
        (1.26, FrameArrived("w", "h", h1)),                     # lap 1's frame: 1.14 -> 1.26
        (1.31, StageFinished("w", 0)),
        (1.31, RunStage("w", 1, 0, 16, 4)),                     # waits behind lap 0 on w
        (1.35, StageFinished("w", 1)),
        (1.35, SendFrame("w", "h", r1)),
        (1.40, FrameArrived("h", "w", r1)),
        (1.40, RunHead(1, 0, 1)),
        (1.42, HeadFinished(1, (7,))),
        (1.42, LapEnded(1, 0, LapKind.PREFILL, 0, 1, False)),
        (1.42, EmitToken(0, "h", 0, 7)),
    ]


def test_first_token_parts_of_a_hand_built_trace():
    f = first_token_parts(_trace())
    # ttft 1.42 - 1.00 = 0.42
    assert f["ttft_s"] == pytest.approx(0.42)
    # host: its first RunStage 1.01 -> lap 1 finished 1.14 = 0.13; worker: lap 1 arrived 1.26 -> finished 1.35 = 0.09
    assert f["parts"]["stage:h"] == pytest.approx(0.13)
    assert f["parts"]["stage:w"] == pytest.approx(0.09)
    assert f["stage_s"] == pytest.approx(0.22)
    # lap 1's hops: 1.14 -> 1.26 = 0.12 and 1.35 -> 1.40 = 0.05
    assert f["parts"]["hop:h->w"] == pytest.approx(0.12) and f["parts"]["hop:w->h"] == pytest.approx(0.05)
    assert f["hop_s"] == pytest.approx(0.17)
    assert f["head_s"] == pytest.approx(0.02)        # 1.40 -> 1.42
    assert f["other_s"] == pytest.approx(0.01)       # 0.42 - 0.22 - 0.17 - 0.02: BeginAnswer -> the first RunStage
    assert len(f["each"]) == 1 and f["each"][0]["ttft_s"] == pytest.approx(0.42)
    assert compute(_trace())["ttft_s"] == pytest.approx(f["ttft_s"])


def test_first_token_parts_of_no_answer():
    f = first_token_parts(_trace()[:5])
    assert f["each"] == [] and f["ttft_s"] == 0.0 and f["parts"] == {}


def _ftp(stage, hop, head, other=0.0):
    return {"ttft_s": stage + hop + head + other, "stage_s": stage, "hop_s": hop, "head_s": head, "other_s": other,
            "parts": {"stage:h": stage / 2, "stage:w": stage / 2, "hop:h->w": hop / 2, "hop:w->h": hop / 2}}


def _bd(stage_h, stage_w, hop, head):
    return [{"kind": "stage", "part": "h", "mean_s": stage_h}, {"kind": "stage", "part": "w", "mean_s": stage_w},
            {"kind": "hop", "part": "h->w", "mean_s": hop / 2}, {"kind": "hop", "part": "w->h", "mean_s": hop / 2},
            {"kind": "head", "part": "h", "mean_s": head}]


# predicted first token 0.60 s: stages 0.40, hops 0.16, head 0.04; decode laps: stages 0.05 + 0.05, hops 0.04, head 0.01
PRED = {"ttft_s": 0.60, "first_token_parts": _ftp(0.40, 0.16, 0.04), "breakdown": _bd(0.05, 0.05, 0.04, 0.01)}


def test_ttft_error_parts_measured():
    # measured 0.50 s: stages 0.32, hops 0.15, head 0.03
    run = {"ttft_s": 0.50, "first_token_parts": _ftp(0.32, 0.15, 0.03), "breakdown": _bd(0.04, 0.04, 0.04, 0.01)}
    e = S.ttft_error_parts(PRED, [run])
    assert e["how"] == "measured"
    assert e["error"] == pytest.approx(0.2)          # 0.60 / 0.50 - 1
    assert e["stage"] == pytest.approx(0.16)         # (0.40 - 0.32) / 0.50
    assert e["hop"] == pytest.approx(0.02)           # (0.16 - 0.15) / 0.50
    assert e["head"] == pytest.approx(0.02)          # (0.04 - 0.03) / 0.50
    assert e["other"] == pytest.approx(0.0)
    assert e["rest"] == pytest.approx(0.0, abs=1e-12)
    assert e["stage_ms"] == pytest.approx(320.0) and e["stage_ms_predicted"] == pytest.approx(400.0)
    assert e["ttft_ms"] == pytest.approx(500.0) and e["ttft_ms_predicted"] == pytest.approx(600.0)


def test_ttft_error_parts_medians_leave_a_rest():
    # three runs, ttft 0.50, 0.41, 0.60 -> median 0.50; stages 0.32, 0.30, 0.34 -> 0.32; hops 0.15, 0.08, 0.20
    # -> 0.15; head 0.03 each; other 0.0, 0.0, 0.03 -> 0.0. Parts: (0.40-0.32)/0.5 = 0.16, (0.16-0.15)/0.5 = 0.02,
    # 0.02, 0.0; rest 0.2 - 0.20 = 0.0 here, since every median is the first run's
    runs = [{"ttft_s": t, "first_token_parts": _ftp(s, h, 0.03, o)}
            for t, s, h, o in ((0.50, 0.32, 0.15, 0.0), (0.41, 0.30, 0.08, 0.0), (0.60, 0.34, 0.20, 0.03))]
    e = S.ttft_error_parts(PRED, runs)
    assert e["error"] == pytest.approx(0.2)
    assert e["stage"] == pytest.approx(0.16) and e["hop"] == pytest.approx(0.02) and e["other"] == pytest.approx(0.0)
    assert e["rest"] == pytest.approx(0.0, abs=1e-12)
    # the first run's stages 0.33 instead (its parts now 0.51 against its ttft 0.50): the medians are no longer one
    # run's; stages 0.33, 0.30, 0.34 -> 0.33, the rest 0.2 - (0.14 + 0.02 + 0.02 + 0.0) = 0.02
    runs[0] = {"ttft_s": 0.50, "first_token_parts": _ftp(0.33, 0.15, 0.03)}
    e = S.ttft_error_parts(PRED, runs)
    assert e["stage"] == pytest.approx((0.40 - 0.33) / 0.5)   # stages 0.33, 0.30, 0.34 -> 0.33
    assert e["rest"] == pytest.approx(0.2 - 0.14 - 0.02 - 0.02)


def test_ttft_error_parts_estimated_from_the_decode_laps():
    # an older record: no measured parts. Decode laps measured: stage h 0.04 (x0.8 of 0.05), stage w 0.05 (x1.0),
    # hops 0.044 (x1.1 each), head 0.01 (x1.0). Measured first token 0.50.
    run = {"ttft_s": 0.50, "breakdown": _bd(0.04, 0.05, 0.044, 0.01)}
    pred = {k: v for k, v in PRED.items() if k != "first_token_parts"}
    e = S.ttft_error_parts(pred, [run], parts_predicted=PRED["first_token_parts"])
    assert e["how"] == "estimated from the decode laps"
    # stages: h 0.20 * (1 - 0.8) + w 0.20 * (1 - 1.0) = 0.04 -> 0.04 / 0.5 = 0.08
    assert e["stage"] == pytest.approx(0.08)
    assert e["stage_ms"] == pytest.approx(360.0)     # 0.20 * 0.8 + 0.20
    # hops: 0.16 * (1 - 1.1) = -0.016 -> -0.032
    assert e["hop"] == pytest.approx(-0.032)
    assert e["head"] == pytest.approx(0.0) and e["other"] == pytest.approx(0.0)
    # rest: 0.2 - 0.08 + 0.032 = 0.152 (what the decode laps do not show)
    assert e["rest"] == pytest.approx(0.152)


def test_ttft_error_parts_needs_runs_and_parts():
    with pytest.raises(ValueError):
        S.ttft_error_parts(PRED, [])
    with pytest.raises(ValueError):
        S.ttft_error_parts({"ttft_s": 0.6, "breakdown": []}, [{"ttft_s": 0.5, "breakdown": []}])


def test_ttft_parts_table_of_a_record(tmp_path):
    run = {"ttft_s": 0.50, "first_token_parts": _ftp(0.32, 0.15, 0.03), "breakdown": _bd(0.04, 0.04, 0.04, 0.01)}
    rec = {"rows": [{"name": "r1", "predicted": PRED, "measured_runs": [run]}, {"name": "not run", "predicted": PRED}]}
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(rec))
    lines = S.ttft_parts_table(p).splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("| r1 | 500 (600) ms | +20.0% | +16.0 | +2.0 | +2.0 | +0.0 | +0.0 | 320 (400) / 150 (160)")
    assert lines[2].endswith("| measured |")
    assert S.ttft_table(p, None) == "\n".join(lines)
    # an older record (no predicted parts) and no profile: said, not guessed
    rec["rows"][0]["predicted"] = {k: v for k, v in PRED.items() if k != "first_token_parts"}
    p.write_text(json.dumps(rec))
    assert "no first_token_parts" in S.ttft_table(p, None)


def test_a_study_records_the_first_tokens_parts(monkeypatch, tmp_path, capsys):
    """--predict-only asks for the predicted parts, --one prints the measured ones."""
    import splitroom.calibration as cal
    import splitroom.real as real
    import splitroom.real_configs as rc
    import splitroom.real_predict as rp
    import runtime.weights as rw
    seen = {}

    def fake_predict(scn, d, prof, rtt, counts, **kw):
        seen.update(kw)
        return {"tokens_per_s": 1.0, "first_token_parts": {"ttft_s": 0.5}}
    monkeypatch.setattr(rp, "predict_real_run", fake_predict)
    monkeypatch.setattr(cal, "load_profile", lambda p: type("P", (), {"notes": {}})())
    monkeypatch.setattr(rw, "ensure_safetensors", lambda *a, **k: "md")
    monkeypatch.setattr(rc, "prompt_token_counts", lambda md, prompts: [10] * len(prompts))
    out = tmp_path / "rec.json"
    S.predict("p.yaml", out, only=["plain"])
    assert seen == {"ttft_parts": True}
    assert json.loads(out.read_text())["rows"][0]["predicted"]["first_token_parts"] == {"ttft_s": 0.5}

    class Res:
        measured = {"tokens_per_s": 2.0, "ttft_s": 0.4, "first_token_parts": {"ttft_s": 0.4, "stage_s": 0.3}}
        calibration = {}
    monkeypatch.setattr(real, "run_real", lambda *a, **k: Res())
    S.one("plain", "p.yaml")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT "))
    assert json.loads(line[7:])["first_token_parts"] == {"ttft_s": 0.4, "stage_s": 0.3}


def test_the_real_rooms_measured_metrics_carry_the_parts():
    """splitroom.real_predict.compare: the measured metrics of a trace carry its first token's parts."""
    from splitroom.real_predict import compare
    m = compute(_trace())
    r = compare(_trace(), m, None, answers=[], calibration={}, network="", emulated=[])
    assert r.measured["first_token_parts"]["parts"]["stage:w"] == pytest.approx(0.09)


def test_a_table_whose_profile_is_not_one_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """--table of an older record (its predictions lack the first token's parts) with a
    --profile that is not a profile: exit 2 and one line naming --profile, not a traceback."""
    run = {"ttft_s": 0.50, "breakdown": _bd(0.04, 0.04, 0.04, 0.01)}
    pred = {k: v for k, v in PRED.items() if k != "first_token_parts"}
    p = tmp_path / "rec.json"
    p.write_text(json.dumps({"rows": [{"name": "r1", "predicted": pred, "measured_runs": [run]}]}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("not: a profile\n")
    monkeypatch.setattr(S, "table", lambda out: "")
    monkeypatch.setattr(S, "parts_table", lambda out: "")
    monkeypatch.setattr(sys, "argv", ["spec_auto.py", "--table", str(p), "--profile", str(bad)])
    assert S.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --profile: ") and "bad.yaml" in err[0]
