#!/usr/bin/env python3
"""`make validate`: reproduce the figures docs/ quotes, and say which documented goal
each run meets or misses.

Three studies, each run by the tool that already owns it:

1. the held-out study (``scripts/validate_heldout.py``): calibrate once, predict rooms
   before they run, run them, compare. Goals (docs/validation.md): tokens/s RMS error
   <= 5 %, worst <= 10 %, time to first token within 15 %.
2. the published table (``tests/integration/test_published.py``): each row is the
   simulator against a published figure with the tolerance its row states; the goal is
   every row inside its tolerance.
3. the long fuzzing run (``tests/benchmark/test_fuzz_counts.py`` with
   ``SPLITROOM_FUZZ_N``): every outside-input surface fed N inputs; the goal is no
   crash and no hang (docs/fuzzing.md).

Writes ``docs/validate-DATE.json`` (and the studies' own files beside it, dated) and
exits 1 when a goal is missed, 2 on bad arguments. Not part of CI: the held-out study
takes about half an hour and its timings need a quiet machine (run it alone).

Usage::

    .venv/bin/python scripts/validate.py                 # all three, full size
    .venv/bin/python scripts/validate.py --quick         # held-out --small, fuzz N=200
    .venv/bin/python scripts/validate.py --only published,fuzz --fuzz-n 2000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("heldout", "published", "fuzz")

#: the held-out goals of docs/validation.md, as (summary key, bound on |value| in percent)
HELDOUT_GOALS = (("rms_error_pct_tokens_per_s", 5.0), ("worst_error_pct_tokens_per_s", 10.0),
                 ("worst_error_pct_ttft", 15.0))


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _run(argv: list[str], env: dict | None = None, timeout_s: float = 6 * 3600) -> subprocess.CompletedProcess:
    print("validate: " + " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, text=True, timeout=timeout_s)


def heldout(day: str, quick: bool, docs: Path) -> dict:
    """Run the held-out study; goals from its summary's signed error percentages."""
    out = docs / f"heldout-{day}{'-small' if quick else ''}.json"
    argv = [sys.executable, str(ROOT / "scripts" / "validate_heldout.py"), "--out", str(out)]
    r = _run(argv + (["--small"] if quick else []))
    if r.returncode != 0 or not out.exists():
        return {"file": _shown(out), "ran": False, "met": False, "why": f"validate_heldout.py exit {r.returncode}"}
    summary = json.loads(out.read_text()).get("summary", {})
    goals = []
    for key, bound in HELDOUT_GOALS:
        value = summary.get(key)
        goals.append({"goal": f"|{key}| <= {bound:g}", "value": value,
                      "met": value is not None and abs(value) <= bound})
    return {"file": _shown(out), "ran": True, "goals": goals, "met": all(g["met"] for g in goals)}


def published(day: str, docs: Path) -> dict:
    """Run the published rows; each test is one row inside its stated tolerance."""
    xml = docs / f"published-{day}.xml"
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
              "tests/integration/test_published.py"])
    rows = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            rows.append({"row": case.get("name"), "met": not failed and case.find("skipped") is None})
        xml.unlink()
    return {"ran": r.returncode in (0, 1), "rows": rows, "met": r.returncode == 0 and bool(rows)}


def fuzz(day: str, n: int, docs: Path) -> dict:
    """The long fuzzing run: N inputs per surface; its counts land in a dated file."""
    out = docs / f"fuzz-counts-{day}.json"
    out.unlink(missing_ok=True)
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/benchmark/test_fuzz_counts.py"],
             env={"SPLITROOM_FUZZ_N": str(n), "SPLITROOM_FUZZ_OUT": str(out)})
    counts = json.loads(out.read_text()) if out.exists() else {}
    surfaces = {k: v["counts"] for k, v in counts.items()}
    return {"file": _shown(out), "n": n, "surfaces": surfaces,
            "met": r.returncode == 0 and bool(surfaces)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small held-out study and 200 fuzz inputs a surface")
    ap.add_argument("--only", default=",".join(STUDIES), help=f"comma-separated subset of {','.join(STUDIES)}")
    ap.add_argument("--fuzz-n", type=int, default=None, help="inputs per fuzzed surface (default 10000; quick 200)")
    ap.add_argument("--docs", default=str(ROOT / "docs"), help="where the dated files go (default docs/)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in only if s not in STUDIES]
    if bad or not only:
        print(f"validate: --only takes {', '.join(STUDIES)}; got {a.only!r}", file=sys.stderr)
        return 2
    n = a.fuzz_n if a.fuzz_n is not None else (200 if a.quick else 10_000)
    if n < 1:
        print(f"validate: --fuzz-n must be at least 1, got {n}", file=sys.stderr)
        return 2
    docs = Path(a.docs).resolve()
    docs.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    day = now.strftime("%Y-%m-%d")
    report: dict = {"started_at": now.strftime("%Y-%m-%d %H:%M UTC"), "quick": a.quick, "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs",
                    "load_average_at_start": os.getloadavg()[0]}
    if "heldout" in only:
        report["heldout"] = heldout(day, a.quick, docs)
    if "published" in only:
        report["published"] = published(day, docs)
    if "fuzz" in only:
        report["fuzz"] = fuzz(day, n, docs)
    report["finished_at"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = docs / f"validate-{day}{'-quick' if a.quick else ''}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    missed = [s for s in STUDIES if s in report and not report[s]["met"]]
    for s in STUDIES:
        if s in report:
            print(f"validate: {s}: {'met' if report[s]['met'] else 'MISSED'}")
    print(f"validate: wrote {_shown(out)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
