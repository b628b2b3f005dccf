"""Serve throughput under concurrent clients, predicted first and then measured.

    python scripts/serve_load.py scenarios/home.yaml --calibration cal.yaml \\
        --in-flight 1,2,3,4 --clients 1,2,4,8 --rtt 0ms,40ms --repeats 3 --out serve-load.json

For each round trip and each ``decoding.questions_in_flight`` N, it first predicts
every client count with the simulator (``workload.clients`` C, the calibration profile,
before any room runs), then starts ``splitroom serve`` once (namespaces with the round
trip; ``--loopback`` when the round trip is 0 ms) and, for each client count, runs C
clients at once through the ``openai`` client, each asking ``--per-client`` questions
one after another (greedy, ``--max-tokens`` each), ``--repeats`` times. A client's token
times are the stream's chunks with text. Reported per configuration (median and spread
over the repeats): aggregate tokens/s (all tokens over the span from the first request
to the last token), per-client inter-token p50/p99 and time to first token p50/p99
(request sent to first token, queue wait included).
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

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.", "Name three primary colours.",
           "What is 12 times 12?", "Give me a word that rhymes with cat.", "What does a bee make?",
           "Say hello in Spanish.", "What colour is the sky on a clear day?"]


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def predict(scenario: str, sets: list[str], calibration: str | None, clients: int, questions: int,
            prompt_tokens: int, answer_tokens: int) -> dict:
    """The simulator's aggregate tokens/s, inter-token and time-to-first-token (from asked)."""
    from splitroom.calibration import apply_profile, load_profile
    from splitroom.scenario import load
    from sim.driver import simulate
    scn = load(scenario, sets + [f"workload.clients={clients}", f"workload.questions={questions}",
                                 f"workload.prompt_tokens={prompt_tokens}", f"workload.answer_tokens={answer_tokens}"])
    if calibration:
        scn = apply_profile(scn, load_profile(calibration))
    m = simulate(scn, trace=False).metrics
    return {"aggregate_tokens_per_s": m["aggregate_tokens_per_s"], "inter_token_p50_s": m["inter_token_s"]["p50"],
            "inter_token_p99_s": m["inter_token_s"]["p99"], "ttft_p50_s": m["ttft_asked_s"]["p50"],
            "ttft_p99_s": m["ttft_asked_s"]["p99"]}


class Served:
    """One ``splitroom serve`` process (started in its own process group, ended by pid)."""

    def __init__(self, scenario: str, sets: list[str], loopback: bool, calibration: str | None):
        argv = [sys.executable, "-c", "from splitroom.cli import main; main()", "serve", scenario, "--port", "0"]
        argv += ["--loopback"] if loopback else []
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


async def _client(url: str, i: int, n: int, max_tokens: int, t0: list) -> list[dict]:
    cl = openai.AsyncOpenAI(base_url=url + "/v1", api_key=f"load-{i}", max_retries=0, timeout=600.0)
    out = []
    try:
        for j in range(n):
            prompt = PROMPTS[(i + j * 3) % len(PROMPTS)]
            sent = time.monotonic()
            t0.append(sent)
            times = []
            stream = await cl.chat.completions.create(model=BUNDLED_MODEL_ID, stream=True, max_tokens=max_tokens,
                                                      messages=[{"role": "user", "content": prompt}])
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(time.monotonic())
            out.append({"sent": sent, "times": times})
    finally:
        await cl.close()
    return out


async def _round(url: str, clients: int, per_client: int, max_tokens: int) -> dict:
    t0: list = []
    res = await asyncio.gather(*[_client(url, i, per_client, max_tokens, t0) for i in range(clients)])
    first = min(t0)
    last = max(q["times"][-1] for c in res for q in c if q["times"])
    tokens = sum(len(q["times"]) for c in res for q in c)
    gaps_p50, gaps_p99, ttfts = [], [], []
    for c in res:
        gaps = [b - a for q in c for a, b in zip(q["times"], q["times"][1:])]
        p = _pcts(gaps)
        gaps_p50.append(p["p50"])
        gaps_p99.append(p["p99"])
        ttfts += [q["times"][0] - q["sent"] for q in c if q["times"]]
    return {"aggregate_tokens_per_s": tokens / (last - first), "tokens": tokens,
            "inter_token_p50_s_worst_client": max(x for x in gaps_p50 if x is not None),
            "inter_token_p50_s_median_client": statistics.median(x for x in gaps_p50 if x is not None),
            "inter_token_p99_s_worst_client": max(x for x in gaps_p99 if x is not None),
            "ttft_p50_s": _pcts(ttfts)["p50"], "ttft_p99_s": _pcts(ttfts)["p99"]}


def _summary(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        xs = [r[k] for r in runs]
        out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return out


def main() -> None:
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
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for rtt in a.rtt.split(","):
        for n in [int(x) for x in a.in_flight.split(",")]:
            sets = a.sets + [f"network.rtt={rtt}", f"decoding.questions_in_flight={n}"]
            clients = [int(x) for x in a.clients.split(",")]
            preds = {c: predict(a.scenario, sets, a.calibration, c, c * a.per_client, a.prompt_tokens, a.max_tokens)
                     for c in clients}
            srv = Served(a.scenario, sets, loopback=rtt.strip() in ("0ms", "0", "0 ms"), calibration=a.calibration)
            try:
                srv.wait_ready()
                asyncio.run(_round(srv.url, 1, 1, 8))  # warm-up, not counted
                for c in clients:
                    runs = [asyncio.run(_round(srv.url, c, a.per_client, a.max_tokens)) for _ in range(a.repeats)]
                    row = {"rtt": rtt, "questions_in_flight": n, "clients": c, "predicted": preds[c],
                           "measured": _summary(runs), "runs": runs}
                    rows.append(row)
                    print(json.dumps({k: row[k] for k in ("rtt", "questions_in_flight", "clients")}),
                          f"predicted {preds[c]['aggregate_tokens_per_s']:.1f} tok/s,",
                          f"measured {row['measured']['aggregate_tokens_per_s']['median']:.1f} tok/s", flush=True)
                    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))
            finally:
                srv.stop()
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
