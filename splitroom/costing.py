"""The cost of a useful token for a simulated room, beside the cheapest single machine
that holds the model (composition root: planner.cost's arithmetic + sim's prediction).

The single machine is predicted by the same simulator and cost model: the scenario's
model, context, workload and decoding on one device built from a catalog entry
(planner/cost.py ``MACHINES``), with no hops.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost import DEFAULT_ELECTRICITY_USD_PER_KWH, Machine, machines_that_hold, token_cost, usd_per_hour
from planner.deal import deal_for
from planner.room import Scenario


def has_prices(scn: Scenario) -> bool:
    """True when any device of ``scn`` carries a price (``price:``)."""
    return any(d.price is not None or d.price_usd_per_h is not None for d in scn.devices)


def electricity(scn: Scenario) -> float:
    """The scenario's electricity price, USD/kWh (planner.cost's default when unset)."""
    return scn.electricity_usd_per_kwh if scn.electricity_usd_per_kwh is not None else DEFAULT_ELECTRICITY_USD_PER_KWH


def _simulate_machine(scn: Scenario, m: Machine) -> dict:
    from sim.driver import Simulation
    one = replace(scn, devices=(m.device(),), measured_s_per_layer={}, measured_head_s_per_row=None,
                  options=replace(scn.options, host=None, stages=None, split="speed"))
    if hasattr(one, "profile"):
        one = replace(one, profile=None)
    d = deal_for(one)
    metrics = Simulation(one, d, trace=False).run().metrics
    c = token_cost(d, one.devices, metrics["tokens"], metrics["duration_s"], electricity(scn))
    return {"id": m.id, "name": m.name, "tokens_per_s": metrics["tokens_per_s"],
            "useful_tokens_per_s": c.useful_tokens_per_s, "usd_per_hour": c.room_usd_per_hour,
            "usd_per_million_tokens": c.usd_per_million_tokens, "source": m.source}


def room_cost(scn: Scenario, deal_, metrics: dict, compare: bool = True) -> dict:
    """The ``cost`` object of ``simulate --json``: the room's USD per million useful
    tokens (planner.cost.token_cost) and, when ``compare``, ``single_machine``: the
    catalog machine that holds the model at the least USD per million tokens (each
    simulated), plus every machine tried under ``machines``.
    """
    c = token_cost(deal_, scn.devices, metrics["tokens"], metrics["duration_s"], electricity(scn))
    out = {"currency": "USD", **c.to_json(), "electricity_usd_per_kwh": electricity(scn)}
    if compare:
        tried = [_simulate_machine(scn, m) for m in machines_that_hold(scn.model, scn.options)]
        tried = [t for t in tried if t["usd_per_million_tokens"] is not None]
        tried.sort(key=lambda t: t["usd_per_million_tokens"])
        out["single_machine"] = tried[0] if tried else None
        out["machines"] = tried
    return out


__all__ = ["has_prices", "electricity", "room_cost", "usd_per_hour"]
