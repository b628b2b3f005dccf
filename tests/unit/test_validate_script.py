"""scripts/validate.py (`make validate`): bad arguments are one line and exit 2, before any study runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,msg", [(["--only", "nope"], "--only takes heldout, published, fuzz"),
                                      (["--only", ","], "--only takes"),
                                      (["--fuzz-n", "0"], "--fuzz-n must be at least 1, got 0"),
                                      (["--bogus"], "unrecognized arguments: --bogus")])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, msg):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate.py"), "--docs", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written
