"""The deal: which device hosts the model and which contiguous layer range each holds.

Rules reproduced from the product page "How layers are split" (shared/seeds/000) and
"What each device does" (001):

* Host pick: WebGPU first, then computer before phone, then most memory lent, then the
  lowest device id; then a device of the same kind hosts instead when its GPU copy
  speed is at least 1.5x the memory pick's and it lends at least half as much memory.
  A scenario's ``host`` forces the host.
* Memory per layer = weights + the layer's KV share at the room's context (int8 KV
  halves the KV part). The host's own share is what it lends minus embedding, output
  head and draft layer. The host always keeps at least one layer.
* ``speed``: devices ordered by measured time per layer, fastest first; unmeasured,
  the host and the biggest computers first, an unmeasured phone counting 20x slower
  than an unmeasured computer. Each is filled up to what it holds until the model is
  dealt; the rest are guests. When the room cannot hold the model, the leftover layers
  are spread over every device in proportion to what it lends (largest remainder).
* ``memory``: every computer gets layers in proportion to what it lends (largest
  remainder), at least one each; phones get none while the computers can hold the
  model, unless ``phone_layers``.
* The chain starts at the host's range, layer 1 onward.

Layer ranges are 0-based half-open ``[start, end)`` here; :attr:`Stage.shown` gives the
1-based inclusive form people read ("1-22").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

from planner.model import ModelSpec
from planner.room import DealOptions, Device, PinnedStage

#: Product page 000: "An unmeasured phone counts as 20x slower than an unmeasured computer".
UNMEASURED_PHONE_SLOWDOWN = 20.0
#: Product page 000: GPU-speed override needs at least 1.5x the memory pick's copy speed ...
HOST_COPY_SPEED_RATIO = 1.5
#: ... while lending at least half as much memory.
HOST_MIN_LENDS_RATIO = 0.5


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
        """The range as people read it: 1-based inclusive, ``"1-22"`` or ``"40"``."""
        if self.layers == 1:
            return str(self.start + 1)
        return f"{self.start + 1}-{self.end}"


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
    """

    host: str
    split: str
    stages: tuple[Stage, ...]
    guests: tuple[str, ...]
    fits: bool
    notes: tuple[str, ...]
    shares: tuple[DeviceShare, ...] = field(default=())

    def stage_of(self, device_id: str) -> Stage | None:
        """The stage of ``device_id``, or None for a guest."""
        for s in self.stages:
            if s.device == device_id:
                return s
        return None

    def to_json(self) -> dict:
        """The keys of SCENARIO.md's ``splitroom plan --json``, plus ``devices``."""
        return {
            "host": self.host,
            "split": self.split,
            "stages": [{"device": s.device, "start": s.start, "end": s.end} for s in self.stages],
            "guests": list(self.guests),
            "fits": self.fits,
            "notes": list(self.notes),
            "devices": [
                {"device": sh.device, "role": sh.role, "layers": sh.layers, "holds_layers": sh.holds_layers,
                 "used_bytes": sh.used_bytes, "lends_bytes": sh.lends_bytes, "why": sh.why}
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

def _memory_pick_key(d: Device) -> tuple:
    return (not d.webgpu, d.kind != "computer", -d.lends_bytes, d.id)


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
    if pick.copy_speed_Bps:
        faster = [d for d in devices
                  if d.id != pick.id and d.webgpu and d.kind == pick.kind and d.copy_speed_Bps
                  and d.copy_speed_Bps >= HOST_COPY_SPEED_RATIO * pick.copy_speed_Bps
                  and d.lends_bytes >= HOST_MIN_LENDS_RATIO * pick.lends_bytes]
        if faster:
            best = min(faster, key=lambda d: (-d.copy_speed_Bps, -d.lends_bytes, d.id))
            notes = [f"{best.id} hosts: copies GPU memory {best.copy_speed_Bps / pick.copy_speed_Bps:.2f}x "
                     f"as fast as {pick.id} (the memory pick) and lends at least half as much"]
            return best.id, notes
    return pick.id, notes


# --- capacity ---------------------------------------------------------------------

def holds_layers(device: Device, model: ModelSpec, options: DealOptions, is_host: bool) -> int:
    """How many layers fit in what ``device`` lends (0 without WebGPU).

    For the model host, the embedding, output head and draft layer come off first.
    """
    if not device.webgpu:
        return 0
    free = device.lends_bytes - (model.host_extra_bytes if is_host else 0)
    per = model.layer_memory_bytes(options.context_tokens, options.kv_cache)
    if free <= 0 or per <= 0:
        return 0 if free <= 0 else model.layers
    return int(free // per)


def _used_bytes(layers: int, is_host: bool, model: ModelSpec, options: DealOptions) -> int:
    used = layers * model.layer_memory_bytes(options.context_tokens, options.kv_cache)
    return used + (model.host_extra_bytes if is_host else 0)


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

def deal(devices: Sequence[Device], model: ModelSpec, options: DealOptions | None = None) -> Deal:
    """Deal ``model``'s layers over ``devices`` by the product's rules (module doc).

    Returns a :class:`Deal`; it does not depend on the order ``devices`` are listed in.
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
    host_id, notes = pick_host(devices, options.host)
    by_id = {d.id: d for d in devices}
    host = by_id[host_id]
    holds = {d.id: holds_layers(d, model, options, d.id == host_id) for d in devices}

    if options.stages is not None:
        return _pinned(devices, model, options, host_id, holds, notes)

    # Checked first, so that a room where nobody can hold a layer (every device lends 0,
    # or none has WebGPU) names every device's shortfall, not only the host's.
    if sum(holds.values()) == 0:
        raise DealError(_shortfall_message(devices, model, options, host_id))
    if not host.webgpu:
        raise DealError(f"host {host_id!r} has no WebGPU and cannot hold layers")
    if host.lends_bytes <= 0:
        raise DealError(f"host {host_id!r} lends no memory; the model host keeps at least one layer")

    speed = _speed_estimates(devices)
    order = sorted((d for d in devices if d.webgpu and d.lends_bytes > 0),
                   key=lambda d: (speed[d.id], d.id != host_id, -holds[d.id], d.id))
    L = model.layers

    if options.split == "memory":
        layers, more = _deal_memory(order, host_id, holds, L, options.phone_layers)
    else:
        layers, more = _deal_speed(order, host_id, holds, L)
    notes += more

    # The host always keeps at least one layer (product page 000).
    if layers.get(host_id, 0) == 0:
        donor = max((d for d in layers if layers[d] > 0), key=lambda d: (layers[d], d))
        layers[donor] -= 1
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
    return _finish(devices, model, options, host_id, options.split, tuple(stages), holds, notes)


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
            if d.id not in layers:
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
                 phone_layers: bool) -> tuple[dict[str, int], list[str]]:
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
    shares = apportion(L, [d.lends_bytes for d in takers], caps=[holds[d.id] for d in takers], minimum=1)
    layers = {d.id: n for d, n in zip(takers, shares) if n > 0}
    notes.append(f"split memory: {len(layers)} devices get layers in proportion to what they lend")
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
        if p.start != at or p.end <= p.start:
            raise DealError(f"stages[{i}]: range [{p.start}, {p.end}) must start at {at} and be non-empty")
        seen.add(p.device)
        at = p.end
    if at != model.layers:
        raise DealError(f"stages cover layers [0, {at}) but the model has {model.layers}")
    stages = tuple(Stage(p.device, p.start, p.end) for p in pins)
    notes = notes + ["stages pinned by the scenario"]
    if host_id not in seen:
        notes.append(f"{host_id} holds no layers: a coordinator (embedding, head, sampling, drafting)")
    return _finish(devices, model, options, host_id, "pinned", stages, holds, notes)


def _shortfall_message(devices: list[Device], model: ModelSpec, options: DealOptions, host_id: str) -> str:
    per = model.layer_memory_bytes(options.context_tokens, options.kv_cache)
    parts = []
    for d in devices:
        if not d.webgpu:
            parts.append(f"{d.id}: no WebGPU")
            continue
        need = per + (model.host_extra_bytes if d.id == host_id else 0)
        parts.append(f"{d.id} lends {format_bytes(d.lends_bytes)}, needs {format_bytes(need)} for one layer"
                     f"{' + embedding/head/draft' if d.id == host_id else ''}"
                     f" (short {format_bytes(need - d.lends_bytes)})")
    return "no device can hold a layer: " + "; ".join(parts)


def _finish(devices: list[Device], model: ModelSpec, options: DealOptions, host_id: str, split: str,
            stages: tuple[Stage, ...], holds: dict[str, int], notes: list[str]) -> Deal:
    in_chain = {s.device: s for s in stages}
    by_id = {x.id: x for x in devices}  # a dict, not a scan per device: 1,000 devices in < 10 ms
    shares = []
    fits = True
    for s in stages:
        d = by_id[s.device]
        used = _used_bytes(s.layers, d.id == host_id, model, options)
        fits &= used <= d.lends_bytes
        role = "model host" if d.id == host_id else "worker"
        why = f"layers {s.shown}" + ("" if used <= d.lends_bytes else
                                     f"; over what it lends by {format_bytes(used - d.lends_bytes)}")
        shares.append(DeviceShare(d.id, role, s.layers, holds[d.id], used, d.lends_bytes, why))
    guests = sorted(d.id for d in devices if d.id not in in_chain)
    for g in guests:
        d = by_id[g]
        if g == host_id:
            used = _used_bytes(0, True, model, options)
            fits &= used <= d.lends_bytes
            shares.append(DeviceShare(g, "model host", 0, holds[g], used, d.lends_bytes, "coordinator, no layers"))
            continue
        why = "no WebGPU" if not d.webgpu else ("lends nothing" if d.lends_bytes <= 0 else "not needed")
        shares.append(DeviceShare(g, "guest", 0, holds[g], 0, d.lends_bytes, why))
    if not fits:
        notes = notes + ["the room cannot hold the model in what it lends: some devices are over"]
    return Deal(host=host_id, split=split, stages=stages, guests=tuple(g for g in guests if g != host_id),
                fits=fits, notes=tuple(notes), shares=tuple(shares))
