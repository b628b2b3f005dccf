"""Pictures of a run (matplotlib): a timeline of a few laps and the latency distribution."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from planner.protocol import (Draft, DraftReady, EmitToken, FrameArrived, HeadFinished, LapEnded, RunHead,  # noqa: E402
                              RunStage, SendFrame, StageFinished)


# event or command -> (what it draws, the key pairing a start with its finish)
_SPANS = {
    RunStage: ("layers", lambda o: (o.device, o.lap_id)),
    StageFinished: ("layers", lambda o: (o.device, o.lap_id)),
    RunHead: ("head", lambda o: o.lap_id),
    HeadFinished: ("head", lambda o: o.lap_id),
    Draft: ("draft", lambda o: o.draft_id),
    DraftReady: ("draft", lambda o: o.draft_id),
    SendFrame: ("hop", lambda o: (o.src, o.dst, o.header.lap_id)),
    FrameArrived: ("hop", lambda o: (o.src, o.device, o.header.lap_id)),
}
_STARTS = (RunStage, RunHead, Draft, SendFrame)


def _intervals(trace, t0: float, t1: float):
    """Compute intervals (device, start, end, what) and hops (src, dst, start, end)
    overlapping [t0, t1]: each start command paired with its finish event."""
    open_: dict = {}
    boxes, hops = [], []
    host = None
    for t, o in trace:
        span = _SPANS.get(type(o))
        if span is None:
            continue
        what, key = span
        if type(o) in _STARTS:
            open_[(what, key(o))] = t
            if type(o) is RunStage and o.inputs:
                host = o.device
            continue
        s = open_.pop((what, key(o)), None)
        if s is None or s >= t1 or t <= t0:
            continue
        if what == "hop":
            hops.append((o.src, o.device, s, t))
        else:
            boxes.append((o.device if what == "layers" else host, s, t, what))
    return boxes, hops


def _hist_bins(values: np.ndarray, bins: int = 60) -> dict:
    """Histogram arguments for ``values``: ``bins`` equal bins over their range, or one
    bar 1 unit wide when the range is too narrow for ``bins`` finite bins (all gaps
    equal, or equal up to rounding: numpy would raise "Too many bins for data range")."""
    lo, hi = float(np.min(values)), float(np.max(values))
    if hi - lo <= 1e-9 * max(1.0, abs(lo), abs(hi)) * bins:
        return {"bins": 1, "range": (lo - 0.5, hi + 0.5)}
    return {"bins": bins, "range": (lo, hi)}


def plot_run(result, path: str, title: str = "", laps: int = 6) -> None:
    """Write a PNG: top, a timeline of ``laps`` decode laps (devices as rows: layer
    compute, head, draft as bars, hops as lines); bottom, the inter-token latency
    histogram with p50/p99 marked."""
    trace = result.trace
    deal = result.deal
    rows = [deal.host] + [s.device for s in deal.stages if s.device != deal.host]
    ends = [t for t, o in trace if isinstance(o, LapEnded) and o.kind != "prefill" and not o.stale]
    starts = [t for t, o in trace if isinstance(o, RunStage) and o.inputs]
    if len(ends) > laps + 2:
        mid = len(ends) // 3
        t0, t1 = ends[mid], ends[mid + laps]
    elif starts:
        t0, t1 = starts[0], trace[-1][0]
    else:
        t0, t1 = 0.0, 1.0
    boxes, hops = _intervals(trace, t0, t1)
    colors = {"layers": "#4C72B0", "head": "#DD8452", "draft": "#55A868"}
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 7.5), gridspec_kw={"height_ratios": [3, 2]})
    ypos = {d: i for i, d in enumerate(rows)}
    for dev, s, e, what in boxes:
        if dev in ypos:
            ax.broken_barh([(1000 * (s - t0), 1000 * (e - s))], (ypos[dev] - 0.3, 0.6), color=colors[what])
    for src, dst, s, e in hops:
        if src in ypos and dst in ypos:
            ax.plot([1000 * (s - t0), 1000 * (e - t0)], [ypos[src], ypos[dst]], color="0.5", lw=0.8)
    for t, o in trace:
        if isinstance(o, EmitToken) and t0 <= t <= t1:
            ax.axvline(1000 * (t - t0), color="#C44E52", lw=0.6, alpha=0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{d}\n(host)" if d == deal.host else d for d in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1000 * (t1 - t0))
    ax.set_xlabel("time (ms)", labelpad=2)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles += [plt.Line2D([0], [0], color="0.5"), plt.Line2D([0], [0], color="#C44E52")]
    ax.legend(handles, ["layers", "output head", "draft", "hop", "token out"], loc="upper center", fontsize=8,
              ncol=5, bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.set_title(f"{title}\n{laps} laps" if title else f"{laps} laps")
    emits: dict[int, list[float]] = {}
    for t, o in trace:
        if isinstance(o, EmitToken):
            emits.setdefault(o.question_id, []).append(t)
    gaps = np.array([b - a for ts in emits.values() for a, b in zip(ts, ts[1:])]) * 1000
    if gaps.size:
        bx.hist(gaps, **_hist_bins(gaps), color="#4C72B0")
        for q, ls in ((50, "--"), (99, ":")):
            v = np.percentile(gaps, q)
            bx.axvline(v, color="k", ls=ls, lw=1)
            bx.text(v, bx.get_ylim()[1] * 0.9, f" p{q} {v:.1f} ms", fontsize=8)
    bx.set_xlabel("inter-token latency (ms)")
    bx.set_ylabel("tokens")
    m = result.metrics
    bx.set_title(f"{m['tokens_per_s']:.1f} tok/s · TTFT {1000 * m['ttft_s']:.0f} ms · "
                 f"{m['tokens_per_lap']:.2f} tokens/lap", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows: list, path: str, title: str = "") -> None:
    """A horizontal bar chart of predicted tokens per second, one bar per combination
    (best at the top, the best bar highlighted); combinations that failed are left out.
    Writes a PNG to ``path``."""
    ok = [r for r in rows if r.get("error") is None]
    labels = [", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["values"]) for r in ok]
    vals = [r["tokens_per_s"] for r in ok]
    fig, ax = plt.subplots(figsize=(8, 0.35 * max(len(ok), 1) + 1.2))
    y = np.arange(len(ok))[::-1]
    colors = ["tab:green" if i == 0 else "tab:blue" for i in range(len(ok))]
    ax.barh(y, vals, color=colors)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("predicted tokens per second")
    ax.set_title(title or "sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
