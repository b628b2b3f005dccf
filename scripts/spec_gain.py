"""Speculation in the real room at an emulated round trip: plain against prompt-lookup
(ngram) and model drafting at fixed k and at ``draft_tokens: auto``, on an
input-grounded workload (copying a given passage, where the draft is right most of the
time) and on a chat question, each measured by ``splitroom run --real`` in network
namespaces and predicted beforehand from a calibration profile (``splitroom
calibrate``; with ``--samples``, each workload names its sample of scenarios/samples/,
which the profile must hold: validate_heldout.py makes such a profile).

    python scripts/spec_gain.py --calibration cal.yaml [--rtt 80ms] [--repeats 3] [--samples] [--out gain.json]

Prints one row per workload and drafting setting (median measured tokens per second
over the repeats, min-max, predicted, and the gain over plain) and writes them as JSON.
Needs root and the tools of runtime/testbed/netem.py; run it alone (timings)."""

from __future__ import annotations

import argparse
import json
import statistics

from _runreal import run_real_json

WORKLOADS = {
    "grounded": "Copy this sentence exactly, word for word: The quick brown fox jumps over the lazy dog near the "
                "old river bank, and then it runs back home before the sun goes down.",
    "chat": "Describe how bread is made, step by step.",
}
SETTINGS = {"plain": "null", "ngram k=2": "{drafter: ngram, draft_tokens: 2}",
            "ngram k=4": "{drafter: ngram, draft_tokens: 4}", "ngram k=8": "{drafter: ngram, draft_tokens: 8}",
            "ngram auto": "{drafter: ngram, draft_tokens: auto}", "model k=2": "{drafter: model, draft_tokens: 2}",
            "model k=4": "{drafter: model, draft_tokens: 4}",
            "model auto": "{drafter: model, draft_tokens: auto, max_draft_tokens: 4}"}
SAMPLES = {"grounded": "samples/grounded.txt", "chat": "samples/chat.txt"}


def run_once(prompt: str, kind: str, spec: str, rtt: str, calibration: str, answer_tokens: int,
             samples: bool = False) -> dict:
    """One ``run --real --json`` of home.yaml's two-device room (desktop layers 1-15 and
    model host, laptop 16-30), ``kind`` its
    ``workload.kind`` (which of the profile's measured acceptances predicts it, or its
    sample with ``samples``); returns its JSON."""
    sets = [f"network.rtt={rtt}", "devices[0].lends=1 GB", "devices[1].lends=1 GB", "host=desktop",
            'stages=[{device: desktop, layers: "1-15"}, {device: laptop, layers: "16-30"}]', "workload.questions=1",
            f"workload.kind={kind}"] + ([f"workload.sample={SAMPLES[kind]}"] if samples else []) + [
            f"workload.answer_tokens={answer_tokens}", f"workload.prompts=[{json.dumps(prompt)}]",
            f"decoding.speculative={spec}"]
    return run_real_json("scenarios/home.yaml", sets, ["--calibration", calibration])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--rtt", default="80ms")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--answer-tokens", type=int, default=40)
    ap.add_argument("--out", default=None)
    ap.add_argument("--samples", action="store_true", help="predict from each workload's sample (scenarios/samples/)")
    ap.add_argument("--settings", help="comma-separated names of SETTINGS to run, each for both workloads, or "
                    "WORKLOAD:NAME for one (default: all; plain always runs)")
    a = ap.parse_args()
    import os
    wanted = a.settings.split(",") if a.settings else list(SETTINGS)
    rows = []
    for wl, prompt in WORKLOADS.items():
        base = None
        for name, spec in SETTINGS.items():
            if name != "plain" and name not in wanted and f"{wl}:{name}" not in wanted:
                continue
            runs, loads = [], []
            for _ in range(a.repeats):
                runs.append(run_once(prompt, wl, spec, a.rtt, a.calibration, a.answer_tokens, a.samples))
                loads.append(os.getloadavg()[0])
            tps = [r["measured"]["tokens_per_s"] for r in runs]
            pred = runs[0]["predicted_from_profile"]["tokens_per_s"]
            rg = runs[0]["predicted_from_profile"].get("range", {}).get("tokens_per_s", {})
            row = {"workload": wl, "setting": name, "measured_tokens_per_s": statistics.median(tps),
                   "runs_tokens_per_s": tps, "load_1min": loads, "predicted_range": rg,
                   "drafted_per_lap": [r["measured"].get("drafted_per_lap") for r in runs],
                   "min": min(tps), "max": max(tps), "predicted_tokens_per_s": pred,
                   "tokens_per_lap": statistics.median(r["measured"]["tokens_per_lap"] for r in runs),
                   "answer": runs[0]["answers"][0]["text"]}
            if name == "plain":
                base = row
            row["gain"] = row["measured_tokens_per_s"] / base["measured_tokens_per_s"]
            row["predicted_gain"] = pred / base["predicted_tokens_per_s"]
            rows.append(row)
            print(f"{wl:9s} {name:10s} measured {row['measured_tokens_per_s']:6.2f} tok/s "
                  f"[{row['min']:.2f}-{row['max']:.2f}]  predicted {pred:6.2f}  "
                  f"gain {row['gain']:.2f}x (predicted {row['predicted_gain']:.2f}x)  "
                  f"tokens/lap {row['tokens_per_lap']:.2f}", flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"rtt": a.rtt, "repeats": a.repeats, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
