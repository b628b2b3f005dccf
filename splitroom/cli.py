"""The ``splitroom`` command line (composition root: wires planner, sim and runtime).

Commands: ``plan`` (the deal), ``simulate`` (predict a room), ``generate`` (run the real
model on one machine). Every command that takes a scenario accepts ``--set KEY=VALUE``
and ``--json``. Bad input prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:  # rich.table is imported where a table is made: --json output makes none
    from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run one LLM across several machines, and predict how fast that room will be.")
out = Console()
err = Console(stderr=True)

SetOpt = typer.Option(None, "--set", help="Override a scenario key, e.g. --set host=spark (VALUE is YAML).")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")


@app.callback()
def _root() -> None:
    """Run one LLM across several machines, and predict how fast that room will be."""


def one_line(message: str) -> str:
    """``message`` with line breaks and other control characters written as escapes
    (``\\n``, ``\\x1b``): user input quoted in an error must not break the line."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in str(message))


def fail(message: str) -> None:
    """Print one line to stderr and exit with status 2."""
    # escape: a message may hold brackets ("[a-z0-9_-]", "devices[1]") that rich would
    # otherwise read as markup and drop
    err.print(f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


ModelOpt = typer.Option(None, "--model", help="A GGUF file or safetensors directory to run (instead of the "
                        "scenario's model; default: the bundled SmolLM2-135M-Instruct).")


def model_override(path: Optional[str]) -> list[str]:
    """``--model PATH`` as a scenario override (``model={gguf: PATH}`` or
    ``{safetensors: PATH}``, absolute), or exit 2 with one line for a bad path."""
    if path is None:
        return []
    from splitroom.models import ModelError, checkpoint_kind
    p = Path(path).expanduser()
    try:
        kind = checkpoint_kind(p)
    except (ModelError, OSError, ValueError) as e:
        fail(f"--model: {e}")
    return [f"model={{{kind}: {json.dumps(str(p.resolve()))}}}"]


#: whether :func:`main` turned garbage collection off for the command's start-up
_startup_gc_off = False


def started() -> None:
    """The command's start-up (imports, the scenario read and validated) is over:
    garbage collection resumes, with what start-up made (modules, classes, pydantic
    validators, the scenario) frozen out of later collections (``gc.freeze``). Start-up
    allocates many long-lived objects and little garbage, so collections during it only
    rescan them (about a tenth of a short simulate's CPU time). Only after
    :func:`main` turned collection off."""
    global _startup_gc_off
    if _startup_gc_off:
        _startup_gc_off = False
        gc.freeze()
        gc.enable()


def load_scenario(path: str, sets: Optional[List[str]], model: Optional[str] = None):
    """Load a scenario (with ``--model PATH`` replacing its model) or exit 2 with its
    one-line error; start-up ends here (:func:`started`)."""
    from splitroom.scenario import ScenarioError, load
    try:
        return load(path, list(sets or []) + model_override(model))
    except ScenarioError as e:
        fail(str(e))
    finally:
        started()


def check_output(path: Optional[str], option: str) -> None:
    """Exit 2 with one line when ``path`` (the value of ``option``, a file to write)
    cannot be written: its directory is missing or not writable, or it is a directory."""
    if not path:
        return
    import os
    from pathlib import Path
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        fail(f"{option} {path}: directory {parent} does not exist")
    if p.is_dir():
        fail(f"{option} {path}: is a directory, not a file")
    if not os.access(parent, os.W_OK):
        fail(f"{option} {path}: directory {parent} is not writable")


def check_runnable(scn, source: str) -> None:
    """Exit 2 with one line when a real room cannot run ``scn``: ``return: via_host``
    (a host relaying every stage's output) and ``head: last_stage`` are simulator models
    only."""
    if scn.decoding.via_host:
        fail(f"{source}: decoding.return: via_host is simulated only (splitroom simulate); a real room "
             "returns direct or via_stages")
    if scn.decoding.head != "host":
        fail(f"{source}: decoding.head: last_stage is simulated only (splitroom simulate); a real room "
             "runs the head on the model host")


def check_simulable(scn, source: str) -> None:
    """Exit 2 with one line when the simulator cannot run ``scn``: speculative decoding
    with ``acceptance: null`` and neither ``accepted_lengths`` nor ``accepted_sequence``
    (null is for real runs, where the model decides), or with the ``draft_layer``
    drafter on a model that has no draft layer (nothing could run that room)."""
    spec = scn.decoding.speculative
    if spec is not None and spec.acceptance is None and not (spec.accepted_lengths or spec.accepted_sequence):
        fail(f"{source}: decoding.speculative.acceptance: null needs accepted_lengths or accepted_sequence "
             "to simulate (or give a probability 0-1)")
    if spec is not None and spec.drafter == "draft_layer" and not scn.model.draft_bytes:
        fail(f"{source}: decoding.speculative.drafter: draft_layer (the default) needs a model with a draft "
             f"layer (an MTP head); {scn.model.id} has none, so no room can run it: choose ngram, early_exit "
             "or model")


CalibrationOpt = typer.Option(None, "--calibration", help="Predict with this calibration profile "
                              "(splitroom calibrate writes one; same as the scenario key calibration:).")


def with_profile(scn, path: Optional[str]):
    """``scn`` with the profile at ``path`` applied (None: unchanged); exit 2 with one
    line when the file is not a readable profile."""
    if not path:
        return scn
    from splitroom.calibration import CalibrationError, apply_profile, load_profile
    try:
        return apply_profile(scn, load_profile(path), Path(path).name)
    except CalibrationError as e:
        fail(f"--calibration {e}")


def check_answered(m: dict, source: str, refusals=None) -> None:
    """Exit 2 when a simulated room answered nothing it was asked: a prediction of
    nothing is an error, never 0.0 tok/s. With the run's ``refusals`` (Refuse commands,
    in order), the line names the first one's reason."""
    if m.get("questions", 0) and not m.get("answered", 0):
        why = next((o.reason for o in (refusals or ())), None)
        fail(f"{source}: the simulated room answered none of its {m['questions']} questions "
             f"({m.get('refused', 0)} refused{': ' + why if why else ''}); no prediction")


def simulated(scn, d, source: str, **kw):
    """:func:`splitroom.report.run_simulation`, or exit 2 with one line when the room's
    times are too large to simulate: every key is finite, but a sum of them (a poll of
    1e308 s on a hop, a pass at an efficiency of 1e-320) overflows the simulated clock
    to infinity, which then gives NaN metrics (or int(NaN) in the stall episodes)."""
    from splitroom.report import NOT_FINITE, finite_metrics, overflowed, run_simulation
    try:
        result = run_simulation(scn, d, **kw)
    except (OverflowError, ValueError) as e:
        if overflowed(e):
            fail(f"{source}: {NOT_FINITE}")
        raise
    if not finite_metrics(result.metrics):
        fail(f"{source}: {NOT_FINITE}")
    return result


def plain_prediction(child, scn, d, source: str) -> dict:
    """The metrics of ``scn`` predicted plain with deal ``d`` (speculation_check): the
    forked ``child``'s (splitroom/forked.py; the same numbers, computed beside the
    speculative run), or computed here when there is none or it failed, so that any
    error is the one :func:`simulated` gives."""
    from splitroom.speculation_check import plain_scenario
    if child is not None:
        from splitroom.forked import ChildFailed
        from splitroom.report import NOT_FINITE, finite_metrics
        try:
            m = child.result()
        except ChildFailed:
            m = None
        if m is not None:
            if not finite_metrics(m):
                fail(f"{source}: {NOT_FINITE}")
            return m
    return simulated(plain_scenario(scn), d, source, show_progress=False, keep_trace=False).metrics


def deal_scenario(scn, source: str):
    """Deal a scenario's room or exit 2 naming the problem. When the deal is predicted
    more than 1.2x slower than ``split: optimal``'s, one line on stderr says so, with
    both figures and the deal to use (:func:`planner.optimal.slower_than_optimal`)."""
    from planner.deal import DealError, deal_for
    from planner.optimal import slower_than_optimal
    try:
        d = deal_for(scn)
    except DealError as e:
        fail(f"{source}: cannot deal the room: {e}")
    warning = slower_than_optimal(d, scn.devices, scn.model, scn.options, scn.network, scn.decoding.return_path)
    if warning:
        err.print(f"{source}: {warning}", highlight=False, soft_wrap=True, markup=False)
    return d


def fitting_deal(scn, source: str):
    """Deal a scenario's room, or exit 2 naming the problem: a room that cannot be
    dealt, or whose layers do not fit in what its devices lend (each device's shortfall;
    planner/fit.py) unless the devices that are over opted in to offload."""
    d = deal_scenario(scn, source)
    from planner.fit import RoomDoesNotFit, check_fits
    try:
        check_fits(d, scn.devices, scn.model, scn.options)
    except RoomDoesNotFit as e:
        fail(f"{source}: {e}")
    return d


def deal_table(deal_, scn) -> Table:
    """The deal as a table: device, role, layers, bytes used of lent, why."""
    from planner.deal import format_bytes
    from rich.table import Table
    t = Table(title=f"{scn.name or 'room'} · {scn.model.name} ({scn.model.layers} layers) · split {deal_.split}",
              title_justify="left")
    for col, j in (("device", "left"), ("role", "left"), ("layers", "right"), ("used / lent", "right"),
                   ("max context", "right"), ("why", "left")):
        t.add_column(col, justify=j)
    for sh in deal_.shares:
        st = deal_.stage_of(sh.device)
        layers = "-" if st is None else st.shown
        over = sh.used_bytes > sh.lends_bytes
        used = f"{format_bytes(sh.used_bytes)} / {format_bytes(sh.lends_bytes)}"
        ctx = "-" if sh.max_context is None or (st is None and sh.role != "model host") else f"{sh.max_context:,}"
        t.add_row(sh.device, sh.role, layers, f"[red]{used}[/]" if over else used, ctx, sh.why)
    if deal_.max_context is not None:
        t.caption = (f"the room holds a context of at most {deal_.max_context:,} tokens "
                     f"(set: {scn.options.context_tokens:,})")
        t.caption_justify = "left"
    return t


@app.command()
def plan(scenario: str = typer.Argument(..., help="Scenario YAML file."),
         set_: Optional[List[str]] = SetOpt, as_json: bool = JsonOpt,
         redeal: bool = typer.Option(False, "--redeal", help="Use the measured ms per layer (a `measured:` "
                                     "section, a calibration profile) to put layers on the fastest devices."),
         calibration: Optional[str] = CalibrationOpt):
    """Deal the model over the room: who hosts, who holds which layers, and why."""
    scn = with_profile(load_scenario(scenario, set_), calibration)
    if redeal:
        if scn.profile is not None:
            from splitroom.calibration import profiled_s_per_layer
            scn = dataclasses.replace(scn, measured_s_per_layer={**profiled_s_per_layer(scn.profile),
                                                                 **scn.measured_s_per_layer})
        if not scn.measured_s_per_layer:
            fail(f"{scenario}: --redeal needs measured ms per layer (a calibration profile from splitroom "
                 "calibrate, or a `measured:` section)")
        scn = scn.with_measured()
    d = deal_scenario(scn, scenario)
    if scn.ends_local is not None:  # privacy: show the split the room will run
        from planner.deal import DealError
        from splitroom.privacy_run import ends_local_scenario
        try:
            scn, d = ends_local_scenario(scn)
        except DealError as e:
            fail(f"{scenario}: {e}")
    if redeal:
        d = dataclasses.replace(d, notes=d.notes + ("re-deal to put the layers on the fastest devices, "
                                                    "as measured (decode time per layer)",))
    if as_json:
        print(json.dumps(d.to_json(), indent=2))
        return
    out.print(deal_table(d, scn))
    for n in d.notes:
        out.print(f"  · {n}", highlight=False)
    if not d.fits:
        out.print("[yellow]The room cannot hold the model in what it lends.[/]")


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def round_s(m: dict) -> float | None:
    """A round's mean seconds: drafting (the breakdown's ``draft`` rows, per judged lap)
    plus the lap it feeds (``lap_s.mean``, which starts when the host's stage does and
    so leaves drafting out); None without drafting. With one lap in flight the two do
    not overlap, so this is what each round of speculation costs."""
    draft = sum(r["mean_s"] for r in m.get("breakdown", ()) if r["kind"] == "draft")
    return m["lap_s"]["mean"] + draft if draft else None


def _range_cell(m: dict, key: str, show) -> str:
    """`` (P10-P90 a-b)`` from a prediction's range (splitroom/ranges.py), or ''. When the
    point ``m[key]`` lies outside it, the cell says why that is no bug: the point pools
    every measured prompt's acceptance, each replica is a run of that many questions
    (docs/calibration.md, "The range of a prediction")."""
    r = m.get("range")
    if not r or not r.get("replicas"):
        return ""
    lo, hi = r[key]["p10"], r[key]["p90"]
    outside = m.get(key) is not None and not lo <= m[key] <= hi
    why = "; the point pools all prompts" if outside else ""
    return f" (P10-P90 {show(lo)}-{show(hi)}{why})"


def metrics_table(m: dict, title: str = "prediction") -> Table:
    """Headline metrics as a two-column table; a prediction's range beside its
    tokens per second and first token when it has one."""
    from rich.table import Table
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    it = m["inter_token_s"]
    rows = [
        ("tokens per second", f"{m['tokens_per_s']:.2f}" + _range_cell(m, "tokens_per_s", lambda x: f"{x:.2f}")),
        ("time to first token", _ms(m["ttft_s"]) + _range_cell(m, "ttft_s", _ms)),
        *([("all questions: tokens per second", f"{m['aggregate_tokens_per_s']:.2f}"),
           ("first token from asking p50 / p99", f"{_ms(m['ttft_asked_s']['p50'])} / "
                                                 f"{_ms(m['ttft_asked_s']['p99'])}")]
          if "aggregate_tokens_per_s" in m and m.get("questions", 1) > 1 else []),
        ("inter-token p50 / p95", f"{_ms(it['p50'])} / {_ms(it['p95'])}"),
        ("inter-token p99 / max", f"{_ms(it['p99'])} / {_ms(it['max'])}"),
        ("tokens per lap", f"{m['tokens_per_lap']:.2f}"),
        ("lap mean / p99", f"{_ms(m['lap_s']['mean'])} / {_ms(m['lap_s']['p99'])}"),
        *([("round: drafting + lap", _ms(round_s(m)))] if round_s(m) is not None else []),
        ("questions answered", f"{m['answered']} of {m['questions']}" + (f" ({m['refused']} refused)"
                                                                          if m["refused"] else "")),
        ("laps (stale)", f"{m['laps']} ({m['stale_laps']})"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


RangeOpt = typer.Option(True, "--range/--no-range", help="Also predict the P10-P90 range (bootstrap replicas over "
                        "the measured prompts and the network's seeds; docs/calibration.md).")


def range_line(r: dict) -> str:
    """Where a prediction's range comes from, in one line."""
    if not r.get("replicas"):
        if r.get("skipped"):
            return "range: not predicted (--no-range)"
        return "range: one point (no acceptance measured by prompt, no jitter, no stall episodes to vary)"
    return f"range: P10-P90 of {r['replicas']} replicas varying {', '.join(r['sources'])} (docs/calibration.md)"


def breakdown_table(m: dict) -> Table:
    """Where one lap's time goes: each stage's compute, each hop, head, draft."""
    from rich.table import Table
    t = Table(title="where one lap's time goes (mean per lap)", title_justify="left")
    t.add_column("part")
    t.add_column("where")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    total = sum(r["mean_s"] for r in m["breakdown"]) or 1.0
    for r in m["breakdown"]:
        t.add_row(r["kind"], r["part"], _ms(r["mean_s"]), f"{100 * r['mean_s'] / total:.0f}%")
    return t


@app.command()
def simulate(scenario: str = typer.Argument(..., help="Scenario YAML file."),
             set_: Optional[List[str]] = SetOpt, as_json: bool = JsonOpt,
             plot: Optional[str] = typer.Option(None, "--plot", help="Write a timeline and latency picture (PNG)."),
             trace: Optional[str] = typer.Option(None, "--trace", help="Write the JSONL trace to this file."),
             progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
             calibration: Optional[str] = CalibrationOpt,
             ranged: bool = RangeOpt):
    """Predict how fast the room answers: tokens/s, time to first token, latency, where time goes."""
    scn = with_profile(load_scenario(scenario, set_).with_measured(), calibration)
    check_output(trace, "--trace")
    check_output(plot, "--plot")
    check_simulable(scn, scenario)
    d = fitting_deal(scn, scenario)
    plain_scn, plain_deal = scn, d
    if scn.ends_local is not None:  # privacy: the host keeps its ends; compared with the plain deal below
        from planner.deal import DealError
        from splitroom.privacy_run import ends_local_scenario
        try:
            scn, d = ends_local_scenario(scn)
        except DealError as e:
            fail(f"{scenario}: {e}")
    from splitroom.ranges import REPLICAS, acceptance_source, default_jobs, start_range
    plain_child = None
    try:
        # the range's replicas run in other processes (where there are CPUs) while this one simulates the point
        with start_range(scn, d, REPLICAS if ranged else 0, default_jobs()) as pending:
            if scn.decoding.speculative is not None and not pending.processes:
                # the plain prediction beside it (below) in a child, on a CPU idle now (splitroom/forked.py)
                from splitroom.forked import may_fork, start as start_child
                if may_fork():
                    from splitroom.speculation_check import plain_metrics
                    plain_child = start_child(plain_metrics, scn, d)
            # the bar only on a terminal: a transient bar on a log or a pipe leaves an empty line
            result = simulated(scn, d, scenario, show_progress=progress and not as_json and err.is_terminal,
                               console=err, keep_trace=bool(trace or plot))
            check_answered(result.metrics, scenario, result.refusals)
            result.metrics["range"] = pending.result(result.metrics)
        source = acceptance_source(scn)
        if source:
            result.metrics["acceptance_from"] = source
        privacy = None
        if scn.ends_local is not None:
            from splitroom.privacy_run import privacy_summary
            plain = simulated(plain_scn, plain_deal, scenario, show_progress=False, keep_trace=False)
            privacy = privacy_summary(scn, result.metrics, plain.metrics)
        if scn.decoding.speculative is not None:  # does it pay? the same room predicted plain, warned on stderr
            from splitroom.speculation_check import speculation_summary, warning_line
            plain_m = plain_prediction(plain_child, scn, d, scenario)
            result.metrics["speculation"] = speculation_summary(scn, result.metrics["tokens_per_s"],
                                                                plain_m["tokens_per_s"])
            warning = warning_line(result.metrics["speculation"])
            if warning:
                err.print(f"{scenario}: {warning}", highlight=False, soft_wrap=True, markup=False)
        try:
            if trace:
                from splitroom.report import write_trace
                write_trace(trace, result.trace)
            if plot:
                from splitroom.plots import plot_run
                plot_run(result, plot, title=f"{scn.name or scenario}: {scn.model.name}")
        except OSError as e:
            fail(f"{e.filename or trace or plot}: cannot write ({e.strerror or e})")
        from splitroom.costing import has_prices, room_cost
        cost = room_cost(scn, d, result.metrics) if has_prices(scn) else None
        if as_json:
            m = {k: v for k, v in result.metrics.items()}
            if round_s(m) is not None:
                m["round_s"] = round_s(m)
            print(json.dumps({"plan": d.to_json(), "metrics": m, **({"cost": cost} if cost else {}),
                              **({"privacy": privacy} if privacy else {})}, indent=2))
            return
        out.print(deal_table(d, scn))
        from splitroom.report import in_flight_line
        in_flight = in_flight_line(scn.decoding.questions_in_flight, d.kv_caches)
        if in_flight:
            out.print(in_flight, highlight=False)
        out.print(metrics_table(result.metrics))
        out.print(range_line(result.metrics["range"]), highlight=False)
        if source:
            out.print(f"acceptance from: {source}", highlight=False)
        out.print(breakdown_table(result.metrics))
        from splitroom.report import recovery_lines
        for line in recovery_lines(result.metrics):  # scenario faults: the predicted recovery, part by part
            out.print(line, highlight=False)
        if cost:
            out.print(cost_table(cost))
        if privacy:
            out.print(f"privacy ends_local (first {privacy['ends_local']['first']}, last {privacy['ends_local']['last']}): "
                      f"{privacy['tokens_per_s']:.2f} tok/s against {privacy['plain_tokens_per_s']:.2f} for the plain "
                      f"deal ({privacy['change_pct']:+.1f}%)", highlight=False)
        if plot:
            out.print(f"picture written to {plot}")
    finally:  # a plain prediction still running in a child (an error above) is ended
        if plain_child is not None:
            plain_child.close()


def cost_table(cost: dict) -> Table:
    """US dollars per million useful tokens: the room beside the cheapest single machine."""
    from rich.table import Table
    t = Table(title=f"cost of a useful token (electricity {cost['electricity_usd_per_kwh']:.3f} USD/kWh)",
              title_justify="left")
    for col, j in (("", "left"), ("USD / hour", "right"), ("useful tok/s", "right"),
                   ("USD per million tokens", "right")):
        t.add_column(col, justify=j)

    def usd(x):
        return "-" if x is None else f"{x:,.2f}"
    room = "this room" + (f" ({', '.join(cost['unpriced'])} unpriced: free)" if cost["unpriced"] else "")
    t.add_row(room, usd(cost["room_usd_per_hour"]), f"{cost['useful_tokens_per_s']:.2f}",
              usd(cost["usd_per_million_tokens"]))
    sm = cost.get("single_machine")
    if sm:
        t.add_row(f"cheapest single machine: {sm['name']}", usd(sm["usd_per_hour"]),
                  f"{sm['useful_tokens_per_s']:.2f}", usd(sm["usd_per_million_tokens"]))
    elif "single_machine" in cost:
        t.add_row("no catalog machine holds the model alone", "-", "-", "-")
    return t


def compare_table(res) -> Table:
    """Measured beside the prediction from a profile (when given, made before the run)
    and the same-run figure (the simulator calibrated from this very run), each with
    its signed error. Without a profile nothing was predicted before the run: the title
    says the figure beside the measured one is the fit, and the caption how to get a
    prediction."""
    from rich.table import Table
    if res.profile_predicted is not None:
        t = Table(title=f"measured vs predicted ({res.network})", title_justify="left")
    else:
        t = Table(title=f"measured vs the simulator fitted to this run ({res.network})", title_justify="left",
                  caption="no prediction made before the run: give --calibration PROFILE (splitroom calibrate "
                          "writes one) for that", caption_justify="left")
    cols = [("metric", "left"), ("measured", "right")]
    if res.profile_predicted is not None:
        cols += [("predicted from profile", "right"), ("error", "right")]
    cols += [("same-run fit", "right"), ("error", "right")]
    for col, j in cols:
        t.add_column(col, justify=j)
    m = res.measured
    rows = [("tokens per second", "tokens_per_s", lambda x: f"{x['tokens_per_s']:.2f}"),
            ("time to first token", "ttft_s", lambda x: _ms(x["ttft_s"])),
            ("inter-token p50", "inter_token_p50", lambda x: _ms(x["inter_token_s"]["p50"])),
            ("inter-token p99", "inter_token_p99", lambda x: _ms(x["inter_token_s"]["p99"])),
            ("tokens per lap", "tokens_per_lap", lambda x: f"{x['tokens_per_lap']:.2f}")]
    ranged = {"tokens_per_s": lambda x: f"{x:.2f}", "ttft_s": _ms}
    for name, key, show in rows:
        cells = [name, show(m)]
        if res.profile_predicted is not None:
            extra = _range_cell(res.profile_predicted, key, ranged[key]) if key in ranged else ""
            cells += [show(res.profile_predicted) + extra, f"{res.profile_error_pct[key]:+.1f}%"]
        cells += [show(res.predicted), f"{res.error_pct[key]:+.1f}%"]
        t.add_row(*cells)
    return t


InProcessDelayOpt = typer.Option(False, "--in-process-delay",
                                 help="Without namespaces (--loopback, or none here), apply the scenario's RTT in "
                                 "the device processes: each holds what it sends RTT/2 (one delay for every pair, "
                                 "no jitter).")


@app.command()
def run(scenario: str = typer.Argument(..., help="Scenario YAML file."),
        real: bool = typer.Option(False, "--real", help="Run the room for real on this machine (required)."),
        set_: Optional[List[str]] = SetOpt, as_json: bool = JsonOpt,
        backend: str = typer.Option("numpy", "--backend", help="numpy or wgpu."),
        netns: bool = typer.Option(True, "--netns/--loopback", help="Emulate the scenario's network in namespaces."),
        in_process_delay: bool = InProcessDelayOpt,
        timeout: float = typer.Option(300.0, "--timeout", help="Give up after this many seconds."),
        calibration: Optional[str] = typer.Option(None, "--calibration", help="Also predict the run before it "
                                                  "starts from this calibration profile (splitroom calibrate)."),
        write_measured: Optional[str] = typer.Option(None, "--write-measured",
                                                     help="Write this run's measured ms per layer here (YAML)."),
        model: Optional[str] = ModelOpt):
    """Run a real room (one process per device, WebRTC between them) and print measured beside predicted."""
    if not real:
        fail("splitroom run needs --real (to predict without running, use splitroom simulate)")
    if backend not in ("numpy", "wgpu"):
        fail(f"--backend {backend}: choose numpy or wgpu")
    if not timeout > 0:
        fail(f"--timeout {timeout:g}: must be more than 0 seconds")
    scn = load_scenario(scenario, set_, model)
    check_runnable(scn, scenario)
    check_output(write_measured, "--write-measured")
    profile = None
    if calibration:
        from splitroom.calibration import CalibrationError, check_covers, load_profile
        try:
            profile = load_profile(calibration)
            check_covers(scn, profile, Path(calibration).name)
        except CalibrationError as e:
            fail(f"--calibration {e}")
    elif scn.profile is not None:
        profile = scn.profile
    d = fitting_deal(scn, scenario)
    from splitroom.real import run_real
    from splitroom.real_errors import RealRunError
    say = (lambda s: err.print(s, highlight=False))
    privacy = plain = None
    if scn.ends_local is not None:  # the ends-local room, then the plain deal's for its price
        from planner.deal import DealError
        from splitroom.privacy_run import ends_local_scenario
        try:
            private_scn, private_deal = ends_local_scenario(scn)
        except DealError as e:
            fail(f"{scenario}: {e}")
        say(f"privacy ends_local: {private_deal.host} runs the embedding, its first and last layers and the head")
    try:
        if scn.ends_local is not None:
            res = run_real(private_scn, private_deal, backend=backend, netns=netns, in_process_delay=in_process_delay,
                           timeout_s=timeout, log=say, profile=profile)
            say("the plain deal, for comparison:")
            plain = run_real(scn, d, backend=backend, netns=netns, in_process_delay=in_process_delay,
                             timeout_s=timeout, log=say, profile=profile)
            from splitroom.privacy_run import real_privacy_summary
            privacy = real_privacy_summary(scn, res, plain)
            d = private_deal
        else:
            res = run_real(scn, d, backend=backend, netns=netns, in_process_delay=in_process_delay,
                           timeout_s=timeout, log=say, profile=profile)
    except RealRunError as e:
        fail(f"{scenario}: {e}")
    from splitroom.speculation_check import warning_line
    warning = warning_line((res.profile_predicted or {}).get("speculation"))
    if warning:  # from the prediction made before the run (run_real's log said it first)
        err.print(f"{scenario}: {warning}", highlight=False, soft_wrap=True, markup=False)
    if write_measured:
        import yaml
        with open(write_measured, "w", encoding="utf-8") as f:
            yaml.safe_dump({"measured": {"ms_per_layer": {k: f"{v * 1000:.4f} ms" for k, v in
                                                          res.calibration["s_per_layer"].items()}}}, f)
    if as_json:
        print(json.dumps({"plan": d.to_json(), "measured": res.measured, "predicted": res.predicted,
                          "error_pct": res.error_pct, "answers": res.answers, "calibration": res.calibration,
                          "network": res.network, "emulated": res.emulated,
                          "predicted_from_profile": res.profile_predicted,
                          "error_pct_from_profile": res.profile_error_pct,
                          **({"privacy": privacy} if privacy else {})}, indent=2))
        report_unanswered(res)
        return
    out.print(deal_table(d, scn))
    for i, a in enumerate(res.answers):
        how = a.get("ended", "answered")
        status = "" if how == "answered" else f" [yellow]({escape(how)}; partial)[/]"
        out.print(f"[bold]answer {i + 1}:[/] {escape(a['text'])}{status}", highlight=False)
    out.print(compare_table(res))
    from splitroom.report import recovery_lines
    for line in recovery_lines(res.measured, "measured: ") + recovery_lines(res.predicted, "predicted: "):
        out.print(line, highlight=False)  # scenario faults: the recovery, measured beside predicted
    cal = res.calibration
    from rich.table import Table
    t = Table(title="measured per device and hop", title_justify="left")
    t.add_column("part")
    t.add_column("value", justify="right")
    for dev, s in cal["s_per_layer"].items():
        t.add_row(f"{dev}: ms per layer", f"{s * 1000:.3f}")
    t.add_row("hop (decode frame), mean / p50", f"{_ms(cal['hop_s'])} / {_ms(cal['hop_p50_s'])}")
    out.print(t)
    out.print(f"network: {res.network}")
    for e_ in res.emulated:
        out.print(f"emulated: {e_}")
    if privacy:
        out.print(f"privacy ends_local (first {privacy['ends_local']['first']}, last {privacy['ends_local']['last']}): "
                  f"measured {privacy['tokens_per_s']:.2f} tok/s against {privacy['plain_tokens_per_s']:.2f} for the "
                  f"plain deal ({privacy['change_pct']:+.1f}%; predicted {privacy['predicted_change_pct']:+.1f}%); "
                  f"same answers: {'yes' if privacy['same_tokens'] else 'NO'}", highlight=False)
    report_unanswered(res)
    if plain is not None:
        report_unanswered(plain)


def report_unanswered(res) -> None:
    """After a real run's report: one line on stderr per question that was not answered
    (refused or lost, with the reason), then exit with status 1 if there was any."""
    missing = res.unanswered
    for i, how in missing:
        err.print(f"question {i + 1}: {escape(one_line(how))}", highlight=False, soft_wrap=True)
    if missing:
        raise typer.Exit(1)


@app.command()
def serve(scenario: str = typer.Argument(..., help="Scenario YAML file."),
          port: int = typer.Option(8000, "--port", help="TCP port of the API (0: any free port)."),
          bind: str = typer.Option("127.0.0.1", "--bind", help="Address to listen on (0.0.0.0 for a LAN)."),
          set_: Optional[List[str]] = SetOpt,
          backend: str = typer.Option("numpy", "--backend", help="numpy or wgpu."),
          netns: bool = typer.Option(True, "--netns/--loopback", help="Emulate the scenario's network in namespaces."),
          in_process_delay: bool = InProcessDelayOpt,
          model: Optional[str] = ModelOpt):
    """Start the room (one process per device, WebRTC between them) and serve an OpenAI-compatible API
    on the model host (/v1/chat/completions, /v1/models, /metrics, /health) until Ctrl-C."""
    if not 0 <= port <= 65535:
        fail(f"--port {port}: expected a TCP port 0-65535")
    if backend not in ("numpy", "wgpu"):
        fail(f"--backend {backend}: choose numpy or wgpu")
    scn = load_scenario(scenario, set_, model)
    check_runnable(scn, scenario)
    d = fitting_deal(scn, scenario)
    from runtime.testbed.netem import NetemError
    from splitroom.real_errors import RealRunError
    from splitroom.serve_cmd import ServeError, serve_room
    try:
        code = serve_room(scn, d, port=port, bind=bind, backend=backend, netns=netns, in_process_delay=in_process_delay,
                          log=lambda s: err.print(escape(s), highlight=False, soft_wrap=True))
    except (ServeError, RealRunError, NetemError) as e:
        fail(f"{scenario}: {e}")
    raise typer.Exit(code)


@app.command()
def calibrate(scenario: str = typer.Argument(..., help="Scenario YAML file: whose devices to profile."),
              out_path: str = typer.Option(..., "--out", help="Write the profile here (YAML)."),
              set_: Optional[List[str]] = SetOpt,
              backend: str = typer.Option("numpy", "--backend", help="numpy or wgpu."),
              quick: bool = typer.Option(False, "--quick", help="A small grid (seconds; for tests, not predictions)."),
              room: bool = typer.Option(True, "--room/--no-room", help="Also run one small 2-device room on "
                                        "loopback (plain, calibration prompts) to measure what a room adds to the "
                                        "parts alone (thread hand-offs, event loop, cold caches), and (not with "
                                        "--quick) a 3-device one for rooms whose devices share this machine."),
              acceptance_only: bool = typer.Option(False, "--acceptance-only", help="Only measure the drafters' "
                                                   "acceptance on the scenario's workload.sample and add it to the "
                                                   "profile given with --profile."),
              base_profile: Optional[str] = typer.Option(None, "--profile", help="With --acceptance-only: the "
                                                         "profile to add the sample's acceptance to.")):
    """Measure this machine once (compute by layers, tokens and context; the head; each drafter's cost
    and acceptance; the transport by frame size) and write a profile that simulate --calibration reads."""
    scn = load_scenario(scenario, set_)
    check_output(out_path, "--out")
    if backend not in ("numpy", "wgpu"):
        fail(f"--backend: expected numpy or wgpu, got {backend!r}")
    from splitroom.calibration import (CalibrationError, add_acceptance, build_profile, load_profile, measure,
                                       measure_room_overheads, measure_shared_room, save_profile,
                                       with_room_overheads, with_shared_room)
    if acceptance_only or base_profile:
        if not (acceptance_only and base_profile):
            fail("--acceptance-only and --profile go together: the profile to add the sample's acceptance to")
        if not scn.workload.sample:
            fail(f"{scenario}: --acceptance-only: the scenario gives no workload.sample to measure")
        model = _measured_model(scn, scenario)
        try:
            prof = load_profile(base_profile)
            err.print(f"acceptance: measuring the drafters on the scenario's workload.sample "
                      f"({len(scn.workload.sample)} prompts)", highlight=False)
            prof = add_acceptance(prof, measure(backend, quick=quick, sample=scn.workload.sample,
                                                acceptance_only=True, answer_tokens=scn.workload.answer_tokens,
                                                **model,
                                                log=lambda line: err.print(f"  {line}", highlight=False)))
            save_profile(prof, out_path)
        except CalibrationError as e:
            fail(f"{scenario}: calibrate: {e}")
        out.print(profile_table(prof))
        out.print(f"profile written to {out_path}")
        return
    model = _measured_model(scn, scenario)
    err.print(f"calibrating on this machine ({backend}); this takes {'a few seconds' if quick else 'about two minutes'}"
              " and runs no scenario workload", highlight=False)
    try:
        if scn.workload.sample:
            err.print(f"acceptance: measured on the scenario's workload.sample ({len(scn.workload.sample)} prompts)",
                      highlight=False)
        else:
            err.print("acceptance: measured on the built-in chat and grounded calibration prompts (the scenario "
                      "gives no workload.sample)", highlight=False)
        measured = measure(backend, quick=quick, log=lambda line: err.print(f"  {line}", highlight=False),
                           sample=scn.workload.sample, answer_tokens=scn.workload.answer_tokens, **model)
        prof = build_profile(scn, measured)
        if room:
            say = (lambda line: err.print(f"  {line}", highlight=False))
            prof = with_room_overheads(prof, measure_room_overheads(scn, prof, log=say,
                                                                    answer_tokens=12 if quick else 32,
                                                                    backend=backend))
            if not quick:  # a third process on this machine's cores: for run --real's emulated rooms
                prof = with_shared_room(prof, measure_shared_room(scn, prof, log=say, backend=backend))
        save_profile(prof, out_path)
    except CalibrationError as e:
        fail(f"{scenario}: calibrate: {e}")
    out.print(profile_table(prof))
    out.print(f"profile written to {out_path}; predict with: splitroom simulate {scenario} --calibration {out_path}")


def _measured_model(scn, scenario: str) -> dict:
    """``{model_dir, weights}`` that calibrate measures: the scenario's own model as its real
    rooms hold it (the bundled SmolLM2 at float32 for ``smollm2-135m``); exit 2 with one line
    when it has no weights here."""
    from splitroom.real_configs import real_model_dir
    from splitroom.real_errors import RealRunError
    try:
        return {"model_dir": str(real_model_dir(scn)), "weights": scn.weights or "f32"}
    except RealRunError as e:
        fail(f"{scenario}: calibrate: {e}")


def profile_table(prof) -> Table:
    """A profile's headline numbers: per device a decode and a verify pass per layer,
    the head; per drafter its cost and mean accepted drafts; the transport's hop."""
    from rich.table import Table
    t = Table(title=f"calibration profile ({prof.notes.get('machine', '?')}, {prof.notes.get('date', '?')})",
              title_justify="left")
    t.add_column("part")
    t.add_column("measured", justify="right")
    for dev, dp in prof.devices.items():
        c = dp.stage.contexts[0]
        one, five = dp.stage.pass_s(10, 1, c) / 10, dp.stage.pass_s(10, 5, c) / 10
        t.add_row(f"{dev} (x{dp.slowdown:g}): ms per layer, 1 / 5 tokens at {c}",
                  f"{one * 1000:.3f} / {five * 1000:.3f}")
        t.add_row(f"{dev}: head, 1 / 5 rows", f"{_ms(dp.head(1))} / {_ms(dp.head(5))}")
    for name, dr in prof.drafters.items():
        k = 4 if 4 in dr.accepted else max(dr.accepted or {1: ()})
        means = []
        for kind in ("chat", *sorted(dr.workloads)):
            acc = dr.for_workload(kind).accepted_lengths(k)
            label = "sample " + kind[len("sample-"):][:6] if kind.startswith("sample-") else kind
            means.append(f"{sum(acc) / len(acc) if acc else 0.0:.2f} {label}")
        t.add_row(f"drafter {name}: one call of {k} / mean accepted", f"{_ms(dr.draft_s(k))} / {', '.join(means)}")
    if prof.transport is not None:
        fixed, per_byte = prof.transport.fit
        t.add_row("hop: fixed + per KiB", f"{_ms(fixed)} + {per_byte * 1024 * 1000:.3f} ms")
        if prof.transport.weights_Bps:
            t.add_row("weights copied from a peer", f"{prof.transport.weights_Bps / 1e6:.1f} MB/s stored")
    return t


@app.command()
def sweep(scenario: str = typer.Argument(..., help="Scenario YAML file."),
          vary: List[str] = typer.Option(..., "--vary", help="KEY=V1,V2,... (repeatable): every combination is "
                                         "predicted, e.g. --vary network.rtt=0ms,20ms,80ms"),
          set_: Optional[List[str]] = SetOpt, as_json: bool = JsonOpt,
          calibration: Optional[str] = CalibrationOpt,
          plot: Optional[str] = typer.Option(None, "--plot", help="Write a bar chart of tokens/s (PNG)."),
          jobs: int = typer.Option(0, "--jobs", help="Processes to spread the runs over (0: one per core)."),
          sort: str = typer.Option("tokens_per_s", "--sort", help="tokens_per_s, ttft_s or cost (USD per million "
                                   "useful tokens; needs device prices), best first."),
          executor: str = typer.Option("process", "--executor", help="process (this machine's cores) or ray "
                                       "(the Ray cluster RAY_ADDRESS names, else a local one; pip install "
                                       "'splitroom[ray]')."),
          ranged: bool = RangeOpt):
    """Predict every combination of the --vary values, best first, and mark the best."""
    from splitroom.sweep import EXECUTORS, SORT_KEYS, SweepError, combinations, run_sweep, sort_rows
    check_output(plot, "--plot")
    if sort not in SORT_KEYS:
        fail(f"--sort: expected {', '.join(SORT_KEYS)}, got {sort!r}")
    if executor not in EXECUTORS:
        fail(f"--executor: expected {' or '.join(EXECUTORS)}, got {executor!r}")
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            fail("--executor ray: the ray package is not installed (pip install 'splitroom[ray]')")
    try:
        combos = combinations(vary)
    except SweepError as e:
        fail(f"--vary: {e}")
    base = list(set_ or [])
    # validate every combination before running any (one line, exit 2, for a bad value)
    last = None
    for c in combos:
        last = load_scenario(scenario, base + [f"{k}={v}" for k, v in c])
    if calibration:  # the profile too: once here, not as a traceback in every worker
        with_profile(last if last is not None else load_scenario(scenario, base), calibration)
    try:
        rows = run_sweep(scenario, base, combos, calibration, jobs=jobs, ranges=ranged,
                         progress=None if as_json else (lambda i, n: err.print(f"  {i}/{n} predicted",
                                                                                highlight=False)),
                         executor=executor)
    except SweepError as e:
        fail(f"{scenario}: {e}")
    if sort == "cost" and not any(r.get("usd_per_million_tokens") is not None for r in rows):
        fail(f"--sort cost: no device of {scenario} has a price (add price: to a device)")
    rows = sort_rows(rows, sort)
    if plot:
        from splitroom.plots import plot_sweep
        plot_sweep(rows, plot, title=f"{scenario}: sweep")
    if as_json:
        print(json.dumps({"sort": sort, "rows": rows}, indent=2))
        return
    from rich.table import Table
    t = Table(title=f"{scenario}: {len(rows)} configurations, best first", title_justify="left")
    keys = [k for k, _ in combos[0]] if combos else []
    t.add_column("")
    for k in keys:
        t.add_column(k)
    priced = any(r.get("usd_per_million_tokens") is not None for r in rows)
    for col in ("tok/s", "P10-P90", "first token", "tokens/lap", "answered") + (("USD / M tokens",) if priced else ()):
        t.add_column(col, justify="right")
    for i, r in enumerate(rows):
        vals = [str(v) for _, v in r["values"]]
        if r["error"] is not None:
            t.add_row("", *vals, "-", "-", "-", "-", escape(r["error"]), *(("-",) if priced else ()))
            continue
        cost = r.get("usd_per_million_tokens")
        rg = r.get("range") or {}
        spread = (f"{rg['tokens_per_s']['p10']:.2f}-{rg['tokens_per_s']['p90']:.2f}" if rg.get("replicas") else "-")
        t.add_row("[bold green]best[/]" if i == 0 else "", *vals, f"{r['tokens_per_s']:.2f}", spread, _ms(r["ttft_s"]),
                  f"{r['tokens_per_lap']:.2f}", f"{r['answered']} of {r['questions']}",
                  *((f"{cost:.2f}" if cost is not None else "-",) if priced else ()))
    out.print(t)
    if plot:
        out.print(f"picture written to {plot}")


TemperatureOpt = typer.Option(0.0, "--temperature", help="Sample at this temperature (0: greedy, the default).")
TopPOpt = typer.Option(1.0, "--top-p", help="Nucleus sampling: keep the likeliest tokens up to this probability.")
TopKOpt = typer.Option(0, "--top-k", help="Keep only the K likeliest tokens (0: all).")
SeedOpt = typer.Option(None, "--seed", help="Seed of the sampled answer (0..2^64-1; default: a fresh one, printed).")


@app.command()
def generate(prompt: Optional[str] = typer.Argument(None, help="The question to answer."),
             backend: str = typer.Option("numpy", "--backend", help="numpy or wgpu."),
             layers: Optional[str] = typer.Option(None, "--layers",
                 help="Host layer range(s), 1-based inclusive A-B, comma-separated (e.g. 1-15: the first "
                      "15 layers); the remaining layers run as one more in-process worker stage."),
             max_tokens: int = typer.Option(256, "--max-tokens", help="Stop after this many tokens."),
             system: Optional[str] = typer.Option(None, "--system", help="System message."),
             raw: bool = typer.Option(False, "--raw", help="Send PROMPT as is, without the chat template."),
             temperature: float = TemperatureOpt, top_p: float = TopPOpt, top_k: int = TopKOpt,
             seed: Optional[int] = SeedOpt,
             model: Optional[str] = typer.Option(None, "--model", help="A GGUF file or safetensors directory "
                                                 "(default: the bundled SmolLM2-135M-Instruct)."),
             ids: Optional[str] = typer.Option(None, "--ids", help="The prompt as token ids, e.g. 1,2,3 "
                                               "(instead of PROMPT; no chat template)."),
             as_json: bool = typer.Option(False, "--json", help="Print the answer and its token ids as JSON."),
             weights: Optional[str] = typer.Option(None, "--weights", help="Weight storage: f32, f16, q8, or gguf "
                                                   "(the GGUF's blocks as stored; the default for --model X.gguf; "
                                                   "f32 otherwise).")):
    """Answer PROMPT with the real model (SmolLM2-135M-Instruct or --model PATH), streaming, then print tokens/s."""
    started()
    from splitroom.generate_cmd import run_generate
    try:
        code = run_generate(prompt, backend=backend, layers=layers, max_new_tokens=max_tokens, system=system, raw=raw,
                            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, model=model, ids=ids,
                            as_json=as_json, weights=weights)
    except ValueError as e:
        fail(str(e))
    raise typer.Exit(code)


@app.command()
def relay(host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for a LAN)."),
          port: int = typer.Option(8765, "--port", help="TCP port."),
          turn_url: Optional[str] = typer.Option(None, "--turn-url", help="A TURN server (turn:HOST:PORT, no "
                                                 "credentials) whose time-limited credentials this relay hands to "
                                                 "devices that ask (join --ice-from-relay)."),
          turn_secret_file: Optional[str] = typer.Option(None, "--turn-secret-file", help="File holding the "
                                                         "secret shared with the TURN server (coturn's "
                                                         "static-auth-secret)."),
          turn_ttl: float = typer.Option(3600.0, "--turn-ttl", help="Seconds the issued TURN credentials last."),
          stun_url: Optional[str] = typer.Option(None, "--stun-url", help="A STUN server (stun:HOST:PORT) to hand "
                                                 "out too.")):
    """Run the signalling relay (SDP offers/answers only) at ws://HOST:PORT/room/ROOM."""
    started()
    if not 0 <= port <= 65535:
        fail(f"--port {port}: expected a TCP port 0-65535")
    from runtime.relay import main as relay_main
    from runtime.transport.ice import TurnIssuer, parse_ice_server
    issuer = None
    if turn_url is not None or turn_secret_file is not None or stun_url is not None:
        if (turn_url is None) != (turn_secret_file is None):
            fail("--turn-url and --turn-secret-file go together")
        if not 60 <= turn_ttl <= 7 * 86400:  # NaN fails too
            fail(f"--turn-ttl {turn_ttl}: expected seconds from 60 to 604800")
        try:
            turn = parse_ice_server(turn_url, credentials=False) if turn_url is not None else None
            stun = parse_ice_server(stun_url) if stun_url is not None else None
        except ValueError as e:
            fail(str(e))
        if turn is not None and turn.kind != "turn" or stun is not None and stun.kind != "stun":
            fail("--turn-url takes a turn: URL and --stun-url a stun: URL")
        secret = ""
        if turn_secret_file is not None:
            try:
                secret = Path(turn_secret_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError, ValueError) as e:
                fail(f"--turn-secret-file {turn_secret_file}: cannot read ({getattr(e, 'strerror', None) or e})")
            if not secret:
                fail(f"--turn-secret-file {turn_secret_file}: the file is empty")
        issuer = TurnIssuer(turn=turn, secret=secret, ttl_s=turn_ttl, stun=stun)
    try:
        relay_main(host, port, issuer)
    except OSError as e:  # address in use, not an address of this machine, no permission
        fail(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})")


@app.command()
def join(room_url: str = typer.Argument(..., help="ws://RELAY:PORT/room/NAME (start the relay with splitroom relay)."),
         device: str = typer.Option(..., "--device", help="This device's id ([a-z0-9_-]+), unique in the room."),
         layers: str = typer.Option("auto", "--layers", help="Layers this device holds, 1-based inclusive A-B "
                                    "(1-15 = the first fifteen), or auto (the host deals them)."),
         lends: Optional[str] = typer.Option(None, "--lends", help="Memory lent to the room, e.g. '4 GiB' (auto)."),
         host: bool = typer.Option(False, "--host", help="This device is the model host and asks the questions."),
         peers: str = typer.Option("", "--peers", help="The other devices' ids, comma-separated."),
         ask: Optional[List[str]] = typer.Option(None, "--ask", help="A question (host; repeat for more)."),
         max_tokens: int = typer.Option(128, "--max-tokens", help="Answer length cap (host)."),
         backend: str = typer.Option("numpy", "--backend", help="numpy or wgpu."),
         address: Optional[List[str]] = typer.Option(None, "--address", help="Offer only this address to peers "
                                                     "(repeatable; default: every interface)."),
         ice_server: Optional[List[str]] = typer.Option(None, "--ice-server", help="A STUN or TURN server for "
                                                        "devices behind NAT: stun:HOST:PORT or "
                                                        "turn:USER:PASS@HOST:PORT?transport=udp|tcp (repeatable; "
                                                        "default: none, no server is contacted)."),
         ice_relay_only: bool = typer.Option(False, "--ice-relay-only", help="Connect only through the TURN "
                                             "server's relay candidates (networks that need it)."),
         ice_from_relay: bool = typer.Option(False, "--ice-from-relay", help="Ask the relay for its STUN/TURN "
                                             "servers and time-limited TURN credentials (relay --turn-url)."),
         heartbeat_timeout: float = typer.Option(1.0, "--heartbeat-timeout", help="Seconds a silent peer has "
                                                 "before it is lost (longer for links with pauses, e.g. TURN)."),
         timeout: float = typer.Option(600.0, "--timeout", help="Give up after this many seconds."),
         answers_json: Optional[str] = typer.Option(None, "--answers-json", help="Write the answers here (host)."),
         serve: Optional[int] = typer.Option(None, "--serve", help="Host: serve the OpenAI-compatible API and the "
                                             "room page on this TCP port until Ctrl-C (instead of --ask)."),
         serve_bind: str = typer.Option("127.0.0.1", "--serve-bind", help="Address for --serve (0.0.0.0: LAN)."),
         host_wait: float = typer.Option(60.0, "--host-wait", help="Worker: seconds to wait for a model host that "
                                         "left to come back (Host reconnecting) before the room is over."),
         rejoin_live: float = typer.Option(10.0, "--rejoin-live", help="Seconds a lost peer is waited for on the "
                                           "live connection before a new one is made through the relay."),
         slowdown: float = typer.Option(1.0, "--slowdown", help="Pad this device's compute to this many times "
                                        "its time (1: none): one machine playing a slower device."),
         queue: Optional[str] = typer.Option(None, "--queue", help="Host: keep the questions in this file; a host "
                                             "started again with it asks first those that never ended."),
         scenario: Optional[str] = typer.Option(None, "--scenario", help="Host: decode as this scenario's "
                                                "decoding: section says (speculation, async laps, sampling)."),
         draft_tokens: Optional[int] = typer.Option(None, "--draft-tokens", help="Host: speculative decoding "
                                                    "with K drafted tokens per lap (0: off)."),
         drafter: Optional[str] = typer.Option(None, "--drafter", help="Host: ngram, early_exit or model."),
         temperature: Optional[float] = typer.Option(None, "--temperature", help="Host: sample at this "
                                                     "temperature (0: greedy, the default)."),
         top_p: Optional[float] = typer.Option(None, "--top-p", help="Host: nucleus sampling threshold."),
         top_k: Optional[int] = typer.Option(None, "--top-k", help="Host: keep the K likeliest tokens (0: all)."),
         seed: Optional[int] = typer.Option(None, "--seed", help="Host: seed of the sampled answers."),
         model: Optional[str] = ModelOpt):
    """Join a room on a LAN as one device: hold a layer range, and (--host) ask and stream answers."""
    started()
    if serve is not None and not 0 <= serve <= 65535:
        fail(f"--serve {serve}: expected a TCP port 0-65535")
    if not 0 <= host_wait <= 86400:  # NaN fails too
        fail(f"--host-wait {host_wait}: expected seconds from 0 to 86400")
    if not 0 <= rejoin_live <= 600:  # NaN fails too
        fail(f"--rejoin-live {rejoin_live}: expected seconds from 0 to 600")
    if not 0.1 <= heartbeat_timeout <= 600:  # NaN fails too
        fail(f"--heartbeat-timeout {heartbeat_timeout}: expected seconds from 0.1 to 600")
    if not 1 <= slowdown <= 100:  # NaN fails too
        fail(f"--slowdown {slowdown}: expected a factor from 1 to 100")
    from splitroom.join_cmd import JoinError, JoinOptions, run_join
    opts = JoinOptions(room_url=room_url, device=device, layers=layers, lends=lends, host=host,
                       peers=[p for p in peers.split(",") if p.strip()], asks=list(ask or []),
                       max_new_tokens=max_tokens, backend=backend, addresses=list(address or []),
                       ice_servers=list(ice_server or []), ice_relay_only=ice_relay_only,
                       ice_from_relay=ice_from_relay, heartbeat_timeout_s=heartbeat_timeout, timeout_s=timeout, answers_json=answers_json, serve_port=serve, serve_bind=serve_bind,
                       host_wait_s=host_wait, rejoin_live_s=rejoin_live, slowdown=slowdown, queue_file=queue,
                       scenario=scenario, draft_tokens=draft_tokens, drafter=drafter, temperature=temperature,
                       top_p=top_p, top_k=top_k, seed=seed, model=model)
    try:
        code = run_join(opts)
    except JoinError as e:
        err.print(f"[bold red]error:[/] {escape(one_line(str(e)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.status)
    raise typer.Exit(code)

def main() -> None:
    """Console-script entry point. Garbage collection is off until the command's
    start-up is over (:func:`started`: after its scenario is loaded, or first thing in
    a command that loads none)."""
    global _startup_gc_off
    if gc.isenabled():
        gc.disable()
        _startup_gc_off = True
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        err.print("interrupted")
        sys.exit(130)
    finally:  # a command that ended before its start-up did (a usage error, --help): collection back on
        if _startup_gc_off:
            _startup_gc_off = False
            gc.enable()
