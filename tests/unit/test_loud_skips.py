"""tests/conftest.py's loud skips, run in a pytest of their own over a small test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES = '''
import pytest

def test_needs_a_browser():
    pytest.skip("needs Debian's chromium")

@pytest.mark.fuzz
def test_the_long_fuzzing_run():
    pytest.skip("set SPLITROOM_FUZZ_N")

def test_passes():
    assert True
'''


def _pytest(tmp_path: Path, ci: str | None, target: str = "test_cases.py") -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_collect.py").write_text('import pytest\npytest.importorskip("no_such_module_0x5e")\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fuzz: the long run\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", target],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_under_ci_a_skip_fails_and_names_what_is_missing(tmp_path):
    r = _pytest(tmp_path, "true")
    assert r.returncode == 1, r.stdout
    assert "1 failed, 1 passed, 1 skipped" in r.stdout, r.stdout
    assert "FAILED test_cases.py::test_needs_a_browser" in r.stdout
    assert "CI does not allow: needs Debian's chromium" in r.stdout
    # a module skipped at import (pytest.importorskip) is a collection error naming the module
    r = _pytest(tmp_path, "true", ".")
    assert r.returncode == 2 and "ERROR test_collect.py" in r.stdout and "no_such_module_0x5e" in r.stdout, r.stdout


def test_without_ci_a_skip_stays_a_skip(tmp_path):
    r = _pytest(tmp_path, None, ".")
    assert r.returncode == 0 and "1 passed, 3 skipped" in r.stdout, r.stdout
