#!/usr/bin/env python3
"""Held-out validation of the simulator: calibrate once, predict rooms that were never
run, then run them and compare.

1. Calibrate this machine once (``splitroom calibrate``: the parts measured alone,
   then one small 2-device room on loopback, plain, on calibration prompts for what a
   room adds, and one 3-device room so for what a third process on the cores adds), with
   the held-out rooms' answer cap (32 tokens), a chat workload sample (scenarios/samples/chat.txt), then the
   acceptance step alone (``calibrate --acceptance-only``) on a grounded sample
   (scenarios/samples/grounded.txt); or take ``--profile`` (one made so).
2. Predict every configuration below from that profile, with its P10-P90 range
   (splitroom/ranges.py), and write the predictions to a file (``--out``, JSON, with a
   timestamp) before any of them runs. Speculative rows name the sample of their kind;
   the prompts they are checked on are not in either sample.
3. Run each configuration for real (``splitroom run --real``: one process per device,
   WebRTC, the round trip applied to packets in network namespaces) ``--repeat``
   times, and print the median measured beside the prediction, with the spread,
   whether the median lies in the range, and per-part measured times (stage per
   layer, hop, head) beside the profile's for the bias, and each configuration's
   first-token error split into its parts, measured (stages, hops, head, the rest:
   :func:`ttft_error_parts`, from each run's ``first_token_parts``).

Usage::

    .venv/bin/python scripts/validate_heldout.py --out heldout.json [--repeat 3] [--profile P]
    .venv/bin/python scripts/validate_heldout.py --small   # CI: a quick profile, two configurations
    .venv/bin/python scripts/validate_heldout.py --predict-only --out H.json     # predictions first, then chunks:
    .venv/bin/python scripts/validate_heldout.py --resume H.json --profile H.profile.yaml --only "2 devices" --repeat 3

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

from planner.metrics import FIRST_TOKEN_KINDS  # noqa: E402

SCENARIO = str(ROOT / "scenarios" / "home.yaml")
#: the held-out prompts, in neither sample nor the calibration prompts
CHAT_PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain how a bicycle works."]
GROUNDED_PROMPTS = [
    "Copy this sentence exactly, word for word: The quick brown fox jumps over the lazy dog near the old river "
    "bank, and then it runs back home before the sun goes down.",
    "Repeat the following exactly: Our team will meet in the small room on the second floor at three, so bring "
    "the printed plans and your laptop.",
]
SAMPLES = {"chat": "samples/chat.txt", "grounded": "samples/grounded.txt"}
COMMON = ["network.jitter={distribution: none}", "network.episodes=null", "workload.answer_tokens=32",
          "host=desktop", "devices[0].lends=1 GB", "devices[1].lends=1 GB"]  # room for the pinned stages' KV
TWO = ['stages=[{device: desktop, layers: "1-15"}, {device: laptop, layers: "16-30"}]']
THREE = ['stages=[{device: desktop, layers: "1-13"}, {device: laptop, layers: "14-25"}, '
         '{device: phone, layers: "26-30"}]']


def workload(kind: str) -> list[str]:
    """--set overrides asking the held-out prompts of ``kind`` (plain rooms: chat)."""
    if kind == "plain":
        return [f"workload.prompts={json.dumps(CHAT_PROMPTS)}"]
    prompts = CHAT_PROMPTS if kind == "chat" else GROUNDED_PROMPTS
    return [f"workload.prompts={json.dumps(prompts)}", f"workload.sample={SAMPLES[kind]}", f"workload.kind={kind}"]


def spec(drafter: str, k, laps: int = 1) -> list[str]:
    return [f"decoding.speculative={{drafter: {drafter}, draft_tokens: {k}}}", f"decoding.async_laps={laps}"]


def configurations(small: bool) -> list[tuple[str, list[str]]]:
    """(name, --set overrides) of each held-out configuration."""
    rows = [
        ("2 devices, loopback, plain", TWO + ["network.rtt=0ms"] + workload("plain")),
        ("2 devices, 20 ms, plain", TWO + ["network.rtt=20ms"] + workload("plain")),
        ("3 devices, 40 ms, plain", THREE + ["network.rtt=40ms"] + workload("plain")),
        ("3 devices, 80 ms, plain", THREE + ["network.rtt=80ms"] + workload("plain")),
        # the grid's other corners: 2 devices far, 3 devices near
        ("2 devices, 80 ms, plain", TWO + ["network.rtt=80ms"] + workload("plain")),
        ("3 devices, loopback, plain", THREE + ["network.rtt=0ms"] + workload("plain")),
        ("3 devices, 20 ms, plain", THREE + ["network.rtt=20ms"] + workload("plain")),
    ]
    spec_rows = [
        ("2 devices, 40 ms, ngram k=2", TWO + ["network.rtt=40ms"], spec("ngram", 2)),
        ("3 devices, 80 ms, ngram k=4", THREE + ["network.rtt=80ms"], spec("ngram", 4)),
        ("2 devices, 20 ms, ngram k=8", TWO + ["network.rtt=20ms"], spec("ngram", 8)),
        ("3 devices, 80 ms, model k=2", THREE + ["network.rtt=80ms"], spec("model", 2)),
        ("3 devices, 80 ms, model k=4", THREE + ["network.rtt=80ms"], spec("model", 4)),
        ("3 devices, 80 ms, ngram auto", THREE + ["network.rtt=80ms"], spec("ngram", "auto")),
        ("3 devices, 80 ms, model auto", THREE + ["network.rtt=80ms"],
         [s.replace("draft_tokens: auto", "draft_tokens: auto, max_draft_tokens: 4") for s in spec("model", "auto")]),
        ("2 devices, 40 ms, ngram k=4, 2 laps", TWO + ["network.rtt=40ms"], spec("ngram", 4, 2)),
    ]
    for name, room, sp in spec_rows:
        for kind in ("chat", "grounded"):
            rows.append((f"{name}, {kind}", room + sp + workload(kind)))
    # the fixed k auto is compared with on grounded at 80 ms: every k, in the same room
    for k in (2, 8):
        rows.append((f"3 devices, 80 ms, ngram k={k}, grounded", THREE + ["network.rtt=80ms"] + spec("ngram", k)
                     + workload("grounded")))
    if small:
        small_rows = ("2 devices, loopback, plain", "2 devices, 40 ms, ngram k=2, chat")
        return [r for r in rows if r[0] in small_rows]
    return rows


def calibrate(small: bool, out: Path):
    """The profile (module doc, step 1), written beside ``out``."""
    from splitroom.calibration import (CalibrationError, add_acceptance, build_profile, measure, measure_room_overheads,
                                       measure_shared_room, save_profile, with_room_overheads, with_shared_room)
    from splitroom.scenario import load
    say = (lambda s: print("  " + s, flush=True))
    # the workload's answer cap (COMMON's) is part of what a user knows of their workload
    cap = [s for s in COMMON if s.startswith("workload.answer_tokens=")]
    chat = load(SCENARIO, cap + [f"workload.sample={SAMPLES['chat']}"])
    grounded = load(SCENARIO, cap + [f"workload.sample={SAMPLES['grounded']}"])
    answer = chat.workload.answer_tokens
    profile = build_profile(chat, measure(quick=small, log=say, sample=chat.workload.sample, answer_tokens=answer))
    profile = with_room_overheads(profile, measure_room_overheads(chat, profile, log=say,
                                                                  answer_tokens=12 if small else 32))
    if not small:  # the third process on this machine's cores (the 3-device rooms below run so)
        try:
            profile = with_shared_room(profile, measure_shared_room(chat, profile, log=say))
        except CalibrationError as e:  # the study goes on, predicting the 3-device rooms without it (said)
            say(f"shared-core room: not measured ({e})")
    profile = add_acceptance(profile, measure(quick=small, log=say, sample=grounded.workload.sample,
                                              acceptance_only=True, answer_tokens=answer))
    save_profile(profile, out.with_suffix(".profile.yaml"))
    return profile


def _parts(cal: dict) -> dict:
    """A run's measured parts for the bias (planner.trace_fit.fit_trace's mapping)."""
    return {"s_per_layer": cal.get("s_per_layer", {}), "hop_p50_s": cal.get("hop_p50_s"),
            "hop_s": cal.get("hop_s"), "head_s_per_row": cal.get("head_s_per_row")}


def _warm_ttft(p: dict) -> None:
    """The first-token time of the questions after each run's first (the first meets
    every process's first use: docs/validation.md), median over runs, beside the
    prediction's for the same questions."""
    warm = [statistics.mean(r["ttft_each_s"][1:]) for r in p["measured_runs"] if len(r.get("ttft_each_s") or []) > 1]
    first = [r["ttft_each_s"][0] for r in p["measured_runs"] if r.get("ttft_each_s")]
    pe = p["predicted"].get("ttft_each_s") or []
    p["measured_first_ttft_s"] = statistics.median(first) if first else None
    p["measured_warm_ttft_s"] = statistics.median(warm) if warm else None
    p["predicted_warm_ttft_s"] = statistics.mean(pe[1:]) if len(pe) > 1 else p["predicted"]["ttft_s"]
    p["error_pct_warm_ttft"] = (100 * (p["predicted_warm_ttft_s"] - p["measured_warm_ttft_s"]) / p["measured_warm_ttft_s"]
                                if p["measured_warm_ttft_s"] else None)


def judge(p: dict) -> None:
    """Fill in one configuration's measured figures beside its prediction, in place.

    ``p``: a configuration of the record, with ``predicted`` (``tokens_per_s``,
    ``ttft_s``, ``ttft_each_s``, ``range``) and ``measured_runs`` (each with
    ``tokens_per_s``, ``ttft_s``, ``ttft_each_s``). Adds the medians over the runs
    (``measured_tokens_per_s``, ``measured_ttft_s``), ``spread_tokens_per_s`` [min,
    max], the signed errors in percent of the measured median (``error_pct_tokens_per_s``,
    ``error_pct_ttft``: positive when the prediction is higher), the warm first-token
    figures and ``inside_range`` (the measured median within the predicted P10-P90)."""
    tps = [m["tokens_per_s"] for m in p["measured_runs"]]
    ttft = [m["ttft_s"] for m in p["measured_runs"]]
    p["measured_tokens_per_s"] = statistics.median(tps)
    p["measured_ttft_s"] = statistics.median(ttft)
    p["spread_tokens_per_s"] = [min(tps), max(tps)]
    p["error_pct_tokens_per_s"] = 100 * (p["predicted"]["tokens_per_s"] - p["measured_tokens_per_s"]) / \
        p["measured_tokens_per_s"]
    p["error_pct_ttft"] = 100 * (p["predicted"]["ttft_s"] - p["measured_ttft_s"]) / p["measured_ttft_s"]
    _warm_ttft(p)
    rg = p["predicted"]["range"]["tokens_per_s"]
    p["inside_range"] = rg["p10"] <= p["measured_tokens_per_s"] <= rg["p90"]


def summary(preds: list[dict]) -> dict:
    """RMS and worst error on tokens/s, worst first-token error, how many medians lie
    in their range, how many first-token times are within 15% (all, and later questions)."""
    errs = [p["error_pct_tokens_per_s"] for p in preds]
    return {"rms_error_pct_tokens_per_s": math.sqrt(sum(e * e for e in errs) / len(errs)),
            "worst_error_pct_tokens_per_s": max(errs, key=abs),
            "worst_error_pct_ttft": max((p["error_pct_ttft"] for p in preds), key=abs),
            "inside_range": sum(1 for p in preds if p["inside_range"]),
            "ttft_within_15pct": sum(1 for p in preds if abs(p["error_pct_ttft"]) <= 15),
            "warm_ttft_within_15pct": sum(1 for p in preds if p.get("error_pct_warm_ttft") is not None
                                          and abs(p["error_pct_warm_ttft"]) <= 15)}


def markdown(record: dict, preds: list[dict]) -> str:
    """The table of docs/validation.md and its summary line."""
    s = summary(preds)
    runs = max((len(p["measured_runs"]) for p in preds), default=0)
    lines = ["| configuration | measured tok/s (median, min-max) | predicted (P10-P90) | error | in range | "
             "TTFT measured (1st question / later) | predicted (later) | error (later) |",
             "|---|---|---|---|---|---|---|---|"]
    for p in preds:
        lo, hi = p["spread_tokens_per_s"]
        rg = p["predicted"]["range"]["tokens_per_s"]
        first, warm = p.get("measured_first_ttft_s"), p.get("measured_warm_ttft_s")
        ttft = f"{first * 1000:.0f} / {warm * 1000:.0f} ms" if first and warm else f"{p['measured_ttft_s'] * 1000:.0f} ms"
        err = p.get("error_pct_warm_ttft")
        lines.append(f"| {p['name']} | {p['measured_tokens_per_s']:.2f} ({lo:.2f}-{hi:.2f}) | "
                     f"{p['predicted']['tokens_per_s']:.2f} ({rg['p10']:.2f}-{rg['p90']:.2f}) | "
                     f"{p['error_pct_tokens_per_s']:+.1f}% | {'yes' if p['inside_range'] else 'no'} | "
                     f"{ttft} | {p['predicted_warm_ttft_s'] * 1000:.0f} ms | "
                     + (f"{err:+.1f}% |" if err is not None else "- |"))
    lines.append(f"\nRMS error on tokens/s {s['rms_error_pct_tokens_per_s']:.1f}%, worst "
                 f"{s['worst_error_pct_tokens_per_s']:+.1f}%; {s['inside_range']} of {len(preds)} measured medians "
                 f"inside the printed range; first-token time within 15% in {s['ttft_within_15pct']} (all questions) "
                 f"and {s['warm_ttft_within_15pct']} (questions after the first) of {len(preds)} "
                 f"({len(preds)} configurations, {runs} run(s) each).")
    return "\n".join(lines)


def parts_markdown(preds: list[dict]) -> str:
    """Per part, measured over predicted: each run's mean per lap (its ``breakdown``)
    averaged over the runs; hops as measured minus predicted (ms, over every hop),
    stages, the head and a drafter's call of more than 1 ms (the drafters that run
    layers) as ratios, and the 1-minute load range of the runs."""
    lines = ["| configuration | hop, measured - predicted (ms, mean over hops and runs) | stages, measured / predicted | "
             "head, measured / predicted | draft (layer drafters), measured / predicted | uptime load (1 min) |",
             "|---|---:|---|---:|---:|---|"]
    for p in preds:
        runs = [r for r in p["measured_runs"] if r.get("breakdown")]
        if not runs:
            continue
        pred = {(e["kind"], e["part"]): e["mean_s"] for e in p["predicted"]["breakdown"]}
        meas: dict = {}
        for r in runs:
            for e in r["breakdown"]:
                meas.setdefault((e["kind"], e["part"]), []).append(e["mean_s"])
        mean = {k: statistics.mean(v) for k, v in meas.items()}
        hops = [mean[k] - pred[k] for k in pred if k[0] == "hop" and k in mean]
        stages = ", ".join(f"{k[1]} x{mean[k] / pred[k]:.2f}" for k in pred if k[0] == "stage" and k in mean and pred[k])
        heads = [mean[k] / pred[k] for k in pred if k[0] == "head" and k in mean and pred[k]]
        drafts = [mean[k] / pred[k] for k in pred if k[0] == "draft" and k in mean and pred[k] > 1e-3]
        loads = [r["load_1min"] for r in runs if r.get("load_1min") is not None]
        lines.append(f"| {p['name']} | {1000 * statistics.mean(hops):+.1f} | {stages} | "
                     + (f"x{statistics.mean(heads):.2f}" if heads else "-")
                     + (f" | x{statistics.mean(drafts):.2f}" if drafts else " | -")
                     + (f" | {min(loads):.1f}-{max(loads):.1f} |" if loads else " | - |"))
    return "\n".join(lines)


#: the kinds of the first token's parts (planner.metrics.first_token_parts)
TTFT_KINDS = FIRST_TOKEN_KINDS


def _decode_ratios(predicted: dict, runs: list[dict]) -> dict[str, float]:
    """``"stage:DEVICE"`` / ``"hop:SRC->DST"`` / ``"head"`` -> measured over predicted
    seconds a decode lap of that part (the ``breakdown`` lists), the median over ``runs``;
    a part the prediction's breakdown lacks or gives 0 is left out."""
    def named(bd):
        out = {}
        for e in bd:
            key = "head" if e["kind"] == "head" else f"{e['kind']}:{e['part']}"
            out[key] = out.get(key, 0.0) + float(e["mean_s"])
        return out
    pred = named(predicted.get("breakdown", []))
    each = [named(r.get("breakdown", [])) for r in runs]
    return {k: statistics.median(x.get(k, 0.0) for x in each) / v for k, v in pred.items() if v > 0}


def ttft_error_parts(predicted: dict, runs: list[dict], parts_predicted: dict | None = None) -> dict:
    """A row's first-token error, predicted over measured ``ttft_s`` less 1 (positive: the
    prediction slower than the room, the sign of docs/validation.md's tables), split into
    parts that add up to it. With ``P`` the predicted first token, ``M`` the measured one
    (median over ``runs``) and ``P_k`` / ``M_k`` their parts of kind ``k``
    (:data:`TTFT_KINDS`; planner.metrics.first_token_parts, ``sum_k P_k = P``):

        P / M - 1 = sum_k (P_k - M_k) / M

    * When every run carries ``first_token_parts`` (spec_auto records from 2026-12-04
      20:00 UTC on, this script's from 2026-12-04 23:30 UTC), ``M_k`` is the median over runs of the measured part and
      ``out[k] = (P_k - M_k) / M``; ``rest`` is what is left (0 with one run; with
      several, the medians' mismatch). ``how`` is ``"measured"``.
    * When they do not (older records hold the measured first token only), ``M_k`` is
      *estimated* from the same run's decode laps: each stage, hop and the head of the
      first token is taken to be off by the factor that part's decode-lap mean is off
      (:func:`_decode_ratios`, measured over predicted), ``M_part ~ P_part * r_part``, so
      ``out[kind] = sum over the kind's parts of P_part * (1 - r_part) / M`` (``other``:
      0). ``rest`` is then what the decode laps do not show: prefill passes off by
      another factor than one-token passes, the prefill frames' wait for the transport's
      window, anything before the host's first stage. ``how`` is
      ``"estimated from the decode laps"``.

    ``parts_predicted``: the prediction's first-token parts when ``predicted`` has no
    ``first_token_parts`` (an older record's prediction re-simulated with its trace:
    scripts/spec_auto.py's ``recomputed_ttft_parts``). Also returns ``error``, ``ttft_ms`` /
    ``ttft_ms_predicted`` and ``<kind>_ms`` (measured or estimated) / ``<kind>_ms_predicted``.
    Raises ValueError for no runs or no predicted parts."""
    if not runs:
        raise ValueError("no measured runs")
    pp = predicted.get("first_token_parts") or parts_predicted
    if not pp:
        raise ValueError("no predicted first-token parts (give parts_predicted)")
    med = statistics.median
    m_ttft = med(r["ttft_s"] for r in runs)
    out = {"error": predicted["ttft_s"] / m_ttft - 1.0, "ttft_ms": 1e3 * m_ttft,
           "ttft_ms_predicted": 1e3 * predicted["ttft_s"]}
    if all(r.get("first_token_parts") for r in runs):
        out["how"] = "measured"
        for k in TTFT_KINDS:
            mk = med(r["first_token_parts"][f"{k}_s"] for r in runs)
            out[k] = (pp[f"{k}_s"] - mk) / m_ttft
            out[f"{k}_ms"], out[f"{k}_ms_predicted"] = 1e3 * mk, 1e3 * pp[f"{k}_s"]
    else:
        out["how"] = "estimated from the decode laps"
        ratio = _decode_ratios(predicted, runs)
        named = dict(pp["parts"]) | {"head": pp["head_s"]}
        for k in TTFT_KINDS:
            keys = [n for n in named if n == k or n.startswith(k + ":")]
            p_k = sum(named[n] for n in keys) if k != "other" else pp["other_s"]
            m_k = sum(named[n] * ratio.get(n, 1.0) for n in keys) if k != "other" else pp["other_s"]
            out[k] = (p_k - m_k) / m_ttft
            out[f"{k}_ms"], out[f"{k}_ms_predicted"] = 1e3 * m_k, 1e3 * p_k
    out["rest"] = out["error"] - sum(out[k] for k in TTFT_KINDS)
    return out


def ttft_parts_markdown(rows: list[dict], parts_predicted: dict[str, dict] | None = None) -> str:
    """Each measured row's first-token error split by :func:`ttft_error_parts`, in
    percentage points (of the measured first token), with the milliseconds of each kind.
    ``rows``: a record's configurations (each ``name``, ``predicted``, ``measured_runs``);
    ``parts_predicted``: row name -> predicted parts for a record that lacks them (rows
    with neither are left out)."""
    head = ["| row | first token measured (predicted) | error | stages | hops | head | other | rest | "
            "ms: stages / hops / head, measured or estimated (predicted) | how |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    lines = []
    for r in rows:
        pp = (parts_predicted or {}).get(r["name"])
        if not r.get("measured_runs") or not (r["predicted"].get("first_token_parts") or pp):
            continue
        e = ttft_error_parts(r["predicted"], r["measured_runs"], pp)
        cols = " | ".join(f"{round(100 * e[k], 1) + 0.0:+.1f}" for k in (*TTFT_KINDS, "rest"))  # no "-0.0"
        ms = " / ".join(f"{e[k + '_ms']:.0f} ({e[k + '_ms_predicted']:.0f})" for k in ("stage", "hop", "head"))
        lines.append(f"| {r['name']} | {e['ttft_ms']:.0f} ({e['ttft_ms_predicted']:.0f}) ms | {100 * e['error']:+.1f}% | "
                     f"{cols} | {ms} | {e['how']} |")
    return "\n".join(head + lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="use this profile (with both samples' acceptance) instead of calibrating now")
    ap.add_argument("--out", default="heldout.json", help="predictions and results (JSON)")
    ap.add_argument("--repeat", type=int, default=1, help="real runs per configuration (median and spread)")
    ap.add_argument("--small", action="store_true", help="quick profile and two configurations (CI)")
    ap.add_argument("--only", help="run only the configurations whose name contains one of these texts "
                    "(comma-separated, or ';'-separated when a text holds a comma; with --resume, run in the order of "
                    "the texts)")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    ap.add_argument("--table", help="only print the table of a finished run's JSON (its --out)")
    ap.add_argument("--predict-only", action="store_true", help="write the predictions to --out and stop")
    ap.add_argument("--stop-by", type=float, help="start no run later than this many seconds before this Unix time "
                    "(--run-s): a quiet window's end; the runs so far are judged as usual")
    ap.add_argument("--run-s", type=float, default=45.0, help="seconds one run is allowed for --stop-by (45)")
    ap.add_argument("--resume", help="run the configurations (those --only selects) of this record, written "
                    "before by --predict-only, adding the runs to it (needs --profile: the one it predicted from)")
    a = ap.parse_args()
    if a.table:
        try:
            record = json.loads(Path(a.table).read_text())
            if not isinstance(record, dict) or not isinstance(record.get("configurations"), list):
                raise ValueError("no 'configurations' list: not a record of this script's --out")
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            print(f"error: --table {a.table}: {e}", file=sys.stderr)
            return 2
        for p in record["configurations"]:
            if "measured_runs" in p:
                _warm_ttft(p)
        ran = [p for p in record["configurations"] if "measured_runs" in p]
        for p in ran:
            judge(p)
        print(markdown(record, ran))
        print()
        print(parts_markdown(ran))
        if any(p["predicted"].get("first_token_parts") for p in ran):
            print()
            print(ttft_parts_markdown(ran))
        return 0

    from planner.deal import deal
    from splitroom.calibration import load_profile
    from splitroom.real_configs import prompt_token_counts, real_prompts
    from splitroom.real_predict import predict_real_run
    from splitroom.scenario import load
    from runtime.weights import ensure_safetensors

    # names hold commas: with a ';' in --only, the texts are ';'-separated
    only = [x.strip() for x in (a.only or "").split(";" if ";" in (a.only or "") else ",") if x.strip()]
    if a.resume:
        if not a.profile:
            print("error: --resume needs --profile (the profile its predictions came from)", file=sys.stderr)
            return 2
        out = Path(a.resume)
        record = json.loads(out.read_text())
        chunk = [p for p in record["configurations"] if not only or any(x in p["name"] for x in only)]
        if only:  # in the order of --only's texts (the ones that must run first, first)
            chunk.sort(key=lambda p: min(i for i, x in enumerate(only) if x in p["name"]))
        print(f"resuming {out}: {len(chunk)} configuration(s), predicted at {record['predicted_at']}", flush=True)
        run_chunk(record, chunk, a.repeat, load_profile(a.profile), out, a.stop_by and a.stop_by - a.run_s)
        return finish(record, out, a.markdown)
    out = Path(a.out)
    model_dir = str(ensure_safetensors())
    if a.profile:
        profile = load_profile(a.profile)
        print(f"profile: {a.profile}", flush=True)
    else:
        print("calibrating (the parts alone, one 2-device room on loopback, the two samples' acceptance; "
              "no held-out room) ...", flush=True)
        t0 = time.time()
        profile = calibrate(a.small, out)
        print(f"calibrated in {time.time() - t0:.0f} s -> {out.with_suffix('.profile.yaml')}", flush=True)

    from runtime.testbed import netem
    netns_ok, why = netem.available()
    configs = [c for c in configurations(a.small) if not only or any(x in c[0] for x in only)]
    preds = []
    for name, sets in configs:
        scn = load(SCENARIO, COMMON + sets)
        d = deal(scn.devices, scn.model, scn.options)
        use_netns = netns_ok and scn.network.rtt_s > 0
        rtt = scn.network.rtt_s if use_netns else 0.0
        m = predict_real_run(scn, d, profile, rtt, prompt_token_counts(model_dir, real_prompts(scn)),
                             ttft_parts=True)
        preds.append({"name": name, "sets": sets, "rtt_s": rtt, "netns": use_netns, "predicted": m})
    import os
    record = {"predicted_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "profile_notes": profile.notes,
              "load_at_start": os.getloadavg(), "network_emulation": "namespaces" if netns_ok else f"none ({why})",
              "configurations": preds}
    out.write_text(json.dumps(record, indent=1))
    print(f"{len(preds)} predictions written to {out} before any run", flush=True)

    if a.predict_only:
        return 0
    run_chunk(record, preds, a.repeat, profile, out, a.stop_by and a.stop_by - a.run_s)
    return finish(record, out, a.markdown)


def _uptime() -> str:
    """``uptime``'s line (the load averages, for the record of each run)."""
    import subprocess
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        import os
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_chunk(record: dict, preds: list[dict], repeat: int, profile, out: Path, last_start: float | None = None) -> None:
    """Run every configuration of ``preds`` ``repeat`` times, interleaved (run 1 of each,
    then run 2 of each, ...: configurations compared with each other see the same load),
    adding each run to its configuration's ``measured_runs`` (with ``uptime`` before and
    after) and writing ``record`` to ``out`` after every run. ``last_start`` (Unix
    seconds): no run starts after it (the rest are left out, and the record says so)."""
    import os
    from planner.deal import deal
    from splitroom.real import run_real
    from splitroom.scenario import load
    for r in range(repeat):
        for p in preds:
            if last_start is not None and time.time() > last_start:
                record.setdefault("stopped", f"round {r + 1} at {p['name']!r}: the window's end "
                                  f"({time.strftime('%H:%M:%S UTC', time.gmtime(last_start))} last start)")
                print(f"  stopped: {record['stopped']}", flush=True)
                return
            scn = load(SCENARIO, COMMON + p["sets"])
            d = deal(scn.devices, scn.model, scn.options)
            before = _uptime()
            # the profile goes in for the adaptive rule's lap costs (its prediction is the one above)
            res = run_real(scn, d, netns=p["netns"], timeout_s=600, log=lambda s: None, profile=profile)
            m, cal = res.measured, res.calibration
            p.setdefault("measured_runs", []).append({
                "tokens_per_s": m["tokens_per_s"], "ttft_s": m["ttft_s"], "ttft_each_s": m.get("ttft_each_s"),
                "tokens_per_lap": m["tokens_per_lap"], "answered": m["answered"], "breakdown": m.get("breakdown"),
                "lap_s": m.get("lap_s"), "drafted_per_lap": m.get("drafted_per_lap"), "parts": _parts(cal),
                "first_token_parts": m.get("first_token_parts"),
                "load_1min": os.getloadavg()[0], "uptime_before": before, "uptime_after": _uptime(),
                "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
            print(f"  {p['name']} run {len(p['measured_runs'])}: {m['tokens_per_s']:.2f} tok/s, "
                  f"ttft {m['ttft_s'] * 1000:.0f} ms (predicted {p['predicted']['tokens_per_s']:.2f}, "
                  f"{p['predicted']['ttft_s'] * 1000:.0f} ms), load {os.getloadavg()[0]:.1f}", flush=True)
            judge(p)
            out.write_text(json.dumps(record, indent=1))


def finish(record: dict, out: Path, markdown_path: str | None) -> int:
    """The summary over the configurations that ran, written to ``out``; print the table."""
    import os
    preds = [p for p in record["configurations"] if p.get("measured_runs")]
    record["summary"] = summary(preds)
    record["summary"]["load_at_end"] = os.getloadavg()
    record["summary"]["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out.write_text(json.dumps(record, indent=1))
    table = markdown(record, preds)
    if any(p["predicted"].get("first_token_parts") for p in preds):
        table += "\n\n" + ttft_parts_markdown(preds)
    print(table)
    if markdown_path:
        Path(markdown_path).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
