#!/usr/bin/env python3
"""`make mutate`'s report: mutmut's verdicts per module, as JSON and a Markdown table.

Reads ``mutmut results --all true`` (run from the directory mutmut ran in) and counts,
per module, the mutants killed, survived, timed out and not checked. The score is
killed / (killed + survived + timeout + suspicious): a timeout or an odd exit counts
as not killed, so a mutant that only makes a test hang or crash the runner does not
raise the score.

Usage::

    .venv/bin/python scripts/mutation_report.py --out docs/mutation-DATE.json   # after `mutmut run`
    .venv/bin/python scripts/mutation_report.py --only planner.deal planner.chain   # those modules' rows
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<key>[\w.]+?)\.x[_\u01c1](?P<rest>\S+)__mutmut_\d+: (?P<status>[\w ]+?)\s*$")


def parse(text: str) -> dict[str, Counter]:
    """``mutmut results --all true`` output -> {module: Counter(status)}; statuses as
    mutmut prints them (killed, survived, timeout, no tests, ...)."""
    out: dict[str, Counter] = defaultdict(Counter)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out[m["key"]][m["status"]] += 1
    return dict(out)


def keep(counts: dict[str, Counter], only: list[str]) -> dict[str, Counter]:
    """The modules named in ``only`` and their submodules (``planner.scheduler`` keeps
    ``planner.scheduler.host``; ``planner.deal`` does not keep ``planner.deals``)."""
    return {m: c for m, c in counts.items() if any(m == o or m.startswith(o + ".") for o in only)}


def score(c: Counter) -> float | None:
    """Killed over the mutants a test could judge; None when there are none."""
    judged = c["killed"] + c["survived"] + c["timeout"] + c["suspicious"]
    return None if judged == 0 else c["killed"] / judged


def table(counts: dict[str, Counter]) -> str:
    """A Markdown table: module, killed, survived, timeout, other, score."""
    rows = ["| module | killed | survived | timeout | suspicious | not checked | score |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for mod in sorted(counts):
        c = counts[mod]
        other = sum(v for k, v in c.items() if k not in ("killed", "survived", "timeout", "suspicious"))
        s = score(c)
        rows.append(f"| {mod} | {c['killed']} | {c['survived']} | {c['timeout']} | {c['suspicious']} | {other} | "
                    f"{'-' if s is None else f'{100 * s:.1f}%'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the counts as JSON here")
    ap.add_argument("--only", nargs="+", metavar="MODULE",
                    help="keep only these modules (and their submodules: planner.scheduler is host, worker, config)")
    ap.add_argument("--mutmut", default=str(Path(sys.executable).with_name("mutmut")), help="the mutmut command")
    a = ap.parse_args(argv)
    r = subprocess.run([a.mutmut, "results", "--all", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"mutation_report: mutmut results failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    counts = parse(r.stdout)
    if a.only:
        counts = keep(counts, a.only)
    if not counts:
        print("mutation_report: no mutants in mutmut's results (run `mutmut run` first)", file=sys.stderr)
        return 2
    print(table(counts))
    if a.out:
        Path(a.out).write_text(json.dumps({m: {**c, "score": score(c)} for m, c in sorted(counts.items())},
                                          indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
