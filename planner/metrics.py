"""Every number a room report shows, computed from a trace.

One module for predicted (simulator) and measured (runtime) numbers, so the two are
computed by the same code. Input: ``(t_s, obj)`` pairs of :mod:`planner.trace`.

Definitions (seconds, tokens):

* ``ttft_s``: mean over answered questions of first answer token time minus the time
  the room began answering it (BeginAnswer; queue wait is ``queue_wait_s``).
* ``tokens_per_s``: decode speed, sum over questions of (answer tokens - 1) divided by
  the sum of (last token time - first token time).
* ``inter_token_s``: gaps between consecutive answer tokens of a question, pooled;
  tokens accepted together in one verify lap arrive with a gap of 0.
* ``lap_s``: a decode or verify lap that was not stale, from the host starting its
  stage (RunStage) to the lap being judged (LapEnded), head and sampling included.
* ``tokens_per_lap``: tokens kept per such lap.
* ``breakdown``: mean seconds per judged lap spent in each part: each device's stage
  compute (RunStage -> StageFinished), each hop (SendFrame -> FrameArrived), the
  host's head (RunHead -> HeadFinished) and drafting (Draft -> DraftReady).
* ``recovery``: per re-deal after a lost device, ``lost_at_s`` (when it was last heard
  from, else when it was noticed), ``detected_at_s`` (DeviceLost), ``ready_at_s`` (the
  new chain ready: ChainReady), ``next_token_at_s`` (the first answer token after it)
  and ``recovery_s`` = next token - lost; ``into_run_s`` is when it was lost counted from
  the trace's first record; ``recovery_s`` is the longest (None: none). ``copies``
  lists the weights each device of the new chain got (WeightsCopied: device, source,
  layers, bytes, seconds) and ``copy_s`` is the longest of them (None: none recorded).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from planner.protocol import (AnswerDone, BeginAnswer, ChainReady, DeviceLost, Draft, DraftReady, EmitToken,
                              FrameArrived, HeadFinished, LapEnded, QuestionAsked, Redeal, Refuse, RunHead, RunStage,
                              SendFrame, StageFinished, WeightsCopied)


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    a = np.asarray(xs, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(a.max())}


def compute(trace: Iterable[tuple[float, Any]]) -> dict:
    """Metrics of a trace: the SCENARIO.md ``metrics`` keys plus details.

    Returns a dict with ``tokens_per_s, ttft_s, tokens_per_lap, inter_token_s{p50,p95,
    p99,max}, lap_s{mean,p50,p99}`` and ``questions, answered, refused, tokens, laps,
    stale_laps, queue_wait_s, breakdown[{part, kind, mean_s}], duration_s``.
    """
    trace = list(trace)
    asked: dict[int, float] = {}
    begin: dict[int, float] = {}
    emits: dict[int, list[float]] = defaultdict(list)
    answered = refused = 0
    stage_start: dict[tuple[str, int], float] = {}
    stage_s: dict[tuple[str, int], float] = {}
    send_t: dict[tuple[str, str, int], float] = {}
    hop_s: dict[tuple[str, str, int], float] = {}
    head_start: dict[int, float] = {}
    head_s: dict[int, float] = {}
    draft_start: dict[int, float] = {}
    draft_total = 0.0
    drafts = 0
    host_start: dict[int, float] = {}
    host = None
    laps: list[tuple[int, float, int]] = []  # (lap, duration, kept)
    stale = 0
    t_first = t_last = None
    for t, o in trace:
        t_first = t if t_first is None else t_first
        t_last = t
        cls = type(o)
        if cls is QuestionAsked:
            asked[o.question_id] = t
        elif cls is BeginAnswer:
            begin[o.question_id] = t
        elif cls is EmitToken:
            emits[o.question_id].append(t)
        elif cls is AnswerDone:
            answered += 1
        elif cls is Refuse:
            refused += 1
        elif cls is RunStage:
            stage_start[(o.device, o.lap_id)] = t
            if o.inputs:
                host = o.device
                host_start[o.lap_id] = t
        elif cls is StageFinished:
            s0 = stage_start.pop((o.device, o.lap_id), None)
            if s0 is not None:
                stage_s[(o.device, o.lap_id)] = t - s0
        elif cls is SendFrame:
            send_t[(o.src, o.dst, o.header.lap_id)] = t
        elif cls is FrameArrived:
            s0 = send_t.pop((o.src, o.device, o.header.lap_id), None)
            if s0 is not None:
                hop_s[(o.src, o.device, o.header.lap_id)] = t - s0
        elif cls is RunHead:
            head_start[o.lap_id] = t
        elif cls is HeadFinished:
            s0 = head_start.pop(o.lap_id, None)
            if s0 is not None:
                head_s[o.lap_id] = t - s0
        elif cls is Draft:
            draft_start[o.draft_id] = t
        elif cls is DraftReady:
            s0 = draft_start.pop(o.draft_id, None)
            if s0 is not None:
                draft_total += t - s0
                drafts += 1
        elif cls is LapEnded:
            if o.kind in ("prefill", "replay"):  # decode and verify laps are the laps measured
                continue
            if o.stale:
                stale += 1
            elif o.lap_id in host_start:
                laps.append((o.lap_id, t - host_start[o.lap_id], o.kept))

    ttfts, waits, gaps = [], [], []
    tok_sum = span_sum = 0.0
    n_tokens = 0
    for qid, ts in emits.items():
        n_tokens += len(ts)
        if qid in begin:
            ttfts.append(ts[0] - begin[qid])
            if qid in asked:
                waits.append(begin[qid] - asked[qid])
        if len(ts) >= 2:
            tok_sum += len(ts) - 1
            span_sum += ts[-1] - ts[0]
            gaps.extend(b - a for a, b in zip(ts, ts[1:]))
    lap_durations = [d for _, d, _ in laps]
    judged = {lap for lap, _, _ in laps}
    parts: dict[tuple[str, str], float] = defaultdict(float)
    for (dev, lap), s in stage_s.items():
        if lap in judged:
            parts[("stage", dev)] += s
    for (src, dst, lap), s in hop_s.items():
        if lap in judged:
            parts[("hop", f"{src}->{dst}")] += s
    for lap, s in head_s.items():
        if lap in judged:
            parts[("head", host or "host")] += s
    n_laps = max(len(laps), 1)
    breakdown = [{"kind": k, "part": p, "mean_s": v / n_laps} for (k, p), v in parts.items()]
    if drafts:
        breakdown.append({"kind": "draft", "part": host or "host", "mean_s": draft_total / n_laps})
    order = {"stage": 0, "hop": 1, "head": 2, "draft": 3}
    breakdown.sort(key=lambda r: (order[r["kind"]], r["part"]))
    lap_arr = np.asarray(lap_durations) if lap_durations else np.zeros(1)
    recs = recoveries(trace)
    done = [r["recovery_s"] for r in recs if r["recovery_s"] is not None]
    return {
        "recovery": recs,
        "recovery_s": max(done) if done else None,
        "tokens_per_s": tok_sum / span_sum if span_sum > 0 else 0.0,
        "ttft_s": float(np.mean(ttfts)) if ttfts else 0.0,
        "tokens_per_lap": sum(k for _, _, k in laps) / len(laps) if laps else 0.0,
        "inter_token_s": _pcts(gaps),
        "lap_s": {"mean": float(lap_arr.mean()), "p50": float(np.percentile(lap_arr, 50)),
                  "p99": float(np.percentile(lap_arr, 99))},
        "questions": len(set(asked) | set(begin)),
        "answered": answered,
        "refused": refused,
        "tokens": n_tokens,
        "laps": len(laps),
        "stale_laps": stale,
        "queue_wait_s": float(np.mean(waits)) if waits else 0.0,
        "breakdown": breakdown,
        "duration_s": (t_last - t_first) if t_first is not None else 0.0,
    }


def recoveries(trace: Iterable[tuple[float, Any]]) -> list[dict]:
    """The timeline of every re-deal after a lost device (see module doc, ``recovery``)."""
    out: list[dict] = []
    lost: dict[str, tuple[float, float]] = {}  # device -> (lost at, detected at)
    ready: dict[int, dict] = {}  # first lap -> its record
    by_lap: dict[int, dict] = {}  # first lap -> its record (kept after ChainReady)
    waiting: list[dict] = []  # ready, no token yet
    t_first = None
    for t, o in trace:
        t_first = t if t_first is None else t_first
        cls = type(o)
        if cls is DeviceLost:
            lost.setdefault(o.device, (o.silent_since_s if o.silent_since_s is not None else t, t))
        elif cls is Redeal:
            at, seen = lost.get(o.lost, (t, t))
            rec = {"device": o.lost, "lost_at_s": at, "into_run_s": at - t_first, "detected_at_s": seen,
                   "ready_at_s": None,
                   "next_token_at_s": None, "recovery_s": None, "replay_tokens": o.replay_tokens,
                   "copies": [], "copy_s": None}
            out.append(rec)
            ready[o.first_lap] = rec
            by_lap[o.first_lap] = rec
        elif cls is WeightsCopied and o.first_lap in by_lap:
            rec = by_lap[o.first_lap]
            rec["copies"].append({"device": o.device, "source": o.source, "start": o.start, "end": o.end,
                                  "nbytes": o.nbytes, "seconds": o.seconds})
            rec["copy_s"] = max(rec["copy_s"] or 0.0, o.seconds)
        elif cls is ChainReady and o.first_lap in ready:
            rec = ready.pop(o.first_lap)
            rec["ready_at_s"] = t
            waiting.append(rec)
        elif cls is EmitToken and waiting:
            for rec in waiting:
                rec["next_token_at_s"] = t
                rec["recovery_s"] = t - rec["lost_at_s"]
            waiting.clear()
    return out
