"""The simulator against published numbers (docs/validation.md holds the distances).

Sources:
* Product page 000 ("How layers are split"): in a DGX Spark (GB10) + M5 Max room with
  Qwen3.6-35B-A3B, the Mac hosting instead of the Spark made speculative decoding
  20-39% faster and plain decoding 9-11% faster.
* A published WAN run of a 744B model over six US states (scenarios/wan_glm.yaml):
  plain 1.87 tok/s, deep-draft speculation 1.99, direct return 2.94, async pipelining
  16.6, a 4x cheaper draft about 30.
"""

import pytest

from sim.driver import simulate
from splitroom.scenario import load

SPEC_ON = "decoding.speculative={drafter: draft_layer, draft_tokens: 4, acceptance: 0.75}"


def tok_s(path, *sets):
    return simulate(load(path, list(sets))).metrics["tokens_per_s"]


def gain(a, b):
    return a / b - 1


@pytest.fixture(scope="module")
def gb10():
    p = "scenarios/gb10_m5.yaml"
    return {(host, spec): tok_s(p, f"host={host}", SPEC_ON if spec else "decoding.speculative=null")
            for host in ("mac", "spark") for spec in (False, True)}


def test_gb10_mac_host_plain_gain_near_published_9_to_11_percent(gb10):
    g = gain(gb10[("mac", False)], gb10[("spark", False)])
    # stated tolerance: within 5 percentage points of the published range
    assert 0.09 - 0.05 <= g <= 0.11 + 0.05, g


def test_gb10_mac_host_speculative_gain_near_published_20_to_39_percent(gb10):
    g = gain(gb10[("mac", True)], gb10[("spark", True)])
    assert 0.20 - 0.05 <= g <= 0.39 + 0.05, g


def test_gb10_the_rules_pick_the_mac_and_both_hold_layers():
    from planner.deal import deal
    scn = load("scenarios/gb10_m5.yaml")
    d = deal(scn.devices, scn.model, scn.options)
    assert d.host == "mac" and {s.device for s in d.stages} == {"mac", "spark"}


WAN = "scenarios/wan_glm.yaml"
WAN_SPEC = "decoding.speculative={drafter: model, draft_tokens: 4, acceptance: 0.7, draft_cost: 50 ms}"


def test_wan_plain_rung_within_5_percent_of_1_87():
    """A regression pin, not validation: hop_overhead (20 ms) is the one number fitted
    to this rung (see the scenario file), so agreeing with 1.87 only shows the fit still
    holds. The validation is the other rungs, predicted with that one number unchanged:
    the direct-return speed-up and the cheaper draft below (docs/validation.md)."""
    assert tok_s(WAN) == pytest.approx(1.87, rel=0.05)


def test_wan_direct_return_speedup_within_15_percent_of_published():
    # published: 2.94 / 1.99 = 1.48x from returning straight to the coordinator
    via = tok_s(WAN, WAN_SPEC)
    direct = tok_s(WAN, WAN_SPEC, "decoding.return=direct")
    assert direct / via == pytest.approx(2.94 / 1.99, rel=0.15)


def test_wan_cheaper_draft_helps_async_laps():
    # published: 16.6 -> about 30 tok/s when the draft went from 50 to 13 ms per token.
    # The simulator's absolute numbers miss here (docs/validation.md says why); the
    # direction and a speed-up of at least 1.5x must hold.
    base = ["decoding.return=direct", "decoding.async_laps=8"]
    slow = tok_s(WAN, "decoding.speculative={drafter: model, draft_tokens: 1, acceptance: 0.9, draft_cost: 50 ms}", *base)
    fast = tok_s(WAN, "decoding.speculative={drafter: model, draft_tokens: 1, acceptance: 0.9, draft_cost: 13 ms}", *base)
    assert fast / slow >= 1.5
