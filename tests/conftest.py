"""Suite-wide rules.

Loud skips: with ``CI=true`` in the environment (``.ci/run`` sets it), a test that would
be skipped fails instead, naming what is missing: on CI a missing chromium, coturn,
network namespace or reference package means the project's setup is broken, and a
silent skip would hide it. The one allowed skip is the long fuzzing run
(``pytest.mark.fuzz``), which runs only when ``SPLITROOM_FUZZ_N`` asks for it.
"""

from __future__ import annotations

import os

import pytest


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
