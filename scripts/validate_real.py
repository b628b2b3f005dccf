"""Measured beside predicted for the rooms of docs/validation.md (real runs, minutes).

    .venv/bin/python scripts/validate_real.py rooms      # table: RTT x devices
    .venv/bin/python scripts/validate_real.py drafters   # table: drafters x async laps

Prints markdown rows; each row is one `splitroom run --real scenarios/home.yaml` with
the --set overrides shown.
"""

from __future__ import annotations

import sys

from planner.deal import deal
from splitroom.real import run_real
from splitroom.scenario import load

TWO = ["devices[1].lends=400 MB", "devices[2].lends=0 B"]
COMMON = ["workload.questions=2", "workload.answer_tokens=48"]


def one(sets: list[str], netns: bool) -> dict:
    scn = load("scenarios/home.yaml", COMMON + sets)
    d = deal(scn.devices, scn.model, scn.options)
    r = run_real(scn, d, netns=netns, timeout_s=300, log=lambda s: None)
    return {"n": len(d.stages), "m": r.measured, "p": r.predicted, "e": r.error_pct, "net": r.network,
            "cal": r.calibration}


def rooms() -> None:
    print("| devices | network | measured tok/s | predicted tok/s | error | hop p50 | inter-token p50 measured / predicted |")
    print("|---|---|---|---|---|---|---|")
    for devs in (TWO, []):
        for rtt in (None, 5, 20, 80):
            sets = list(devs) + ([f"network.rtt={rtt} ms"] if rtt else [])
            r = one(sets, netns=rtt is not None)
            net = "loopback" if rtt is None else f"{rtt} ms RTT (namespaces)"
            print(f"| {r['n']} | {net} | {r['m']['tokens_per_s']:.2f} | {r['p']['tokens_per_s']:.2f} | "
                  f"{r['e']['tokens_per_s']:+.1f}% | {r['cal']['hop_p50_s'] * 1000:.1f} ms | "
                  f"{r['m']['inter_token_s']['p50'] * 1000:.1f} / {r['p']['inter_token_s']['p50'] * 1000:.1f} ms |",
                  flush=True)


def drafters() -> None:
    print("| RTT | drafter | async laps | measured tok/s | x plain | tokens/lap | stale laps | predicted tok/s | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rtt in (20, 80):
        base = TWO + [f"network.rtt={rtt} ms"]
        plain = one(base + ["decoding.speculative=null"], netns=True)
        p0 = plain["m"]["tokens_per_s"]
        print(f"| {rtt} ms | plain | 1 | {p0:.2f} | 1.00 | 1.00 | 0 | {plain['p']['tokens_per_s']:.2f} | "
              f"{plain['e']['tokens_per_s']:+.1f}% |", flush=True)
        for drafter, k in (("ngram", 4), ("early_exit", 3), ("model", 4)):
            # early_exit (8 of 30 layers) is almost never right on SmolLM2: with 4 laps in
            # flight nearly every lap is stale and a run takes minutes, so it is left out
            for laps in ((1, 2) if drafter == "early_exit" else (1, 2, 4)):
                r = one(base + [f"decoding.speculative={{drafter: {drafter}, draft_tokens: {k}}}",
                                f"decoding.async_laps={laps}"], netns=True)
                m = r["m"]
                print(f"| {rtt} ms | {drafter} (k={k}) | {laps} | {m['tokens_per_s']:.2f} | "
                      f"{m['tokens_per_s'] / p0:.2f} | {m['tokens_per_lap']:.2f} | {m['stale_laps']} | "
                      f"{r['p']['tokens_per_s']:.2f} | {r['e']['tokens_per_s']:+.1f}% |", flush=True)


def prefill() -> None:
    print("| RTT | prefill | chunk tokens | measured TTFT | predicted TTFT |")
    print("|---|---|---|---|---|")
    for rtt in (20, 80):
        for name, chunk in (("pipelined chunks", 16), ("one frame", 4096), ("one token at a time", 1)):
            r = one(TWO + [f"network.rtt={rtt} ms", f"decoding.prefill_chunk={chunk}", "workload.answer_tokens=4"],
                    netns=True)
            print(f"| {rtt} ms | {name} | {min(chunk, 4096)} | {r['m']['ttft_s'] * 1000:.0f} ms | "
                  f"{r['p']['ttft_s'] * 1000:.0f} ms |", flush=True)


if __name__ == "__main__":
    {"rooms": rooms, "drafters": drafters, "prefill": prefill}[sys.argv[1] if len(sys.argv) > 1 else "rooms"]()
