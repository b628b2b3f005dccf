"""Suite-wide rules.

Loud skips: with ``CI=true`` in the environment (``.ci/run`` sets it), a test that would
be skipped fails instead, naming what is missing: on CI a missing chromium, coturn,
network namespace or reference package means the project's setup is broken, and a
silent skip would hide it. The one allowed skip is the long fuzzing run
(``pytest.mark.fuzz``), which runs only when ``SPLITROOM_FUZZ_N`` asks for it.

Mutation runs: with ``SPLITROOM_MUTATION=1`` (``make mutate`` sets it) every hypothesis
test runs at most ``SPLITROOM_MUTATION_EXAMPLES`` examples (default 20), derandomized
and without the example database, so each mutant costs a few seconds of the selected
tests instead of a full property run, and two runs judge a mutant alike. A test's own
``@settings(max_examples=N)`` wins over a hypothesis profile, so the cap is applied to
each collected test's settings (hypothesis keeps them on the test function).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings as _hsettings


def mutation_run() -> bool:
    """True during ``make mutate`` (``SPLITROOM_MUTATION`` is ``1``)."""
    return os.environ.get("SPLITROOM_MUTATION", "") == "1"


_hsettings.register_profile("mutation", max_examples=int(os.environ.get("SPLITROOM_MUTATION_EXAMPLES", "20")),
                            derandomize=True, database=None, deadline=None, print_blob=False)
if mutation_run():
    _hsettings.load_profile("mutation")


def pytest_collection_modifyitems(config, items):
    """Under :func:`mutation_run`, cap every hypothesis test's examples (module doc)."""
    if not mutation_run():
        return
    cap = _hsettings.get_profile("mutation")
    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is not None and getattr(fn, "is_hypothesis_test", False):
            fn._hypothesis_internal_use_settings = _hsettings(
                own, max_examples=min(own.max_examples, cap.max_examples), derandomize=True, database=None,
                deadline=None)


def ci_strict() -> bool:
    """True when skips must fail: ``CI`` is ``true`` or ``1`` (any case)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _loud(report, allowed: bool) -> None:
    if report.skipped and ci_strict() and not allowed and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"CI=true: would have been skipped, which CI does not allow: {_skip_reason(report)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _loud(outcome.get_result(), allowed=item.get_closest_marker("fuzz") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _loud(outcome.get_result(), allowed=False)
