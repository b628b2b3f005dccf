"""The calibration profile: what one measurement of a room's machines tells a prediction.

``splitroom calibrate SCENARIO --out PROFILE`` measures it (runtime/calibrate.py) and
writes it as versioned YAML; ``splitroom simulate --calibration PROFILE`` (or the
scenario key ``calibration:``) reads it and the simulator's cost model
(sim/devices.py) uses it instead of rooflines. The scheduler never sees it. This module
is the data model only: plain frozen dataclasses, their conversion to and from plain
mappings (``to_mapping`` / ``from_mapping``) and the interpolation the cost model
needs. It reads no file and no clock.

What a profile holds (all times in seconds, sizes in bytes):

* per device, the time of one pass of a stage as a function of the layers in it, the
  tokens in the pass and the context already cached:
  ``pass_s(L, n, c) = fixed_s(n, c) + L * per_layer_s(n, c)``, measured on a grid of
  ``n`` (1, 2, 3, 5, 9, 16, 64) and ``c`` (128, 512, 2048) and interpolated linearly
  in ``n`` and in ``c`` between grid points (extrapolated linearly beyond the last
  ``n`` and the last ``c``, clamped below the first); the device's output head (final
  norm + head + argmax) as a function of rows; the slowdown it was measured with;
* per drafter (``ngram``, ``early_exit``, ``model``): seconds per draft call of ``k``
  tokens and the accepted lengths of every draft made in a greedy speculative walk over
  a calibration prompt set, for each ``k`` measured, and the same walk prompt by prompt
  (``walks``: the distribution, for a bootstrap over prompts), on the built-in chat and
  grounded prompts and on the scenario's own ``workload.sample`` when it gives one;
* the transport: one-way seconds of a frame by size on the measuring machine, fitted
  as ``fixed_s + bytes * s_per_byte``, and the transport's initial congestion window;
* the compute noise of the calibration room (``stage_noise``): every decode lap's stage
  time over its stage's mean in that room, in lap order, the spread a prediction's
  range draws its compute factor from (:func:`block_mean`);
* what device processes that share one machine's cores add (``shared_host``): for a
  room of ``P`` device processes on the one calibrated machine, seconds on every pass
  and the factor of a prefill chunk's pass (a prompt's chunks are pipelined, so two
  stages compute at once on the shared cores), measured in a calibration room of ``P``
  processes (:meth:`Profile.on_one_host` applies it, through each device's
  ``prefill_ratio``). Real rooms are separate machines: nothing applies it unless the
  prediction says its devices run on one host.

Version :data:`PROFILE_VERSION`; a newer or older file is refused with its version.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

#: the drafters that run the model's layers: one forward pass per drafted token (runtime/calibrate.py walks them)
LAYER_DRAFTERS = ("early_exit", "model")

__all__ = ["LAYER_DRAFTERS", "PROFILE_VERSION", "WORKLOAD_KINDS", "SAMPLE", "ProfileError", "Curve", "PassCurve", "DeviceProfile",
           "DrafterProfile", "SharedHost", "TransportProfile", "Profile", "block_mean", "fit_line", "sample_workload"]

#: the profile format's version; bump on any incompatible change
PROFILE_VERSION = 1


class ProfileError(ValueError):
    """A profile mapping that is malformed: the message names the key path."""


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through the points, linear beyond the last segment,
    clamped to ``ys[0]`` below ``xs[0]``. ``xs`` strictly increasing."""
    if len(xs) == 1 or x <= xs[0]:
        return float(ys[0])
    i = bisect.bisect_right(xs, x) - 1
    if i >= len(xs) - 1:
        i = len(xs) - 2
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)``. One point: ``(y, 0)``.
    Raises ProfileError for no points or lengths that differ."""
    if not xs or len(xs) != len(ys):
        raise ProfileError("fit_line needs as many ys as xs, at least one")
    n = len(xs)
    if n == 1:
        return float(ys[0]), 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


@dataclass(frozen=True)
class Curve:
    """``y(x)`` through measured points, piecewise linear (see :func:`_interp`).
    ``xs`` strictly increasing, ``ys`` seconds, same length >= 1."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise ProfileError("a curve needs as many values as points, at least one")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ProfileError(f"curve points must increase strictly, got {list(self.xs)}")
        if not all(math.isfinite(y) and y >= 0 for y in self.ys):
            raise ProfileError(f"curve values must be finite and >= 0, got {list(self.ys)}")

    def __call__(self, x: float) -> float:
        return max(_interp(self.xs, self.ys, x), 0.0)

    def scaled(self, factor: float) -> "Curve":
        """The same curve with every value times ``factor`` (> 0)."""
        return Curve(self.xs, tuple(y * factor for y in self.ys))

    def shifted(self, seconds: float) -> "Curve":
        """The same curve with ``seconds`` added to every value (kept >= 0)."""
        return Curve(self.xs, tuple(max(y + seconds, 0.0) for y in self.ys))

    def to_mapping(self) -> dict:
        return {str(_num(x)): float(y) for x, y in zip(self.xs, self.ys)}

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "Curve":
        if not isinstance(m, Mapping) or not m:
            raise ProfileError(f"{where}: expected a mapping of point: seconds")
        try:
            pts = sorted((float(k), float(v)) for k, v in m.items())
        except (TypeError, ValueError):
            raise ProfileError(f"{where}: points and values must be numbers") from None
        try:
            return cls(tuple(p for p, _ in pts), tuple(v for _, v in pts))
        except ProfileError as e:
            raise ProfileError(f"{where}: {e}") from None


def _num(x: float):
    return int(x) if float(x).is_integer() else float(x)


@dataclass(frozen=True)
class PassCurve:
    """One device's pass time: ``fixed_s(n, c) + layers * per_layer_s(n, c)``.

    ``tokens`` and ``contexts`` are the grid (strictly increasing); ``fixed_s`` and
    ``per_layer_s`` are ``[len(contexts)][len(tokens)]`` seconds.
    """

    tokens: tuple[int, ...]
    contexts: tuple[int, ...]
    fixed_s: tuple[tuple[float, ...], ...]
    per_layer_s: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_layer_s"):
            grid = getattr(self, name)
            if len(grid) != len(self.contexts) or any(len(r) != len(self.tokens) for r in grid):
                raise ProfileError(f"{name}: expected {len(self.contexts)} rows of {len(self.tokens)} values")
            if not all(math.isfinite(v) for r in grid for v in r):
                raise ProfileError(f"{name}: values must be finite")
        for name in ("tokens", "contexts"):
            xs = getattr(self, name)
            if not xs or any(b <= a for a, b in zip(xs, xs[1:])) or xs[0] < 0:
                raise ProfileError(f"{name}: expected increasing non-negative values, got {list(xs)}")

    def _at(self, grid, tokens: float, context: float) -> float:
        per_ctx = [_interp(self.tokens, row, tokens) for row in grid]
        return _interp(self.contexts, per_ctx, context)

    def pass_s(self, layers: int, tokens: int, context: int) -> float:
        """Seconds of one pass of ``layers`` layers over ``tokens`` new positions with
        ``context`` positions already cached. 0 for no tokens; never negative.
        Raises ValueError for negative arguments."""
        if layers < 0 or tokens < 0 or context < 0:
            raise ValueError(f"layers, tokens, context must be >= 0, got {layers}, {tokens}, {context}")
        if tokens == 0:
            return 0.0
        t = self._at(self.fixed_s, tokens, context) + layers * self._at(self.per_layer_s, tokens, context)
        return max(t, 0.0)

    def scaled(self, factor: float) -> "PassCurve":
        """The same curve with every time times ``factor`` (a slowdown)."""
        return PassCurve(self.tokens, self.contexts, tuple(tuple(v * factor for v in r) for r in self.fixed_s),
                         tuple(tuple(v * factor for v in r) for r in self.per_layer_s))

    def shifted(self, seconds: float) -> "PassCurve":
        """The same curve with ``seconds`` more per pass (added to every fixed part)."""
        return PassCurve(self.tokens, self.contexts, tuple(tuple(v + seconds for v in r) for r in self.fixed_s),
                         self.per_layer_s)

    def to_mapping(self) -> dict:
        return {"tokens": list(self.tokens), "contexts": list(self.contexts),
                "fixed_s": [list(r) for r in self.fixed_s], "per_layer_s": [list(r) for r in self.per_layer_s]}

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "PassCurve":
        try:
            return cls(tuple(int(v) for v in m["tokens"]), tuple(int(v) for v in m["contexts"]),
                       tuple(tuple(float(v) for v in r) for r in m["fixed_s"]),
                       tuple(tuple(float(v) for v in r) for r in m["per_layer_s"]))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ProfileError):
                raise ProfileError(f"{where}: {e}") from None
            raise ProfileError(f"{where}: expected tokens, contexts, fixed_s and per_layer_s grids ({e})") from None


@dataclass(frozen=True)
class DeviceProfile:
    """One device as measured: its pass curve and head curve (rows -> seconds), both
    with ``slowdown`` (the emulated slowdown it was measured with) already applied;
    ``prefill_ratio`` (> 0): a prefill chunk's pass in a room over ``stage``'s time for it
    (1: not measured); ``idle``: idle seconds -> the factor on the first work (a decode or
    verify pass, or the head) that starts that long after the device's last work ended,
    over the same work back to back (the pass curve's condition); beyond the last point
    its last factor; None: not measured (factor 1). Measured on a GPU, whose clock falls
    while it waits on the network (runtime/calibrate.py ``measure_idle``)."""

    stage: PassCurve
    head: Curve
    slowdown: float = 1.0
    prefill_ratio: float = 1.0
    idle: Curve | None = None

    def idle_factor(self, idle_s: float) -> float:
        """The factor :attr:`idle` gives work that starts ``idle_s`` seconds after the last
        ended (1 for no gap or no curve; the last point's factor beyond it)."""
        if self.idle is None or not idle_s > 0:
            return 1.0
        return self.idle(min(idle_s, self.idle.xs[-1]))

    def to_mapping(self) -> dict:
        out = {"slowdown": self.slowdown, "stage": self.stage.to_mapping(), "head_s": self.head.to_mapping()}
        if self.prefill_ratio != 1.0:
            out["prefill_ratio"] = float(self.prefill_ratio)
        if self.idle is not None:
            out["idle"] = self.idle.to_mapping()
        return out

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "DeviceProfile":
        if not isinstance(m, Mapping):
            raise ProfileError(f"{where}: expected a mapping")
        try:
            slowdown = float(m.get("slowdown", 1.0))
        except (TypeError, ValueError):
            raise ProfileError(f"{where}.slowdown: expected a number") from None
        if "stage" not in m or "head_s" not in m:
            raise ProfileError(f"{where}: needs stage and head_s")
        ratio = _positive_or_none(m.get("prefill_ratio"), f"{where}.prefill_ratio", "times")
        idle = Curve.from_mapping(m["idle"], f"{where}.idle") if m.get("idle") is not None else None
        if idle is not None and not all(y > 0 for y in idle.ys):
            raise ProfileError(f"{where}.idle: factors must be > 0, got {list(idle.ys)}")
        return cls(PassCurve.from_mapping(m["stage"], f"{where}.stage"),
                   Curve.from_mapping(m["head_s"], f"{where}.head_s"), slowdown, 1.0 if ratio is None else ratio, idle)


@dataclass(frozen=True)
class SharedHost:
    """What a room of more device processes on the one calibrated machine takes beyond
    the profile's devices: ``pass_s`` seconds more on every pass per unit of slowdown
    (signed and finite: measured on decode passes, where the stages compute one at a
    time) and ``prefill_ratio`` (> 0), the prefill chunk's factor over the curve with
    ``pass_s`` added (it replaces the device's own ``prefill_ratio``)."""

    pass_s: float
    prefill_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pass_s) and math.isfinite(self.prefill_ratio) and self.prefill_ratio > 0):
            raise ProfileError(f"expected a finite pass_s and a prefill_ratio > 0, got {self.pass_s!r}, "
                               f"{self.prefill_ratio!r}")

    def to_mapping(self) -> dict:
        return {"pass_s": float(self.pass_s), "prefill_ratio": float(self.prefill_ratio)}

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "SharedHost":
        if not isinstance(m, Mapping) or "pass_s" not in m:
            raise ProfileError(f"{where}: expected a mapping with pass_s (and prefill_ratio)")
        v = m["pass_s"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ProfileError(f"{where}.pass_s: expected a number of seconds, got {v!r}")
        r = _positive_or_none(m.get("prefill_ratio"), f"{where}.prefill_ratio", "times")
        return cls(float(v), 1.0 if r is None else r)


#: kinds of workload a profile can hold acceptance for (``workload.kind`` of a scenario):
#: ``chat`` open questions answered from the model's own knowledge (the calibration
#: prompts of runtime.calibrate); ``grounded`` rewriting, copying or editing a passage
#: given in the prompt, where prompt-lookup drafts are right most of the time
WORKLOAD_KINDS = ("chat", "grounded")
#: the workload key of acceptance measured on a scenario's own ``workload.sample`` is
#: this prefix and the sample's fingerprint (:func:`sample_workload`), so one profile
#: can hold several samples and a scenario finds only its own
SAMPLE = "sample-"


def sample_workload(prompts: Sequence[str]) -> str:
    """The workload key of a sample: ``sample-`` and the first 16 hex digits of the
    SHA-256 of the prompts (each UTF-8, a NUL after each)."""
    import hashlib
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.encode("utf-8", "surrogatepass") + b"\0")
    return SAMPLE + h.hexdigest()[:16]


def _is_sample_key(w: Any) -> bool:
    return (isinstance(w, str) and w.startswith(SAMPLE) and len(w) == len(SAMPLE) + 16
            and all(c in "0123456789abcdef" for c in w[len(SAMPLE):]))


@dataclass(frozen=True)
class DrafterProfile:
    """One drafter as measured: ``call_s`` (k -> seconds of one draft call of k tokens)
    and ``accepted`` (k -> accepted lengths of every draft of a greedy speculative walk
    over the chat calibration prompts, each in ``[0, k]``). ``workloads`` holds the
    same walk over the prompts of other workload kinds (:data:`WORKLOAD_KINDS`, e.g.
    ``{"grounded": {k: lengths}}``, and :func:`sample_workload` keys for scenarios' own
    samples):
    acceptance depends on what is asked far more than on the room, so a prediction
    draws from the kind its scenario names. ``walks`` (workload -> k -> one tuple of
    accepted lengths per prompt, in the order measured; ``chat`` for ``accepted``) keeps
    the walk prompt by prompt; the flat lists are their concatenation."""

    call_s: Curve
    accepted: dict[int, tuple[int, ...]] = field(default_factory=dict)
    workloads: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    walks: dict[str, dict[int, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)

    def for_workload(self, kind: str) -> "DrafterProfile":
        """This drafter with the accepted lengths measured on ``kind`` prompts
        (``chat``: itself), its walks by prompt under ``chat``. Raises ProfileError
        when the profile has none for ``kind``."""
        if kind == "chat":
            return self
        if kind not in self.workloads:
            has = ", ".join(["chat", *sorted(self.workloads)])
            sample = kind.startswith(SAMPLE)
            how = ("calibrate with this scenario (splitroom calibrate measures its workload.sample; "
                   "--acceptance-only adds it to a profile)" if sample
                   else "calibrate again (splitroom calibrate measures every kind)")
            what = "this workload.sample (measured on another sample, or none)" if sample else f"workload.kind {kind}"
            raise ProfileError(f"the profile has no drafter acceptance for {what} (it has: {has}); {how}")
        walks = {"chat": self.walks[kind]} if kind in self.walks else {}
        return DrafterProfile(self.call_s, dict(self.workloads[kind]), walks=walks)

    def draft_s(self, k: int) -> float:
        """Seconds of one draft call of ``k`` tokens (0 for k = 0)."""
        return self.call_s(k) if k > 0 else 0.0

    def _measured_k(self, k: int) -> int | None:
        """The smallest measured k' >= k (the largest when none is); None when none."""
        if not self.accepted:
            return None
        ks = sorted(self.accepted)
        return next((x for x in ks if x >= k), ks[-1])

    def accepted_lengths(self, k: int) -> tuple[int, ...]:
        """Accepted lengths for a ``k``-token draft: those measured at the smallest
        measured k' >= k, each capped at k (a draft's first k tokens are the same
        whatever it was asked for: prompt lookup and greedy drafters both extend a
        prefix); the largest measured k' when none is >= k. Empty when nothing measured."""
        kk = self._measured_k(k)
        if kk is None:
            return ()
        return tuple(min(a, k) for a in self.accepted[kk])

    def prompt_lengths(self, k: int) -> tuple[tuple[int, ...], ...]:
        """:meth:`accepted_lengths` prompt by prompt (from ``walks["chat"]``, the walk of
        this view's workload); ``(accepted_lengths(k),)`` when no walk by prompt is
        kept; ``()`` when nothing was measured."""
        kk = self._measured_k(k)
        if kk is None:
            return ()
        per = self.walks.get("chat", {}).get(kk)
        if not per:
            return (self.accepted_lengths(k),)
        return tuple(tuple(min(a, k) for a in walk) for walk in per if walk)

    def prompts(self) -> int:
        """How many prompts the walk by prompt holds (0: none kept)."""
        per = self.walks.get("chat", {})
        return min((len(v) for v in per.values()), default=0)

    def resampled(self, picks: Sequence[int]) -> "DrafterProfile":
        """This view with its prompts replaced by ``picks`` (indices into the walk by
        prompt, repeats allowed: a bootstrap sample); the flat lengths follow. Itself
        when no walk by prompt is kept. Raises IndexError for a pick out of range."""
        per = self.walks.get("chat")
        if not per or not picks:
            return self
        walks = {k: tuple(v[i] for i in picks) for k, v in per.items()}
        flat = {k: tuple(a for w in v for a in w) for k, v in walks.items()}
        flat = {k: v for k, v in flat.items() if v} or dict(self.accepted)
        return DrafterProfile(self.call_s, flat, walks={"chat": walks})

    def to_mapping(self) -> dict:
        out = {"call_s": self.call_s.to_mapping(),
               "accepted": {int(k): list(v) for k, v in sorted(self.accepted.items())}}
        if self.workloads:
            out["workloads"] = {w: {int(k): list(v) for k, v in sorted(acc.items())}
                                for w, acc in sorted(self.workloads.items())}
        if self.walks:
            out["walks"] = {w: {int(k): [list(x) for x in v] for k, v in sorted(acc.items())}
                            for w, acc in sorted(self.walks.items())}
        return out

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "DrafterProfile":
        if not isinstance(m, Mapping) or "call_s" not in m:
            raise ProfileError(f"{where}: needs call_s")
        wl = m.get("workloads") or {}
        if not isinstance(wl, Mapping):
            raise ProfileError(f"{where}.workloads: expected a mapping of workload kind: {{k: [lengths]}}")
        others = [k for k in WORKLOAD_KINDS if k != "chat"] + [SAMPLE + "<16 hex digits>"]
        for w in wl:
            if w not in others and not _is_sample_key(w):
                raise ProfileError(f"{where}.workloads.{w}: not a workload kind with its own acceptance "
                                   f"(one of: {', '.join(others)})")
        workloads = {str(w): _accepted_from_mapping(v, f"{where}.workloads.{w}") for w, v in wl.items()}
        for w, acc in workloads.items():
            if not acc:
                raise ProfileError(f"{where}.workloads.{w}: no accepted lengths (calibrate again)")
        accepted = _accepted_from_mapping(m.get("accepted"), f"{where}.accepted")
        walks = _walks_from_mapping(m.get("walks"), f"{where}.walks", {"chat": accepted, **workloads})
        return cls(Curve.from_mapping(m["call_s"], f"{where}.call_s"), accepted, workloads, walks)


def _walks_from_mapping(m: Any, where: str, flat: Mapping[str, Mapping[int, tuple[int, ...]]]
                        ) -> dict[str, dict[int, tuple[tuple[int, ...], ...]]]:
    """``{workload: {k: ((lengths of a prompt), ...)}}`` from a mapping; each walk must
    concatenate to the flat lengths of its workload and k (``flat``). Raises
    ProfileError naming ``where`` for anything else."""
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise ProfileError(f"{where}: expected a mapping of workload: {{k: [[lengths of one prompt], ...]}}")
    out: dict[str, dict[int, tuple[tuple[int, ...], ...]]] = {}
    for w, acc in m.items():
        if w not in flat:
            raise ProfileError(f"{where}.{w}: no accepted lengths of that workload to split by prompt")
        if not isinstance(acc, Mapping):
            raise ProfileError(f"{where}.{w}: expected a mapping of k: [[lengths of one prompt], ...]")
        per: dict[int, tuple[tuple[int, ...], ...]] = {}
        for k, v in acc.items():
            kk = k if isinstance(k, int) and not isinstance(k, bool) else (
                int(k) if isinstance(k, str) and k.isdigit() else None)
            if kk is None or kk not in flat[w]:
                raise ProfileError(f"{where}.{w}.{k}: not a k with accepted lengths")
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, (list, tuple)) for x in v):
                raise ProfileError(f"{where}.{w}.{k}: expected a list of lists (one per prompt)")
            walk = tuple(tuple(x) for x in v)
            if tuple(a for x in walk for a in x) != tuple(flat[w][kk]):
                raise ProfileError(f"{where}.{w}.{k}: the walks by prompt do not add up to the accepted lengths")
            per[kk] = walk
        out[str(w)] = per
    return out


def _accepted_from_mapping(acc: Any, where: str) -> dict[int, tuple[int, ...]]:
    """``{k: (lengths)}`` from a mapping of k: [lengths], each in ``[0, k]``.
    Raises ProfileError naming ``where`` for anything else."""
    acc = acc or {}
    if not isinstance(acc, Mapping):
        raise ProfileError(f"{where}: expected a mapping of k: [lengths]")
    out = {}
    for k, v in acc.items():
        try:
            kk = int(k) if not isinstance(k, (bool, float)) else None
        except (TypeError, ValueError):
            kk = None
        if kk is None or kk < 1:
            raise ProfileError(f"{where}.{k}: k must be a whole number of drafted tokens, at least 1")
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ProfileError(f"{where}.{k}: expected a list of whole numbers (accepted lengths)")
        if not v:
            raise ProfileError(f"{where}.{k}: no accepted lengths (an empty walk says nothing)")
        if any(x < 0 or x > kk for x in v):
            raise ProfileError(f"{where}.{k}: lengths must lie in [0, {k}]")
        out[kk] = tuple(v)
    return out


@dataclass(frozen=True)
class TransportProfile:
    """One-way seconds of a residual frame by size (bytes) on the measuring machine,
    without any emulated delay; ``window_bytes`` the transport's initial congestion
    window (None: not window-limited); ``weights_Bps`` stored weight bytes per second
    of a peer's copy of a layer range (runtime.weights_share, packing and checks
    included; None: not measured), which a re-deal's copy cannot beat whatever the
    link's bandwidth; ``delay_late_s`` (>= 0) the seconds a frame's one-way time exceeds
    the in-process delay it was given (``run --real --in-process-delay``: the event loop
    sends a held packet after its due time), added to every hop of a room whose round trip
    is applied so (None: not measured)."""

    one_way_s: Curve
    window_bytes: float | None = None
    weights_Bps: float | None = None
    delay_late_s: float | None = None

    @property
    def fit(self) -> tuple[float, float]:
        """``(fixed_s, s_per_byte)``: the slope of the least-squares line through the
        points, and the intercept that puts the line through the smallest frame (the
        decode frame, by far the most frequent hop); both clamped at 0."""
        _, b = fit_line(self.one_way_s.xs, self.one_way_s.ys)
        b = max(b, 0.0)
        return max(self.one_way_s.ys[0] - b * self.one_way_s.xs[0], 0.0), b

    def to_mapping(self) -> dict:
        fixed, per_byte = self.fit
        out = {"one_way_s": self.one_way_s.to_mapping(), "window_bytes": self.window_bytes,
               "fit": {"fixed_s": fixed, "s_per_byte": per_byte}}
        if self.weights_Bps is not None:
            out["weights_Bps"] = self.weights_Bps
        if self.delay_late_s is not None:
            out["delay_late_s"] = self.delay_late_s
        return out

    @classmethod
    def from_mapping(cls, m: Any, where: str) -> "TransportProfile":
        if not isinstance(m, Mapping) or "one_way_s" not in m:
            raise ProfileError(f"{where}: needs one_way_s")
        w = _positive_or_none(m.get("window_bytes"), f"{where}.window_bytes", "bytes")
        r = _positive_or_none(m.get("weights_Bps"), f"{where}.weights_Bps", "bytes per second")
        late = m.get("delay_late_s")
        if late is not None and (isinstance(late, bool) or not isinstance(late, (int, float))
                                 or not (math.isfinite(late) and late >= 0)):
            raise ProfileError(f"{where}.delay_late_s: expected a number of seconds >= 0 (or null), got {late!r}")
        return cls(Curve.from_mapping(m["one_way_s"], f"{where}.one_way_s"), w, r,
                   None if late is None else float(late))


def _positive_or_none(v: Any, where: str, unit: str) -> float | None:
    """``v`` as a finite float > 0, or None when ``v`` is None.
    Raises ProfileError naming ``where`` (and ``unit``) for anything else."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ProfileError(f"{where}: expected a number of {unit}, got {v}")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ProfileError(f"{where}: expected a number of {unit}") from None
    if not (math.isfinite(x) and x > 0):
        raise ProfileError(f"{where}: expected more than 0 {unit} (or null), got {x:g}")
    return x


@dataclass(frozen=True)
class Profile:
    """A whole calibration: devices by id, drafters by name, the transport, and notes
    saying where and when it was measured (free text: machine, date, backend)."""

    devices: dict[str, DeviceProfile]
    drafters: dict[str, DrafterProfile] = field(default_factory=dict)
    transport: TransportProfile | None = None
    notes: dict[str, str] = field(default_factory=dict)
    version: int = PROFILE_VERSION
    #: each decode lap's stage time over its stage's mean in the calibration room, in
    #: lap order (dimensionless, > 0; empty: not measured)
    stage_noise: tuple[float, ...] = ()
    #: device processes on one machine (>= 2) -> what a room of that many adds, measured in
    #: a calibration room of that many processes on this machine (empty: not measured);
    #: applied only by :meth:`on_one_host`
    shared_host: dict[int, SharedHost] = field(default_factory=dict)

    def on_one_host(self, processes: int) -> tuple["Profile", str]:
        """This profile for a room whose ``processes`` device processes all run on the one
        machine that was calibrated (the emulated rooms of ``run --real``), and a line
        saying what was applied.

        With :attr:`shared_host` of the largest measured count <= ``processes`` (more
        processes than measured take the largest measurement, and the line says so):
        every device's pass curve plus its ``pass_s`` times the device's slowdown (its
        process pads the whole pass), and its ``prefill_ratio`` in place of the device's.
        One process, or none measured: unchanged (the line says so when none was
        measured for 2 or more)."""
        if processes < 2:
            return self, ""
        counts = [p for p in sorted(self.shared_host) if p <= processes]
        if not counts:
            return self, (f"{processes} device processes on one machine: no shared-core room measured in the "
                          "profile, predicted as separate machines")
        p = counts[-1]
        sh = self.shared_host[p]
        devices = {k: replace(v, stage=v.stage.shifted(sh.pass_s * v.slowdown), prefill_ratio=sh.prefill_ratio)
                   for k, v in self.devices.items()}
        # a drafter that runs layers makes one forward pass a drafted token in the host's process, on the same
        # cores: each pays the same per-pass excess (its walk was measured in one process, at slowdown 1)
        drafters = {k: (replace(v, call_s=Curve(v.call_s.xs, tuple(max(y + x * sh.pass_s, 0.0)
                                                                   for x, y in zip(v.call_s.xs, v.call_s.ys))))
                        if k in LAYER_DRAFTERS else v) for k, v in self.drafters.items()}
        more = "" if p == processes else f" (measured with {p}; {processes} not measured)"
        shifted = sorted(k for k in drafters if k in LAYER_DRAFTERS)
        return (replace(self, devices=devices, drafters=drafters),
                f"{processes} device processes on one machine: every pass {sh.pass_s * 1e3:+.2f} ms a unit of "
                f"slowdown" + (f" (the {'/'.join(shifted)} drafter's too, one pass a drafted token)" if shifted else "")
                + f", prefill chunks x{sh.prefill_ratio:.3f}{more}")

    def to_mapping(self) -> dict:
        """A plain mapping (YAML/JSON-ready) that :meth:`from_mapping` reads back."""
        return {"splitroom_profile": self.version, "notes": dict(self.notes),
                "devices": {k: v.to_mapping() for k, v in sorted(self.devices.items())},
                "drafters": {k: v.to_mapping() for k, v in sorted(self.drafters.items())},
                "transport": self.transport.to_mapping() if self.transport else None,
                **({"stage_noise": [float(x) for x in self.stage_noise]} if self.stage_noise else {}),
                **({"shared_host": {int(p): c.to_mapping() for p, c in sorted(self.shared_host.items())}}
                   if self.shared_host else {})}

    @classmethod
    def from_mapping(cls, m: Any) -> "Profile":
        """Read a mapping written by :meth:`to_mapping`.
        Raises ProfileError (naming the key path) for anything malformed or another version."""
        if not isinstance(m, Mapping) or "splitroom_profile" not in m:
            raise ProfileError("not a splitroom calibration profile (no splitroom_profile: VERSION key; "
                               "splitroom calibrate writes one)")
        if m["splitroom_profile"] != PROFILE_VERSION:
            raise ProfileError(f"splitroom_profile: version {m['splitroom_profile']!r} is not supported "
                               f"(this splitroom reads version {PROFILE_VERSION}); calibrate again")
        devs = m.get("devices") or {}
        if not isinstance(devs, Mapping):
            raise ProfileError("devices: expected a mapping of device id: profile")
        drafters = m.get("drafters") or {}
        if not isinstance(drafters, Mapping):
            raise ProfileError("drafters: expected a mapping of drafter name: profile")
        tr = m.get("transport")
        notes = m.get("notes") or {}
        return cls({str(k): DeviceProfile.from_mapping(v, f"devices.{k}") for k, v in devs.items()},
                   {str(k): DrafterProfile.from_mapping(v, f"drafters.{k}") for k, v in drafters.items()},
                   TransportProfile.from_mapping(tr, "transport") if tr is not None else None,
                   {str(k): str(v) for k, v in notes.items()} if isinstance(notes, Mapping) else {},
                   stage_noise=_ratios(m.get("stage_noise"), "stage_noise"),
                   shared_host=_shared_host(m.get("shared_host")))


def _shared_host(v: Any) -> dict[int, SharedHost]:
    """``shared_host`` (None, or processes >= 2: {pass_s, prefill_ratio}) read.
    Raises ProfileError naming the key for anything else."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ProfileError("shared_host: expected a mapping of device processes: {pass_s, prefill_ratio}")
    out = {}
    for k, c in v.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ProfileError(f"shared_host: {k!r}: expected a count of device processes >= 2")
        out[k] = SharedHost.from_mapping(c, f"shared_host.{k}")
    return out


def _ratios(v: Any, where: str) -> tuple[float, ...]:
    """``v`` (None or a list of finite numbers > 0) as a tuple of floats.
    Raises ProfileError naming ``where`` for anything else."""
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        raise ProfileError(f"{where}: expected a list of ratios (numbers > 0)")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
            raise ProfileError(f"{where}[{i}]: expected a number > 0, got {x!r}")
        out.append(float(x))
    return tuple(out)


def block_mean(xs: Sequence[float], starts: Sequence[int], block: int) -> float:
    """The mean of ``xs`` over the blocks of ``block`` consecutive values beginning
    at each index of ``starts``, wrapping past the end: one replica of the circular
    block bootstrap (Politis and Romano 1992; blocks keep the lap-to-lap correlation
    that load on a shared machine gives, which drawing single laps would lose).

    ``xs``: values in order, at least one; ``starts``: indices into ``xs``, at least
    one; ``block`` >= 1 (longer than ``xs``: it wraps). Raises ProfileError otherwise."""
    if not xs or not starts or block < 1:
        raise ProfileError("block_mean needs values, starts and a block of at least 1")
    n = len(xs)
    if any(not (0 <= s < n) for s in starts):
        raise ProfileError(f"block_mean: a start outside 0..{n - 1}")
    total = sum(xs[(s + j) % n] for s in starts for j in range(block))
    return float(total / (len(starts) * block))
