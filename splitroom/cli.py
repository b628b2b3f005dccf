"""The ``splitroom`` command line (composition root: wires planner, sim and runtime).

Commands: ``plan`` (the deal), ``simulate`` (predict a room), ``generate`` (run the real
model on one machine). Every command that takes a scenario accepts ``--set KEY=VALUE``
and ``--json``. Bad input prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run one LLM across several machines, and predict how fast that room will be.")
out = Console()
err = Console(stderr=True)

SetOpt = typer.Option(None, "--set", help="Override a scenario key, e.g. --set host=spark (VALUE is YAML).")
JsonOpt = typer.Option(False, "--json", help="Print JSON (keys as in SCENARIO.md) instead of tables.")


@app.callback()
def _root() -> None:
    """Run one LLM across several machines, and predict how fast that room will be."""


def fail(message: str) -> None:
    """Print one line to stderr and exit with status 2."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def load_scenario(path: str, sets: Optional[List[str]]):
    """Load a scenario or exit 2 with its one-line error."""
    from splitroom.scenario import ScenarioError, load
    try:
        return load(path, list(sets or []))
    except ScenarioError as e:
        fail(str(e))


def deal_scenario(scn, source: str):
    """Deal a scenario's room or exit 2 naming the problem."""
    from planner.deal import DealError, deal
    try:
        return deal(scn.devices, scn.model, scn.options)
    except DealError as e:
        fail(f"{source}: cannot deal the room: {e}")


def deal_table(deal_, scn) -> Table:
    """The deal as a table: device, role, layers, bytes used of lent, why."""
    from planner.deal import format_bytes
    t = Table(title=f"{scn.name or 'room'} · {scn.model.name} ({scn.model.layers} layers) · split {deal_.split}",
              title_justify="left")
    for col, j in (("device", "left"), ("role", "left"), ("layers", "right"), ("used / lent", "right"),
                   ("why", "left")):
        t.add_column(col, justify=j)
    for sh in deal_.shares:
        st = deal_.stage_of(sh.device)
        layers = "-" if st is None else st.shown
        over = sh.used_bytes > sh.lends_bytes
        used = f"{format_bytes(sh.used_bytes)} / {format_bytes(sh.lends_bytes)}"
        t.add_row(sh.device, sh.role, layers, f"[red]{used}[/]" if over else used, sh.why)
    return t


@app.command()
def plan(scenario: str = typer.Argument(..., help="Scenario YAML file."),
         set_: Optional[List[str]] = SetOpt, as_json: bool = JsonOpt):
    """Deal the model over the room: who hosts, who holds which layers, and why."""
    scn = load_scenario(scenario, set_)
    d = deal_scenario(scn, scenario)
    if as_json:
        print(json.dumps(d.to_json(), indent=2))
        return
    out.print(deal_table(d, scn))
    for n in d.notes:
        out.print(f"  · {n}", highlight=False)
    if not d.fits:
        out.print("[yellow]The room cannot hold the model in what it lends.[/]")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        err.print("interrupted")
        sys.exit(130)
