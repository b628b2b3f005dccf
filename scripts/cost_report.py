"""The numbers and the picture of docs/cost.md: dollars per million useful tokens for the
bundled rooms (with the prices below) beside every catalog machine that holds the model.

    .venv/bin/python scripts/cost_report.py [--plot docs/cost.png]

Prices marked "assumed" are not list prices; docs/cost.md says which.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.deal import deal  # noqa: E402
from sim.driver import Simulation  # noqa: E402
from splitroom.costing import room_cost  # noqa: E402
from splitroom.scenario import load  # noqa: E402

ROOMS = {
    "gb10_m5": ("scenarios/gb10_m5.yaml", [
        # NVIDIA list price and GB10 TDP; the MacBook Pro's price and power are assumed
        "devices[0].price={buy: 3999 USD, years: 3, watts: 140}",
        "devices[1].price={buy: 3999 USD, years: 3, watts: 90}",
    ]),
    "home (bought for it)": ("scenarios/home.yaml", [
        "devices[0].price={buy: 1000 USD, years: 4, watts: 120}",   # assumed
        "devices[1].price={buy: 1200 USD, years: 3, watts: 45}",    # assumed
        "devices[2].price={buy: 800 USD, years: 3, watts: 6}",      # assumed
    ]),
    "home (already owned: power only)": ("scenarios/home.yaml", [
        "devices[0].price={buy: 0 USD, years: 4, watts: 120}",
        "devices[1].price={buy: 0 USD, years: 3, watts: 45}",
        "devices[2].price={buy: 0 USD, years: 3, watts: 6}",
    ]),
    "wan_glm": ("scenarios/wan_glm.yaml", [
        f"devices[{i}].price={{per_hour: 1.80 USD}}" for i in range(7)  # assumed cloud price per GPU
    ]),
}


def main(argv: list[str]) -> None:
    rows = []
    for label, (path, sets) in ROOMS.items():
        scn = load(ROOT / path, sets).with_measured()
        d = deal(scn.devices, scn.model, scn.options, scn.network)
        m = Simulation(scn, d, trace=False).run().metrics
        c = room_cost(scn, d, m)
        rows.append((label, "room", f"{len(d.stages)} stages", c["useful_tokens_per_s"], c["room_usd_per_hour"],
                     c["usd_per_million_tokens"]))
        for mach in c["machines"]:
            rows.append((label, "machine", mach["name"], mach["useful_tokens_per_s"], mach["usd_per_hour"],
                         mach["usd_per_million_tokens"]))
    print("| room | what | useful tok/s | USD/h | USD per million tokens |")
    print("|------|------|-------------:|------:|-----------------------:|")
    for label, kind, name, tps, usdh, usdm in rows:
        what = f"the room ({name})" if kind == "room" else name
        print(f"| {label} | {what} | {tps:.2f} | {usdh:.3f} | {usdm:,.2f} |")
    if "--plot" in argv:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        out = argv[argv.index("--plot") + 1]
        fig, ax = plt.subplots(figsize=(9, 6))
        colors = dict(zip(ROOMS, ["tab:blue", "tab:green", "tab:olive", "tab:red"]))
        for label, kind, name, tps, usdh, usdm in rows:
            ax.scatter(tps, usdm, marker="o" if kind == "room" else "s", s=90 if kind == "room" else 40,
                       color=colors[label], edgecolor="black" if kind == "room" else "none",
                       label=f"{label}: the room" if kind == "room" else None)
            text = f"{label} room" if kind == "room" else name.split(",")[0].replace("Apple ", "")
            ax.annotate(text, (tps, usdm), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("useful tokens per second (simulated, scenario workload)")
        ax.set_ylabel("USD per million useful tokens")
        ax.set_title("Cost of a useful token: split rooms (circles) vs single machines (squares)")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        print(f"picture written to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
