"""Whether a dealt room fits in what its devices lend, and what it offloads when it does not.

A deal (planner/deal.py) always places every layer; when the devices cannot hold the
model it spreads the leftover layers and says ``fits=False``. A room whose layers do not
fit cannot run, so predicting its speed is an error (:class:`RoomDoesNotFit`, one line
naming each device's shortfall), unless every device that is over has opted in to
offload (``Device.offload_Bps``): it then keeps what does not fit on disk or in host
memory and reads those weights on every pass, as prima.cpp does with mmap (the
simulator charges the read: sim/devices.py, "Offload").

A device's shortfall is ``used - usable`` bytes: ``used`` its layers' weights plus their
KV cache at the room's context (plus embedding, head and draft on the model host), as
the deal counts them (``DeviceShare.used_bytes``); ``usable`` what it lends less the
headroom (:func:`planner.deal.usable_bytes`). Offloaded bytes are weights only, at
most the stage's weight bytes: the KV cache stays in the lent memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.deal import Deal, DealError, format_bytes, usable_bytes
from planner.model import ModelSpec
from planner.room import DealOptions, Device

__all__ = ["RoomDoesNotFit", "Shortfall", "check_fits", "offload_bytes", "shortfalls"]


class RoomDoesNotFit(DealError):
    """A dealt room's layers do not fit in what its devices lend (and not every device
    that is over opted in to offload). The message is one line naming each shortfall."""


@dataclass(frozen=True)
class Shortfall:
    """One device over what it lends: ``used_bytes`` of ``usable_bytes`` (lends less the
    headroom), short ``short_bytes`` = used - usable; ``offload_Bps`` its offload rate
    (bytes/s) or None."""

    device: str
    used_bytes: int
    usable_bytes: int
    lends_bytes: int
    offload_Bps: float | None

    @property
    def short_bytes(self) -> int:
        """Bytes over what the device may use."""
        return self.used_bytes - self.usable_bytes


def shortfalls(deal: Deal, devices: Sequence[Device], options: DealOptions) -> list[Shortfall]:
    """Every device of ``deal`` whose share is over what it lends less the headroom, in
    the deal's order of shares (stages first)."""
    by_id = {d.id: d for d in devices}
    out = []
    for sh in deal.shares:
        d = by_id[sh.device]
        usable = usable_bytes(d, options)
        if sh.used_bytes > usable:
            out.append(Shortfall(d.id, sh.used_bytes, usable, d.lends_bytes, d.offload_Bps))
    return out


def check_fits(deal: Deal, devices: Sequence[Device], model: ModelSpec, options: DealOptions) -> None:
    """Raise :class:`RoomDoesNotFit` when some device is over what it lends less the
    headroom and has not opted in to offload, or is over by more than its stage's
    weights (only weights are offloaded). The message, one line:
    ``the room does not fit: laptop needs 9.4 GB of 7.6 GB (lends 8.0 GB less 5% headroom), short 1.8 GB; ...``."""
    parts = []
    for s in shortfalls(deal, devices, options):
        lent = (f"lends {format_bytes(s.lends_bytes)} less {options.headroom:.0%} headroom"
                if s.usable_bytes != s.lends_bytes else "what it lends")
        if s.offload_Bps is not None:
            st = deal.stage_of(s.device)
            weights = 0 if st is None else model.weight_bytes(st.start, st.end)
            if s.short_bytes <= weights:
                continue  # offloads the weights that do not fit
            parts.append(f"{s.device} needs {format_bytes(s.used_bytes)} of {format_bytes(s.usable_bytes)} "
                         f"({lent}), short {format_bytes(s.short_bytes)}, more than its layers' weights "
                         f"({format_bytes(weights)}) it may offload: its KV cache and host extras must fit")
            continue
        parts.append(f"{s.device} needs {format_bytes(s.used_bytes)} of {format_bytes(s.usable_bytes)} "
                     f"({lent}), short {format_bytes(s.short_bytes)}")
    if not parts:
        return
    raise RoomDoesNotFit("the room does not fit: " + "; ".join(parts)
                         + " (lend more, add a device, or opt in to offload: devices[].offload)")


def offload_bytes(deal: Deal, devices: Sequence[Device], model: ModelSpec, options: DealOptions) -> dict[str, int]:
    """Device id -> weight bytes it offloads (keeps outside what it lends and reads on
    every pass): its shortfall, at most its stage's weight bytes; only devices that
    opted in (``offload_Bps``) and are over appear."""
    out = {}
    for s in shortfalls(deal, devices, options):
        if s.offload_Bps is None:
            continue
        st = deal.stage_of(s.device)
        weights = 0 if st is None else model.weight_bytes(st.start, st.end)
        n = min(s.short_bytes, weights)
        if n > 0:
            out[s.device] = n
    return out
