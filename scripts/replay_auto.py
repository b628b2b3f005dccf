#!/usr/bin/env python3
"""Replay ``draft_tokens: auto`` (planner/draft_policy.py) lap by lap on greedy answers,
with the lap times real rooms measured, against every fixed k (docs/benchmarks.md, "Why
auto misses on grounded prompt lookup").

For each answer (the bundled model's greedy answer, 32-token cap, of the held-out
grounded prompts of scripts/validate_heldout.py and of the grounded sample), prompt
lookup drafts k tokens from the prompt and the answer so far, the accepted length is
the leading drafts equal to the answer (exact: prompt lookup needs no model), and the
lap commits that many plus one. A lap drafting k costs the mean lap time that study's
record measured for k (3 devices, 80 ms: the runs' ``lap_s`` means averaged; k = 1, 3
and 5-7, which no fixed row ran, interpolated linearly between the measured k, with the
return hop's step from k = 5, where the frame outgrows the initial window). The rule
gets its prior from ``--profile`` (the grounded sample's walk) and either the profile's
lap costs (the rule as on main), or the measured ones (``oracle``). Prints tokens per
second of lap time, and x the best fixed k of {1, 2, 4, 8}.

    .venv/bin/python scripts/replay_auto.py [--profile docs/heldout-2026-12-02-s6.profile.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import validate_heldout as V  # noqa: E402

RECORDS = {"S6": "docs/heldout-2026-12-02-s6.json", "quiet": "docs/heldout-2026-12-01-quiet.json",
           "W1": "docs/heldout-2026-12-01-w1.json"}
ROWS = {0: "3 devices, 80 ms, plain", 2: "3 devices, 80 ms, ngram k=2, grounded",
        4: "3 devices, 80 ms, ngram k=4, grounded", 8: "3 devices, 80 ms, ngram k=8, grounded"}


def measured_costs(record: str) -> list[float]:
    """Seconds of a lap drafting k = 0..8 (module doc)."""
    rows = {c["name"]: c for c in json.loads((ROOT / record).read_text())["configurations"]}
    at = {k: statistics.mean(r["lap_s"]["mean"] for r in rows[n]["measured_runs"]) for k, n in ROWS.items()}
    back = {k: statistics.mean(e["mean_s"] for r in rows[n]["measured_runs"] for e in r["breakdown"]
                               if e["kind"] == "hop" and e["part"] == "phone->desktop") for k, n in ROWS.items()}
    step = back[8] - back[4]  # the way back's extra at 9 positions: from k = 5 on
    out = []
    for k in range(9):
        if k in at:
            out.append(at[k])
        elif k < 4:
            lo, hi = max(x for x in at if x < k), min(x for x in at if x > k)
            out.append(at[lo] + (at[hi] - at[lo]) * (k - lo) / (hi - lo))
        else:  # 5..7: the step, then the rest linear between k=4 and k=8
            out.append(at[4] + step + (at[8] - step - at[4]) * (k - 4) / 4)
    return out


def tokens_per_s(answers, cost, policy=None, fixed=0) -> float:
    from runtime.drafters import ngram_draft
    t = toks = 0.0
    for prompt, ans in answers:
        ctx, pos = list(prompt) + ans[:1], 1  # the first answer token comes from the prefill
        toks += 1
        st = policy.start() if policy is not None else None
        while pos < len(ans):
            k = st.choose() if st is not None else fixed
            a = 0
            if k == 0:
                if st is not None:
                    st.plain_lap()
            else:
                d = ngram_draft(ctx, k)
                while a < k and pos + a < len(ans) and d[a] == ans[pos + a]:
                    a += 1
                if st is not None:
                    st.observe(k, a)
            n = min(a + 1, len(ans) - pos)
            ctx += ans[pos:pos + n]
            pos += n
            toks += n
            t += cost[k]
    return toks / t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="docs/heldout-2026-12-02-s6.profile.yaml")
    a = ap.parse_args()
    if not (ROOT / a.profile).is_file():
        print(f"error: --profile: no such profile {a.profile!r}", file=sys.stderr)
        return 2
    from planner.deal import deal
    from runtime.calibrate import greedy_answers
    from runtime.weights import ensure_safetensors
    from sim.draft_costs import draft_policy
    from splitroom.calibration import load_profile
    from splitroom.real_predict import on_this_host, real_run_scenario
    from splitroom.scenario import load
    md = str(ensure_safetensors())
    sample = [ln.strip() for ln in (ROOT / "scenarios" / V.SAMPLES["grounded"]).read_text().splitlines() if ln.strip()]
    sets = {"held-out": greedy_answers(md, V.GROUNDED_PROMPTS, 32), "sample": greedy_answers(md, sample, 32)}
    scn = load(V.SCENARIO, V.COMMON + V.THREE + ["network.rtt=80ms"]
               + [s.replace("draft_tokens: auto", "draft_tokens: auto, max_draft_tokens: 8")
                  for s in V.spec("ngram", "auto")] + V.workload("grounded"))
    d = deal(scn.devices, scn.model, scn.options)
    prof = load_profile(str(ROOT / a.profile))
    counts = [len(p) for p, _ in sets["held-out"]]
    pol = draft_policy(real_run_scenario(scn, 0.08, counts, 32).with_profile(on_this_host(prof, d)[0]), d)
    print(f"rule's lap costs (ms): {[round(1000 * s, 1) for s in pol.lap_s]}")
    print("| lap costs of | prompts | k=1 | k=2 | k=4 | k=8 | rule (its costs) | rule (measured costs) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for study, record in RECORDS.items():
        cost = measured_costs(record)
        oracle = dataclasses.replace(pol, lap_s=tuple(cost))
        for name, answers in sets.items():
            fixed = {k: tokens_per_s(answers, cost, fixed=k) for k in (1, 2, 4, 8)}
            best = max(fixed.values())
            rule, orc = tokens_per_s(answers, cost, pol), tokens_per_s(answers, cost, oracle)
            print(f"| {study} | {name} | " + " | ".join(f"{v:.2f}" for v in fixed.values())
                  + f" | {rule:.2f} ({rule / best:.2f}x) | {orc:.2f} ({orc / best:.2f}x) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
