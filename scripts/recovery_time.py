"""Recovery in the real room: how long from a lost worker to the next token,
measured by ``splitroom run --real`` on loopback and predicted by the simulator from a
calibration profile made beforehand (``splitroom calibrate``).

    python scripts/recovery_time.py --calibration cal.yaml [--repeats 5] [--out rec.json]

The room: home.yaml with desktop hosting, every device lending 1 GB, stages pinned
desktop 1-10, laptop 11-29, phone 30, one question of 16 tokens; the phone's process is
killed at token 5, so the laptop takes layer 30 and copies its weights from the host
over the weights channel. Prints one row per part (median and min-max of the measured
runs, the profile's prediction) and writes the runs as JSON. Run it alone (timings)."""

from __future__ import annotations

import argparse
import json
import statistics

from _runreal import run_real_json

SETS = ["host=desktop", "devices[0].lends=1 GB", "devices[1].lends=1 GB", "devices[2].lends=1 GB",
        "stages=[{device: desktop, layers: '1-10'}, {device: laptop, layers: '11-29'}, {device: phone, layers: '30'}]",
        "workload.questions=1", "workload.answer_tokens=16",
        "workload.prompts=['List the numbers from 1 to 30, separated by commas.']",
        "faults=[{device: phone, at: token 5}]"]


def parts(rec: dict) -> dict:
    """Seconds after the loss of each part of one recovery record (planner.metrics)."""
    copies = [c for c in rec.get("copies") or () if c["source"] != "disk"]
    return {"noticed_s": rec["detected_at_s"] - rec["lost_at_s"],
            "copy_s": max((c["seconds"] for c in copies), default=0.0),
            "copy_MBps": (sum(c["nbytes"] for c in copies) / 1e6 / max(sum(c["seconds"] for c in copies), 1e-9))
            if copies else None,
            "ready_s": None if rec["ready_at_s"] is None else rec["ready_at_s"] - rec["lost_at_s"],
            "next_token_s": rec["recovery_s"]}


def run_once(calibration: str) -> dict:
    """One ``run --real --loopback --json`` of the room above; returns its JSON."""
    return run_real_json("scenarios/home.yaml", SETS, ["--loopback", "--calibration", calibration])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    runs = []
    for i in range(a.repeats):
        out = run_once(a.calibration)
        (m,) = out["measured"]["recovery"]
        (p,) = out["predicted_from_profile"]["recovery"]
        runs.append({"measured": parts(m), "predicted": parts(p), "copies": m.get("copies"),
                     "answered": out.get("answers", [{}])[0].get("ended") == "answered"})
        print(f"run {i + 1}: next token {runs[-1]['measured']['next_token_s']:.2f} s after the loss "
              f"(predicted {runs[-1]['predicted']['next_token_s']:.2f} s)", flush=True)
    print(f"{'part':<28}{'measured median (min-max)':>34}{'predicted':>12}")
    for key in ("noticed_s", "copy_s", "copy_MBps", "ready_s", "next_token_s"):
        xs = [r["measured"][key] for r in runs if r["measured"][key] is not None]
        ps = [r["predicted"][key] for r in runs if r["predicted"][key] is not None]
        if not xs:
            continue
        print(f"{key:<28}{statistics.median(xs):>16.2f} ({min(xs):.2f}-{max(xs):.2f}){'':>6}"
              f"{statistics.median(ps) if ps else float('nan'):>12.2f}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"sets": SETS, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
