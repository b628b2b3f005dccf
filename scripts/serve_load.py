"""Serve throughput under concurrent clients, predicted first and then measured.

    python scripts/serve_load.py scenarios/home.yaml --calibration cal.yaml \\
        --in-flight 1,2,3,4 --clients 1,2,4,8 --rtt 0ms,40ms --repeats 3 --out serve-load.json
    python scripts/serve_load.py ... --predict-only --out predicted.json   # the prediction alone
    python scripts/serve_load.py ... --predictions predicted.json --out serve-load.json
    python scripts/serve_load.py --table serve-load.json [more.json ...]  # markdown rows

For each round trip and each ``decoding.questions_in_flight`` N, it first predicts
every client count with the simulator (``workload.clients`` C, the calibration profile;
all predictions are made, stamped and written before any room runs, or read from
``--predictions``), then starts ``splitroom serve`` once (namespaces with the round
trip; ``--loopback`` when the round trip is 0 ms) and, for each client count, runs C
clients at once through the ``openai`` client, each asking ``--per-client`` questions
one after another (greedy, ``--max-tokens`` each), ``--repeats`` times. A client's token
times are the stream's chunks with text; each answer's length is the server's
``usage.completion_tokens`` (the prediction assumes every answer runs to ``--max-tokens``:
the prompts are ones the bundled model answers at length, and the JSON records each
answer's length so a short one shows). Reported per configuration (median and spread
over the repeats): aggregate tokens/s (all tokens over the span from the first request
to the last token), per-client inter-token p50/p99 and time to first token p50/p99
(request sent to first token, queue wait included), with the machine's load average
(``os.getloadavg``) before and after.

The prediction's network is the one the real room has (:func:`splitroom.real_predict.real_run_network`:
the round trip, jitter as netem applies it, no stall episodes, no bandwidth cap).
``--in-process-delay``: the rooms run on loopback with the round trip applied in the
device processes (``serve --in-process-delay``; for machines without namespaces; give the
scenario no jitter). ``--pin K``: once a room is ready, each device process (every one of
its threads) is pinned to K logical CPUs of its own (whole physical cores first where
the CPUs have siblings), and the rest (``serve`` itself, the relay, this script and its
clients) to the CPUs left; the JSON records which (``machine``). ``--separate-machines``:
predict without the profile's measured shared-core room (each device its own machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openai

from planner.model import BUNDLED_MODEL_ID

#: questions the bundled model answers greedily at more than 64 tokens (checked with
#: ``splitroom generate --max-tokens 64``), so every answer runs to ``--max-tokens``
PROMPTS = ["Write a short story about a dragon.", "Describe the water cycle.", "Tell me about the history of Rome.",
           "Write a poem about the sea.", "Explain photosynthesis.", "What are the benefits of exercise?",
           "Describe a busy city market.", "Write a letter to a friend about your summer."]


#: answer tokens of the unmeasured warm-up question a room is asked before it is measured;
#: the prediction simulates the same (``workload.warm_up_tokens``: the room measured is warm)
WARM_UP_TOKENS = 8


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def by_client(trace) -> dict:
    """Each asker's answers in a simulated trace, as a client sees them: ``{device:
    [{"sent": asked at, "times": [answer token times]}, ...]}`` (``QuestionAsked`` and
    ``EmitToken`` records, seconds), the form :func:`figures` takes."""
    questions, out = {}, {}
    for t, o in trace:
        name = type(o).__name__
        if name == "QuestionAsked":
            questions[o.question_id] = q = {"sent": t, "times": []}
            out.setdefault(o.device, []).append(q)
        elif name == "EmitToken" and o.question_id in questions:
            questions[o.question_id]["times"].append(t)
    return out


def figures(clients: list[list[dict]]) -> dict:
    """One round's latency figures from what each client saw (``clients``: per client, its
    questions ``{"sent": s, "times": [token times]}``, seconds), the measurement's and the
    prediction's alike: the worst and the median client's inter-token p50 (each client's
    gaps between consecutive tokens, pooled over its questions), the worst client's
    inter-token p99, and time to first token p50/p99 over every question (from sent, queue
    wait included). Percentiles: numpy's linear."""
    gaps_p50, gaps_p99, ttfts = [], [], []
    for c in clients:
        gaps = [b - a for q in c for a, b in zip(q["times"], q["times"][1:])]
        p = _pcts(gaps)
        gaps_p50.append(p["p50"])
        gaps_p99.append(p["p99"])
        ttfts += [q["times"][0] - q["sent"] for q in c if q["times"]]
    return {"inter_token_p50_s_worst_client": max(x for x in gaps_p50 if x is not None),
            "inter_token_p50_s_median_client": statistics.median(x for x in gaps_p50 if x is not None),
            "inter_token_p99_s_worst_client": max(x for x in gaps_p99 if x is not None),
            "ttft_p50_s": _pcts(ttfts)["p50"], "ttft_p99_s": _pcts(ttfts)["p99"]}


def predict(scenario: str, sets: list[str], calibration: str | None, clients: int, questions: int,
            prompt_tokens: int, answer_tokens: int, separate: bool = False) -> dict:
    """The simulator's aggregate tokens/s, inter-token and time-to-first-token (from asked).

    The room is predicted warm: it first answers one question of :data:`WARM_UP_TOKENS`
    alone, left out of the figures (``workload.warm_up_tokens``), as the measurement asks
    one before its rounds. The network is the real room's (:func:`splitroom.real_predict.real_run_network`). The profile
    is applied as for ``run --real`` (:func:`splitroom.real_predict.on_this_host`): serve's device
    processes all run on this machine, so a profile holding a measured shared-core room
    (``shared_host``) has it applied, unless ``separate``; ``shared_core`` says what was."""
    import dataclasses
    from splitroom.calibration import apply_profile, load_profile
    from splitroom.cli import deal_scenario
    from splitroom.real_predict import on_this_host, real_run_network
    from splitroom.scenario import load
    from sim.driver import simulate
    scn = load(scenario, sets + [f"workload.clients={clients}", f"workload.questions={questions}",
                                 f"workload.prompt_tokens={prompt_tokens}", f"workload.answer_tokens={answer_tokens}",
                                 f"workload.warm_up_tokens={WARM_UP_TOKENS}"])
    scn = dataclasses.replace(scn, network=real_run_network(scn, scn.network.rtt_s))
    line = "separate machines: the profile's shared-core room not applied" if separate else ""
    if calibration:
        profile = load_profile(calibration)
        if not separate:
            profile, line = on_this_host(profile, deal_scenario(scn, scenario))
        scn = apply_profile(scn, profile)
    res = simulate(scn)
    m = res.metrics
    per = figures(list(by_client(res.trace).values()))
    return {"aggregate_tokens_per_s": m["aggregate_tokens_per_s"], "inter_token_p50_s": m["inter_token_s"]["p50"],
            "inter_token_p99_s": m["inter_token_s"]["p99"], "ttft_p50_s": m["ttft_asked_s"]["p50"],
            "ttft_p99_s": m["ttft_asked_s"]["p99"], "shared_core": line,
            "per_client": {k: per[k] for k in ("inter_token_p50_s_worst_client", "inter_token_p99_s_worst_client")}}


class Served:
    """One ``splitroom serve`` process (started in its own process group, ended by pid)."""

    def __init__(self, scenario: str, sets: list[str], loopback: bool, in_process_delay: bool = False):
        argv = [sys.executable, "-c", "from splitroom.cli import main; main()", "serve", scenario, "--port", "0"]
        argv += ["--loopback"] if loopback or in_process_delay else []
        argv += ["--in-process-delay"] if in_process_delay and not loopback else []
        for s in sets:
            argv += ["--set", s]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="400"),
                                     start_new_session=True)
        self.url = None
        self.log: list[str] = []
        got = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"serving \S+ at (http://\S+)/v1", line)
                if m and self.url is None:
                    self.url = m.group(1)
                    got.set()
        threading.Thread(target=read, daemon=True).start()
        if not got.wait(120.0):
            self.stop()
            raise SystemExit("serve did not start: " + " | ".join(self.log[-3:]))

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        import urllib.request
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if json.load(r).get("ready"):
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise SystemExit("serve never got ready: " + " | ".join(self.log[-3:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


#: the logical CPUs this process may run on when it started (pinning a room narrows its own)
ALLOWED_CPUS = frozenset(os.sched_getaffinity(0))


def cpus_by_core() -> list[int]:
    """The logical CPUs this process was allowed when it started (:data:`ALLOWED_CPUS`),
    siblings of one physical core next to each other (``/sys/devices/system/cpu/cpuN/topology``:
    package, then core id)."""
    def core(c: int) -> tuple[int, int, int]:
        t = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            return int((t / "physical_package_id").read_text()), int((t / "core_id").read_text()), c
        except (OSError, ValueError):
            return 0, c, c
    return sorted(ALLOWED_CPUS, key=core)


def _pin(pid: int, cpus: list[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (OSError, ValueError):  # a thread that ended meanwhile
            pass


def pin_room(serve_pid: int, per_device: int) -> dict:
    """Each device process of the served room (``runtime.serve``, ``runtime.node``
    children of ``serve_pid``) onto ``per_device`` CPUs of its own (:func:`cpus_by_core`
    order); ``serve``, the relay and this process onto the CPUs left. Returns
    ``{device or "rest": [cpus]}``. Exits when the CPUs do not go round."""
    flat = cpus_by_core()
    devices, others = {}, [serve_pid, os.getpid()]
    for pid in _children(serve_pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"runtime.serve" in argv or b"runtime.node" in argv:
            cfg = next(a for a in argv if a.endswith(b".json"))
            devices[Path(cfg.decode()).stem] = pid
        else:
            others.append(pid)
    need = len(devices) * per_device
    if need >= len(flat):
        raise SystemExit(f"--pin {per_device}: {len(devices)} device processes need {need} CPUs and one more "
                         f"for the rest; this machine allows {len(flat)}")
    out = {}
    for i, (dev, pid) in enumerate(sorted(devices.items())):
        out[dev] = flat[i * per_device:(i + 1) * per_device]
        _pin(pid, out[dev])
    out["rest"] = sorted(set(flat[need:]))
    for pid in others:
        _pin(pid, out["rest"])
    return out


def machine_notes() -> dict:
    """The CPU model, logical CPU count and thread settings, for the JSON."""
    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": model, "logical_cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)),
            "threads_env": {v: os.environ.get(v) for v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS")}}


async def _client(url: str, i: int, n: int, max_tokens: int, t0: list) -> list[dict]:
    cl = openai.AsyncOpenAI(base_url=url + "/v1", api_key=f"load-{i}", max_retries=0, timeout=600.0)
    out = []
    try:
        for j in range(n):
            prompt = PROMPTS[(i + j * 3) % len(PROMPTS)]
            sent = time.monotonic()
            t0.append(sent)
            times, used, asked = [], None, None
            stream = await cl.chat.completions.create(model=BUNDLED_MODEL_ID, stream=True, max_tokens=max_tokens,
                                                      messages=[{"role": "user", "content": prompt}],
                                                      stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(time.monotonic())
                if getattr(chunk, "usage", None) is not None:
                    used, asked = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
            out.append({"sent": sent, "times": times, "completion_tokens": used, "prompt_tokens": asked})
    finally:
        await cl.close()
    return out


async def _round(url: str, clients: int, per_client: int, max_tokens: int) -> dict:
    t0: list = []
    res = await asyncio.gather(*[_client(url, i, per_client, max_tokens, t0) for i in range(clients)])
    first = min(t0)
    last = max(q["times"][-1] for c in res for q in c if q["times"])
    lengths = [q["completion_tokens"] if q["completion_tokens"] is not None else len(q["times"]) for c in res for q in c]
    tokens = sum(lengths)
    asked = [q["prompt_tokens"] for c in res for q in c if q["prompt_tokens"] is not None]
    return {"aggregate_tokens_per_s": tokens / (last - first), "tokens": tokens, "shortest_answer": min(lengths),
            "prompt_tokens_mean": statistics.mean(asked) if asked else 0.0, **figures(res)}


def _summary(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        xs = [r[k] for r in runs]
        out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return out


def _grid(a) -> list[tuple[str, int, list[str]]]:
    return [(rtt, n, a.sets + [f"network.rtt={rtt}", f"decoding.questions_in_flight={n}"])
            for rtt in a.rtt.split(",") for n in [int(x) for x in a.in_flight.split(",")]]


def _key(rtt: str, n: int, c: int) -> str:
    return f"{rtt}/{n}/{c}"


def predict_all(a) -> dict:
    """Every configuration's prediction, stamped with the time it was made (UTC)."""
    clients = [int(x) for x in a.clients.split(",")]
    preds = {_key(rtt, n, c): predict(a.scenario, sets, a.calibration, c, c * a.per_client, a.prompt_tokens,
                                      a.max_tokens, a.separate_machines)
             for rtt, n, sets in _grid(a) for c in clients}
    return {"made_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "scenario": a.scenario, "sets": a.sets,
            "calibration": a.calibration, "per_client": a.per_client, "max_tokens": a.max_tokens,
            "prompt_tokens": a.prompt_tokens, "separate_machines": a.separate_machines, "predicted": preds}


def _gap(meas: float, pred: float) -> str:
    return f"{100 * (meas / pred - 1):+.0f}%" if pred else "-"


def table(paths: list[str]) -> str:
    """Markdown rows (one per configuration) of one or more ``--out`` files (their rows in
    order; a ``--predict-only`` file among them is a second prediction): predicted and
    measured aggregate tokens/s (median, min-max over the repeats) and the gap (measured
    over predicted, minus 1), x N = 1 at the same round trip and clients, the worst
    client's inter-token p50 (x what one client alone gets at N = 1, the same round trip)
    and p99, and first token p50, each predicted / measured (median of the repeats) with
    its gap. A prediction made before the per-client figures existed gives the pooled
    inter-token figures instead, marked ``*``. With a second prediction, its aggregate
    tokens/s and gap as well."""
    rows, p2 = [], None
    for path in paths:
        d = json.loads(Path(path).read_text())
        if "rows" in d:
            rows += d["rows"]
        else:
            p2 = d["predicted"]
    base = {(r["rtt"], r["clients"]): r for r in rows if r["questions_in_flight"] == 1}
    alone = {r["rtt"]: r for r in rows if r["clients"] == 1 and r["questions_in_flight"] == 1}
    out = ["| RTT | N | clients | predicted tok/s | measured tok/s (min-max) | gap | measured x N=1 "
           "| inter-token p50 ms: pred / meas (x alone, gap) | inter-token p99 ms: pred / meas (gap) "
           "| first token p50 s: pred / meas (gap) | load |",
           "|---|---:|---:|---:|---|---:|---:|---|---|---|---|"]
    if p2:
        out[0] = out[0].replace("| gap |", "| gap | second prediction tok/s (gap) |", 1)
        out[1] = "|---|---:|---:|---:|---|---:|---:|---:|---|---|---|---|"
    for r in rows:
        p, m = r["predicted"], r["measured"]
        agg = m["aggregate_tokens_per_s"]
        b = base.get((r["rtt"], r["clients"]))
        x1 = f"{agg['median'] / b['measured']['aggregate_tokens_per_s']['median']:.2f}x" if b else "-"
        al = alone.get(r["rtt"])
        it = m["inter_token_p50_s_worst_client"]["median"]
        it99 = m["inter_token_p99_s_worst_client"]["median"]
        xa = f"{it / al['measured']['inter_token_p50_s_worst_client']['median']:.2f}x, " if al else ""
        pc = p.get("per_client")
        star = "" if pc else "*"
        p50 = pc["inter_token_p50_s_worst_client"] if pc else p["inter_token_p50_s"]
        p99 = pc["inter_token_p99_s_worst_client"] if pc else p["inter_token_p99_s"]
        ttft = m["ttft_p50_s"]["median"]
        load = r.get("load_1min")
        load_s = f"{load[0]:.1f}-{load[1]:.1f}" if load else "-"
        q = p2.get(_key(r["rtt"], r["questions_in_flight"], r["clients"])) if p2 else None
        out.append(f"| {r['rtt']} | {r['questions_in_flight']} | {r['clients']} | {p['aggregate_tokens_per_s']:.1f} "
                   f"| {agg['median']:.1f} ({agg['min']:.1f}-{agg['max']:.1f}) "
                   f"| {_gap(agg['median'], p['aggregate_tokens_per_s'])} "
                   + (f"| {q['aggregate_tokens_per_s']:.1f} ({_gap(agg['median'], q['aggregate_tokens_per_s'])}) "
                      if p2 else "")
                   + f"| {x1} "
                   f"| {1e3 * p50:.0f}{star} / {1e3 * it:.0f} ({xa}{_gap(it, p50)}) "
                   f"| {1e3 * p99:.0f}{star} / {1e3 * it99:.0f} ({_gap(it99, p99)}) "
                   f"| {p['ttft_p50_s']:.2f} / {ttft:.2f} ({_gap(ttft, p['ttft_p50_s'])}) "
                   f"| {load_s} |")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--table":
        print(table(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--calibration")
    ap.add_argument("--in-flight", default="1,2,3,4")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--rtt", default="0ms,40ms")
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=36, help="prompt length the prediction assumes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--predict-only", action="store_true", help="write the predictions to --out and stop")
    ap.add_argument("--predictions", help="a --predict-only file made for this same grid")
    ap.add_argument("--separate-machines", action="store_true",
                    help="predict without the profile's shared-core room")
    ap.add_argument("--in-process-delay", action="store_true",
                    help="rooms on loopback, the round trip applied in the device processes")
    ap.add_argument("--pin", type=int, default=0, metavar="K", help="pin each device process to K CPUs of its own")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pred = json.loads(Path(a.predictions).read_text()) if a.predictions else predict_all(a)
    if a.predict_only:
        Path(a.out).write_text(json.dumps(pred, indent=1))
        return
    rows = []
    machine = machine_notes()
    clients = [int(x) for x in a.clients.split(",")]
    # a SIGTERM (timeout's) unwinds through the finally below, so the served room is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for rtt, n, sets in _grid(a):
        srv = Served(a.scenario, sets, loopback=rtt.strip() in ("0ms", "0", "0 ms"),
                     in_process_delay=a.in_process_delay)
        try:
            srv.wait_ready()
            pinned = pin_room(srv.proc.pid, a.pin) if a.pin > 0 else None
            asyncio.run(_round(srv.url, 1, 1, WARM_UP_TOKENS))  # warm-up, not counted (predicted so too)
            for c in clients:
                load0 = os.getloadavg()[0]
                runs = [asyncio.run(_round(srv.url, c, a.per_client, a.max_tokens)) for _ in range(a.repeats)]
                p = pred["predicted"][_key(rtt, n, c)]
                row = {"rtt": rtt, "questions_in_flight": n, "clients": c, "predicted": p,
                       "measured": _summary(runs), "runs": runs, "load_1min": [load0, os.getloadavg()[0]],
                       "ended_utc": time.strftime("%H:%M:%S", time.gmtime()), "pinned": pinned}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("rtt", "questions_in_flight", "clients")}),
                      f"predicted {p['aggregate_tokens_per_s']:.1f} tok/s,",
                      f"measured {row['measured']['aggregate_tokens_per_s']['median']:.1f} tok/s", flush=True)
                Path(a.out).write_text(json.dumps({"prediction": {k: v for k, v in pred.items() if k != "predicted"},
                                                   "machine": machine, "in_process_delay": a.in_process_delay,
                                                   "rows": rows}, indent=1))
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
