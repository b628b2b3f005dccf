"""An analytic cost of one decode lap, small enough to search over (planner/optimal.py).

A lap of plain decoding is one token going round the ring: the host embeds it, every
stage runs its layers, each hand-off costs a hop, the last stage returns to the host,
the host runs the output head and samples. So, in seconds,

    lap = head_s(host) + sum_i stage_s(device_i, layers_i) + sum_hops hop_s(a, b)

and the predicted decode rate is ``1 / lap`` tokens per second (one token per lap;
speculative decoding multiplies every deal's rate by the same tokens per lap to first
order, so it does not change which deal is best).

* ``stage_s``: a measured ``ms_per_layer`` when the device has one, else the roofline
  of one decoded token, ``max(layer_active_bytes / bandwidth, layer_flops / compute)``
  per layer (decode reads each layer's weights once). KV reads are left out: they are
  the same bytes wherever a layer sits, on devices of similar bandwidth.
* ``head_s``: the output head read once (``head_bytes``, or the embedding when tied)
  over bandwidth, scaled by the device's measured/roofline ratio when it is measured,
  plus :data:`SAMPLE_S` for the argmax.
* ``hop_s(a, b)``: half the link's round trip + its hop overhead + one token's frame
  (header + ``residual_bytes_per_token``) over the link's bandwidth. The link is the
  pair's :func:`planner.links.resolve_link`, the simulator's own resolution (room
  defaults, then room-wide, undirected and directed overrides field by field, the more
  specific and then the later winning). Jitter, stall episodes and congestion windows are the
  simulator's business (sim/), not this model's.
* ``return_path``: ``direct`` (the last stage sends the result to the host) or
  ``via_stages`` (it travels back through every stage: each forward hop ``a -> b`` is
  matched by a return hop ``b -> a``, and the last stage's hop to the host by the first
  stage's).

Defaults for devices that give neither bandwidth nor compute are the room's
(planner.room.DEFAULT_BANDWIDTH_BPS / DEFAULT_COMPUTE_FLOPS, which the simulator uses
too): 100 GB/s and 3.6 TFLOPS for a computer (Apple M2), 50 GB/s and 2 TFLOPS for a phone.

This is deliberately one small class: a calibration profile (planner/profile.py) or the
simulator's richer model can replace it by providing the same three methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from planner.frames import HEADER_BYTES
from planner.model import ModelSpec
from planner.links import resolve_link
from planner.room import DEFAULT_BANDWIDTH_BPS, DEFAULT_COMPUTE_FLOPS, DEFAULT_SAMPLE_S_PER_TOKEN, Device, Network

#: greedy argmax over one row of logits (planner.room.DEFAULT_SAMPLE_S_PER_TOKEN)
SAMPLE_S = DEFAULT_SAMPLE_S_PER_TOKEN


@dataclass(frozen=True)
class LapCost:
    """Seconds of one decode lap, per part; see the module doc for the formulas.

    Args:
        devices: the room's devices (bandwidth, compute, measured ``s_per_layer``).
        model: the model (active bytes and FLOPs per layer, head bytes, residual size).
        network: link defaults and per-pair overrides.
        return_path: ``direct`` or ``via_stages`` (module doc).
    """

    devices: Sequence[Device]
    model: ModelSpec
    network: Network = field(default_factory=Network)
    return_path: str = "direct"

    def __post_init__(self) -> None:
        by_id = {d.id: d for d in self.devices}
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_links", {})

    def roofline_layer_s(self, device_id: str) -> float:
        """Roofline seconds of one layer for one decoded token on ``device_id``."""
        d = self._by_id[device_id]
        bw = d.memory_bandwidth_Bps or DEFAULT_BANDWIDTH_BPS[d.kind]
        fl = d.compute_flops or DEFAULT_COMPUTE_FLOPS[d.kind]
        return max(self.model.layer_active_bytes / bw, self.model.layer_flops_per_token / fl)

    def layer_s(self, device_id: str) -> float:
        """Seconds per layer per decoded token: measured if given, else the roofline."""
        d = self._by_id[device_id]
        return d.s_per_layer if d.s_per_layer else self.roofline_layer_s(device_id)

    def stage_s(self, device_id: str, start: int, end: int) -> float:
        """Seconds for ``device_id`` to run layers ``[start, end)`` on one token.

        With per-layer sizes, each layer's time scales with its bytes over the mean."""
        if self.model.uniform:
            return (end - start) * self.layer_s(device_id)
        return self.layer_s(device_id) * self.model.weight_bytes(start, end) / self.model.layer_bytes

    def head_s(self, device_id: str) -> float:
        """Seconds of the output head + sampling for one token on host ``device_id``."""
        d = self._by_id[device_id]
        bw = d.memory_bandwidth_Bps or DEFAULT_BANDWIDTH_BPS[d.kind]
        head = self.model.head_bytes or self.model.embedding_bytes
        scale = 1.0
        if d.s_per_layer:
            roof = self.roofline_layer_s(device_id)
            scale = d.s_per_layer / roof if roof > 0 else 1.0
        return head / bw * scale + SAMPLE_S

    def hop_s(self, a: str, b: str) -> float:
        """Seconds of one hand-off of one token's residual from ``a`` to ``b``."""
        link = self._links.get((a, b))
        if link is None:  # resolved as the simulator resolves it (planner.links), once per pair
            link = self._links[(a, b)] = resolve_link(self.network, a, b)
        frame = HEADER_BYTES + self.model.residual_bytes_per_token
        return link.rtt_s / 2 + link.hop_overhead_s + frame / link.bandwidth_Bps

    def lap_s(self, host: str, stages: Sequence[tuple[str, int, int]]) -> float:
        """Seconds of one lap: host's head, every stage, every hop round the ring.

        ``stages``: ``(device, start, end)`` in chain order; the host need not be first
        (a coordinator host holds no layers). Hops: host -> first stage (when the first
        stage is not the host), stage to stage, then back: last stage -> host
        (``direct``), or back through every stage to the host (``via_stages``).
        """
        t = self.head_s(host)
        for dev, start, end in stages:
            t += self.stage_s(dev, start, end)
        return t + self.hops_s(host, [s[0] for s in stages])

    def tokens_per_s_in_flight(self, host: str, stages: Sequence[tuple[str, int, int]], in_flight: int) -> float:
        """Plain decode tokens per second, all questions together, with ``in_flight``
        questions' laps interleaved through the chain (each lap a pass of its own).

        Each question still takes one lap per token, so ``in_flight`` of them give at
        most ``in_flight / lap_s``; and each device computes one pass at a time, so no
        more than one token per ``busy_s`` of the busiest device (its stages' seconds
        per lap, the host's head and sampling included). The rate is the smaller:
        ``min(in_flight / lap_s, 1 / max busy_s)`` (the pipeline bound of GPipe, Huang
        et al. 2019, for a ring). Raises ValueError for ``in_flight`` < 1.
        """
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        busy: dict[str, float] = {host: self.head_s(host)}
        for dev, start, end in stages:
            busy[dev] = busy.get(dev, 0.0) + self.stage_s(dev, start, end)
        return min(in_flight / self.lap_s(host, stages), 1.0 / max(busy.values()))

    def hops_s(self, host: str, chain: Sequence[str]) -> float:
        """Seconds of every hand-off of one lap through ``chain`` (device ids in order)
        from and back to ``host``, by ``return_path``."""
        return sum(self.hop_s(a, b) for a, b in lap_hops(host, chain, self.return_path))


def lap_hops(host: str, chain: Sequence[str], return_path: str = "direct") -> list[tuple[str, str]]:
    """The links ``(src, dst)`` one lap crosses through ``chain`` (device ids in order)
    from and back to ``host``: host -> first, stage to stage, then the last stage -> host
    (``direct``) or back through every stage to the host (``via_stages``); a device's
    hand-off to itself is no hop."""
    path = [host] + list(chain)
    if return_path == "via_stages":
        back = path[::-1]
        hops = list(zip(path, path[1:])) + list(zip(back, back[1:]))
    else:
        ring = path + [host]
        hops = list(zip(ring, ring[1:]))
    return [(a, b) for a, b in hops if a != b]
