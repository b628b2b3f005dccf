#!/usr/bin/env python3
"""``draft_tokens: auto`` against every fixed draft length, in the real room at 80 ms
RTT, on a machine of many cores (docs/benchmarks.md, "auto on 16 quiet cores").

The room is the held-out studies' 3-device room (scripts/validate_heldout.py: home.yaml,
desktop 1-13 / laptop 14-25 / phone 26-30 at its 3x slowdown, two held-out questions of
up to 32 answer tokens), the 80 ms round trip applied in the device processes
(``run --real --in-process-delay``: no netem needed, no jitter). Rows: plain; prompt
lookup k = 1, 2, 4, 8 and auto (up to 8) on the chat and on the grounded held-out
prompts; the model drafter k = 2, 4 and auto (up to 4) on both.

1. ``--predict-only``: predict every row from ``--profile`` (with both samples'
   acceptance) and write the predictions to ``--out`` with their time, before any room
   runs.
2. ``--resume OUT``: run every row ``--repeat`` times, interleaved (round 1 of every row,
   then round 2, ...), ``--slots`` rooms at a time, each room's processes pinned to
   ``--cores`` CPUs of their own (``taskset``, inherited by the device processes), and
   add each run to its row in ``OUT``; no run starts after ``--budget-s`` seconds.
   With ``--physical`` the CPUs are one hardware thread of each physical core (read from
   ``/sys/devices/system/cpu/cpu*/topology/thread_siblings_list``), so no two rooms and no
   two processes of a room share a core; at most as many rooms as whole groups of
   ``--cores`` such CPUs fit (``physical_slots``).
``--calibrate PROFILE`` makes the profile first (on the machine that runs the rooms);
with ``--physical`` it runs under ``taskset`` on the first room slot's CPUs (``--cores``
of them, one hardware thread of each physical core: :func:`calibration_command`), so the
profile is timed on the same kind of cores as the rooms; the profile's notes say where.
``--only "row;row"`` predicts (and so runs) only those rows.
3. ``--table OUT``: the table (median, min-max, predicted, tokens and drafts a lap,
   x plain and x the best fixed k of the same drafter and workload, round by round),
   then each row's error split into its parts (:func:`error_parts`, :func:`parts_table`),
   then the first token's error split into stages, hops, head and the rest
   (:func:`ttft_error_parts`, :func:`ttft_parts_table`). The record carries the first
   token's parts, predicted and measured (``first_token_parts``:
   planner.metrics.first_token_parts), from 2026-12-04 20:00 UTC on; for an older record
   ``--profile`` re-simulates the predicted ones and the measured ones are estimated
   from the decode laps (:func:`ttft_error_parts` says how).

Raises SystemExit(2) with a one-line error for a missing profile or record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import validate_heldout as V  # noqa: E402  (the held-out room, prompts and samples)

RTT = ["network.rtt=80ms"]


def rows() -> list[tuple[str, list[str]]]:
    """(name, --set overrides) of every row."""
    out = [("plain", V.THREE + RTT + V.workload("plain"))]
    for kind in ("chat", "grounded"):
        for k in (1, 2, 4, 8, "auto"):
            sp = V.spec("ngram", k)
            if k == "auto":
                sp = [s.replace("draft_tokens: auto", "draft_tokens: auto, max_draft_tokens: 8") for s in sp]
            out.append((f"ngram k={k}, {kind}", V.THREE + RTT + sp + V.workload(kind)))
        for k in (2, 4, "auto"):
            sp = V.spec("model", k)
            if k == "auto":
                sp = [s.replace("draft_tokens: auto", "draft_tokens: auto, max_draft_tokens: 4") for s in sp]
            out.append((f"model k={k}, {kind}", V.THREE + RTT + sp + V.workload(kind)))
    return out + heldout_rows()


def heldout_rows() -> list[tuple[str, list[str]]]:
    """(name, --set overrides) of the held-out rooms that widen the study to the issue's
    configurations (2 devices, loopback, 20 and 40 ms, 2 laps in flight), run the same
    way as the rows above (in-process delay, ``--slots`` rooms at a time)."""
    two, three = V.TWO, V.THREE
    return [
        ("2 devices, loopback, plain", two + ["network.rtt=0ms"] + V.workload("plain")),
        ("2 devices, 20 ms, plain", two + ["network.rtt=20ms"] + V.workload("plain")),
        ("3 devices, 40 ms, plain", three + ["network.rtt=40ms"] + V.workload("plain")),
        ("2 devices, 40 ms, ngram k=4, 2 laps, chat",
         two + ["network.rtt=40ms"] + V.spec("ngram", 4, 2) + V.workload("chat")),
        ("2 devices, 40 ms, ngram k=2, chat", two + ["network.rtt=40ms"] + V.spec("ngram", 2) + V.workload("chat")),
        ("2 devices, 40 ms, ngram k=2, grounded",
         two + ["network.rtt=40ms"] + V.spec("ngram", 2) + V.workload("grounded")),
        ("2 devices, 20 ms, ngram k=8, grounded",
         two + ["network.rtt=20ms"] + V.spec("ngram", 8) + V.workload("grounded")),
        ("3 devices, 80 ms, model k=2, grounded", three + RTT + V.spec("model", 2) + V.workload("grounded")),
    ]


def _scenario(sets):
    from planner.deal import deal
    from splitroom.scenario import load
    scn = load(V.SCENARIO, V.COMMON + sets)
    return scn, deal(scn.devices, scn.model, scn.options)


def calibrate(out: Path, placed: str | None = None) -> None:
    """The profile of the device-machine study (docs/benchmarks.md): ``calibrate --quick``
    on the chat sample (the parts, prompt lookup's walks, the model drafter's call times
    and a first walk, the calibration room), then the grounded sample's acceptance alone,
    full (prompt lookup on its 12 prompts, the drafters that run layers on 4). Written to
    ``out``; ``placed`` (the CPUs it was pinned to, or None) goes in the profile's notes."""
    from splitroom.calibration import (add_acceptance, build_profile, measure, measure_room_overheads, save_profile,
                                       with_room_overheads)
    from splitroom.scenario import load
    say = (lambda s: print("  " + s, flush=True))
    cap = [x for x in V.COMMON if x.startswith("workload.answer_tokens=")]
    chat = load(V.SCENARIO, cap + [f"workload.sample={V.SAMPLES['chat']}"])
    grounded = load(V.SCENARIO, cap + [f"workload.sample={V.SAMPLES['grounded']}"])
    answer = chat.workload.answer_tokens
    prof = build_profile(chat, measure(quick=True, log=say, sample=chat.workload.sample, answer_tokens=answer))
    prof = with_room_overheads(prof, measure_room_overheads(chat, prof, log=say, answer_tokens=12))
    print(f"calibrated (quick) at {time.strftime('%H:%M:%S UTC', time.gmtime())}", flush=True)
    prof = add_acceptance(prof, measure(log=say, sample=grounded.workload.sample, acceptance_only=True,
                                        answer_tokens=answer))
    if placed:
        prof = dataclasses.replace(prof, notes=dict(prof.notes) | {"placement": placed})
    save_profile(prof, out)
    print(f"grounded acceptance added at {time.strftime('%H:%M:%S UTC', time.gmtime())}: {out}", flush=True)


def predict(profile_path: str, out: Path, only: list[str] | None = None) -> None:
    from runtime.weights import ensure_safetensors
    from splitroom.calibration import load_profile
    from splitroom.real_configs import prompt_token_counts, real_prompts
    from splitroom.real_predict import predict_real_run
    prof = load_profile(profile_path)
    md = str(ensure_safetensors())
    preds = []
    for name, sets in rows():
        if only is not None and name not in only:
            continue
        scn, d = _scenario(sets)
        m = predict_real_run(scn, d, prof, scn.network.rtt_s, prompt_token_counts(md, real_prompts(scn)),
                             ttft_parts=True)
        preds.append({"name": name, "sets": sets, "predicted": m})
    record = {"predicted_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "profile": profile_path,
              "profile_notes": prof.notes, "load_at_start": os.getloadavg(), "cpus": os.cpu_count(),
              "network_emulation": "in process (each device process holds what it sends rtt/2)", "rows": preds}
    out.write_text(json.dumps(record, indent=1))
    print(f"{len(preds)} predictions written to {out} at {record['predicted_at']}", flush=True)


def one(name: str, profile_path: str) -> None:
    """Run one row once; print its measured figures as one JSON line."""
    from splitroom.calibration import load_profile
    from splitroom.real import run_real
    sets = dict(rows())[name]
    scn, d = _scenario(sets)
    res = run_real(scn, d, netns=False, in_process_delay=True, timeout_s=240, log=lambda s: None,
                   profile=load_profile(profile_path))
    m = res.measured
    print("RESULT " + json.dumps({k: m.get(k) for k in ("tokens_per_s", "ttft_s", "ttft_each_s", "tokens_per_lap",
                                                        "drafted_per_lap", "answered", "breakdown", "lap_s",
                                                        "first_token_parts")}
                                 | {"in_process_delay": res.calibration.get("in_process_delay")}), flush=True)


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a sysfs CPU list ("0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}).

    Raises ValueError on text that is not such a list."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def siblings_text(cpu: int, sysfs: Path = Path("/sys/devices/system/cpu")) -> str | None:
    """``cpuN/topology/thread_siblings_list`` as the machine gives it, or None where it cannot be read."""
    try:
        return (sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip()
    except OSError:
        return None


def physical_cpus(allowed: set[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """One CPU of each physical core among ``allowed`` (ascending, the lowest thread of
    each core): a CPU is left out when a lower allowed CPU is its hyperthread sibling
    (``cpuN/topology/thread_siblings_list``). A CPU whose topology cannot be read counts
    as a core of its own."""
    out: list[int] = []
    taken: set[int] = set()
    for cpu in sorted(allowed):
        if cpu in taken:
            continue
        try:
            sibs = parse_cpu_list(siblings_text(cpu, sysfs) or str(cpu))
        except ValueError:
            sibs = {cpu}
        taken |= sibs | {cpu}
        out.append(cpu)
    return out


def physical_slots(slots: int, cores: int, allowed: set[int],
                   sysfs: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """Up to ``slots`` disjoint groups of ``cores`` CPUs, each CPU on a physical core of its
    own (``physical_cpus``). Fewer groups when fewer fit; one group of every such CPU when
    not even one whole group fits (a small machine: the rooms then run one at a time)."""
    phys = physical_cpus(allowed, sysfs)
    n = min(slots, len(phys) // cores)
    if n == 0:
        return [phys]
    return [phys[i * cores:(i + 1) * cores] for i in range(n)]


def calibration_command(profile: str, cores: int, allowed: set[int],
                        sysfs: Path = Path("/sys/devices/system/cpu")) -> list[str]:
    """The command that calibrates (``--calibrate profile``) pinned like a room of
    ``--physical``: ``taskset`` on the first group :func:`physical_slots` gives (``cores``
    CPUs, one hardware thread of each physical core), the same CPUs the first room runs
    on; ``--placed`` tells the pinned run where it is (for the profile's notes)."""
    cpus = physical_slots(1, cores, allowed, sysfs)[0]
    where = ",".join(map(str, cpus))
    note = f"taskset -c {where}: one hardware thread of each of {len(cpus)} physical cores, as the rooms (--physical)"
    return ["taskset", "-c", where, sys.executable, str(Path(__file__).resolve()), "--calibrate", profile,
            "--placed", note]


def resume(out: Path, profile_path: str, repeat: int, slots: int, cores: int, budget_s: float,
           physical: bool = False) -> None:
    t0 = time.time()
    record = json.loads(out.read_text())
    by_name = {r["name"]: r for r in record["rows"]}
    queue = [(r + 1, name) for r in range(repeat) for name in by_name]
    if physical:
        free = physical_slots(slots, cores, set(os.sched_getaffinity(0)))
        record["slots"] = {"physical": True, "cpus": free, "siblings": _siblings()}
    else:
        free = [list(range(i * cores, (i + 1) * cores)) for i in range(slots)]
        record["slots"] = {"physical": False, "cpus": free}
    print(f"  rooms at a time: {len(free)}, cpus {free}", flush=True)
    running: list = []
    while queue or running:
        while queue and free and time.time() - t0 < budget_s:
            rnd, name = queue.pop(0)
            cpus = free.pop(0)
            cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, __file__, "--one", name,
                   "--profile", profile_path]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((p, rnd, name, cpus, time.time()))
        if queue and time.time() - t0 >= budget_s and not running:
            record["stopped"] = f"budget: {len(queue)} runs not started"
            break
        time.sleep(0.2)
        for item in list(running):
            p, rnd, name, cpus, started = item
            if p.poll() is None:
                continue
            running.remove(item)
            free.append(cpus)
            text = p.stdout.read()
            line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
            row = by_name[name]
            if line is None:
                row.setdefault("failed_runs", []).append({"round": rnd, "tail": text[-800:]})
                print(f"  {name} round {rnd}: FAILED: {text.strip().splitlines()[-1:]}", flush=True)
            else:
                m = json.loads(line[7:]) | {"round": rnd, "cpus": cpus, "wall_s": time.time() - started,
                                            "load_1min": os.getloadavg()[0],
                                            "finished_at": time.strftime("%H:%M:%S UTC", time.gmtime())}
                row.setdefault("measured_runs", []).append(m)
                print(f"  {name} round {rnd}: {m['tokens_per_s']:.2f} tok/s, {m['tokens_per_lap']:.2f} tokens and "
                      f"{m['drafted_per_lap']:.2f} drafts a lap (predicted {row['predicted']['tokens_per_s']:.2f}), "
                      f"cpus {cpus[0]}-{cpus[-1]}, {m['wall_s']:.0f} s", flush=True)
            out.write_text(json.dumps(record, indent=1))
    record.setdefault("finished_at", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    out.write_text(json.dumps(record, indent=1))


def _siblings() -> dict[int, str]:
    """Every CPU's thread_siblings_list as the machine gives it (for the record)."""
    return {cpu: siblings_text(cpu) or "?" for cpu in sorted(os.sched_getaffinity(0))}


def table(out: Path) -> str:
    """The Markdown table of a record (module doc, step 3)."""
    record = json.loads(out.read_text())
    rws = [r for r in record["rows"] if r.get("measured_runs")]
    by_round = {r["name"]: {m["round"]: m["tokens_per_s"] for m in r["measured_runs"]} for r in rws}
    lines = ["| row | tok/s median [min-max] (runs) | predicted (P10-P90) | tokens / drafts a lap | x plain | "
             "x best fixed k (same drafter, workload) |", "|---|---:|---:|---:|---:|---:|"]
    for r in rws:
        tps = [m["tokens_per_s"] for m in r["measured_runs"]]
        p = r["predicted"]
        rg = p["range"]["tokens_per_s"]
        tpl = statistics.median(m["tokens_per_lap"] for m in r["measured_runs"])
        dpl = statistics.median(m["drafted_per_lap"] for m in r["measured_runs"])

        def ratios(other: list[str]) -> str:
            mine = by_round[r["name"]]
            vals = []
            for rnd, v in mine.items():
                best = max((by_round[o][rnd] for o in other if rnd in by_round.get(o, {})), default=None)
                if best:
                    vals.append(v / best)
            if not vals:
                return "-"
            return f"{statistics.median(vals):.2f}x [{min(vals):.2f}-{max(vals):.2f}]"
        drafter, rest = r["name"].split(" ", 1) if r["name"] != "plain" else ("plain", "")
        kind = rest.split(", ")[-1] if rest else ""
        fixed = [n for n in by_round if n.startswith(drafter + " k=") and n.endswith(kind) and "auto" not in n]
        lines.append(f"| {r['name']} | {statistics.median(tps):.2f} [{min(tps):.2f}-{max(tps):.2f}] ({len(tps)}) | "
                     f"{p['tokens_per_s']:.2f} ({rg['p10']:.2f}-{rg['p90']:.2f}) | {tpl:.2f} / {dpl:.2f} | "
                     f"{ratios(['plain'])} | {ratios(fixed) if 'auto' in r['name'] else '-'} |")
    return "\n".join(lines)


#: the kinds of a lap's parts in a room's and a prediction's ``breakdown`` (``draft``: the drafter)
PART_KINDS = ("stage", "hop", "head", "draft")


def lap_parts(breakdown: list[dict]) -> dict[str, float]:
    """Seconds a lap of each kind of part (:data:`PART_KINDS`), summed over the parts of
    that kind (every stage, every hop) of a ``breakdown`` list."""
    out = dict.fromkeys(PART_KINDS, 0.0)
    for e in breakdown:
        out[e["kind"]] = out.get(e["kind"], 0.0) + float(e["mean_s"])
    return out


def error_parts(predicted: dict, runs: list[dict]) -> dict[str, float]:
    """A row's prediction error, predicted over measured tokens/s less 1 (the sign of the
    tables in docs/benchmarks.md: negative when the room ran faster than predicted),
    split into parts that add up to it.

    Tokens/s is tokens a lap over the seconds a lap takes once everything is counted,
    ``L = tokens_per_lap / tokens_per_s`` (the first token's time spread over the laps
    too). So ``P / M = (tpl_P / tpl_M) * (L_M / L_P)``, and with ``L`` the sum of the
    lap's parts by kind (:func:`lap_parts`) plus ``gap`` (what no part holds: the first
    token, idle waits, minus what parts overlap):

    * ``tokens_per_lap``: ``tpl_P / tpl_M - 1`` (the acceptance predicted);
    * ``stage``, ``hop``, ``head``, ``draft``: ``(part_M - part_P) / L_P`` (a part the
      prediction makes slower than the room makes the prediction lower);
    * ``gap``: ``(gap_M - gap_P) / L_P``;
    * ``rest``: what is left, the product ``(tpl_P / tpl_M - 1) * (L_M / L_P - 1)`` when a
      single run is given (with several, also the medians' mismatch).

    Measured figures are the medians over ``runs`` (each a room's record:
    ``tokens_per_s``, ``tokens_per_lap``, ``breakdown``), a part's median taken per kind.
    Also returns ``error`` and, in ms, ``<kind>_ms`` / ``<kind>_ms_predicted`` for each
    kind, ``gap`` and ``lap`` (``L``). Raises ValueError for no runs."""
    if not runs:
        raise ValueError("no measured runs")
    med = statistics.median
    err = predicted["tokens_per_s"] / med(r["tokens_per_s"] for r in runs) - 1.0
    lap_p = predicted["tokens_per_lap"] / predicted["tokens_per_s"]
    lap_m = med(r["tokens_per_lap"] / r["tokens_per_s"] for r in runs)
    parts_p = lap_parts(predicted["breakdown"])
    each = [lap_parts(r["breakdown"]) for r in runs]
    kinds = sorted(set(parts_p) | {k for x in each for k in x}, key=lambda k: (PART_KINDS + (k,)).index(k))
    parts_m = {k: med(x.get(k, 0.0) for x in each) for k in kinds}
    parts_p = {k: parts_p.get(k, 0.0) for k in kinds}
    parts_m["gap"] = lap_m - sum(parts_m.values())
    parts_p["gap"] = lap_p - sum(parts_p.values())
    out = {"error": err, "tokens_per_lap": predicted["tokens_per_lap"] / med(r["tokens_per_lap"] for r in runs) - 1}
    for k in (*kinds, "gap"):
        out[k] = (parts_m[k] - parts_p[k]) / lap_p
        out[f"{k}_ms"], out[f"{k}_ms_predicted"] = 1e3 * parts_m[k], 1e3 * parts_p[k]
    out["rest"] = err - out["tokens_per_lap"] - sum(out[k] for k in (*kinds, "gap"))
    out["lap_ms"], out["lap_ms_predicted"] = 1e3 * lap_m, 1e3 * lap_p
    return out


def parts_table(out: Path) -> str:
    """Each measured row's error split by :func:`error_parts`, in percentage points (of
    the measured tokens/s), with the measured and predicted milliseconds a lap of each kind."""
    record = json.loads(out.read_text())
    head = ["| row | error | tokens a lap | stages | hops | head | drafter | gap | rest | "
            "ms a lap: stages / hops / head / drafter / gap / all, measured (predicted) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines = []
    for r in record["rows"]:
        if not r.get("measured_runs"):
            continue
        e = error_parts(r["predicted"], r["measured_runs"])
        pp = " | ".join(f"{100 * e.get(k, 0.0):+.1f}" for k in ("tokens_per_lap", *PART_KINDS, "gap", "rest"))
        ms = " / ".join(f"{e.get(k + '_ms', 0.0):.0f} ({e.get(k + '_ms_predicted', 0.0):.0f})"
                        for k in (*PART_KINDS, "gap", "lap"))
        lines.append(f"| {r['name']} | {100 * e['error']:+.1f}% | {pp} | {ms} |")
    return "\n".join(head + lines)


#: the kinds of the first token's parts, and its error split (validate_heldout, where both
#: studies' records are read)
TTFT_KINDS = V.TTFT_KINDS
ttft_error_parts = V.ttft_error_parts


def recomputed_ttft_parts(record: dict, profile_path: str) -> dict[str, dict]:
    """Row name -> the prediction's first-token parts (planner.metrics.first_token_parts),
    re-simulated with its trace from ``profile_path`` for a record whose predictions do not
    carry them; only rows whose re-simulated ``ttft_s`` is the record's own (to 1e-9: the
    same prediction) are given."""
    from runtime.weights import ensure_safetensors
    from splitroom.calibration import load_profile
    from splitroom.real_configs import prompt_token_counts, real_prompts
    from splitroom.real_predict import predict_real_run
    prof = load_profile(profile_path)
    md = str(ensure_safetensors(progress=None))
    out = {}
    for r in record["rows"]:
        if not r.get("measured_runs") or r["predicted"].get("first_token_parts"):
            continue
        scn, d = _scenario(r["sets"])
        m = predict_real_run(scn, d, prof, scn.network.rtt_s, prompt_token_counts(md, real_prompts(scn)),
                             ttft_parts=True)
        if abs(m["ttft_s"] - r["predicted"]["ttft_s"]) <= 1e-9 * max(abs(r["predicted"]["ttft_s"]), 1.0):
            out[r["name"]] = m["first_token_parts"]
    return out


def ttft_parts_table(out: Path, parts_predicted: dict[str, dict] | None = None) -> str:
    """:func:`validate_heldout.ttft_parts_markdown` of the rows of the record at ``out``
    (each measured row's first-token error split in percentage points); ``parts_predicted``:
    row name -> predicted parts for a record that lacks them."""
    return V.ttft_parts_markdown(json.loads(out.read_text())["rows"], parts_predicted)


def ttft_table(out: Path, profile_path: str | None) -> str:
    """:func:`ttft_parts_table` of a record; a record whose predictions lack the first
    token's parts has them re-simulated from ``profile_path`` (:func:`recomputed_ttft_parts`)
    when one is given, else the table says they are missing."""
    record = json.loads(out.read_text())
    ran = [r for r in record["rows"] if r.get("measured_runs")]
    if all(r["predicted"].get("first_token_parts") for r in ran):
        return ttft_parts_table(out)
    if not profile_path or not Path(profile_path).is_file():
        return "(the record's predictions carry no first_token_parts: give --profile to re-simulate them)"
    return ttft_parts_table(out, recomputed_ttft_parts(record, profile_path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="the calibration profile (both samples' acceptance)")
    ap.add_argument("--out", help="with --predict-only: where the predictions go")
    ap.add_argument("--predict-only", action="store_true")
    ap.add_argument("--resume", help="run the rows of this record")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--placed", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--slots", type=int, default=5, help="rooms at a time (5)")
    ap.add_argument("--cores", type=int, default=3, help="CPUs per room (3)")
    ap.add_argument("--physical", action="store_true",
                    help="each room's CPUs on physical cores of their own (one hardware thread each); with "
                         "--calibrate, the calibration pinned the same way (the first room's CPUs)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no run after this many seconds")
    ap.add_argument("--table", help="print the table of this record")
    ap.add_argument("--calibrate", help="write the study's profile here (calibrate() above) and stop")
    ap.add_argument("--only", help="with --predict-only: the rows to predict (and so to run), names separated by ';'")
    a = ap.parse_args()
    for flag in ("repeat", "slots", "cores"):
        if getattr(a, flag) < 1:
            ap.error(f"--{flag} must be at least 1 (got {getattr(a, flag)})")
    if a.calibrate:
        if a.physical and not a.placed:
            cmd = calibration_command(a.calibrate, a.cores, set(os.sched_getaffinity(0)))
            print(f"  calibrating on cpus {cmd[2]}", flush=True)
            return subprocess.call(cmd)
        calibrate(Path(a.calibrate), a.placed)
        return 0
    if a.table:
        from splitroom.calibration import CalibrationError
        try:
            print(table(Path(a.table)))
            print("\nthe error split (percentage points; error_parts):\n")
            print(parts_table(Path(a.table)))
            print("\nthe first token's error split (percentage points; ttft_error_parts):\n")
            print(ttft_table(Path(a.table), a.profile))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --table: cannot read {a.table!r} ({getattr(e, 'strerror', None) or e})", file=sys.stderr)
            return 2
        except CalibrationError as e:  # --profile, read to re-simulate the first token's parts
            print(f"error: --profile: {e}", file=sys.stderr)
            return 2
        return 0
    if not a.profile or not Path(a.profile).is_file():
        print(f"error: --profile: no such profile {a.profile!r}", file=sys.stderr)
        return 2
    if a.one:
        one(a.one, a.profile)
    elif a.predict_only:
        if not a.out:
            print("error: --predict-only needs --out", file=sys.stderr)
            return 2
        only = None
        if a.only:
            only = [x.strip() for x in a.only.split(";") if x.strip()]
            unknown = sorted(set(only) - {n for n, _ in rows()})
            if unknown:
                print(f"error: --only: no such row {unknown[0]!r}", file=sys.stderr)
                return 2
        predict(a.profile, Path(a.out), only)
    elif a.resume:
        if not Path(a.resume).is_file():
            print(f"error: --resume: no such record {a.resume!r}", file=sys.stderr)
            return 2
        resume(Path(a.resume), a.profile, a.repeat, a.slots, a.cores, a.budget_s, a.physical)
        print(table(Path(a.resume)))
        print("\nthe error split (percentage points; error_parts):\n")
        print(parts_table(Path(a.resume)))
        print("\nthe first token's error split (percentage points; ttft_error_parts):\n")
        print(ttft_table(Path(a.resume), a.profile))
    else:
        print("error: give --predict-only, --resume or --table", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
