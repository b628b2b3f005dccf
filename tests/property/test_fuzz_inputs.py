"""Fuzzing every outside input, briefly (issue 11): scenario files and ``--set`` values
through the CLI entry point. No input may crash (a traceback, an exit status other
than 0 or 2, more than one line of error) or hang.

The inputs come from tests/fuzzing.py. The default run keeps to a few dozen inputs per
surface (seconds); ``SPLITROOM_FUZZ_EXAMPLES=N`` asks for more here, and
tests/benchmark/test_fuzz_counts.py is the long counted run (docs/fuzzing.md).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from tests.fuzzing import BASE, _dump, scenario_files, set_options, try_cli

FAST = settings(max_examples=int(os.environ.get("SPLITROOM_FUZZ_EXAMPLES", "30")), deadline=None,
                suppress_health_check=list(HealthCheck), database=None)


def check(o):
    assert o.kind in ("ok", "refused"), f"{o.kind}: {o.detail}"


@FAST
@given(data=scenario_files())
def test_scenario_files_never_crash(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("fz") / "room.yaml"
    f.write_bytes(data)
    check(try_cli(f, []))


@FAST
@given(sets=set_options())
def test_set_values_never_crash(tmp_path_factory, sets):
    f = tmp_path_factory.mktemp("fz") / "room.yaml"
    f.write_text(_dump(BASE))
    check(try_cli(f, sets))


def test_base_room_is_accepted_and_simulated(tmp_path):
    """The fuzzers' starting point is valid, so mutations test validation, not a broken base."""
    from tests.fuzzing import _cli, small_enough_to_simulate
    f = tmp_path / "room.yaml"
    f.write_text(_dump(BASE))
    assert small_enough_to_simulate(str(f), [])
    assert _cli(["simulate", str(f), "--json", "--no-progress"]).kind == "ok"


def test_a_known_crash_counts_as_one():
    """The classifier itself: an exception other than SystemExit is a crash, exit 2 with
    one line is a refusal, and a second line of error makes it a crash."""
    from tests.fuzzing import _cli
    assert _cli(["plan", "/nonexistent/x.yaml"]).kind == "refused"
    assert _cli(["no-such-command"]).kind == "crash"  # click's usage error: exit 2, several lines
