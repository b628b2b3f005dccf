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

One BLAS thread: pytest computes too (rooms of nodes in this one process, each node with
a compute thread; references; tiny models doing thousands of small products), so it asks
its BLAS for one thread as every device process does (runtime.threads, set before numpy
loads; a count already in the environment is kept). A pool of two threads on two cores
waits for its second thread whenever another thread or process holds a core: with one
other busy process here, test_sampled_room's chi-square test took 36.7 s instead of
8.7 s, and 9.9 s with one BLAS thread; a fresh clone lost 2.5 minutes so on that one test
(162 s). On a quiet machine one thread costs a little: test_local_room, test_room_nodes,
test_sampled_room and test_drafters took 127.7 s against 123.4 s with two (2026-12-02).

Memory: a room a test built is often a reference cycle (tests.local_room.LocalRoom and
its Driver point at each other; so do nodes and their transports), so its stages'
weights (about 540 MB for the whole float32 SmolLM2) stay until Python's cyclic
collector runs, which counts objects, not bytes, and seldom reaches the oldest
generation. A fresh clone's pytest was seen at 9.7 GB so. After each test, when this
process's resident memory has grown by :data:`GC_AFTER_GROWTH_BYTES` since the last
collection, :func:`gc.collect` frees such rooms; reading the size is one small read of
``/proc/self/statm``, so the collector runs only a few dozen times a suite.
"""

from __future__ import annotations

from runtime.threads import pin_one_blas_thread

pin_one_blas_thread()  # before anything imports numpy (module doc)

import gc  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings as _hsettings  # noqa: E402


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


#: resident growth (bytes) after which a test's teardown runs the cyclic collector (module doc)
GC_AFTER_GROWTH_BYTES = 1 << 30
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_rss_after_gc = [float("inf")]  # resident bytes after the last collection, or the least seen since


def _rss_bytes() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Free the cycles of rooms that ended when memory has grown (module doc)."""
    rss = _rss_bytes()
    if rss - _rss_after_gc[0] > GC_AFTER_GROWTH_BYTES:
        gc.collect()
        _rss_after_gc[0] = _rss_bytes()  # what is still held is the new floor: no collection every test
    else:
        _rss_after_gc[0] = min(_rss_after_gc[0], rss)
