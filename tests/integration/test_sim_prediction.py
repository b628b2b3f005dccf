"""The simulator as a predictor (issue 9): frames delivered in order, no silent
zero-answer predictions, drafter costs by kind, KV reads at the context."""

from __future__ import annotations

import dataclasses

import pytest

from planner.room import Jitter
from sim.driver import simulate
from splitroom.scenario import from_mapping, load


def _home_like(s_per_layer, rtt_s, hop_s, prompt, answer, head_s):
    base = load("scenarios/home.yaml")
    devs = tuple(dataclasses.replace(d, s_per_layer=s, clocks_down=False) for d, s in zip(base.devices, s_per_layer))
    net = dataclasses.replace(base.network, rtt_s=rtt_s, hop_overhead_s=hop_s, jitter=Jitter(), episodes=None,
                              links=(), window_bytes=11600)
    wl = dataclasses.replace(base.workload, prompt_tokens=prompt, answer_tokens=answer, questions=2, asked_by=())
    return dataclasses.replace(base, devices=devs, network=net, workload=wl, measured_head_s_per_row=head_s)


def test_frames_that_a_link_delivers_at_the_same_time_keep_their_order():
    # A case found by fuzzing (seed 1, draw 8): three prefill frames reach the phone at
    # the same instant (the window made the first two wait); floating point fired the
    # last one first, the phone dropped it, and the room answered nothing (0.0 tok/s).
    scn = _home_like([0.002432731893152048, 0.001360079198042168, 0.0006844207244213426], 0.02,
                     0.00043233794864124155, 43, 33, 0.0030506939797878972)
    m = simulate(scn).metrics
    assert (m["questions"], m["answered"]) == (2, 2)
    assert m["tokens_per_s"] > 0


@pytest.mark.parametrize("seed", range(40))
def test_every_calibrated_home_room_answers_everything(seed):
    import random
    rng = random.Random(seed)
    scn = _home_like([rng.uniform(2e-4, 3e-3) for _ in range(3)], rng.choice([0.0, 0.005, 0.02, 0.08]),
                     rng.uniform(0, 0.005), rng.randint(1, 60), rng.randint(1, 60), rng.uniform(1e-3, 2e-2))
    m = simulate(scn).metrics
    assert m["answered"] == 2


def _two(decoding):
    return from_mapping({
        "name": "t", "seed": 2,
        "model": "smollm2-135m", "context": 2048,
        "devices": [{"id": "a", "lends": "1 GB", "memory_bandwidth": "50 GB/s", "compute": "2 TFLOPS"}],
        "network": {"rtt": "1 ms", "bandwidth": "1 Gbit/s"},
        "workload": {"questions": 1, "prompt_tokens": 32, "answer_tokens": 64},
        "decoding": decoding})


def test_ngram_drafting_is_not_charged_a_head_read():
    # issue 9: ngram (a lookup, 10 us a token) was charged the draft layer's cost, a
    # read of the 113 MB tied head: 2.3 ms a token at 50 GB/s
    spec = {"drafter": "ngram", "draft_tokens": 4, "acceptance": 0.5}
    r = simulate(_two({"speculative": spec}))
    drafts = [b for b in r.metrics["breakdown"] if b["kind"] == "draft"]
    assert drafts and drafts[0]["mean_s"] == pytest.approx(4 * 10e-6, rel=1e-6)


def test_decode_slows_as_the_context_grows():
    # the KV cache read is in the stage time: per decoded token each layer reads its
    # weights and ctx * kv_bytes_per_token of cache (SmolLM2: 2 x 3 KV heads x 64 x 2 B
    # = 768 B a position), the head reads the tied embedding; memory bound at 50 GB/s
    short_scn = _two({})
    long_scn = dataclasses.replace(short_scn, workload=dataclasses.replace(short_scn.workload, prompt_tokens=1900))
    m = short_scn.model
    assert m.kv_bytes_per_token == 768

    def lap_bytes(mean_ctx):
        return m.layers * (m.layer_active_bytes + mean_ctx * m.kv_bytes_per_token) + m.embedding_bytes
    # decode positions: prompt .. prompt + 63; tokens_per_s counts gaps after the first
    expected = lap_bytes(1900 + 32.5) / lap_bytes(32 + 32.5)
    short = simulate(short_scn).metrics["tokens_per_s"]
    long = simulate(long_scn).metrics["tokens_per_s"]
    assert short / long == pytest.approx(expected, rel=0.01)
    assert expected > 1.07


def test_a_grounded_workload_draws_the_profiles_grounded_acceptance():
    # issue 14: the profile's chat walk accepts nothing, its grounded walk every draft;
    # 64 answer tokens, the first from the prefill: 63 verify laps of 1 token (chat),
    # ceil(63 / (4 + 1)) = 13 laps of up to 5 (grounded)
    from planner.profile import Curve, DrafterProfile, Profile
    prof = Profile({}, {"ngram": DrafterProfile(Curve((4.0,), (1e-5,)), {4: (0,)}, {"grounded": {4: (4,)}})})
    spec = {"speculative": {"drafter": "ngram", "draft_tokens": 4}}
    laps = {}
    for kind in ("chat", "grounded"):
        scn = _two(spec)
        scn = dataclasses.replace(scn, workload=dataclasses.replace(scn.workload, kind=kind)).with_profile(prof)
        m = simulate(scn).metrics
        assert m["answered"] == 1
        laps[kind] = m["laps"]
    assert laps == {"chat": 63, "grounded": 13}


def test_a_profile_without_the_workloads_acceptance_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from planner.profile import Curve, DeviceProfile, DrafterProfile, PassCurve, Profile
    from splitroom.calibration import save_profile
    from splitroom.cli import app
    base = load("scenarios/home.yaml")
    stage = PassCurve(tokens=(1, 5), contexts=(100, 300), fixed_s=((0.001, 0.002),) * 2,
                      per_layer_s=((0.001, 0.002),) * 2)
    prof = Profile({"desktop": DeviceProfile(stage, Curve((1.0,), (0.01,)), 1.0)}, {"ngram": DrafterProfile(Curve((4.0,), (1e-5,)), {4: (1,)})})
    f = tmp_path / "p.yaml"
    save_profile(prof, f)
    r = CliRunner().invoke(app, ["simulate", "scenarios/home.yaml", "--calibration", str(f), "--set",
                                 "decoding.speculative={drafter: ngram, draft_tokens: 4}", "--set",
                                 "workload.kind=grounded"])
    assert r.exit_code == 2, r.output
    assert "no drafter acceptance for workload.kind grounded" in r.output
    assert base.workload.kind == "chat"  # the default
