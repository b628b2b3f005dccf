"""The warning when speculation is predicted slower than plain decoding
(splitroom/speculation_check.py), by hand and through ``simulate``."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.room import Speculative
from splitroom.cli import app
from splitroom.scenario import load
from splitroom.speculation_check import plain_scenario, speculation_summary, warning_line

HOME = str(Path(__file__).resolve().parents[2] / "scenarios" / "home.yaml")


def _spec(scn, **kw):
    return replace(scn, decoding=replace(scn.decoding, speculative=Speculative(**kw)))


def test_summary_and_warning_by_hand():
    scn = _spec(load(HOME), drafter="ngram", draft_tokens=4)
    s = speculation_summary(scn, 7.0, 8.0)
    assert s["change_pct"] == pytest.approx(-12.5)  # (7 - 8) / 8
    assert s["slower"] is True and s["draft_tokens"] == 4 and "max_draft_tokens" not in s
    line = warning_line(s)
    assert "predicted slower than plain" in line and "7.00 against 8.00 tok/s (-12.5%)" in line
    assert "draft_tokens: auto" in line  # a fixed k is told of the adaptive rule
    assert warning_line(speculation_summary(scn, 9.0, 8.0)) is None  # +12.5%: it pays, nothing said
    assert warning_line(speculation_summary(scn, 8.0, 8.0)) is None  # a tie is not slower
    assert warning_line(None) is None


def test_auto_is_told_to_turn_speculation_off():
    scn = _spec(load(HOME), drafter="ngram", draft_tokens=8, adaptive=True)
    s = speculation_summary(scn, 3.0, 4.0)
    assert s["draft_tokens"] == "auto" and s["max_draft_tokens"] == 8
    line = warning_line(s)
    assert "auto up to 8" in line and line.endswith("turn speculation off")


def test_plain_scenario_keeps_everything_but_speculation():
    scn = _spec(load(HOME, ["decoding.async_laps=2"]), drafter="ngram", draft_tokens=4)
    plain = plain_scenario(scn)
    assert plain.decoding.speculative is None and plain.decoding.async_laps == 2
    assert plain.network == scn.network and plain.devices == scn.devices
    with pytest.raises(ValueError):
        speculation_summary(plain, 1.0, 1.0)


def _simulate(*sets):
    r = CliRunner().invoke(app, ["simulate", HOME, "--json", "--no-progress", "--no-range",
                                 *[x for s in sets for x in ("--set", s)]])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), r.stderr


#: home.yaml at 80 ms with no jitter and no stall episodes: a lap's time can be worked by hand
STILL = ("network.rtt=80ms", "network.jitter={distribution: none}", "network.episodes=null")


def test_simulate_warns_when_no_draft_is_ever_accepted():
    # acceptance 0: every lap commits one token (no draft kept, the verify pass's own), as
    # plain does, so each rate is one token over its lap. home.yaml's deal: laptop hosts with
    # layers 1-4, desktop 5-23, phone 24-30, direct return. By hand (SmolLM2-135M: 14,160,384
    # bytes a layer, a 113,246,208-byte tied head; frames 32 + 2,304 bytes a position):
    #   hops: 3 x (40 ms + 0.5 ms overhead + 2,336 B / 25 MB/s)            = 121.780 ms
    #   laptop: 4 layers / 102 GB/s 0.555 + head 1.110 + argmax 0.1        =   1.765 ms
    #   desktop: 19 layers / 51.2 GB/s                                     =   5.255 ms
    #   phone: 7 layers / 60 GB/s x 1.5 (clocked down: its frame comes two 40 ms hops
    #          into the lap, after the wake's 50 ms)                       =   2.478 ms
    #   plain lap                                                          = 131.279 ms
    # Speculating adds, with every pass still memory bound (9 positions' FLOPs are below
    # their bytes' time on each device and the head): 8 ngram drafts x 10 us 0.080, 8 more
    # rows to argmax 0.800, and 8 more positions on each of the 3 hops 3 x 18,432 B / 25 MB/s
    # 2.212: 3.092 ms more a lap, 134.371 ms. (The KV reads, 0.02 ms, are left out: rel 1e-3.)
    plain_lap_s, spec_lap_s = 131.279e-3, 134.371e-3
    j, err = _simulate("decoding.speculative={drafter: ngram, draft_tokens: 8, acceptance: 0.0}", *STILL)
    s = j["metrics"]["speculation"]
    assert j["metrics"]["tokens_per_lap"] == 1.0
    assert 1 / s["tokens_per_s"] == pytest.approx(spec_lap_s, rel=1e-3)
    assert 1 / s["plain_tokens_per_s"] == pytest.approx(plain_lap_s, rel=1e-3)
    assert s["change_pct"] == pytest.approx(100 * (plain_lap_s / spec_lap_s - 1), abs=0.05)  # -2.30 %
    assert s["slower"] is True
    assert "predicted slower than plain decoding" in err and "(-2.3%)" in err
    plain, _ = _simulate(*STILL)  # the plain figure is the plain room's own prediction
    assert s["plain_tokens_per_s"] == pytest.approx(plain["metrics"]["tokens_per_s"])
    assert "speculation" not in plain["metrics"]


def test_simulate_is_quiet_when_every_draft_is_accepted():
    # acceptance 1: 9 tokens a lap for one lap's round trip at 80 ms
    j, err = _simulate("decoding.speculative={drafter: ngram, draft_tokens: 8, acceptance: 1.0}", "network.rtt=80ms")
    assert j["metrics"]["speculation"]["slower"] is False
    assert "slower than plain" not in err
