"""Ends-local privacy in ``simulate`` (composition root): the scenario and deal with the
host's ends kept local (planner/privacy.py), and the comparison with the plain deal."""

from __future__ import annotations

from dataclasses import replace

from planner.privacy import ends_local, tail_id
from planner.room import Scenario


def ends_local_scenario(scn: Scenario):
    """``(scenario, deal)`` of ``scn`` with ``privacy.ends_local``: the room gains the
    host's virtual tail device and its free link; the answer returns straight to the
    host (``return: direct``: returning through the stages would send the last hidden
    state back round the room). Measured ms per layer of the host also covers its tail.
    Raises planner.deal.DealError (one line) when the split is impossible."""
    first, last = scn.ends_local
    room, net, d = ends_local(scn.devices, scn.model, scn.options, scn.network, first, last)
    measured = dict(scn.measured_s_per_layer)
    if d.host in measured:
        measured[tail_id(d.host)] = measured[d.host]
    out = replace(scn, devices=room, network=net, measured_s_per_layer=measured,
                  decoding=replace(scn.decoding, return_path="direct"))
    return out, d


def privacy_summary(scn: Scenario, metrics: dict, plain_metrics: dict) -> dict:
    """The ``privacy`` object of ``simulate --json``: the split, its tokens per second,
    the plain deal's, and the change in percent (negative: the price of privacy)."""
    first, last = scn.ends_local
    tps, plain = metrics["tokens_per_s"], plain_metrics["tokens_per_s"]
    return {"ends_local": {"first": first, "last": last}, "tokens_per_s": tps, "plain_tokens_per_s": plain,
            "change_pct": 100.0 * (tps - plain) / plain if plain else None}


def real_privacy_summary(scn: Scenario, private, plain) -> dict:
    """The ``privacy`` object of ``run --real --json``: ``private`` and ``plain`` are the
    :class:`splitroom.real_predict.RealResult` of the ends-local room and of the plain deal, run
    one after the other on the same questions. Gives both measured tokens per second,
    the change in percent (negative: the price), the same-run predicted change, and
    ``same_tokens``: whether every answer's token ids are equal in both rooms."""
    first, last = scn.ends_local
    tps, base = private.measured["tokens_per_s"], plain.measured["tokens_per_s"]
    ptps, pbase = private.predicted["tokens_per_s"], plain.predicted["tokens_per_s"]
    same = (len(private.answers) == len(plain.answers)
            and all(a["token_ids"] == b["token_ids"] for a, b in zip(private.answers, plain.answers)))
    return {"ends_local": {"first": first, "last": last}, "tokens_per_s": tps, "plain_tokens_per_s": base,
            "change_pct": 100.0 * (tps - base) / base if base else None,
            "predicted_tokens_per_s": ptps, "predicted_plain_tokens_per_s": pbase,
            "predicted_change_pct": 100.0 * (ptps - pbase) / pbase if pbase else None,
            "same_tokens": same}
