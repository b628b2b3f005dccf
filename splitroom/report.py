"""Running a simulation with a progress bar, and writing traces (composition root)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from planner.deal import shown_layers
from planner.trace import to_record

if TYPE_CHECKING:  # rich.progress is imported only where a bar is shown
    from rich.console import Console


#: The one line for a room whose every key is finite but whose simulated times overflow.
NOT_FINITE = ("the simulated times are not finite: a time, rate or efficiency in the scenario is too "
              "extreme to simulate; no prediction")


def _all_finite(x) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_all_finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_all_finite(v) for v in x)
    return True


def finite_metrics(m: dict) -> bool:
    """Whether a run's headline metrics (tokens/s, first token, laps, inter-token
    percentiles, the breakdown, the duration) are all finite numbers: a sum of finite
    keys (a poll of 1e308 s on a hop, a pass at an efficiency of 1e-320) can overflow
    the simulated clock to infinity, and the metrics then hold inf and NaN."""
    return _all_finite({k: m.get(k) for k in ("tokens_per_s", "ttft_s", "lap_s", "inter_token_s",
                                               "breakdown", "duration_s")})


def overflowed(e: Exception) -> bool:
    """Whether an error raised by a simulation is that overflow (``int(nan)`` in the
    stall episodes, an OverflowError), not a bug to show."""
    return isinstance(e, OverflowError) or (isinstance(e, ValueError) and
                                            any(w in str(e).lower() for w in ("nan", "infinity")))


def run_simulation(scn, deal, show_progress: bool = True, console: Console | None = None, keep_trace: bool = True):
    """Simulate ``scn`` with ``deal``; a progress bar of answer tokens on ``console``.
    ``keep_trace``: keep the trace (for --trace, --plot); without it the run is faster."""
    from sim.driver import Simulation
    if not show_progress:
        return Simulation(scn, deal, trace=keep_trace).run()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                  TimeElapsedColumn(), console=console or Console(stderr=True), transient=True) as bar:
        task = bar.add_task("sim", total=scn.workload.questions * scn.workload.answer_tokens)
        return Simulation(scn, deal, progress=lambda done, total: bar.update(task, completed=done),
                          trace=keep_trace).run()


def in_flight_line(asked: int, kv_caches: int | None) -> str | None:
    """The line that says how many questions a room answers at once, or None when one
    was asked (``decoding.questions_in_flight`` = ``asked``). ``kv_caches`` is the deal's
    :attr:`planner.deal.Deal.kv_caches`: the KV caches every stage holds at the room's
    context, which :func:`planner.deal.deal` lowers from ``asked`` until they fit (None:
    a deal made by hand, not counted, so the scheduler runs what was asked)."""
    if asked <= 1:
        return None
    held = asked if kv_caches is None else min(asked, kv_caches)
    if held == asked:
        return f"questions in flight: {asked} at once, each with its own KV cache on every stage"
    return (f"questions in flight: {held} of the {asked} asked, as the stages hold only {held} KV "
            f"cache{'' if held == 1 else 's'} at the room's context (`splitroom plan` says which stage; "
            f"a smaller `context` holds more)")


def write_trace(path: str | Path, trace) -> None:
    """Write ``[(t_s, obj)]`` as JSONL, one record per line (planner.trace format)."""
    with open(path, "w", encoding="utf-8") as f:
        for t, o in trace:
            f.write(json.dumps(to_record(t, o)) + "\n")


def read_trace(path: str | Path) -> list:
    """Read a JSONL trace back into ``[(t_s, obj)]``. Raises planner.trace.TraceError."""
    from planner.trace import from_record
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(from_record(json.loads(line)))
    return out


def recovery_lines(metrics: dict, label: str = "") -> list[str]:
    """One line per recovery in ``metrics["recovery"]`` (planner.metrics): when the
    device was lost, noticed, the weights each device got from a peer (layers, bytes,
    seconds, rate) or else how long loading took, the new chain ready, the replay, and
    the next token, in seconds."""
    out = []
    for rec in metrics.get("recovery") or ():
        nxt = (f"next token +{rec['recovery_s']:.2f} s after the loss" if rec["recovery_s"] is not None
               else "no token after it")
        copies = [c for c in rec.get("copies") or () if c["source"] != "disk"]
        if copies:
            copy = ", weights " + "; ".join(
                f"{c['device']} got {shown_layers(c['start'], c['end'], words=True)} ({c['nbytes'] / 1e6:.1f} MB) from "
                f"{c['source']} in {c['seconds']:.2f} s ({c['nbytes'] / 1e6 / max(c['seconds'], 1e-9):.1f} MB/s)"
                for c in copies)
        elif rec.get("copy_s") is not None:
            copy = f", weights loaded in {rec['copy_s']:.2f} s"
        else:
            copy = ""
        ready = (f", new chain ready +{rec['ready_at_s'] - rec['lost_at_s']:.2f} s" if rec["ready_at_s"] is not None
                 else ", new chain never ready")
        out.append(f"{label}{rec['device']} lost {rec['into_run_s']:.2f} s into the run: noticed "
                   f"+{rec['detected_at_s'] - rec['lost_at_s']:.2f} s{copy}{ready}, replay of "
                   f"{rec['replay_tokens']} tokens, {nxt}")
    return out
