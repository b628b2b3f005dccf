"""The deal: which device hosts the model and which contiguous layer range each holds.

Rules reproduced from the product page's "How layers are split" and "What each device
does":

* Host pick: WebGPU first, then computer before phone, then most memory lent, then the
  lowest device id; then a device of the same kind hosts instead when its GPU copy
  speed is at least 1.5x the memory pick's and it lends at least half as much memory.
  A scenario's ``host`` forces the host. In the product every device times a copy
  when it loads; a scenario that gives no ``copy_speed`` is compared on the next
  basis both devices have: memory bandwidth (a copy streams memory, so copy speeds
  track bandwidth: GB10 copies 190 GB/s of its published 273 GB/s, 0.70, and the M5
  Max scenario 390 of 546, 0.71), else measured time per layer (inverse ratio).
* Zero capacity: a device with ``compute: 0``, ``memory_bandwidth: 0`` or a measured
  ``ms_per_layer: 0`` cannot run a layer; it gets none, never hosts, and a room where
  nobody can compute is a :class:`DealError` naming every device.
* Headroom: layers are dealt into ``lends - ceil(lends * options.headroom)`` and
  ``fits`` is checked against it (runtime buffers, activations, allocator slack).
* Memory per layer = weights + the layer's KV share at the room's context (int8 KV
  halves the KV part). Layers may differ in size (``ModelSpec.layer_sizes``): then
  what a device holds depends on where its range starts, and the deal is repeated
  with each device's capacity at its own position until it settles (a range that
  reaches the last layer counts what it could hold starting earlier). The host's own
  share is what it lends minus embedding, output head and draft layer. The host always
  keeps at least one layer.
* ``speed``: devices ordered by measured time per layer, fastest first; unmeasured,
  the host and the biggest computers first, an unmeasured phone counting 20x slower
  than an unmeasured computer. Each is filled up to what it holds until the model is
  dealt; the rest are guests. When the room cannot hold the model, the leftover layers
  are spread over every device in proportion to what it lends (largest remainder).
* ``memory``: every computer gets layers in proportion to what it lends for layers
  (:func:`layer_budget_bytes`: less the headroom, and for the host less its embedding,
  head and draft, as the page's table counts what each device holds; largest
  remainder), at least one each; with layers of different sizes, bytes in that
  proportion (:func:`cut_by_bytes`). Phones get none while the computers can hold the
  model, unless ``phone_layers``.
* The chain starts at the host's range, layer 1 onward.

Layer ranges are 0-based half-open ``[start, end)`` here; :attr:`Stage.shown` gives the
1-based inclusive form people read ("1-22").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Sequence

from planner.model import ModelSpec
from planner.room import DealOptions, Device, Network, PinnedStage, Scenario

#: Product page 000: "An unmeasured phone counts as 20x slower than an unmeasured computer".
UNMEASURED_PHONE_SLOWDOWN = 20.0
#: Product page 000: GPU-speed override needs at least 1.5x the memory pick's copy speed ...
HOST_COPY_SPEED_RATIO = 1.5
#: ... while lending at least half as much memory.
HOST_MIN_LENDS_RATIO = 0.5
#: Scenario default for ``DealOptions.headroom``: 5% of what a device lends stays free.
#: Public tools keep a margin too: vLLM uses 90% of GPU memory by default
#: (``gpu_memory_utilization=0.9``, vLLM engine arguments), Ollama subtracts a reserve
#: (``OLLAMA_GPU_OVERHEAD``) from reported free memory. Our ``lends`` already excludes
#: what the machine keeps for itself, so half of vLLM's 10% is reserved.
DEFAULT_HEADROOM = 0.05


#: Deal modes beyond the product page's, by name: ``f(devices, model, options, network,
#: return_path) -> Deal``. planner/optimal.py registers ``optimal`` (it imports this module, so this
#: module cannot import it; planner/__init__.py imports it so the mode is always there).
SPLITS: dict = {}


class LayerRangeError(ValueError):
    """A layer range a person typed is not one (:func:`parse_layers`); ``malformed``
    when it is not ``A-B`` or ``A`` at all, else it lies outside the model or is reversed."""

    def __init__(self, message: str, malformed: bool):
        super().__init__(message)
        self.malformed = malformed


def parse_layers(text: str, n_layers: int) -> tuple[int, int]:
    """A layer range as people type it, 1-based and inclusive (``"1-15"`` is the first
    fifteen layers, ``"7"`` layer 7 alone), as the code's 0-based half-open
    ``(start, end)``: ``"1-15"`` -> ``(0, 15)``. Every range a person types goes through
    here (scenario stages, ``join --layers``, ``generate --layers``); :func:`shown_layers`
    is the way back.

    Raises:
        LayerRangeError: not ``A-B`` or ``A`` (``malformed``), or not ``1 <= A <= B <= n_layers``.
    """
    parts = [p.strip() for p in str(text).strip().split("-")]
    try:
        if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError  # int() would read full-width digits, '²' and '1_0'
        a = int(parts[0])
        b = int(parts[-1])
    except ValueError:
        raise LayerRangeError(f"expected a range like '1-13' (1-based, inclusive), got {text!r}", True) from None
    if not 1 <= a <= b <= n_layers:
        raise LayerRangeError(f"range {text!r} is outside 1-{n_layers} or reversed (1-based, inclusive)", False)
    return a - 1, b


def shown_layers(start: int, end: int, words: bool = False) -> str:
    """0-based half-open ``[start, end)`` as people read it, 1-based inclusive:
    ``"1-22"``, ``"40"`` for one layer, ``"none"`` for an empty range; with ``words``
    ``"layers 1-22"``, ``"layer 40"``, ``"no layers"``. The inverse of :func:`parse_layers`."""
    if end <= start:
        return "no layers" if words else "none"
    text = str(start + 1) if end - start == 1 else f"{start + 1}-{end}"
    if words:
        return ("layer " if end - start == 1 else "layers ") + text
    return text


class DealError(ValueError):
    """The room cannot be dealt (nobody can hold a layer, a bad pin, a bad forced host).

    The message is one line a person can act on; for a room that cannot hold anything it
    names each device's shortfall.
    """


@dataclass(frozen=True)
class Stage:
    """One device's layer range ``[start, end)`` (0-based, half-open)."""

    device: str
    start: int
    end: int

    @property
    def layers(self) -> int:
        """Number of layers in the range."""
        return self.end - self.start

    @property
    def shown(self) -> str:
        """The range as people read it: 1-based inclusive, ``"1-22"`` or ``"40"``
        (:func:`shown_layers`)."""
        return shown_layers(self.start, self.end)


@dataclass(frozen=True)
class DeviceShare:
    """What the deal gives one device: role, layers, bytes used of bytes lent."""

    device: str
    role: str  # "model host" | "worker" | "guest"
    layers: int
    holds_layers: int
    used_bytes: int
    lends_bytes: int
    why: str = ""
    max_context: int | None = None  # tokens of KV it can hold with its layers; None: unbounded


@dataclass(frozen=True)
class Deal:
    """The result of :func:`deal`.

    Attributes:
        host: model host device id.
        split: the mode used (``speed``, ``memory`` or ``pinned``).
        stages: the chain, host's range first when it holds layers.
        guests: devices with no layers, sorted by id.
        fits: every device's share fits in what it lends.
        notes: why the deal is what it is, one sentence each.
        shares: per device, in the order of ``stages`` then guests.
        predicted: for ``split: optimal``, the analytic prediction (planner/lapcost.py):
            ``lap_s`` (seconds), ``tokens_per_s``, ``exact``, ``bound_lap_s`` and, when
            the speed deal exists, ``speed_tokens_per_s`` and ``speedup_vs_speed``.
        kv_caches: questions' KV caches every stage holds at the room's context (the
            questions that may be in flight at once); None for a deal made by hand
            (not counted: the scheduler's setting alone decides).
    """

    host: str
    split: str
    stages: tuple[Stage, ...]
    guests: tuple[str, ...]
    fits: bool
    notes: tuple[str, ...]
    shares: tuple[DeviceShare, ...] = field(default=())
    predicted: dict | None = None  # split optimal: lap_s, tokens_per_s, speed_tokens_per_s, ...
    kv_caches: int | None = None

    @classmethod
    def pinned(cls, host: str, rows) -> "Deal":
        """A chain made by hand (or announced by a re-deal): ``rows`` is
        ``[(device, start, end), ...]`` 0-based half-open, in chain order (the host's
        range first when it holds one). Split ``pinned``, no guests, fits, no notes. The
        one way every layer of the project builds a Deal from rows."""
        return cls(host=host, split="pinned", stages=tuple(Stage(d, a, b) for d, a, b in rows), guests=(), fits=True,
                   notes=())

    def stage_of(self, device_id: str) -> Stage | None:
        """The stage of ``device_id``, or None for a guest."""
        for s in self.stages:
            if s.device == device_id:
                return s
        return None

    @property
    def max_context(self) -> int | None:
        """The longest context (tokens) the whole room can hold: the smallest of its
        stages' (and a coordinator host's). None when unknown or unbounded (no KV)."""
        cands = [sh.max_context for sh in self.shares
                 if sh.max_context is not None and (sh.layers > 0 or sh.role == "model host")]
        return min(cands) if cands else None

    def to_json(self) -> dict:
        """The keys of ``splitroom plan --json``: host, split, stages, guests, fits, notes, plus ``devices`` and
        ``max_context`` (tokens; per stage too; null when no layer keeps a KV cache)."""
        ctx = {sh.device: sh.max_context for sh in self.shares}
        return {
            "host": self.host,
            "split": self.split,
            "stages": [{"device": s.device, "start": s.start, "end": s.end, "max_context": ctx.get(s.device)}
                       for s in self.stages],
            "guests": list(self.guests),
            "fits": self.fits,
            "max_context": self.max_context,
            "kv_caches": self.kv_caches,
            "notes": list(self.notes),
            **({"predicted": self.predicted} if self.predicted is not None else {}),
            "devices": [
                {"device": sh.device, "role": sh.role, "layers": sh.layers, "holds_layers": sh.holds_layers,
                 "used_bytes": sh.used_bytes, "lends_bytes": sh.lends_bytes, "why": sh.why,
                 "max_context": sh.max_context}
                for sh in self.shares
            ],
        }


def format_bytes(n: float) -> str:
    """Bytes as people read them, binary units: ``1.5 GiB``, ``512 MiB``, ``0 B``."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    x = float(n)
    for u in units:
        if abs(x) < 1024 or u == units[-1]:
            return f"{x:.0f} {u}" if u == "B" or x == int(x) else f"{x:.1f} {u}"
        x /= 1024
    return f"{x:.1f} TiB"  # pragma: no cover


# --- host pick --------------------------------------------------------------------

def computes(d: Device) -> bool:
    """False for a device of zero capacity (``compute``, ``memory_bandwidth`` or a
    measured ``ms_per_layer`` of 0): it cannot run a layer, however much it lends."""
    return not (d.compute_flops == 0 or d.memory_bandwidth_Bps == 0 or d.s_per_layer == 0)


def _zero_capacity_why(d: Device) -> str:
    what = ("compute 0 TFLOPS" if d.compute_flops == 0 else
            "memory_bandwidth 0" if d.memory_bandwidth_Bps == 0 else "ms_per_layer 0 ms")
    return f"{d.id}: {what} (zero capacity)"


def _memory_pick_key(d: Device) -> tuple:
    return (not computes(d), not d.webgpu, d.kind != "computer", -d.lends_bytes, d.id)


def speed_ratio(fast: Device, slow: Device) -> tuple[float, str] | None:
    """How many times faster ``fast`` copies GPU memory than ``slow``, and the basis.

    The first basis both devices have: measured copy speed (``copy_speed``), memory
    bandwidth (copy speed tracks it: module doc), measured time per layer (inverse).
    None when they share no basis.
    """
    if fast.copy_speed_Bps and slow.copy_speed_Bps:
        return fast.copy_speed_Bps / slow.copy_speed_Bps, "copies GPU memory"
    if fast.memory_bandwidth_Bps and slow.memory_bandwidth_Bps:
        return fast.memory_bandwidth_Bps / slow.memory_bandwidth_Bps, \
            "has the memory bandwidth (copy speed estimated from it)"
    if fast.s_per_layer and slow.s_per_layer:
        return slow.s_per_layer / fast.s_per_layer, "runs a layer (copy speed estimated from ms per layer)"
    return None


def pick_host(devices: Sequence[Device], forced: str | None = None) -> tuple[str, list[str]]:
    """Pick the model host; returns ``(device id, notes)``.

    Memory pick: WebGPU first, computer before phone, most memory lent, lowest id.
    GPU-speed override (product page 000): a device of the same kind (with WebGPU)
    hosts instead when its copy speed is >= 1.5x the memory pick's and it lends >= half
    as much; among several, the fastest copier (then most lent, then lowest id).

    Raises DealError when ``devices`` is empty or ``forced`` is not one of them.
    """
    if not devices:
        raise DealError("the room has no devices")
    ids = {d.id for d in devices}
    if forced is not None:
        if forced not in ids:
            raise DealError(f"host {forced!r} is not a device of the room ({', '.join(sorted(ids))})")
        return forced, [f"{forced} hosts: forced by the scenario"]
    pick = min(devices, key=_memory_pick_key)
    notes = [f"{pick.id} hosts by memory: " + (
        "WebGPU, " if pick.webgpu else "no device has WebGPU, ") + f"{pick.kind}, lends the most"]
    faster = []
    for d in devices:
        if d.id == pick.id or not d.webgpu or not computes(d) or d.kind != pick.kind:
            continue
        r = speed_ratio(d, pick)
        if r and r[0] >= HOST_COPY_SPEED_RATIO and d.lends_bytes >= HOST_MIN_LENDS_RATIO * pick.lends_bytes:
            faster.append((r, d))
    if faster:
        (ratio, basis), best = min(faster, key=lambda x: (-x[0][0], -x[1].lends_bytes, x[1].id))
        notes = [f"{best.id} hosts: {basis} {ratio:.2f}x as fast as {pick.id} (the memory pick) "
                 f"and lends at least half as much"]
        return best.id, notes
    return pick.id, notes


# --- capacity ---------------------------------------------------------------------

def usable_bytes(device: Device, options: DealOptions) -> int:
    """Bytes of what ``device`` lends that layers may use: ``lends - ceil(lends * headroom)``."""
    lends = device.lends_bytes
    if lends <= 0:
        return lends
    return lends - math.ceil(lends * options.headroom)


def holds_layers(device: Device, model: ModelSpec, options: DealOptions, is_host: bool,
                 start: int | None = None) -> int:
    """How many layers fit in what ``device`` lends, less the headroom (0 without
    WebGPU or with zero capacity).

    For the model host, the embedding, output head and draft layer come off first.
    With per-layer sizes, ``start`` is where the range begins (0-based; default 0 for
    the host, else the mean layer size is used) and the count is capped at the layers
    left from there.
    """
    if not device.webgpu or not computes(device):
        return 0
    free = usable_bytes(device, options) - (model.host_extra_bytes if is_host else 0)
    if free <= 0:
        return 0
    if not model.uniform and start is not None:
        kv = model.kv_bytes(options.kv_tokens, options.kv_cache)
        n, used = 0, 0
        for size in model.layer_sizes[start:]:
            used += size + kv
            if used > free:
                break
            n += 1
        return n
    per = model.layer_memory_bytes(options.kv_tokens, options.kv_cache)
    if per <= 0:
        return model.layers
    return int(free // per)


def _used_bytes(stage: Stage | None, is_host: bool, model: ModelSpec, options: DealOptions) -> int:
    used = 0 if stage is None else model.range_memory_bytes(stage.start, stage.end, options.kv_tokens,
                                                            options.kv_cache)
    return used + (model.host_extra_bytes if is_host else 0)


def max_context(device: Device, stage: Stage | None, is_host: bool, model: ModelSpec,
                options: DealOptions) -> int | None:
    """The longest context (tokens) ``device`` can hold KV for with ``stage``'s layers,
    for each of ``options.kv_caches`` questions in flight.

    What it lends less the headroom, the range's weights and (host) embedding, head
    and draft, divided by the range's KV bytes per token (halved for q8). None when
    the range keeps no KV cache (unbounded); 0 when the weights alone do not fit.
    """
    layers = 0 if stage is None else stage.layers
    per_token = layers * model.kv_bytes(1, "f16")
    if options.kv_cache == "q8":
        per_token = per_token / 2
    elif options.kv_cache == "f32":
        per_token = per_token * 2
    if per_token <= 0:
        return None
    weights = 0 if stage is None else model.weight_bytes(stage.start, stage.end)
    free = usable_bytes(device, options) - weights - (model.host_extra_bytes if is_host else 0)
    return max(0, int(free // (per_token * max(1, options.kv_caches))))


# --- apportionment ----------------------------------------------------------------

def apportion(total: int, weights: Sequence[float], caps: Sequence[int] | None = None,
              minimum: int = 0) -> list[int]:
    """Split ``total`` whole items in proportion to ``weights`` (largest remainder).

    Each share starts at ``floor(quota)`` (raised to ``minimum``, lowered to its cap);
    the items still missing go one at a time to the share furthest below its quota and
    under its cap; ties go to the earlier index, so callers order by their tie-break.
    When ``total`` is smaller than ``len(weights) * minimum``, the ``total`` heaviest
    (earlier on ties) get one each. Caps are ignored when they cannot hold ``total``.
    Source: Hamilton's largest remainder method.
    """
    n = len(weights)
    if n == 0:
        return []
    if total < n * minimum:
        order = sorted(range(n), key=lambda i: (-weights[i], i))
        out = [0] * n
        for i in order[:total]:
            out[i] = 1
        return out
    w_sum = float(sum(weights))
    quotas = [total * w / w_sum if w_sum > 0 else total / n for w in weights]
    use_caps = caps is not None and sum(caps) >= total
    cap = list(caps) if use_caps else [total] * n
    cap = [max(c, minimum) for c in cap]
    out = [min(max(int(q), minimum), c) for q, c in zip(quotas, cap)]
    while sum(out) > total:  # minimums pushed us over: take from the most above quota
        i = max((i for i in range(n) if out[i] > minimum), key=lambda i: (out[i] - quotas[i], -i))
        out[i] -= 1
    while sum(out) < total:
        open_ = [i for i in range(n) if out[i] < cap[i]] or list(range(n))
        i = max(open_, key=lambda i: (quotas[i] - out[i], -i))
        out[i] += 1
    return out


# --- ordering ---------------------------------------------------------------------

def _speed_estimates(devices: Sequence[Device]) -> dict[str, float]:
    """Seconds per layer per device, measured or estimated (unmeasured phone = 20x)."""
    measured_pc = [d.s_per_layer for d in devices if d.s_per_layer and d.kind == "computer"]
    measured_phone = [d.s_per_layer for d in devices if d.s_per_layer and d.kind == "phone"]
    if measured_pc:
        unmeasured_pc = statistics.median(measured_pc)
    elif measured_phone:
        unmeasured_pc = statistics.median(measured_phone) / UNMEASURED_PHONE_SLOWDOWN
    else:
        unmeasured_pc = 1.0
    out = {}
    for d in devices:
        if d.s_per_layer:
            out[d.id] = d.s_per_layer
        else:
            out[d.id] = unmeasured_pc * (UNMEASURED_PHONE_SLOWDOWN if d.kind == "phone" else 1.0)
    return out


# --- the deal ---------------------------------------------------------------------

def deal_for(scn: Scenario, devices: Sequence[Device] | None = None, options: DealOptions | None = None) -> Deal:
    """The deal of scenario ``scn``: :func:`deal` over its devices, model and options with
    its network and return path (``split: optimal`` searches against them). Every deal of
    a scenario is made here: plan and simulate, sweep, the simulator, the re-deal rule.

    Args:
        devices: the devices to deal over instead of ``scn.devices`` (a re-deal: those
            left).
        options: instead of ``scn.options`` (a re-deal keeps the host).
    Raises:
        DealError: as :func:`deal` does.
    """
    return deal(scn.devices if devices is None else devices, scn.model, scn.options if options is None else options,
                scn.network, scn.decoding.return_path)


def deal(devices: Sequence[Device], model: ModelSpec, options: DealOptions | None = None,
         network: Network | None = None, return_path: str = "direct") -> Deal:
    """Deal ``model``'s layers over ``devices`` by the product's rules (module doc),
    with ``options.kv_caches`` KV caches (questions in flight) on every stage.

    Each cache holds ``options.context_tokens`` positions, so a layer needs
    ``kv_caches`` times its KV share. When the room cannot hold that many (the deal
    would not fit, or nobody could hold a layer), it is dealt again with one cache
    fewer, down to one, and a note says how many fit; the returned deal's
    :attr:`Deal.kv_caches` is the number it holds, never more than fits (with one cache
    the deal is the product page's, ``fits`` saying whether it fits). Raises as
    :func:`deal_one` does with one cache.
    """
    options = options or DealOptions()
    asked = max(1, options.kv_caches)
    n = asked
    while True:
        try:
            d = deal_one(devices, model, replace(options, kv_caches=n), network, return_path)
        except DealError:
            if n == 1:
                raise
            n -= 1
            continue
        if d.fits or n == 1:
            break
        n -= 1
    notes = d.notes
    if n < asked:
        notes = notes + (f"{n} of the {asked} questions in flight fit: each keeps a KV cache of "
                         f"{options.context_tokens:,} positions on every stage",)
    return replace(d, kv_caches=n, notes=notes)


def deal_one(devices: Sequence[Device], model: ModelSpec, options: DealOptions | None = None,
             network: Network | None = None, return_path: str = "direct") -> Deal:
    """Deal ``model``'s layers over ``devices`` by the product's rules (module doc),
    counting exactly ``options.kv_caches`` KV caches per layer (:func:`deal` deals
    fewer when they do not fit).

    Returns a :class:`Deal`; it does not depend on the order ``devices`` are listed in.
    ``split: optimal`` goes to :func:`planner.optimal.optimal_deal` (through
    :data:`SPLITS`), which uses ``network`` (per-link RTT and hop overhead; room
    defaults when None) and ``return_path`` (``direct`` | ``via_stages``: the hops a lap
    pays on the way back).
    Raises DealError when the room has no devices, device ids repeat, the forced host
    is unknown, the host has no WebGPU or lends nothing, a pinned deal is not a
    contiguous cover, or no device can hold even one layer (the message then names
    every device's shortfall). A host that lends too little for its extras and a layer
    still keeps one layer; the deal then says ``fits=False``.
    """
    options = options or DealOptions()
    devices = sorted(devices, key=lambda d: d.id)
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise DealError(f"duplicate device id: {', '.join(dup)}")
    if options.split in SPLITS and options.stages is None:
        return SPLITS[options.split](devices, model, options, network, return_path)
    host_id, notes = pick_host(devices, options.host)
    by_id = {d.id: d for d in devices}
    host = by_id[host_id]
    holds = {d.id: holds_layers(d, model, options, d.id == host_id, 0 if d.id == host_id else None)
             for d in devices}

    if options.stages is not None:
        return _pinned(devices, model, options, host_id, holds, notes)

    # Checked first, so that a room where nobody can hold a layer (every device lends 0,
    # or none has WebGPU) names every device's shortfall, not only the host's.
    if sum(holds.values()) == 0:
        raise DealError(_shortfall_message(devices, model, options, host_id))
    if not host.webgpu:
        raise DealError(f"host {host_id!r} has no WebGPU and cannot hold layers")
    if not computes(host):
        raise DealError(f"host {host_id!r} cannot compute ({_zero_capacity_why(host)}); "
                        "the model host keeps at least one layer")
    if host.lends_bytes <= 0:
        raise DealError(f"host {host_id!r} lends no memory; the model host keeps at least one layer")

    speed = _speed_estimates([d for d in devices if computes(d)])
    order = sorted((d for d in devices if d.webgpu and d.lends_bytes > 0 and computes(d)),
                   key=lambda d: (speed[d.id], d.id != host_id, -holds[d.id], d.id))
    stages, more = _count_and_lay_out(order, host_id, holds, model, options)
    if not model.uniform:
        # Per-layer sizes: what each device holds depends on where its range starts.
        # Re-deal with each stage's capacity at its own start until nothing changes
        # (bounded; the last deal stands and `fits` says whether it fits).
        for _ in range(2 * len(order) + 2):
            new = dict(holds)
            for st in stages:
                new[st.device] = _holds_from(by_id[st.device], model, options, st.device == host_id, st.start)
            if new == holds:
                break
            holds = new
            stages, more = _count_and_lay_out(order, host_id, holds, model, options)
    return _finish(devices, model, options, host_id, options.split, stages, holds, notes + more)


def _holds_from(device: Device, model: ModelSpec, options: DealOptions, is_host: bool, start: int) -> int:
    """What ``device`` holds with its range starting at ``start`` (uneven layer sizes).

    :func:`holds_layers` stops at the model's last layer; a range that starts too early
    for its device would then look as small as the layers left, and the deal would never
    move its start later. A range that reaches the last layer with room to spare counts
    the layers before ``start`` that would fit too (a tail range can start earlier), so
    the next deal can give it the layers it really holds.
    """
    n = holds_layers(device, model, options, is_host, start)
    if start + n < model.layers or model.uniform:
        return n
    kv = model.kv_bytes(options.kv_tokens, options.kv_cache)
    spare = (usable_bytes(device, options) - (model.host_extra_bytes if is_host else 0)
             - model.range_memory_bytes(start, model.layers, options.kv_tokens, options.kv_cache))
    j = start - 1
    while j >= 0 and spare >= model.layer_sizes[j] + kv:
        spare -= model.layer_sizes[j] + kv
        n += 1
        j -= 1
    return n


def layer_budget_bytes(device: Device, model: ModelSpec, options: DealOptions, is_host: bool) -> int:
    """Bytes ``device`` has for layers: what it lends less the headroom and, for the
    model host, less the embedding, output head and draft layer (never below 0).

    ``split: memory`` deals in proportion to these (product page 000's "By memory"
    table: "host holds 30, desktop 30" gives 1-20 / 21-40, whatever the host's
    embedding weighs)."""
    if not device.webgpu or not computes(device):
        return 0
    return max(0, usable_bytes(device, options) - (model.host_extra_bytes if is_host else 0))


def cut_by_bytes(costs: Sequence[int], weights: Sequence[float], budgets: Sequence[int] | None = None
                 ) -> list[int]:
    """Layer counts for a chain that share ``costs`` (bytes of each layer, in order) in
    proportion to ``weights`` (one per device, chain order), at least one layer each.

    Each cut goes to the layer boundary whose running bytes are nearest the running
    quota ``sum(costs) * sum(weights[:k+1]) / sum(weights)`` (the earlier on a tie).
    With ``budgets`` (bytes each device may hold), cuts then move so that a range over
    its budget gives layers to its neighbour when the neighbour has room (a forward
    then a backward pass). Requires ``len(costs) >= len(weights) > 0``.
    """
    n, L = len(weights), len(costs)
    cum = [0]
    for c in costs:
        cum.append(cum[-1] + c)
    total, w_sum = cum[-1], float(sum(weights))
    cuts = [0]
    run = 0.0
    for k in range(n - 1):
        run += weights[k]
        target = total * run / w_sum if w_sum > 0 else total * (k + 1) / n
        lo, hi = cuts[-1] + 1, L - (n - 1 - k)
        cuts.append(min(range(lo, hi + 1), key=lambda j: (abs(cum[j] - target), j)))
    cuts.append(L)
    if budgets is not None:
        def used(k: int) -> int:
            return cum[cuts[k + 1]] - cum[cuts[k]]
        for k in range(n - 1):  # forward: an over range ends earlier when the next has room
            while (used(k) > budgets[k] and cuts[k + 1] - 1 > cuts[k]
                   and used(k + 1) + costs[cuts[k + 1] - 1] <= budgets[k + 1]):
                cuts[k + 1] -= 1
        for k in range(n - 1, 0, -1):  # backward: an over range starts later when the one before has room
            while (used(k) > budgets[k] and cuts[k] + 1 < cuts[k + 1]
                   and used(k - 1) + costs[cuts[k]] <= budgets[k - 1]):
                cuts[k] += 1
    return [cuts[k + 1] - cuts[k] for k in range(n)]


def _count_and_lay_out(order: list[Device], host_id: str, holds: dict[str, int], model: ModelSpec,
                       options: DealOptions) -> tuple[tuple[Stage, ...], list[str]]:
    """Layer counts by the split's rule, the host's one-layer rule, then the chain."""
    L = model.layers
    if options.split == "memory":
        budget = {d.id: layer_budget_bytes(d, model, options, d.id == host_id) for d in order}
        layers, notes = _deal_memory(order, host_id, holds, L, options.phone_layers, budget,
                                     None if model.uniform else model, options)
    else:
        layers, notes = _deal_speed(order, host_id, holds, L)

    # The host always keeps at least one layer (product page 000).
    if layers.get(host_id, 0) == 0:
        donor = max((d for d in layers if layers[d] > 0), key=lambda d: (layers[d], d))
        layers[donor] -= 1
        if layers[donor] == 0:
            del layers[donor]
        layers[host_id] = 1
        notes.append(f"{host_id} keeps one layer (the model host always does); taken from {donor}")

    chain = [host_id] + [d.id for d in order if d.id != host_id and layers.get(d.id, 0) > 0]
    stages = []
    at = 0
    for dev in chain:
        n = layers[dev]
        stages.append(Stage(dev, at, at + n))
        at += n
    assert at == L, (at, L)
    return tuple(stages), notes


def _deal_speed(order: list[Device], host_id: str, holds: dict[str, int], L: int
                ) -> tuple[dict[str, int], list[str]]:
    notes = []
    layers: dict[str, int] = {}
    room_holds = sum(holds[d.id] for d in order)
    if room_holds >= L:
        left = L
        for d in order:
            take = min(holds[d.id], left)
            if take:
                layers[d.id] = take
            left -= take
        measured = "measured time per layer" if any(d.s_per_layer for d in order) else \
            "fewest hops (nothing measured yet)"
        notes.append(f"split speed: filled by {measured}")
        for d in order:
            if d.id not in layers and d.id != host_id:  # the host keeps a layer (noted then)
                why = ("computers hold the model" if d.kind == "phone" else "not needed")
                notes.append(f"{d.id} asks only: {why}")
        return layers, notes
    leftover = L - room_holds
    extra = apportion(leftover, [d.lends_bytes for d in order])
    for d, e in zip(order, extra):
        if holds[d.id] + e:
            layers[d.id] = holds[d.id] + e
    notes.append(f"the room holds {room_holds} of {L} layers: leftover {leftover} "
                 f"layer{'s' if leftover != 1 else ''} spread by memory")
    return layers, notes


def _deal_memory(order: list[Device], host_id: str, holds: dict[str, int], L: int,
                 phone_layers: bool, budget: dict[str, int], uneven: ModelSpec | None,
                 options: DealOptions) -> tuple[dict[str, int], list[str]]:
    notes = []
    computers = [d for d in order if d.kind == "computer"]
    phones = [d for d in order if d.kind == "phone"]
    computers_hold = bool(computers) and sum(holds[d.id] for d in computers) >= L
    if phone_layers or not computers_hold:
        takers = list(order)
        if phones and phone_layers:
            notes.append("phones get layers: phone_layers is on")
        elif phones:
            notes.append("phones get layers: the computers cannot hold the model")
    else:
        takers = computers
        for p in phones:
            notes.append(f"{p.id} asks only: phone left out, computers hold the model")
    # A device that cannot hold one layer in what it lends takes none while the others
    # can hold the model ("at least one each" would put it over what it lends).
    if sum(holds[d.id] for d in takers) >= L:
        for d in takers:
            if holds[d.id] == 0:
                notes.append(f"{d.id} asks only: cannot hold one layer in what it lends")
        takers = [d for d in takers if holds[d.id] > 0]
    # host first, so ties in the largest remainder go to the start of the chain
    takers.sort(key=lambda d: d.id != host_id)
    weights = [budget[d.id] for d in takers]
    if uneven is not None and len(takers) <= L:  # layers of different sizes: deal bytes, not counts
        kv = uneven.kv_bytes(options.kv_tokens, options.kv_cache)
        shares = cut_by_bytes([size + kv for size in uneven.layer_sizes], weights, weights)
        basis = "bytes"
    else:
        shares = apportion(L, weights, caps=[holds[d.id] for d in takers], minimum=1)
        basis = "layers"
    layers = {d.id: n for d, n in zip(takers, shares) if n > 0}
    notes.append(f"split memory: {len(layers)} devices get {basis} in proportion to what they lend "
                 "for layers (less the headroom; the host's less its embedding, head and draft)")
    for d, n in zip(takers, shares):
        if n == 0:
            notes.append(f"{d.id} asks only: more devices than layers")
    return layers, notes


def _pinned(devices: list[Device], model: ModelSpec, options: DealOptions, host_id: str,
            holds: dict[str, int], notes: list[str]) -> Deal:
    by_id = {d.id: d for d in devices}
    pins: tuple[PinnedStage, ...] = options.stages or ()
    at = 0
    seen = set()
    for i, p in enumerate(pins):
        if p.device not in by_id:
            raise DealError(f"stages[{i}]: {p.device!r} is not a device of the room")
        if p.device in seen:
            raise DealError(f"stages[{i}]: {p.device!r} holds two ranges; a device holds one contiguous range")
        if not by_id[p.device].webgpu:
            raise DealError(f"stages[{i}]: {p.device!r} has no WebGPU and cannot hold layers")
        if not computes(by_id[p.device]):
            raise DealError(f"stages[{i}]: {p.device!r} cannot compute ({_zero_capacity_why(by_id[p.device])})")
        if p.start != at or p.end <= p.start:
            typed = f"{p.start + 1}-{p.end}" if p.end > p.start + 1 else f"{p.end}"
            raise DealError(f"stages[{i}]: {p.device!r} layers {typed} must start at layer {at + 1}"
                            + (f" (the stages before it end at layer {at})" if at else "") + " and hold at least one")
        seen.add(p.device)
        at = p.end
    if at != model.layers:
        raise DealError(f"stages cover layers 1-{at} but the model has {model.layers}")
    host_at = [i for i, p in enumerate(pins) if p.device == host_id]
    if host_at and host_at[0] != 0:
        raise DealError(f"stages[{host_at[0]}]: the model host {host_id!r} holds layers "
                        f"{pins[host_at[0]].start + 1}-{pins[host_at[0]].end} but is not the first stage; "
                        "the host's range must come first (or give the host no layers)")
    stages = tuple(Stage(p.device, p.start, p.end) for p in pins)
    notes = notes + ["stages pinned by the scenario"]
    if host_id not in seen:
        notes.append(f"{host_id} holds no layers: a coordinator (embedding, head, sampling, drafting)")
    return _finish(devices, model, options, host_id, "pinned", stages, holds, notes)


def _shortfall_message(devices: list[Device], model: ModelSpec, options: DealOptions, host_id: str) -> str:
    per = model.layer_memory_bytes(options.kv_tokens, options.kv_cache)
    parts = []
    for d in devices:
        if not d.webgpu:
            parts.append(f"{d.id}: no WebGPU")
            continue
        if not computes(d):
            parts.append(_zero_capacity_why(d))
            continue
        if not model.uniform:
            per = model.range_memory_bytes(0, 1, options.kv_tokens, options.kv_cache)
        need = per + (model.host_extra_bytes if d.id == host_id else 0)
        usable = usable_bytes(d, options)
        parts.append(f"{d.id} lends {format_bytes(d.lends_bytes)}"
                     f"{f' ({format_bytes(usable)} after headroom)' if usable != d.lends_bytes else ''}"
                     f", needs {format_bytes(need)} for one layer"
                     f"{' + embedding/head/draft' if d.id == host_id else ''}"
                     f" (short {format_bytes(need - usable)})")
    if all(not computes(d) for d in devices if d.webgpu):
        return "no device can compute a layer: " + "; ".join(parts)
    return "no device can hold a layer: " + "; ".join(parts)


def _finish(devices: list[Device], model: ModelSpec, options: DealOptions, host_id: str, split: str,
            stages: tuple[Stage, ...], holds: dict[str, int], notes: list[str]) -> Deal:
    in_chain = {s.device: s for s in stages}
    by_id = {x.id: x for x in devices}  # a dict, not a scan per device: 1,000 devices in < 10 ms
    shares = []
    fits = True
    for s in stages:
        d = by_id[s.device]
        used = _used_bytes(s, d.id == host_id, model, options)
        room = usable_bytes(d, options)
        fits &= used <= room
        role = "model host" if d.id == host_id else "worker"
        if used <= room:
            why = f"layers {s.shown}"
        elif used <= d.lends_bytes:
            why = (f"layers {s.shown}; inside what it lends but into the {options.headroom:.0%} headroom "
                   f"by {format_bytes(used - room)}")
        else:
            why = f"layers {s.shown}; over what it lends by {format_bytes(used - d.lends_bytes)}"
        shares.append(DeviceShare(d.id, role, s.layers, holds[d.id], used, d.lends_bytes, why,
                                  max_context(d, s, d.id == host_id, model, options)))
    guests = sorted(d.id for d in devices if d.id not in in_chain)
    for g in guests:
        d = by_id[g]
        if g == host_id:
            used = _used_bytes(None, True, model, options)
            fits &= used <= usable_bytes(d, options)
            shares.append(DeviceShare(g, "model host", 0, holds[g], used, d.lends_bytes, "coordinator, no layers"))
            continue
        why = ("no WebGPU" if not d.webgpu else "zero capacity" if not computes(d) else
               "lends nothing" if d.lends_bytes <= 0 else "not needed")
        shares.append(DeviceShare(g, "guest", 0, holds[g], 0, d.lends_bytes, why))
    if not fits:
        notes = notes + ["the room cannot hold the model in what it lends" +
                         (f" less the {options.headroom:.0%} headroom" if options.headroom else "") +
                         ": some devices are over"]
    return Deal(host=host_id, split=split, stages=stages, guests=tuple(g for g in guests if g != host_id),
                fits=fits, notes=tuple(notes), shares=tuple(shares))
