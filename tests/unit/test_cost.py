"""The cost of a useful token (issue 12): prices, the per-token arithmetic, the catalog,
and ``simulate --json``'s ``cost`` object. Expected values are computed here by hand
from the prices (USD / (years x 8766 h) + watts x USD/kWh), not by the planner.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from planner.cost import MACHINES, HOURS_PER_YEAR, machines_that_hold, token_cost, usd_per_hour
from planner.deal import Deal, Stage
from planner.model import lookup
from planner.room import DealOptions, Device, Price
from splitroom.cli import app
from splitroom.scenario import ScenarioError, from_mapping


def test_bought_device_per_hour_by_hand():
    # 3999 USD over 3 years = 3999 / 26298 h = 0.152065 USD/h; 140 W at 0.30 USD/kWh
    # = 0.042 USD/h; together 0.194065 USD/h.
    p = Price(buy=3999.0, years=3.0, watts=140.0)
    assert HOURS_PER_YEAR == 8766.0
    assert usd_per_hour(p, 0.30) == pytest.approx(3999 / 26298 + 0.042, rel=1e-12)


def test_rented_device_is_all_in():
    assert usd_per_hour(Price(per_hour=2.10), 0.30) == 2.10


def test_token_cost_counts_serving_devices_only():
    # a (2 USD/h) and b (1 USD/h) serve; g (guest, 100 USD/h) only asks.
    # 3600 tokens in 3600 s = 1 tok/s = 3600 tokens per hour -> 3 USD / 3600 tokens
    # = 833.33 USD per million.
    devs = [Device("a", lends_bytes=1, price=Price(per_hour=2.0)),
            Device("b", lends_bytes=1, price_usd_per_h=1.0),
            Device("g", lends_bytes=1, price=Price(per_hour=100.0))]
    d = Deal(host="a", split="speed", stages=(Stage("a", 0, 1), Stage("b", 1, 2)), guests=("g",), fits=True,
             notes=())
    c = token_cost(d, devs, tokens=3600, duration_s=3600.0)
    assert c.room_usd_per_hour == pytest.approx(3.0)
    assert c.usd_per_million_tokens == pytest.approx(3.0 / 3600 * 1e6)
    assert c.unpriced == ()


def test_unpriced_devices_are_named_and_nobody_priced_gives_none():
    devs = [Device("a", lends_bytes=1), Device("b", lends_bytes=1, price=Price(per_hour=1.0))]
    d = Deal(host="a", split="speed", stages=(Stage("a", 0, 1), Stage("b", 1, 2)), guests=(), fits=True, notes=())
    c = token_cost(d, devs, 100, 10.0)
    assert c.unpriced == ("a",)
    d2 = Deal(host="a", split="speed", stages=(Stage("a", 0, 2),), guests=("b",), fits=True, notes=())
    assert token_cost(d2, devs, 100, 10.0).usd_per_million_tokens is None


def test_catalog_entries_are_cited_and_priced():
    assert len(MACHINES) >= 4
    for m in MACHINES:
        assert m.source and ("USD" in m.source)
        assert usd_per_hour(m.price, 0.17) > 0


def test_machines_that_hold_the_model():
    # GLM-5.2 744B at 4.5 bits is about 420 GB of weights: only the 512 GB Mac Studio.
    glm = lookup("glm-5.2-744b")
    held = {m.id for m in machines_that_hold(glm, DealOptions(context_tokens=4096, headroom=0.05))}
    assert held == {"mac-studio-m3-ultra-512"}
    # SmolLM2-135M (540 MB) fits every machine.
    small = lookup("smollm2-135m")
    assert len(machines_that_hold(small, DealOptions(context_tokens=2048))) == len(MACHINES)


def test_scenario_price_forms_and_errors():
    s = from_mapping({"electricity": "0.30 USD/kWh",
                      "devices": [{"id": "a", "lends": "4 GB", "price": {"buy": "3999 USD", "years": 3, "watts": 140}},
                                  {"id": "b", "lends": "4 GB", "price": {"per_hour": "2.10 USD"}},
                                  {"id": "c", "lends": "4 GB", "price": "1.20 USD/h"}]})
    assert s.electricity_usd_per_kwh == 0.30
    assert s.devices[0].price == Price(buy=3999.0, years=3.0, watts=140.0)
    assert s.devices[1].price == Price(per_hour=2.10)
    assert s.devices[2].price is None and s.devices[2].price_usd_per_h == 1.20
    for bad, where in (({"buy": "3999", "years": 3}, "devices[0].price.buy"),
                       ({"buy": "3999 USD"}, "devices[0].price"),
                       ({"buy": "1 USD", "years": 1, "per_hour": "2 USD"}, "devices[0].price")):
        with pytest.raises(ScenarioError, match="^" + re.escape(f"f.yaml: {where}:")):
            from_mapping({"devices": [{"id": "a", "lends": "4 GB", "price": bad}]}, "f.yaml")
    with pytest.raises(ScenarioError, match="electricity"):
        from_mapping({"electricity": 0.3, "devices": [{"id": "a", "lends": "4 GB"}]})


def test_simulate_json_has_cost(tmp_path):
    # One bought device serving SmolLM2 alone: its USD/h by hand, then USD per million
    # = USD/h / (tokens / duration x 3600) x 1e6 with the run's own tokens and duration.
    scn = {"model": "smollm2-135m", "context": 512, "electricity": "0.20 USD/kWh",
           "devices": [{"id": "a", "lends": "2 GB", "memory_bandwidth": "100 GB/s",
                        "price": {"buy": "2000 USD", "years": 2, "watts": 100}}],
           "workload": {"questions": 1, "prompt_tokens": 16, "answer_tokens": 16}}
    f = tmp_path / "priced.yaml"
    f.write_text(json.dumps(scn))
    r = CliRunner().invoke(app, ["simulate", str(f), "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout if hasattr(r, "stdout") else r.output)
    cost = j["cost"]
    per_hour = 2000 / (2 * 8766) + 0.1 * 0.20
    assert cost["room_usd_per_hour"] == pytest.approx(per_hour)
    rate = j["metrics"]["tokens"] / j["metrics"]["duration_s"]
    assert cost["usd_per_million_tokens"] == pytest.approx(per_hour / (rate * 3600) * 1e6)
    sm = cost["single_machine"]
    assert sm["usd_per_million_tokens"] == min(m["usd_per_million_tokens"] for m in cost["machines"])
    assert sm["id"] in {m.id for m in MACHINES}


def test_simulate_without_prices_has_no_cost(tmp_path):
    scn = {"model": "smollm2-135m", "context": 512, "devices": [{"id": "a", "lends": "2 GB"}],
           "workload": {"questions": 1, "prompt_tokens": 16, "answer_tokens": 8}}
    f = tmp_path / "free.yaml"
    f.write_text(json.dumps(scn))
    r = CliRunner().invoke(app, ["simulate", str(f), "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert not any("cost" in k for k in json.loads(r.output))


@pytest.mark.parametrize("price", [Price(buy=1000.0, years=0.0), Price(buy=1000.0, years=-1.0),
                                   Price(years=3.0, watts=100.0), Price()])
def test_a_price_without_rent_or_a_positive_life_is_refused_by_name(price):
    with pytest.raises(ValueError) as e:
        usd_per_hour(price, 0.30)
    assert str(e.value) == "a price needs per_hour, or buy with years > 0"


def test_a_life_under_a_year_is_a_life():
    # 876.60 USD over half a year = 876.60 / (0.5 x 8766 h) = 0.2 USD/h, no power drawn
    assert usd_per_hour(Price(buy=876.60, years=0.5), 0.30) == pytest.approx(0.2, rel=1e-12)


def test_nothing_delivered_costs_no_rate_and_no_price_per_token():
    devs = [Device("a", lends_bytes=1, price=Price(per_hour=2.0))]
    d = Deal(host="a", split="speed", stages=(Stage("a", 0, 1),), guests=(), fits=True, notes=())
    # 100 tokens in 0 s (an empty run) or 0 tokens in 10 s: rate 0, USD per million None
    for tokens, s in ((100, 0.0), (0, 10.0)):
        c = token_cost(d, devs, tokens, s)
        assert (c.useful_tokens_per_s, c.usd_per_million_tokens, c.room_usd_per_hour) == (0.0, None, 2.0)
    # 50 tokens in 20 s: 2.5 tok/s = 9000 an hour; 2 USD / 9000 tokens = 222.22 USD per million
    c = token_cost(d, devs, 50, 20.0)
    assert c.useful_tokens_per_s == 2.5 and c.usd_per_million_tokens == pytest.approx(2.0 / 9000 * 1e6)
    assert c.to_json() == {"usd_per_million_tokens": pytest.approx(2.0 / 9000 * 1e6), "room_usd_per_hour": 2.0,
                           "useful_tokens_per_s": 2.5, "per_device_usd_per_hour": {"a": 2.0}, "unpriced": []}


def test_a_machine_as_the_room_s_only_device_keeps_its_numbers():
    for m in MACHINES:
        d = m.device()
        assert (d.id, d.name, d.kind, d.lends_bytes, d.memory_bandwidth_Bps, d.compute_flops, d.price, d.webgpu) == (
            m.id, m.name, "computer", m.lends_bytes, m.memory_bandwidth_Bps, m.compute_flops, m.price, True)


def test_machines_that_hold_count_the_host_s_embedding_and_uneven_layers_exactly():
    from planner.model import ModelSpec
    # 4 layers of 40e9 + 1, 10e9, 10e9 and 10e9 bytes (70e9 + 1) and an embedding of
    # 10e9 - 1 bytes: the host needs exactly 80e9 bytes, no headroom, no KV. The rented
    # H100 lends exactly 80 GB: it holds all 4 (from layer 1, summed size by size; the
    # mean size, ceil(70e9 + 1) / 4) = 17.5e9 + 1, would give only 3). The 72 GB Mac
    # Studio would hold the layers (70e9 + 1) but not with the embedding: it does not
    # hold the model. The 96, 119 and 480 GB machines do.
    sizes = (40 * 10**9 + 1, 10**10, 10**10, 10**10)
    m = ModelSpec(id="u", name="u", layers=4, hidden=8, layer_bytes=-(-sum(sizes) // 4), layer_active_bytes=1,
                  layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=10**10 - 1, layer_sizes=sizes)
    held = {x.id for x in machines_that_hold(m, DealOptions(context_tokens=16, headroom=0.0))}
    assert held == {"h100-80-rent", "framework-desktop-128", "dgx-spark", "mac-studio-m3-ultra-512"}
