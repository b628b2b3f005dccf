"""``splitroom sweep``: predict every combination of some scenario keys' values.

Each combination is the scenario with ``--set KEY=VALUE`` overrides, loaded with the
same validation as any command, dealt and simulated (with the calibration profile when
one is given). Combinations run in parallel over the machine's cores with the standard
library's process pool, or on a Ray cluster (``executor="ray"``: for sweeps that outgrow
one machine; Ray schedules the tasks, we keep no scheduler of our own). Results come
back in the order asked, the same whichever runs them, and the caller sorts them.

A row's ``usd_per_million_tokens`` is the room's dollars per million useful tokens
(splitroom.costing / planner.cost: every priced serving device's hourly cost over the
tokens delivered, stalls and idle time paid for), None when no device has a price.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["EXECUTORS", "SORT_KEYS", "SweepError", "combinations", "predict_one", "run_sweep", "sort_rows"]

#: where the combinations run: this machine's cores, or a Ray cluster
EXECUTORS = ("process", "ray")
#: what ``sort_rows`` can order by, best first: fastest, quickest first token, cheapest useful token
SORT_KEYS = ("tokens_per_s", "ttft_s", "cost")

#: more combinations than this is almost certainly a typo in a --vary list
MAX_COMBINATIONS = 10_000


class SweepError(ValueError):
    """A bad --vary specification (one line)."""


def _split_values(text: str) -> list[str]:
    """Split ``a,b,{x: 1, y: 2},[1,2]`` at top-level commas (YAML flow values keep theirs)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def combinations(varies: Sequence[str]) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of ``KEY=V1,V2,...`` specs, as ``((key, value), ...)`` tuples
    in the order given (the last key varies fastest).
    Raises SweepError for a spec without ``=``, an empty value, a key given twice or
    more than :data:`MAX_COMBINATIONS` combinations."""
    axes = []
    seen = set()
    for v in varies:
        key, eq, values = v.partition("=")
        key = key.strip()
        if not eq or not key:
            raise SweepError(f"expected KEY=V1,V2,... got {v!r}")
        if key in seen:
            raise SweepError(f"{key} is varied twice")
        seen.add(key)
        vals = _split_values(values)
        if any(x == "" for x in vals):
            raise SweepError(f"{key}: empty value in {values!r}")
        axes.append([(key, x) for x in vals])
    n = 1
    for a in axes:
        n *= len(a)
    if n > MAX_COMBINATIONS:
        raise SweepError(f"{n} combinations is more than {MAX_COMBINATIONS}")
    return [tuple(c) for c in itertools.product(*axes)] if axes else []


def predict_one(args: tuple) -> dict:
    """Predict one combination: ``(scenario path, base --set list, combination,
    profile path or None[, ranges: bool])`` -> a row with the values, the headline metrics
    and the P10-P90 range (splitroom/ranges.py; a point when ``ranges`` is False), or an
    ``error`` (one line) when the room cannot be dealt or answers nothing."""
    path, base, combo, calibration, ranged = args if len(args) == 5 else (*args, True)
    from planner.deal import DealError, deal_for
    from planner.fit import check_fits
    from sim.driver import simulate
    from splitroom.calibration import CalibrationError
    from splitroom.scenario import ScenarioError, load
    row = {"values": [list(kv) for kv in combo], "error": None}
    try:
        scn = load(path, list(base) + [f"{k}={v}" for k, v in combo]).with_measured()
        if calibration:
            from splitroom.calibration import apply_profile, load_profile
            scn = apply_profile(scn, load_profile(calibration), Path(calibration).name)
        d = deal_for(scn)
        check_fits(d, scn.devices, scn.model, scn.options)  # a room that does not fit is a row's error, not a speed
        m = simulate(scn, d, trace=False).metrics
    except (ScenarioError, DealError, ValueError, CalibrationError) as e:
        from splitroom.report import NOT_FINITE, overflowed
        row["error"] = NOT_FINITE if overflowed(e) else str(e)
        return row
    from splitroom.report import NOT_FINITE, finite_metrics
    if not finite_metrics(m):
        row["error"] = NOT_FINITE
        return row
    if m["questions"] and not m["answered"]:
        row["error"] = f"answered none of {m['questions']} questions"
        return row
    row.update({k: m[k] for k in ("tokens_per_s", "ttft_s", "tokens_per_lap", "answered", "questions")})
    from splitroom.ranges import SWEEP_REPLICAS, predict_range
    row["range"] = predict_range(scn, d, m, SWEEP_REPLICAS if ranged else 0)
    row["inter_token_p99_s"] = m["inter_token_s"]["p99"]
    from splitroom.costing import has_prices, room_cost
    row["usd_per_million_tokens"] = (room_cost(scn, d, m, compare=False)["usd_per_million_tokens"]
                                     if has_prices(scn) else None)
    row["host"] = d.host
    row["stages"] = [{"device": s.device, "start": s.start, "end": s.end} for s in d.stages]
    return row


def run_sweep(path: str, base: Sequence[str], combos: Sequence[tuple], calibration: Optional[str] = None,
              jobs: int = 0, progress: Optional[Callable[[int, int], None]] = None,
              executor: str = "process", ranges: bool = True) -> list[dict]:
    """Predict every combination; returns the rows in the order of ``combos``.

    ``executor="process"``: ``jobs`` processes at a time (0: one per core; 1: in this
    process). ``executor="ray"``: one Ray task per combination on the cluster this
    process is connected to (``ray.init`` already called), else on the one
    ``RAY_ADDRESS`` names, else on a local one started here (with ``jobs`` CPUs when
    given) and shut down after; the scenario and calibration files must be readable
    where the tasks run and splitroom importable there.
    Raises SweepError when ``jobs`` is negative or the executor unknown."""
    if jobs < 0:
        raise SweepError(f"--jobs must be >= 0, got {jobs}")
    if executor not in EXECUTORS:
        raise SweepError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    tasks = [(path, tuple(base), c, calibration, ranges) for c in combos]
    if executor == "ray":
        return _run_on_ray(tasks, jobs, progress)
    n = jobs or os.cpu_count() or 1
    rows: list[dict] = []
    if n == 1 or len(tasks) <= 1:
        for i, t in enumerate(tasks):
            rows.append(predict_one(t))
            if progress:
                progress(i + 1, len(tasks))
        return rows
    with ProcessPoolExecutor(max_workers=min(n, len(tasks))) as pool:
        for i, r in enumerate(pool.map(predict_one, tasks)):
            rows.append(r)
            if progress:
                progress(i + 1, len(tasks))
    return rows


def _run_on_ray(tasks: list[tuple], jobs: int, progress: Optional[Callable[[int, int], None]]) -> list[dict]:
    """Every task as a Ray task (see run_sweep); rows in task order."""
    import ray  # optional: pip install 'splitroom[ray]'
    started = not ray.is_initialized()
    if started:  # RAY_ADDRESS (if set) is honoured by ray.init itself
        ray.init(num_cpus=jobs or None, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(predict_one)
        refs = [remote.remote(t) for t in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        rows: list = [None] * len(tasks)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                rows[index[ref]] = ray.get(ref)
            if progress:
                progress(len(tasks) - len(pending), len(tasks))
        return rows
    finally:
        if started:
            ray.shutdown()


def sort_rows(rows: list[dict], key: str) -> list[dict]:
    """``rows`` best first by ``key`` (one of :data:`SORT_KEYS`): most tokens/s, least
    time to first token, or fewest dollars per million useful tokens (``cost``); rows
    with an error, and for ``cost`` rows without a price, go last in their order.
    Raises SweepError for an unknown key."""
    if key not in SORT_KEYS:
        raise SweepError(f"--sort must be one of {', '.join(SORT_KEYS)}, got {key!r}")

    def value(r: dict):
        if r["error"] is not None:
            return (2, 0.0)
        if key == "cost":
            c = r.get("usd_per_million_tokens")
            return (1, 0.0) if c is None else (0, c)
        return (0, -r["tokens_per_s"] if key == "tokens_per_s" else r["ttft_s"])
    return sorted(rows, key=value)
