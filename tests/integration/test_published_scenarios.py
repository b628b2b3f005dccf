"""Every scenario of scenarios/published/ (docs/validation.md, "Rooms other systems
published") is a valid room the simulator answers: it loads, is dealt, fits (or offloads
by opt-in) and answers every question. Accuracy is in docs/validation.md, not here."""

from pathlib import Path

import pytest

from planner.deal import deal
from planner.fit import check_fits
from sim.driver import simulate
from splitroom.scenario import load

PUBLISHED = sorted((Path(__file__).resolve().parents[2] / "scenarios" / "published").glob("*.yaml"))


def test_there_are_published_rooms():
    assert len(PUBLISHED) >= 5


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_published_room_simulates(path):
    scn = load(path, ["workload.answer_tokens=8"])
    d = deal(scn.devices, scn.model, scn.options)
    check_fits(d, scn.devices, scn.model, scn.options)
    m = simulate(scn, d, trace=False).metrics
    assert m["answered"] == m["questions"] == 1 and m["tokens"] == 8
