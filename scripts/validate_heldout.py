#!/usr/bin/env python3
"""Held-out validation of the simulator (issue 9): calibrate once, predict rooms that
were never run, then run them and compare.

1. Calibrate this machine once (``splitroom calibrate``: the parts measured alone,
   then one small 2-device room on loopback, plain, on calibration prompts for what a
   room adds; no held-out configuration, no scenario workload; or take ``--profile``).
2. Predict every configuration below from that profile and write the predictions to
   a file (``--out``, JSON, with a timestamp) before any of them runs.
3. Run each configuration for real (``splitroom run --real``: one process per device,
   WebRTC, the round trip applied to packets in network namespaces) ``--repeat``
   times, and print the median measured beside the prediction, with the spread.

Usage::

    .venv/bin/python scripts/validate_heldout.py --out heldout.json [--repeat 3] [--profile P]
    .venv/bin/python scripts/validate_heldout.py --small   # CI: a quick profile, two configurations

Run it alone on the machine (no test suite, no other load): timings swing with load.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIO = str(ROOT / "scenarios" / "home.yaml")
#: prompts whose answers run long (neither the calibration prompts nor home.yaml's)
PROMPTS = '["Write a short story about a robot who learns to paint.", "Explain how a bicycle works."]'
LONG_PROMPT = ("Summarise the following notes in two sentences. " + " ".join(
    f"Note {i}: the team met on day {i} to review the plan, agreed on the next step, and wrote down who "
    "would check the results before the following meeting." for i in range(1, 13)))
COMMON = ["network.jitter={distribution: none}", "network.episodes=null", f"workload.prompts={PROMPTS}",
          "workload.answer_tokens=48", "host=desktop"]
TWO = ['stages=[{device: desktop, layers: "1-15"}, {device: laptop, layers: "16-30"}]']
THREE = ['stages=[{device: desktop, layers: "1-13"}, {device: laptop, layers: "14-25"}, '
         '{device: phone, layers: "26-30"}]']


def spec(drafter: str, k: int, laps: int = 1) -> list[str]:
    return [f"decoding.speculative={{drafter: {drafter}, draft_tokens: {k}}}", f"decoding.async_laps={laps}"]


def configurations(small: bool) -> list[tuple[str, list[str]]]:
    """(name, --set overrides) of each held-out configuration."""
    rows = [
        ("2 devices, loopback, plain", TWO + ["network.rtt=0ms"]),
        ("2 devices, 5 ms, plain", TWO + ["network.rtt=5ms"]),
        ("2 devices, 20 ms, plain", TWO + ["network.rtt=20ms"]),
        ("2 devices, 80 ms, plain", TWO + ["network.rtt=80ms"]),
        ("3 devices, loopback, plain", THREE + ["network.rtt=0ms"]),
        ("3 devices, 20 ms, plain", THREE + ["network.rtt=20ms"]),
        ("3 devices, 80 ms, plain", THREE + ["network.rtt=80ms"]),
        ("2 devices, 20 ms, ngram k=4", TWO + ["network.rtt=20ms"] + spec("ngram", 4)),
        ("3 devices, 80 ms, ngram k=4", THREE + ["network.rtt=80ms"] + spec("ngram", 4)),
        ("3 devices, 80 ms, ngram k=4, 2 laps", THREE + ["network.rtt=80ms"] + spec("ngram", 4, 2)),
        ("2 devices, 80 ms, model k=4", TWO + ["network.rtt=80ms"] + spec("model", 4)),
        ("3 devices, 20 ms, model k=2, 2 laps", THREE + ["network.rtt=20ms"] + spec("model", 2, 2)),
        ("3 devices, 20 ms, long prompt", THREE + ["network.rtt=20ms", f"workload.prompts={json.dumps([LONG_PROMPT])}",
                                                   "workload.answer_tokens=16"]),
    ]
    if small:
        return [rows[0], rows[7]]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="use this profile instead of calibrating now")
    ap.add_argument("--out", default="heldout.json", help="predictions and results (JSON)")
    ap.add_argument("--repeat", type=int, default=1, help="real runs per configuration (median and spread)")
    ap.add_argument("--small", action="store_true", help="quick profile and two configurations (CI)")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    a = ap.parse_args()

    from planner.deal import deal
    from splitroom.calibration import (build_profile, load_profile, measure, measure_room_overheads, save_profile,
                                       with_room_overheads)
    from splitroom.real import predict_real_run, prompt_token_counts, real_prompts, run_real
    from splitroom.scenario import load
    from runtime.weights import ensure_safetensors

    out = Path(a.out)
    model_dir = str(ensure_safetensors())
    if a.profile:
        profile = load_profile(a.profile)
        print(f"profile: {a.profile}", flush=True)
    else:
        print("calibrating (the parts alone, then one 2-device room on loopback; no held-out room) ...", flush=True)
        t0 = time.time()
        base = load(SCENARIO)
        profile = build_profile(base, measure(quick=a.small, log=lambda s: print("  " + s, flush=True)))
        profile = with_room_overheads(profile, measure_room_overheads(
            base, profile, log=lambda s: print("  " + s, flush=True), answer_tokens=12 if a.small else 32))
        save_profile(profile, out.with_suffix(".profile.yaml"))
        print(f"calibrated in {time.time() - t0:.0f} s -> {out.with_suffix('.profile.yaml')}", flush=True)

    from runtime import netem
    netns_ok, why = netem.available()
    configs = configurations(a.small)
    preds = []
    for name, sets in configs:
        scn = load(SCENARIO, COMMON + sets)
        d = deal(scn.devices, scn.model, scn.options)
        use_netns = netns_ok and scn.network.rtt_s > 0
        rtt = scn.network.rtt_s if use_netns else 0.0
        m = predict_real_run(scn, d, profile, rtt, prompt_token_counts(model_dir, real_prompts(scn)))
        preds.append({"name": name, "sets": sets, "rtt_s": rtt, "netns": use_netns, "predicted": m})
    record = {"predicted_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "profile_notes": profile.notes,
              "network_emulation": "namespaces" if netns_ok else f"none ({why})", "configurations": preds}
    out.write_text(json.dumps(record, indent=1))
    print(f"{len(preds)} predictions written to {out} before any run", flush=True)

    for p in preds:
        scn = load(SCENARIO, COMMON + p["sets"])
        d = deal(scn.devices, scn.model, scn.options)
        runs = []
        for r in range(a.repeat):
            res = run_real(scn, d, netns=p["netns"], timeout_s=600, log=lambda s: None)
            runs.append(res.measured)
            print(f"  {p['name']} run {r + 1}: {res.measured['tokens_per_s']:.2f} tok/s, "
                  f"ttft {res.measured['ttft_s'] * 1000:.0f} ms (predicted {p['predicted']['tokens_per_s']:.2f}, "
                  f"{p['predicted']['ttft_s'] * 1000:.0f} ms)", flush=True)
        tps = [m["tokens_per_s"] for m in runs]
        ttft = [m["ttft_s"] for m in runs]
        p["measured_runs"] = [{"tokens_per_s": m["tokens_per_s"], "ttft_s": m["ttft_s"],
                               "tokens_per_lap": m["tokens_per_lap"], "answered": m["answered"]} for m in runs]
        p["measured_tokens_per_s"] = statistics.median(tps)
        p["measured_ttft_s"] = statistics.median(ttft)
        p["spread_tokens_per_s"] = [min(tps), max(tps)]
        p["error_pct_tokens_per_s"] = 100 * (p["predicted"]["tokens_per_s"] - p["measured_tokens_per_s"]) / \
            p["measured_tokens_per_s"]
        p["error_pct_ttft"] = 100 * (p["predicted"]["ttft_s"] - p["measured_ttft_s"]) / p["measured_ttft_s"]
        out.write_text(json.dumps(record, indent=1))

    errs = [p["error_pct_tokens_per_s"] for p in preds]
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    worst = max(errs, key=abs)
    ttft_worst = max((p["error_pct_ttft"] for p in preds), key=abs)
    record["summary"] = {"rms_error_pct_tokens_per_s": rms, "worst_error_pct_tokens_per_s": worst,
                         "worst_error_pct_ttft": ttft_worst, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                          time.gmtime())}
    out.write_text(json.dumps(record, indent=1))
    lines = ["| configuration | measured tok/s (median, min-max) | predicted | error | measured TTFT | predicted | error |",
             "|---|---|---|---|---|---|---|"]
    for p in preds:
        lo, hi = p["spread_tokens_per_s"]
        lines.append(f"| {p['name']} | {p['measured_tokens_per_s']:.2f} ({lo:.2f}-{hi:.2f}) | "
                     f"{p['predicted']['tokens_per_s']:.2f} | {p['error_pct_tokens_per_s']:+.1f}% | "
                     f"{p['measured_ttft_s'] * 1000:.0f} ms | {p['predicted']['ttft_s'] * 1000:.0f} ms | "
                     f"{p['error_pct_ttft']:+.1f}% |")
    lines.append(f"\nRMS error on tokens/s {rms:.1f}%, worst {worst:+.1f}%; worst time to first token "
                 f"{ttft_worst:+.1f}% ({len(preds)} configurations, {a.repeat} run(s) each).")
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
