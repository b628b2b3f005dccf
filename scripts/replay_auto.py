#!/usr/bin/env python3
"""Replay ``draft_tokens: auto`` (planner/draft_policy.py) lap by lap on greedy answers,
with the lap times real rooms measured, against every fixed k (docs/benchmarks.md, "Why
auto misses on grounded prompt lookup").

For each answer (the bundled model's greedy answer, 32-token cap, of the held-out
grounded prompts of scripts/validate_heldout.py and of the grounded sample), prompt
lookup drafts k tokens from the prompt and the answer so far, the accepted length is
the leading drafts equal to the answer (exact: prompt lookup needs no model), and the
lap commits that many plus one. A lap drafting k costs the mean lap time that study's
record measured for k (3 devices, 80 ms; the three VM studies and the device machine's
scripts/spec_auto.py record: the runs' ``lap_s`` means averaged; k = 1, 3
and 5-7, and any k a record lacks, interpolated linearly between the measured k, with the
return hop's step from k = 5, where the frame outgrows the initial window). The rule
gets its prior from ``--profile`` (the grounded sample's walk) and either the profile's
lap costs (the rule as on main), or the measured ones (``oracle``). Prints tokens per
second of lap time, and x the best fixed k of {1, 2, 4, 8}; then the rule with its window
charge for k >= 5 cut to fractions of the round trip (``--window-charges``), and the rule
that carries the return hop's window (its last column: :func:`carried_lap_s`).

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
           "W1": "docs/heldout-2026-12-01-w1.json", "device": "docs/spec-auto-2026-12-03-h200.json",
           "device S9": "docs/spec-auto-2026-12-03-h200-s9.json",
           "device S10": "docs/spec-auto-2026-12-03-h200-s10.json",
           "device S11": "docs/spec-auto-2026-12-04-h200.json"}
ROWS = {0: "3 devices, 80 ms, plain", 2: "3 devices, 80 ms, ngram k=2, grounded",
        4: "3 devices, 80 ms, ngram k=4, grounded", 8: "3 devices, 80 ms, ngram k=8, grounded"}
#: scripts/spec_auto.py's record (the 16-core device machine): its rows' names
SPEC_AUTO_ROWS = {0: "plain", 2: "ngram k=2, grounded", 4: "ngram k=4, grounded", 8: "ngram k=8, grounded"}


def measured_costs(record: str, with_step: bool = True) -> list[float]:
    """Seconds of a lap drafting k = 0..8 (module doc); ``with_step`` False leaves the
    return hop's step out (for :func:`tokens_per_s` with a window)."""
    data = json.loads((ROOT / record).read_text())
    names = ROWS if "configurations" in data else SPEC_AUTO_ROWS
    rows = {c["name"]: c for c in data.get("configurations", data.get("rows", []))}
    ran = {k: n for k, n in names.items() if rows.get(n, {}).get("measured_runs")}  # a record may lack k = 2
    at = {k: statistics.mean(r["lap_s"]["mean"] for r in rows[n]["measured_runs"]) for k, n in ran.items()}
    back = {k: statistics.mean(e["mean_s"] for r in rows[n]["measured_runs"] for e in r["breakdown"]
                               if e["kind"] == "hop" and e["part"] == "phone->desktop")
            for k, n in ran.items()}
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
    if not with_step:
        out = [c - step if k > 4 else c for k, c in enumerate(out)]
    return out


#: the return hop phone -> desktop of the studies' room: its round trip, the tuned SCTP
#: sender's initial window and burst (runtime.transport.patches), SmolLM2's frame
RTT_S, WINDOW_BYTES, BURST_BYTES, HIDDEN = 0.080, 11600.0, 37120.0, 576


def carried_lap_s(policy, cwnd: float) -> tuple[float, ...]:
    """The rule's lap costs with the return hop's window carried (the last table's last column): the whole
    round trip the rule on main charges a lap of k >= 5 taken off, and each k charged
    :func:`sim.link.sctp_frame_rounds` round trips of its result frame from the window
    ``cwnd`` the room's frames have already grown (bytes). Seconds, k = 0..max."""
    from planner.frames import frame_bytes
    from sim.link import sctp_frame_rounds
    return tuple(c - (RTT_S if k >= 5 else 0.0)
                 + sctp_frame_rounds(frame_bytes(k + 1, HIDDEN), cwnd, BURST_BYTES)[0] * RTT_S
                 for k, c in enumerate(policy.lap_s))


def growth_s(k: int, cwnd: float, laps: float) -> float:
    """Seconds of round trips the return hop's result frames of ``k + 1`` positions still
    pay over the next ``laps`` laps drafting ``k``, from the window ``cwnd`` (bytes):
    :func:`sim.link.sctp_frame_rounds` frame after frame, the window carried, until a
    frame pays none (then none after it pays either)."""
    from planner.frames import frame_bytes
    from sim.link import sctp_frame_rounds
    total, n, w = 0.0, 0, cwnd
    while n < laps:
        r, w = sctp_frame_rounds(frame_bytes(k + 1, HIDDEN), w, BURST_BYTES)
        if r == 0:
            break
        total += r * RTT_S * min(1.0, laps - n)
        n += 1
    return total


def invest_choose(st, cwnd: float, tokens_left: float) -> int:
    """The rule that weighs a window growth over the tokens still to come (the
    replay's last column, ``horizon``): each k's lap cost without the window's charge
    (:func:`carried_lap_s` at a window that holds every frame), and the round trips its
    frames still pay from the window the room has (:func:`growth_s`) spread over the
    ``tokens_left / (1 + E[accepted | k])`` laps that drafting k takes to commit them.
    Picks the k with the most tokens per second over those laps, i.e. the most
    ``tokens_left / (laps_k * lap_k + growth_k)``; a probe as the rule on main."""
    from planner.draft_policy import expected_accepted
    p = st.policy
    base = carried_lap_s(p, 1e9)
    best, best_rate = 0, -1.0
    for k in range(p.max_draft_tokens + 1):
        e = expected_accepted(st.rates(k), k) if k else 0.0
        laps = max(1.0, tokens_left / (1.0 + e))
        t = laps * base[k] + (growth_s(k, cwnd, laps) if k else 0.0)
        r = laps * (1.0 + e) / t
        if r > best_rate * (1 + 1e-12):
            best, best_rate = k, r
    if best == 0 and st.plain_run >= p.probe_every:
        best = p.probe_tokens
    return best


def tokens_per_s(answers, cost, policy=None, fixed=0, window: bool = False, carried: bool = False,
                 horizon: str | None = None, cap: int = 32) -> float:
    """Tokens per second of lap time over ``answers`` (one room's questions in turn).
    ``window``: ``cost`` leaves the return hop's step out, and each lap pays
    :func:`sim.link.sctp_frame_rounds` round trips for its result frame instead, the
    window carried lap to lap and question to question from the initial one (aiortc's
    window in one room). ``carried``: before each lap the rule's costs are
    :func:`carried_lap_s` of the window the room has then. ``horizon`` ``"question"``:
    :func:`invest_choose` over the question's tokens left (``cap`` less those committed);
    ``"room"``: over the room's (this question's and every later question's cap)."""
    from planner.frames import frame_bytes
    from runtime.drafters import ngram_draft
    from sim.link import sctp_frame_rounds
    cwnd = WINDOW_BYTES
    t = toks = 0.0
    for qi, (prompt, ans) in enumerate(answers):
        ctx, pos = list(prompt) + ans[:1], 1  # the first answer token comes from the prefill
        toks += 1
        st = policy.start() if policy is not None else None
        while pos < len(ans):
            if carried and st is not None:
                st.policy = dataclasses.replace(policy, lap_s=carried_lap_s(policy, cwnd))
            if horizon is not None and st is not None:
                left = cap - pos + (cap * (len(answers) - qi - 1) if horizon == "room" else 0)
                k = invest_choose(st, cwnd, left)
            else:
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
            if window:
                r, cwnd = sctp_frame_rounds(frame_bytes(k + 1, HIDDEN), cwnd, BURST_BYTES)
                t += r * RTT_S
    return toks / t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="docs/heldout-2026-12-02-s6.profile.yaml")
    ap.add_argument("--window-charges", default="1,0.6,0.4,0.25,0",
                    help="fractions of the round trip the rule charges a lap of k >= 5 for the window, one "
                         "column each in the last table (1: the rule as on main)")
    a = ap.parse_args()
    try:
        charges = [float(x) for x in a.window_charges.split(",") if x.strip()]
    except ValueError:
        charges = []
    if not charges or any(not 0.0 <= c <= 1.0 for c in charges):
        print(f"error: --window-charges: need fractions in [0, 1], comma-separated, got {a.window_charges!r}",
              file=sys.stderr)
        return 2
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
    room = real_run_scenario(scn, 0.08, counts, 32).with_profile(on_this_host(prof, d)[0])
    pol = draft_policy(room, d)
    print(f"rule's lap costs (ms): {[round(1000 * s, 1) for s in pol.lap_s]}")
    for window in (False, True):
        print("\nlap times: " + ("measured, the return hop's step from the window model, the window carried"
                                  if window else "measured, the return hop's step on every lap from k = 5"))
        print("| lap costs of | prompts | k=1 | k=2 | k=4 | k=8 | rule | rule (measured costs) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for study, record in RECORDS.items():
            cost = measured_costs(record, with_step=not window)
            oracle = dataclasses.replace(pol, lap_s=tuple(measured_costs(record)))
            for name, answers in sets.items():
                fixed = {k: tokens_per_s(answers, cost, fixed=k, window=window) for k in (1, 2, 4, 8)}
                best = max(fixed.values())
                got = [tokens_per_s(answers, cost, p, window=window) for p in (pol, oracle)]
                print(f"| {study} | {name} | " + " | ".join(f"{v:.2f}" for v in fixed.values()) + " | "
                      + " | ".join(f"{v:.2f} ({v / best:.2f}x)" for v in got) + " |")
    # the rule with a smaller window charge: lap_s[k] for k >= 5 less (1 - charge) round trips
    rtt_s = RTT_S
    pols = [dataclasses.replace(pol, lap_s=tuple(c - (1 - f) * rtt_s if k >= 5 else c for k, c in enumerate(pol.lap_s)))
            for f in charges]
    print("\nthe rule with the window charge cut (lap times measured, the window carried), x the best fixed k")
    print("| lap costs of | prompts | best fixed k | " + " | ".join(f"charge {f:g}" for f in charges)
          + " | window carried |")
    print("|---|---|---:|" + "---:|" * (len(charges) + 1))
    for study, record in RECORDS.items():
        cost = measured_costs(record, with_step=False)
        for name, answers in sets.items():
            fixed = {k: tokens_per_s(answers, cost, fixed=k, window=True) for k in (1, 2, 4, 8)}
            kb = max(fixed, key=fixed.get)
            print(f"| {study} | {name} | k={kb} {fixed[kb]:.2f} | "
                  + " | ".join(f"{tokens_per_s(answers, cost, p, window=True) / fixed[kb]:.2f}x" for p in pols)
                  + f" | {tokens_per_s(answers, cost, pol, window=True, carried=True) / fixed[kb]:.2f}x |")
    # the rule that weighs a growth over the tokens to come (invest_choose), grounded and chat
    cscn = load(V.SCENARIO, V.COMMON + V.THREE + ["network.rtt=80ms"]
                + [s.replace("draft_tokens: auto", "draft_tokens: auto, max_draft_tokens: 8")
                   for s in V.spec("ngram", "auto")] + V.workload("chat"))
    chat = greedy_answers(md, V.CHAT_PROMPTS, 32)
    croom = real_run_scenario(cscn, 0.08, [len(p) for p, _ in chat], 32).with_profile(on_this_host(prof, d)[0])
    cpol = draft_policy(croom, d)
    print("\nthe rule that weighs a window growth over the tokens to come (invest_choose; lap times measured, "
          "the window carried): grounded x the best fixed k, chat x plain")
    print("| lap costs of | prompts | best fixed k | main | horizon: question | horizon: room |")
    print("|---|---|---:|---:|---:|---:|")
    for study, record in RECORDS.items():
        cost = measured_costs(record, with_step=False)
        for name, answers, p, ks in [(n, a, pol, (1, 2, 4, 8)) for n, a in sets.items()] + [("chat", chat, cpol, (0,))]:
            fixed = {k: tokens_per_s(answers, cost, fixed=k, window=True) for k in ks}
            kb = max(fixed, key=fixed.get)
            got = [tokens_per_s(answers, cost, p, window=True)] + [
                tokens_per_s(answers, cost, p, window=True, horizon=h) for h in ("question", "room")]
            print(f"| {study} | {name} | k={kb} {fixed[kb]:.2f} | " + " | ".join(f"{g / fixed[kb]:.2f}x" for g in got)
                  + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
