"""splitroom.cli.main keeps garbage collection off while a command starts (imports,
the scenario's validation) and turns it back on once the scenario is loaded."""

from __future__ import annotations

import gc
import sys

import pytest

import splitroom.cli as cli
import splitroom.scenario as scenario


def _main(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["splitroom", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code


def test_collection_is_off_while_the_scenario_loads_and_on_after(monkeypatch, capsys):
    seen = []
    real_load = scenario.load

    def load(*a, **k):
        seen.append(gc.isenabled())
        return real_load(*a, **k)

    monkeypatch.setattr(scenario, "load", load)
    after = []
    real_plan = cli.deal_table
    monkeypatch.setattr(cli, "deal_table", lambda *a: (after.append(gc.isenabled()), real_plan(*a))[1])
    assert gc.isenabled()
    try:
        assert _main(monkeypatch, "plan", "scenarios/home.yaml") in (0, None)
        assert seen == [False] and after == [True]
        assert gc.isenabled() and not cli._startup_gc_off
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_scenario_that_fails_to_load_turns_it_back_on_too(monkeypatch, capsys):
    try:
        assert _main(monkeypatch, "plan", "no/such/file.yaml") == 2
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_collection_the_caller_turned_off_stays_off(monkeypatch, capsys):
    gc.disable()
    try:
        assert _main(monkeypatch, "plan", "scenarios/home.yaml") in (0, None)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("argv", [("no-such-command",), ("plan",), ("--help",)])
def test_a_command_that_ends_before_start_up_is_over_turns_it_back_on(monkeypatch, capsys, argv):
    assert _main(monkeypatch, *argv) in (0, 2)
    assert gc.isenabled() and not cli._startup_gc_off
