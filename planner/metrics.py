"""Every number a room report shows, computed from a trace.

One module for predicted (simulator) and measured (runtime) numbers, so the two are
computed by the same code. Input: ``(t_s, obj)`` pairs of :mod:`planner.trace`.

Definitions (seconds, tokens):

* ``ttft_s``: mean over answered questions of first answer token time minus the time
  the room began answering it (BeginAnswer; queue wait is ``queue_wait_s``);
  ``ttft_each_s`` the same per question, by question id.
* ``tokens_per_s``: decode speed, sum over questions of (answer tokens - 1) divided by
  the sum of (last token time - first token time).
* ``aggregate_tokens_per_s``: every answer token of every question divided by the
  span from the first question asked to the last answer token (what a room answering
  several questions at once delivers in all; ``tokens_per_s`` is one question's rate).
* ``ttft_asked_s``: first answer token minus the time the question was asked (queue
  wait included), ``p50`` and ``p99`` over answered questions.
* ``inter_token_s``: gaps between consecutive answer tokens of a question, pooled;
  tokens accepted together in one verify lap arrive with a gap of 0.
* ``lap_s``: a decode or verify lap that was not stale, from the host starting its
  stage (RunStage) to the lap being judged (LapEnded), head and sampling included.
* ``tokens_per_lap``: tokens kept per such lap; ``drafted_per_lap`` drafts per such lap
  (0 for plain decoding; with ``draft_tokens: auto`` the mean of the k chosen).
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
    """Metrics of a trace: the ``metrics`` keys ``simulate --json`` prints plus details.

    Returns a dict with ``tokens_per_s, ttft_s, tokens_per_lap, inter_token_s{p50,p95,
    p99,max}, lap_s{mean,p50,p99}`` and ``questions, answered, refused, tokens, laps,
    stale_laps, queue_wait_s, breakdown[{part, kind, mean_s}], duration_s``.
    """
    acc = Accumulator()
    add = acc.add
    for t, o in trace:
        add(t, o)
    return acc.result()


class Accumulator:
    """:func:`compute`, one record at a time, so a driver can feed records as it makes
    them instead of keeping a trace.

    :meth:`add` takes any ``(t_s, obj)`` record in trace order. A driver that knows a
    worker's stage or a hop as a whole may instead write its seconds into ``stage_s``
    (``(device, lap) -> seconds``) / ``hop_s`` (``(src, dst, lap) -> seconds``), the
    same numbers as the RunStage/StageFinished or SendFrame/FrameArrived pair,
    and call :meth:`sent` for a SendFrame whose FrameArrived comes later through
    :meth:`add`; records of one device, one link or one lap must still come in time
    order, but different ones may interleave out of time order (the sums per device
    and per link are then taken in the same order as from the sorted trace). Such a
    driver reports the times of the records it did not :meth:`add` with :meth:`seen`.
    ``duration_s`` spans the first record added to the last one added, or to the
    latest time seen when that is later.
    """

    __slots__ = ("asked", "begin", "drafted_laps", "emits", "answered", "refused", "stage_start", "stage_s",
                 "send_t", "hop_s", "head_start", "head_s", "draft_start", "draft_total", "drafts", "host_start", "host", "laps",
                 "stale", "t_first", "t_last", "t_seen", "_redeal_seen", "_records")

    def __init__(self) -> None:
        self.asked: dict[int, float] = {}
        self.begin: dict[int, float] = {}
        self.emits: dict[int, list[float]] = defaultdict(list)
        self.answered = self.refused = 0
        self.stage_start: dict[tuple[str, int], float] = {}
        self.stage_s: dict[tuple[str, int], float] = {}
        self.send_t: dict[tuple[str, str, int], float] = {}
        self.hop_s: dict[tuple[str, str, int], float] = {}
        self.head_start: dict[int, float] = {}
        self.head_s: dict[int, float] = {}
        self.draft_start: dict[int, float] = {}
        self.draft_total = 0.0
        self.drafts = 0
        self.host_start: dict[int, float] = {}
        self.host: str | None = None
        self.laps: list[tuple[int, float, int]] = []  # (lap, duration, kept)
        self.drafted_laps: list[int] = []  # drafts of each of those laps
        self.stale = 0
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.t_seen: float | None = None
        self._redeal_seen = False
        self._records: list[tuple[float, Any]] = []  # the records recoveries() needs

    # -- feeding ------------------------------------------------------------------------

    def add(self, t: float, o: Any) -> None:
        """One trace record ``(t_s, obj)``; records of kinds no metric uses are counted
        in the duration only."""
        if self.t_first is None:
            self.t_first = t
        self.t_last = t
        h = _HANDLERS.get(type(o))
        if h is not None:
            h(self, t, o)

    def add_all(self, t: float, first: Any, rest: Iterable[Any]) -> None:
        """``add(t, first)`` then ``add(t, o)`` for each ``o`` of ``rest``: the records a
        driver makes at one instant (an event and the commands it gave)."""
        if self.t_first is None:
            self.t_first = t
        self.t_last = t
        get = _HANDLERS.get
        h = get(type(first))
        if h is not None:
            h(self, t, first)
        for o in rest:
            h = get(type(o))
            if h is not None:
                h(self, t, o)

    def seen(self, t: float) -> None:
        """A record at ``t`` was made out of trace order (not through :meth:`add`): the
        duration reaches at least ``t``."""
        if self.t_seen is None or t > self.t_seen:
            self.t_seen = t

    def sent(self, src: str, dst: str, lap_id: int, t: float) -> None:
        """A SendFrame of lap ``lap_id`` at ``t`` (its FrameArrived comes later)."""
        self.send_t[(src, dst, lap_id)] = t

    # -- one kind each ------------------------------------------------------------------

    def _asked(self, t, o):
        self.asked[o.question_id] = t

    def _begin(self, t, o):
        self.begin[o.question_id] = t

    def _emit(self, t, o):
        self.emits[o.question_id].append(t)
        if self._redeal_seen:
            self._records.append((t, o))

    def _done(self, t, o):
        self.answered += 1

    def _refuse(self, t, o):
        self.refused += 1

    def _run_stage(self, t, o):
        self.stage_start[(o.device, o.lap_id)] = t
        if o.inputs:
            self.host = o.device
            self.host_start[o.lap_id] = t

    def _stage_finished(self, t, o):
        key = (o.device, o.lap_id)
        s0 = self.stage_start.pop(key, None)
        if s0 is not None:
            self.stage_s[key] = t - s0

    def _send(self, t, o):
        self.send_t[(o.src, o.dst, o.header.lap_id)] = t

    def _arrived(self, t, o):
        key = (o.src, o.device, o.header.lap_id)
        s0 = self.send_t.pop(key, None)
        if s0 is not None:
            self.hop_s[key] = t - s0

    def _run_head(self, t, o):
        self.head_start[o.lap_id] = t

    def _head_finished(self, t, o):
        s0 = self.head_start.pop(o.lap_id, None)
        if s0 is not None:
            self.head_s[o.lap_id] = t - s0

    def _draft(self, t, o):
        self.draft_start[o.draft_id] = t

    def _draft_ready(self, t, o):
        s0 = self.draft_start.pop(o.draft_id, None)
        if s0 is not None:
            self.draft_total += t - s0
            self.drafts += 1

    def _lap_ended(self, t, o):
        if o.kind in ("prefill", "replay"):  # decode and verify laps are the laps measured
            return
        if o.stale:
            self.stale += 1
        elif o.lap_id in self.host_start:
            self.laps.append((o.lap_id, t - self.host_start[o.lap_id], o.kept))
            self.drafted_laps.append(o.drafted)

    def _recovery(self, t, o):
        if type(o) is Redeal:
            self._redeal_seen = True
        self._records.append((t, o))

    # -- result -------------------------------------------------------------------------

    def result(self) -> dict:
        """The metrics dict (see :func:`compute`)."""
        laps, host = self.laps, self.host
        ttfts, waits, gaps, from_asked = [], [], [], []
        tok_sum = span_sum = 0.0
        n_tokens = 0
        last_emit = None
        for qid, ts in self.emits.items():
            n_tokens += len(ts)
            if ts and (last_emit is None or ts[-1] > last_emit):
                last_emit = ts[-1]
            if ts and qid in self.asked:
                from_asked.append(ts[0] - self.asked[qid])
            if qid in self.begin:
                ttfts.append(ts[0] - self.begin[qid])
                if qid in self.asked:
                    waits.append(self.begin[qid] - self.asked[qid])
            if len(ts) >= 2:
                tok_sum += len(ts) - 1
                span_sum += ts[-1] - ts[0]
                gaps.extend(b - a for a, b in zip(ts, ts[1:]))
        lap_durations = [d for _, d, _ in laps]
        judged = {lap for lap, _, _ in laps}
        parts: dict[tuple[str, str], float] = defaultdict(float)
        for (dev, lap), s in self.stage_s.items():
            if lap in judged:
                parts[("stage", dev)] += s
        for (src, dst, lap), s in self.hop_s.items():
            if lap in judged:
                parts[("hop", f"{src}->{dst}")] += s
        for lap, s in self.head_s.items():
            if lap in judged:
                parts[("head", host or "host")] += s
        n_laps = max(len(laps), 1)
        breakdown = [{"kind": k, "part": p, "mean_s": v / n_laps} for (k, p), v in parts.items()]
        if self.drafts:
            breakdown.append({"kind": "draft", "part": host or "host", "mean_s": self.draft_total / n_laps})
        order = {"stage": 0, "hop": 1, "head": 2, "draft": 3}
        breakdown.sort(key=lambda r: (order[r["kind"]], r["part"]))
        lap_arr = np.asarray(lap_durations) if lap_durations else np.zeros(1)
        recs = recoveries(self._records, t_first=self.t_first)
        done = [r["recovery_s"] for r in recs if r["recovery_s"] is not None]
        return {
            "recovery": recs,
            "recovery_s": max(done) if done else None,
            "tokens_per_s": tok_sum / span_sum if span_sum > 0 else 0.0,
            "ttft_s": float(np.mean(ttfts)) if ttfts else 0.0,
            "aggregate_tokens_per_s": (n_tokens / (last_emit - min(self.asked.values()))
                                       if self.asked and last_emit is not None
                                       and last_emit > min(self.asked.values()) else 0.0),
            "ttft_asked_s": {k: v for k, v in _pcts(from_asked).items() if k in ("p50", "p99")},
            "ttft_each_s": [self.emits[q][0] - self.begin[q] for q in sorted(self.emits) if q in self.begin],
            "tokens_per_lap": sum(k for _, _, k in laps) / len(laps) if laps else 0.0,
            "drafted_per_lap": sum(self.drafted_laps) / len(self.drafted_laps) if self.drafted_laps else 0.0,
            "inter_token_s": _pcts(gaps),
            "lap_s": {"mean": float(lap_arr.mean()), "p50": float(np.percentile(lap_arr, 50)),
                      "p99": float(np.percentile(lap_arr, 99))},
            "questions": len(set(self.asked) | set(self.begin)),
            "answered": self.answered,
            "refused": self.refused,
            "tokens": n_tokens,
            "laps": len(laps),
            "stale_laps": self.stale,
            "queue_wait_s": float(np.mean(waits)) if waits else 0.0,
            "breakdown": breakdown,
            "duration_s": (self._t_end() - self.t_first) if self.t_first is not None else 0.0,
        }

    def _t_end(self) -> float:
        end = self.t_last
        return end if self.t_seen is None or self.t_seen <= end else self.t_seen


#: record kind -> the Accumulator method that takes it (unbound: no reference cycle)
_HANDLERS = {QuestionAsked: Accumulator._asked, BeginAnswer: Accumulator._begin, EmitToken: Accumulator._emit,
             AnswerDone: Accumulator._done, Refuse: Accumulator._refuse, RunStage: Accumulator._run_stage,
             StageFinished: Accumulator._stage_finished, SendFrame: Accumulator._send,
             FrameArrived: Accumulator._arrived, RunHead: Accumulator._run_head,
             HeadFinished: Accumulator._head_finished, Draft: Accumulator._draft,
             DraftReady: Accumulator._draft_ready, LapEnded: Accumulator._lap_ended,
             DeviceLost: Accumulator._recovery, Redeal: Accumulator._recovery, ChainReady: Accumulator._recovery,
             WeightsCopied: Accumulator._recovery}


def recoveries(trace: Iterable[tuple[float, Any]], t_first: float | None = None) -> list[dict]:
    """The timeline of every re-deal after a lost device (see module doc, ``recovery``).
    ``t_first``: the time of the whole trace's first record when ``trace`` holds only
    some of its records (default: the first record's time)."""
    out: list[dict] = []
    lost: dict[str, tuple[float, float]] = {}  # device -> (lost at, detected at)
    ready: dict[int, dict] = {}  # first lap -> its record
    by_lap: dict[int, dict] = {}  # first lap -> its record (kept after ChainReady)
    waiting: list[dict] = []  # ready, no token yet
    for t, o in trace:
        t_first = t if t_first is None else t_first
        cls = type(o)
        if cls is DeviceLost:
            lost.setdefault(o.device, (o.silent_since_s if o.silent_since_s is not None else t, t))
        elif cls is Redeal and o.back is None:  # a re-deal after a loss (not a device taken back)
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


#: the kinds of :func:`first_token_parts` (``other``: what no record of the first token's lap spans)
FIRST_TOKEN_KINDS = ("stage", "hop", "head", "other")


def first_token_parts(trace: Iterable[tuple[float, Any]]) -> dict:
    """Each answered question's first token (``ttft_s``: BeginAnswer -> first EmitToken)
    split along the lap that made it, the prompt's last prefill chunk (the one that comes
    back to the host), into parts that add up to it:

    * ``stage`` of the model host: from the host starting the question's first chunk
      (its first RunStage) to finishing this chunk (StageFinished): every chunk's embed
      and compute on the host, one after another;
    * ``stage`` of each worker: from the chunk's frame arriving (FrameArrived) to the
      worker finishing it (StageFinished): its compute and its wait behind the earlier
      chunks' compute there;
    * ``hop`` of each link: SendFrame -> FrameArrived of this chunk's frame (the frame's
      bytes, and its wait behind the earlier chunks' frames for the transport's window);
    * ``head``: RunHead -> HeadFinished of the lap;
    * ``other``: ``ttft`` less all of those (BeginAnswer -> the first RunStage, and any
      wait between one record of the lap and the next).

    Returns ``{"ttft_s", "stage_s", "hop_s", "head_s", "other_s"}`` (means over the
    questions, as ``ttft_s`` of :func:`compute`), ``"parts"`` (``{"stage:DEVICE"`` /
    ``"hop:SRC->DST": mean seconds}``) and ``"each"`` (one such dict, without ``each``,
    per question, in question order). Empty means (0.0) and ``each == []`` when no
    question was answered."""
    begin: dict[int, float] = {}
    first_run: dict[int, float] = {}
    first_emit: dict[int, float] = {}
    lap_q: dict[int, int] = {}  # lap -> question (RunStage carries it)
    ended: dict[int, int] = {}  # question -> the first lap judged with a token kept
    fin: dict[tuple[int, str], float] = {}
    send: dict[tuple[int, str, str], float] = {}
    arrive: dict[tuple[int, str, str], float] = {}
    run_head: dict[int, float] = {}
    head_fin: dict[int, float] = {}
    host: dict[int, str] = {}  # lap -> the device that embedded its inputs
    for t, o in trace:
        cls = type(o)
        if cls is BeginAnswer:
            begin.setdefault(o.question_id, t)
        elif cls is RunStage:
            lap_q.setdefault(o.lap_id, o.question_id)
            if o.inputs:
                host[o.lap_id] = o.device
                first_run.setdefault(o.question_id, t)
        elif cls is StageFinished:
            fin.setdefault((o.lap_id, o.device), t)
        elif cls is SendFrame:
            send.setdefault((o.header.lap_id, o.src, o.dst), t)
        elif cls is FrameArrived:
            arrive.setdefault((o.header.lap_id, o.src, o.device), t)
        elif cls is RunHead:
            run_head.setdefault(o.lap_id, t)
        elif cls is HeadFinished:
            head_fin.setdefault(o.lap_id, t)
        elif cls is LapEnded:
            if o.kept and not o.stale:
                ended.setdefault(o.question_id, o.lap_id)
        elif cls is EmitToken:
            first_emit.setdefault(o.question_id, t)
    each = []
    for q in sorted(first_emit):
        if q not in begin or q not in ended:
            continue
        lap = ended[q]
        ttft = first_emit[q] - begin[q]
        parts: dict[str, float] = {}
        h = host.get(lap)
        arrived: dict[str, float] = {}  # this lap's first frame at each device
        for (lp, _, dst), a in arrive.items():
            if lp == lap:
                arrived.setdefault(dst, a)
        for (lp, dev), t in fin.items():
            if lp != lap:
                continue
            start = first_run.get(q) if dev == h else arrived.get(dev)
            if start is not None:
                parts[f"stage:{dev}"] = t - start
        for (lp, src, dst), t in send.items():
            if lp == lap and (lap, src, dst) in arrive:
                parts[f"hop:{src}->{dst}"] = arrive[(lap, src, dst)] - t
        head = head_fin[lap] - run_head[lap] if lap in run_head and lap in head_fin else 0.0
        rec = {"ttft_s": ttft, "parts": parts, "head_s": head,
               "stage_s": sum(v for k, v in parts.items() if k.startswith("stage:")),
               "hop_s": sum(v for k, v in parts.items() if k.startswith("hop:"))}
        rec["other_s"] = ttft - rec["stage_s"] - rec["hop_s"] - head
        each.append(rec)
    n = max(len(each), 1)
    names = sorted({k for e in each for k in e["parts"]})
    out = {k: sum(e[k] for e in each) / n for k in ("ttft_s", "stage_s", "hop_s", "head_s", "other_s")}
    out["parts"] = {k: sum(e["parts"].get(k, 0.0) for e in each) / n for k in names}
    out["each"] = each
    return out
