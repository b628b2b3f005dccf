"""Shared by the measuring scripts: one ``splitroom run --real --json`` in a child
process (the way a user runs it), its JSON back."""

from __future__ import annotations

import json
import subprocess
import sys


def run_real_json(scenario: str, sets: list[str], flags: list[str], timeout_s: float = 600.0) -> dict:
    """``splitroom run --real SCENARIO --json FLAGS --set S...``; returns the parsed JSON.
    Exits (SystemExit with the child's last error line) when the run fails."""
    argv = [sys.executable, "-c", "from splitroom.cli import main; main()", "run", "--real", scenario,
            "--json", *flags] + [a for s in sets for a in ("--set", s)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"run --real failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return json.loads(r.stdout)
