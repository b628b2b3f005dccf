"""How long a device takes to compute: its layers, and on the model host the
embedding, output head, sampling and drafting; plus phone GPU clock-down.

Compute model (all times in seconds)
------------------------------------
Roofline. One stage of ``L`` layers on ``n`` token positions takes

    max(L * bytes_read(n) / bandwidth,  n * L * layer_flops_per_token / compute)

(+ the KV cache read, ``L * n_ctx * kv_bytes_per_token / bandwidth``, when a context
length is passed; and on the compute side attention over the context:
``L * 4 * attn_width * (n * n_ctx + n * (n + 1) / 2) / compute``, position ``i`` of the
chunk attending to ``n_ctx + i`` positions at two multiply-adds a head dimension, q.k
and p.v: the ``4 x seqlen^2 x head_dim x heads`` forward count of FlashAttention's
benchmarks, Dao et al. 2022). Decode passes stay memory bound: what context costs them
is the KV read. Decoding one token reads each layer's weights once, which is why
decode is memory bound: a chunk of n tokens costs max(bytes/bandwidth, flops/compute).

``bytes_read(n)`` for a dense layer is ``layer_active_bytes`` whatever ``n`` is (every
position of a chunk shares one read of the weights). For a mixture-of-experts layer
each position routes to ``k`` of ``E`` experts, so a chunk touches more experts than a
single token does. Taking routing as uniform and independent across positions, the
expected number of distinct experts ``n`` positions touch is ``E * (1 - (1 - k/E)**n)``
(the occupancy formula), and

    bytes_read(n) = layer_active_bytes + (E * (1 - (1 - k/E)**n) - k) * expert_bytes

capped at ``layer_bytes`` (all experts). ``E``, ``k`` and ``expert_bytes`` come from the
``moe=`` argument, else from the catalog architecture when ``model.id`` is a catalog
MoE model whose sizes match (planner/model.py ``ARCHITECTURES``). An MoE model with
neither (an inline spec) uses the upper bound ``min(layer_bytes, n * layer_active_bytes)``
(each position reads its own experts, no overlap). Real routing is not uniform (popular
experts overlap more), so the occupancy formula slightly overestimates the bytes.

Measured devices. When the device gives ``ms_per_layer`` (``Device.s_per_layer``, a
measured time per layer per *decoded token*), a stage takes
``s_per_layer * L * ratio(n)`` where ``ratio(n) = roofline(n) / roofline(1)`` for one
layer on this device: the measurement fixes the one-token time, the roofline says how a
chunk of ``n`` scales from it (1.0 while memory bound for dense layers; MoE chunks read
more experts; compute-bound chunks grow linearly). The measurement is taken to be at a
short context: a ``context_tokens`` KV read is added through the same ratio. The measured/roofline ratio of one
token (``host_scale``) also scales the host costs below (head, embedding, draft layer):
the same device runs them with the same kernels, so its efficiency carries over.

Host costs
----------
* ``head_s(n)``: final norm + output head on ``n`` positions: reads the head matrix
  once (``head_bytes``, or ``embedding_bytes`` when the head is tied to the embedding)
  and costs ``n * head_flops_per_token`` FLOPs; roofline of the two.
* ``embed_s(n)``: gathers ``n`` embedding rows of ``embedding_bytes / vocab`` bytes
  (vocab = ``head_flops_per_token / (2 * hidden)``; ``2 * hidden`` bytes per row when
  unknown). Microseconds: a table lookup.
* ``sample_s(n)``: greedy argmax over the logits of ``n`` positions, a constant
  :data:`DEFAULT_SAMPLE_S_PER_TOKEN` per position (0.1 ms: one pass over ~150-250 k
  float32 logits, about 1 MB, at the ~10 GB/s a single CPU core streams). An assumption.
* ``draft_s(k)``: ``k`` drafted tokens. ``Speculative.draft_s_per_token`` when given
  (taken literally), else by drafter: ``ngram`` costs :data:`NGRAM_S_PER_TOKEN`
  (10 us per token, a lookup in the tokens so far; an assumption); ``draft_layer`` (an
  MTP head) reads, per drafted token, the draft layer's active weights
  (``draft_bytes * layer_active_bytes / layer_bytes``) plus the output head it
  shares with the model; roofline against its FLOPs, times ``host_scale``.

Phone GPU clock-down
--------------------
Mobile GPUs lower their clock when their queue runs dry and take time to ramp back up
(dynamic voltage and frequency scaling). Decoding submits many small pieces of work
per token, and the clock falls in the gaps between them; a prompt chunk keeps the GPU
busy with large submissions. Public measurements of llama.cpp on an Adreno 830 over
Vulkan show exactly that: decode 21.0 tok/s with the clock free vs
31.5 with it pinned (a second model: 11.8 vs 13.7), prompt processing unchanged. So a
device that clocks down runs a decode or verify pass (at most
:data:`DECODE_MAX_TOKENS` positions) :data:`DECODE_CLOCK_DOWN_FACTOR` (31.5 / 21.0 =
1.5) times slower, unless a wake spin is running when the pass starts; prefill chunks
are unaffected.

``wake(now_s, until_s)`` is the host's wake message (product page 001: "The phone
keeps its GPU busy until it arrives, for at most 50 ms, so the GPU hasn't clocked
down"): the GPU spins from ``now_s`` to ``min(until_s, now_s + 50 ms)``, and a pass
that starts within that spin runs at full clock; a frame that arrives after the spin
ended finds the clock down. A model host that clocks down wakes itself
(``self_wake``: it knows its own schedule). Computers do not clock down
(``clock_down`` defaults to ``device.kind == "phone"``).

Calibrated devices
------------------
With a measured :class:`planner.profile.DeviceProfile` (``splitroom calibrate``), a
stage takes ``profile.stage.pass_s(layers, tokens, context)`` (measured on a grid of
tokens and context, see planner/profile.py), the head ``profile.head(rows)``, and
drafting the :class:`planner.profile.DrafterProfile`'s measured seconds per call; the
device is then known not to clock down unless the scenario says ``clocks_down: true``.

Roofline efficiency and engine overheads
----------------------------------------
Without a profile, a device may name an engine preset (sim/engines.py) that scales the
roofline: ``stage = roofline / efficiency + pass_overhead + layers * layer_overhead``.
Without one the roofline is used as is (efficiency 1, no overheads), which is an upper
bound on speed.

A device's own ``efficiency`` and ``overhead`` (scenario keys) replace its preset's
numbers one by one; either alone applies to the plain roofline.

Offload
-------
A room that does not fit is an error (planner/fit.py) unless each device that is over
opted in to offload (``offload: {bandwidth: RATE}``). Such a device keeps
``offload_bytes`` of its stage's weights on disk or in host memory and reads them on
every pass of its stage, at ``offload_Bps``: ``stage += offload_bytes x share /
offload_Bps``, where ``share`` is the part of a layer's weights the pass reads (1 for
dense layers; for MoE the active or touched experts, as above). The read is added, not
overlapped with compute: prima.cpp (Li et al. 2025, arXiv 2504.08791) prefetches
mmap'd layers ahead of use and hides part of it, so this is an upper bound on time.
The read is charged to the simulator's stage passes only (not to a ``model`` drafter's
pass through the same device).

The model never reads a clock: stateful calls take ``now_s`` (simulation seconds).

Defaults when a device gives neither ``memory_bandwidth`` nor ``ms_per_layer``
-----------------------------------------------------------------------------
* computer: 100 GB/s memory bandwidth (Apple M2's published unified-memory bandwidth,
  a mid-range laptop), 3.6 TFLOPS (M2 10-core GPU, Apple's published figure).
* phone: 50 GB/s (LPDDR5-6400 on a 64-bit bus = 51.2 GB/s, as in Apple's A17 Pro),
  2 TFLOPS (a current flagship phone GPU, order of magnitude).
A device that gives bandwidth but no ``compute`` gets its kind's default compute.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from planner.model import ARCHITECTURES, ModelSpec, spec_from_architecture
from planner.fit import offload_bytes as room_offload_bytes
from planner.profile import DeviceProfile, DrafterProfile
from planner.scheduler.config import WAKE_MAX_S
from planner.room import (DEFAULT_BANDWIDTH_BPS, DEFAULT_COMPUTE_FLOPS, DEFAULT_SAMPLE_S_PER_TOKEN, DRAFTERS, Device,
                          Speculative)
from sim.engines import engine as engine_preset
from sim.link import resolve_link

__all__ = [
    "DEFAULT_BANDWIDTH_BPS",
    "DEFAULT_COMPUTE_FLOPS",
    "DECODE_CLOCK_DOWN_FACTOR",
    "DECODE_MAX_TOKENS",
    "DEFAULT_SAMPLE_S_PER_TOKEN",
    "DRAFTERS",
    "NGRAM_S_PER_TOKEN",
    "WAKE_MAX_S",
    "DeviceModel",
    "device_model",
    "moe_layout",
]

#: a clocked-down phone decodes this much slower: 31.5 / 21.0 tok/s, llama.cpp Vulkan
#: on an Adreno 830 with the GPU clock pinned vs free (public figures)
DECODE_CLOCK_DOWN_FACTOR = 31.5 / 21.0
#: passes of at most this many positions are decode/verify passes (clock-down applies);
#: larger ones are prefill chunks (16 by default), whose large submissions keep the clock up
DECODE_MAX_TOKENS = 9
NGRAM_S_PER_TOKEN = 1e-5


def moe_layout(model: ModelSpec) -> tuple[int, int, float] | None:
    """``(experts, active_experts, expert_bytes)`` of a catalog MoE model, or of an
    inline one described by its architecture (``ModelSpec.experts``), or None.

    Found through ``planner.model.ARCHITECTURES[model.id]`` and used only when the
    architecture's derived ``layer_bytes`` and ``layer_active_bytes`` equal the spec's
    (so an edited spec is not misread). ``expert_bytes`` = ``3 * hidden * expert_ffn``
    weights (gate, up, down) at the architecture's bits per weight.
    """
    entry = ARCHITECTURES.get(model.id)
    if entry is None:  # an inline model given by architecture (model.experts ...)
        return (model.experts, model.active_experts, model.expert_bytes) if model.experts else None
    name, arch = entry
    if not arch.experts:
        return None
    ref = spec_from_architecture(model.id, name, arch)
    if (ref.layer_bytes, ref.layer_active_bytes) != (model.layer_bytes, model.layer_active_bytes):
        return None
    return arch.experts, arch.active_experts, 3 * arch.hidden * arch.expert_ffn * arch.bits_per_weight / 8


class DeviceModel:
    """Compute times of one device for one model (seconds).

    Args:
        device: the device (kind, bandwidth, compute, measured ``s_per_layer``).
        model: the model it runs.
        clock_down: whether this device clocks down (default: it is a phone; False
            when a profile is given, unless ``device.clocks_down`` says otherwise).
        self_wake: a clocking-down device keeps its own clock up (the model host with
            wake messages on); default False.
        wake_max_s: the longest a wake message keeps the GPU busy, seconds.
        sample_s_per_token: greedy sampling cost per position, seconds.
        slowdown: multiply every roofline compute time by this (e.g.
            ``device.emulate_slowdown`` to predict a real run that pads compute); 1.0
            by default. A profile's times already include the slowdown measured.
        moe: ``(experts, active_experts, expert_bytes)`` for an MoE model; default
            :func:`moe_layout` (catalog models).
        profile: the device's measured curves (planner/profile.py), or None.
        drafters: measured drafters by name (a profile's), used by :meth:`draft_s`.
        efficiency: fraction of the roofline an engine reaches (0, 1]; 1 by default.
        pass_overhead_s, layer_overhead_s: fixed seconds per pass and per layer of a
            pass (an engine's launch/dispatch cost); 0 by default.
        offload_bytes: weight bytes of its stage kept outside what it lends
            (planner.fit.offload_bytes), read on every pass of the stage at
            ``offload_Bps`` bytes/s (module docstring, "Offload"); 0 by default.

    Raises:
        ValueError: a non-positive bandwidth, compute, measured time, slowdown or
            efficiency, or a negative overhead.
    """

    def __init__(
        self,
        device: Device,
        model: ModelSpec,
        *,
        clock_down: bool | None = None,
        self_wake: bool = False,
        wake_max_s: float = WAKE_MAX_S,
        sample_s_per_token: float = DEFAULT_SAMPLE_S_PER_TOKEN,
        slowdown: float = 1.0,
        moe: tuple[int, int, float] | None = None,
        profile: DeviceProfile | None = None,
        drafters: dict[str, DrafterProfile] | None = None,
        efficiency: float = 1.0,
        pass_overhead_s: float = 0.0,
        layer_overhead_s: float = 0.0,
        offload_bytes: float = 0.0,
        offload_Bps: float | None = None,
    ) -> None:
        self.device = device
        self.model = model
        kind = device.kind if device.kind in DEFAULT_BANDWIDTH_BPS else "computer"
        bw, fl = device.memory_bandwidth_Bps, device.compute_flops
        self.bandwidth_Bps = float(DEFAULT_BANDWIDTH_BPS[kind] if bw is None else bw)
        self.compute_flops = float(DEFAULT_COMPUTE_FLOPS[kind] if fl is None else fl)
        if not (self.bandwidth_Bps > 0 and self.compute_flops > 0):
            raise ValueError(f"device {device.id}: bandwidth and compute must be > 0")
        if device.s_per_layer is not None and not device.s_per_layer > 0:
            raise ValueError(f"device {device.id}: ms_per_layer must be > 0, got {device.s_per_layer}")
        if not slowdown > 0:
            raise ValueError(f"device {device.id}: slowdown must be > 0, got {slowdown}")
        if not 0 < efficiency <= 1:
            raise ValueError(f"device {device.id}: efficiency must be in (0, 1], got {efficiency}")
        if wake_max_s < 0 or sample_s_per_token < 0 or pass_overhead_s < 0 or layer_overhead_s < 0:
            raise ValueError("wake_max_s, sample_s_per_token and overheads must be >= 0")
        if offload_bytes < 0 or (offload_bytes > 0 and not (offload_Bps or 0) > 0):
            raise ValueError(f"device {device.id}: offloaded bytes need an offload rate > 0")
        self.profile = profile
        self.drafters = dict(drafters or {})
        if clock_down is None:
            clock_down = device.clocks_down if device.clocks_down is not None else (
                device.kind == "phone" and profile is None)
        self.clock_down = bool(clock_down)
        self.self_wake = bool(self_wake)
        self.wake_max_s = float(wake_max_s)
        self.sample_s_per_token = float(sample_s_per_token)
        self.slowdown = float(slowdown)
        self.efficiency = float(efficiency)
        self.pass_overhead_s = float(pass_overhead_s)
        self.layer_overhead_s = float(layer_overhead_s)
        self.moe = moe if moe is not None else moe_layout(model)
        self.offload_bytes = float(offload_bytes)
        self.offload_Bps = offload_Bps
        #: a separate draft model's cost model on its device (drafter ``model``), and the
        #: round trip from the host to that device and back (seconds); set by device_model
        self.draft: DeviceModel | None = None
        self.draft_round_trip_s = 0.0
        #: ``head: last_stage``: the last stage's device model, which runs the head and
        #: sampling that :meth:`head_s` / :meth:`sample_s` report; set by device_model
        self.head_device: DeviceModel | None = None
        self.measured = device.s_per_layer is not None
        one = self._roofline_layer_s(1)
        #: measured seconds per layer-token over the roofline's (1.0 when not measured)
        self.host_scale = (device.s_per_layer / one) if (self.measured and one > 0) else 1.0
        self._one_s = one
        self._cache: dict[tuple[int, int, int], float] = {}
        self._per_tokens: dict[int, tuple[float, float]] = {}
        self._busy_end_s = -math.inf
        self._wake_until_s = -math.inf

    # -- pure compute times ------------------------------------------------------------

    def layer_bytes_read(self, tokens: int) -> float:
        """Weight bytes one layer reads for a chunk of ``tokens`` positions (see the
        module docstring: dense = active bytes; MoE = occupancy of the experts)."""
        m = self.model
        if tokens <= 1 or m.layer_bytes <= m.layer_active_bytes:
            return float(m.layer_active_bytes)
        if self.moe is None:
            return float(min(m.layer_bytes, tokens * m.layer_active_bytes))
        e, k, eb = self.moe
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        return float(min(m.layer_bytes, m.layer_active_bytes + (touched - k) * eb))

    def attention_flops(self, tokens: int, context_tokens: int) -> float:
        """FLOPs of one layer's attention for ``tokens`` positions after
        ``context_tokens`` cached ones: position ``i`` (1-based) attends to
        ``context + i`` positions at 4 FLOPs per position per unit of
        ``ModelSpec.attn_width`` (q.k and p.v), so ``4 * attn_width * (tokens * context
        + tokens * (tokens + 1) / 2)``; 0 when the width is unknown."""
        w = self.model.attn_width
        if not w or tokens <= 0:
            return 0.0
        return 4.0 * w * (tokens * context_tokens + tokens * (tokens + 1) / 2)

    def _roofline_layer_s(self, tokens: int, context_tokens: int = 0) -> float:
        m = self.model
        mem = (self.layer_bytes_read(tokens) + context_tokens * m.kv_bytes_per_token) / self.bandwidth_Bps
        flops = (tokens * m.layer_flops_per_token + self.attention_flops(tokens, context_tokens)) / self.compute_flops
        return mem if mem > flops else flops

    def roofline_stage_s(self, layers: int, tokens: int, context_tokens: int = 0) -> float:
        """Roofline time of ``layers`` layers on ``tokens`` positions, seconds, with the
        KV cache of ``context_tokens`` positions read too (f16). No measurement, no
        slowdown. Raises ValueError for negative arguments."""
        if layers < 0 or tokens < 0 or context_tokens < 0:
            raise ValueError(f"layers, tokens, context must be >= 0, got {layers}, {tokens}, {context_tokens}")
        if layers == 0 or tokens == 0:
            return 0.0
        return layers * self._roofline_layer_s(tokens, context_tokens)

    def stage_s(self, layers: int, tokens: int, *, now_s: float | None = None, context_tokens: int = 0,
                decode: bool | None = None) -> float:
        """Time to run ``layers`` layers on a chunk of ``tokens`` positions with
        ``context_tokens`` positions already cached, seconds.

        Profiled: the measured ``pass_s(layers, tokens, context)``. Measured
        ``s_per_layer``: ``s_per_layer * layers * roofline(tokens, ctx)/roofline(1, 0)``.
        Else the roofline over the efficiency plus the engine overheads, times
        ``slowdown``. With ``now_s`` (the stage's start, simulation seconds) the
        call is stateful: a clocked-down decode pass is slower (module docstring);
        ``decode`` says whether this is a decode/verify pass (None: at most
        :data:`DECODE_MAX_TOKENS` positions).
        Raises ValueError for negative arguments.
        """
        if now_s is None:
            return self.pass_s(layers, tokens, context_tokens)
        return self.run_s(layers, tokens, context_tokens, now_s,
                          tokens <= DECODE_MAX_TOKENS if decode is None else decode)

    def pass_s(self, layers: int, tokens: int, context_tokens: int = 0, weight_scale: float = 1.0) -> float:
        """:meth:`stage_s` without ``now_s`` (pure): seconds. ``weight_scale``: the
        stage's weight bytes over ``layers * layer_bytes`` (models whose layers differ
        in size, ``ModelSpec.layer_sizes``; see :meth:`stage_scale`): the weight read
        and the FLOPs of a roofline or measured device scale by it (a profiled device
        is measured on its own layers and ignores it). Raises ValueError for
        negative arguments."""
        if self.profile is not None:
            key = (layers, tokens, context_tokens)
            s = self._cache.get(key)
            if s is None:
                s = self.profile.stage.pass_s(layers, tokens, context_tokens) if layers else 0.0
                if len(self._cache) < 4096:
                    self._cache[key] = s
            return s
        s = self._roofline_pass_s(layers, tokens, context_tokens, weight_scale)
        if self.measured and s > 0:
            s = self.device.s_per_layer * layers * (s / layers) / self._one_s
        elif s > 0:
            s = s / self.efficiency + self.pass_overhead_s + layers * self.layer_overhead_s
        return s * self.slowdown

    def idle_factor(self, start_s: float) -> float:
        """The profile's factor (:meth:`planner.profile.DeviceProfile.idle_factor`) on work
        that starts at ``start_s``, after the device's last known work ended (1 without a
        profile or its ``idle`` curve; pure)."""
        if self.profile is None or self.profile.idle is None or self._busy_end_s == -math.inf:
            return 1.0
        return self.profile.idle_factor(start_s - self._busy_end_s)

    def ran_until(self, end_s: float) -> None:
        """Other work of this device (its head) ran until ``end_s``: mark it busy till then."""
        if end_s > self._busy_end_s:
            self._busy_end_s = end_s

    def run_s(self, layers: int, tokens: int, context_tokens: int, start_s: float, decode: bool,
              weight_scale: float = 1.0) -> float:
        """:meth:`stage_s` with ``now_s=start_s`` and ``decode`` given, positionally (the
        simulator's per-stage call), ``weight_scale`` as in :meth:`pass_s`: seconds, and
        the GPU marked busy until it ends. A profiled device's prefill pass (``decode``
        false) is its curve's time times the profile's ``prefill_ratio``; its decode or
        verify pass, times :meth:`idle_factor` (the profile's ``idle`` curve)."""
        s = self.pass_s(layers, tokens, context_tokens, weight_scale)
        if not decode and self.profile is not None:  # a prefill chunk in a room (DeviceProfile.prefill_ratio)
            s *= self.profile.prefill_ratio
        elif self.profile is not None and self.profile.idle is not None:  # after idle (DeviceProfile.idle)
            s *= self.idle_factor(start_s)
        if self.offload_bytes and layers > 0 and tokens > 0:
            s += self.offload_s(tokens)
        if not self.clock_down:  # busy_s without the clock-down check (the same numbers)
            end = start_s + s
            if end > self._busy_end_s:
                self._busy_end_s = end
            return s
        return self.busy_s(start_s, s, decode=decode)

    def stage_scale(self, start: int, end: int) -> float:
        """The weight scale of the stage of layers ``[start, end)``: its weight bytes
        over ``(end - start) * layer_bytes``; exactly 1.0 when every layer weighs
        ``layer_bytes`` (no ``layer_sizes``) or the stage is empty."""
        m = self.model
        if m.uniform or end <= start or not m.layer_bytes:
            return 1.0
        return m.weight_bytes(start, end) / ((end - start) * m.layer_bytes)

    def stage_timer(self, layers: int, weight_scale: float = 1.0) -> Callable[[int, int, float, bool], float]:
        """``f(tokens, context_tokens, start_s, decode) -> seconds``: :meth:`run_s` for a
        stage of ``layers`` layers, as one function (the simulator calls it per stage
        per lap). The same numbers as :meth:`run_s`; for a roofline device that does
        not clock down, the arithmetic is inlined."""
        if (self.profile is not None or self.clock_down or layers <= 0 or weight_scale != 1.0
                or self.offload_bytes):
            return lambda tokens, ctx, start, decode: self.run_s(layers, tokens, ctx, start, decode, weight_scale)
        per_tokens, bw, kvb = self._per_tokens, self.bandwidth_Bps, self.model.kv_bytes_per_token
        slowdown = self.slowdown
        att = 4.0 * self.model.attn_width / self.compute_flops  # attention_flops over compute, per position pair
        measured = self.measured
        if measured:  # pass_s's two cases, without its call: s_per_layer scaled by the roofline
            spl, one = self.device.s_per_layer, self._one_s
        else:  # the roofline over the efficiency plus the engine overheads
            eff, po, lo = self.efficiency, self.pass_overhead_s, self.layer_overhead_s

        def timer(tokens: int, ctx: int, start: float, decode: bool) -> float:
            if tokens <= 0 or ctx < 0:
                return self.run_s(layers, tokens, ctx, start, decode)  # 0 s, or the error
            per = per_tokens.get(tokens)
            if per is None:
                self._roofline_pass_s(layers, tokens, ctx)  # fills per_tokens[tokens]
                per = per_tokens[tokens]
            mem = (per[0] + ctx * kvb) / bw
            flops = per[1] + att * (tokens * ctx + tokens * (tokens + 1) / 2) if att else per[1]
            s = layers * (mem if mem > flops else flops)
            if s > 0:
                s = spl * layers * (s / layers) / one if measured else s / eff + po + layers * lo
            s *= slowdown
            end = start + s
            if end > self._busy_end_s:
                self._busy_end_s = end
            return s
        return timer

    def offload_s(self, tokens: int) -> float:
        """Seconds one pass of its stage on ``tokens`` positions spends reading the
        offloaded weights: ``offload_bytes`` times the share of a layer's weights the
        pass reads (1 for dense layers; active experts, or the experts ``tokens``
        positions touch, for MoE: :meth:`layer_bytes_read` / ``layer_bytes``) over
        ``offload_Bps``. 0 without offload."""
        if not self.offload_bytes or tokens <= 0:
            return 0.0
        lb = self.model.layer_bytes
        share = self.layer_bytes_read(tokens) / lb if lb else 1.0
        return self.offload_bytes * min(share, 1.0) / self.offload_Bps

    def _roofline_pass_s(self, layers: int, tokens: int, context_tokens: int, weight_scale: float = 1.0) -> float:
        """:meth:`roofline_stage_s` (the same arithmetic, in the same order), with the
        weight bytes and FLOP time of ``tokens`` positions kept per ``tokens``: the
        simulator asks at a new context length every lap."""
        if layers < 0 or tokens < 0 or context_tokens < 0:
            raise ValueError(f"layers, tokens, context must be >= 0, got {layers}, {tokens}, {context_tokens}")
        if layers == 0 or tokens == 0:
            return 0.0
        per = self._per_tokens.get(tokens)
        if per is None:
            m = self.model
            per = self._per_tokens[tokens] = (self.layer_bytes_read(tokens),
                                              tokens * m.layer_flops_per_token / self.compute_flops)
        if weight_scale != 1.0:  # layers of their own sizes: weights read and FLOPs follow the bytes
            per = (per[0] * weight_scale, per[1] * weight_scale)
        mem = (per[0] + context_tokens * self.model.kv_bytes_per_token) / self.bandwidth_Bps
        flops = per[1]
        if self.model.attn_width:
            flops += self.attention_flops(tokens, context_tokens) / self.compute_flops
        return layers * (mem if mem > flops else flops)

    def head_s(self, tokens: int = 1) -> float:
        """Final norm + output head on ``tokens`` positions, seconds: the profile's
        measured head curve, else the roofline of ``head_bytes`` (or
        ``embedding_bytes`` when tied) against ``tokens * head_flops_per_token``, times
        ``host_scale`` and ``slowdown``, over the efficiency."""
        if tokens <= 0:
            return 0.0
        if self.head_device is not None:  # head: last_stage
            return self.head_device.head_s(tokens)
        if self.profile is not None:
            return self.profile.head(tokens)
        m = self.model
        nbytes = m.head_bytes or m.embedding_bytes
        mem = nbytes / self.bandwidth_Bps
        flops = tokens * m.head_flops_per_token / self.compute_flops
        return max(mem, flops) * self.host_scale * self.slowdown / self.efficiency

    def sample_s(self, tokens: int = 1) -> float:
        """Greedy sampling of ``tokens`` positions, seconds: 0 with a profile (its head
        curve includes the argmax), else ``tokens * sample_s_per_token * slowdown``; on
        the head's device with ``head: last_stage``."""
        if self.head_device is not None:
            return self.head_device.sample_s(tokens)
        if self.profile is not None:
            return 0.0
        return max(tokens, 0) * self.sample_s_per_token * self.slowdown

    def embed_s(self, tokens: int = 1) -> float:
        """Embedding lookup of ``tokens`` tokens, seconds (``tokens`` rows of the
        embedding over the bandwidth; microseconds)."""
        if tokens <= 0:
            return 0.0
        m = self.model
        vocab = m.head_flops_per_token / (2 * m.hidden) if m.hidden else 0
        row = m.embedding_bytes / vocab if vocab >= 1 and m.embedding_bytes else 2 * m.hidden
        return tokens * row / self.bandwidth_Bps * self.host_scale * self.slowdown

    def draft_s(self, k: int, speculative: Speculative | None = None) -> float:
        """Drafting ``k`` tokens on this (host) device, seconds.

        ``speculative.draft_s_per_token`` when given (literal, ``k`` times it); a
        profiled drafter of that name: its measured seconds per call of ``k``; an
        ``ngram`` drafter costs 10 us a token (a lookup); ``draft_layer`` (an MTP
        head) reads, per drafted token, the draft layer's active weights and the
        output head; ``early_exit`` runs a quarter of the layers (rounded up) and the
        head per token; ``model`` the whole model and the head per token, or, with a
        separate draft model (``self.draft``, set by :func:`device_model`), ``k +
        draft_extra_passes`` passes of all its layers and its head on its own device
        and engine, plus ``draft_round_trip_s`` when it runs on another device;
        rooflines times ``host_scale`` and ``slowdown``.
        Raises ValueError for ``k < 0`` or a drafter with no cost model.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if speculative is not None and speculative.draft_s_per_token is not None:
            return k * speculative.draft_s_per_token
        drafter = speculative.drafter if speculative is not None else "draft_layer"
        prof = self.drafters.get(drafter)
        if prof is not None:
            return prof.draft_s(k)
        if drafter == "ngram":
            return k * NGRAM_S_PER_TOKEN * self.slowdown
        m = self.model
        head = self.head_s(1)
        if drafter == "early_exit":
            return k * (self.stage_s(-(-m.layers // 4), 1) + head)
        if drafter == "model" and self.draft is not None:
            d = self.draft
            passes = k + (speculative.draft_extra_passes if speculative is not None else 0)
            return passes * (d.stage_s(d.model.layers, 1) + d.head_s(1)) + self.draft_round_trip_s
        if drafter == "model":
            return k * (self.stage_s(m.layers, 1) + head)
        if drafter != "draft_layer":
            raise ValueError(f"no cost model for drafter {drafter!r}; choose one of {', '.join(DRAFTERS)}")
        share = m.layer_active_bytes / m.layer_bytes if m.layer_bytes else 1.0
        nbytes = m.draft_bytes * share + (m.head_bytes or m.embedding_bytes)
        draft_layers = m.draft_bytes / m.layer_bytes if m.layer_bytes else 0.0
        flops = draft_layers * m.layer_flops_per_token + m.head_flops_per_token
        per_token = max(nbytes / self.bandwidth_Bps, flops / self.compute_flops)
        return k * per_token * self.host_scale * self.slowdown / self.efficiency

    # -- clock-down state --------------------------------------------------------------

    def woken(self, now_s: float) -> bool:
        """Whether a pass starting at ``now_s`` finds the clock up (pure): always for a
        device that does not clock down or wakes itself; else within a wake spin."""
        return (not self.clock_down) or self.self_wake or now_s <= self._wake_until_s

    def penalty_s(self, now_s: float, compute_s: float) -> float:
        """Extra seconds a decode pass of ``compute_s`` starting at ``now_s`` takes
        because the clock is down (pure)."""
        return 0.0 if self.woken(now_s) else compute_s * (DECODE_CLOCK_DOWN_FACTOR - 1.0)

    def busy_s(self, now_s: float, compute_s: float, decode: bool = True) -> float:
        """Run ``compute_s`` seconds of GPU work starting at ``now_s``: returns its
        duration (slower for a decode pass on a clocked-down GPU) and marks the GPU
        busy until it ends."""
        dur = compute_s + (self.penalty_s(now_s, compute_s) if decode else 0.0)
        end = now_s + dur
        if end > self._busy_end_s:
            self._busy_end_s = end
        return dur

    def wake(self, now_s: float, until_s: float) -> None:
        """The host's wake message at ``now_s``: keep the GPU spinning until ``until_s``
        (the frame's expected arrival), at most ``wake_max_s`` (50 ms) past ``now_s``.
        Seconds."""
        end = min(until_s, now_s + self.wake_max_s)
        if end > self._wake_until_s:
            self._wake_until_s = end
        if end > self._busy_end_s:
            self._busy_end_s = end

    @property
    def busy_until_s(self) -> float:
        """When the GPU's last known work (or wake spin) ends, seconds."""
        return self._busy_end_s


def device_model(d: Device, scn, deal, profile=None) -> DeviceModel:
    """The cost model of device ``d`` in scenario ``scn`` (a planner.room.Scenario)
    dealt as ``deal``: its measured profile (``profile``, a planner.profile.Profile, or
    None), else its engine preset (sim/engines.py) with the device's own
    ``efficiency`` and overheads replacing the preset's one by one; the weights it
    offloads (planner/fit.py) when it opted in. The model host wakes itself when wake
    messages are on, and with a separate draft model (``speculative.draft_model``) gets
    its cost model on the draft device (``DeviceModel.draft``) and the round trip to it;
    with ``head: last_stage`` its head and sampling are timed on the last stage's device
    (``DeviceModel.head_device``).
    Raises KeyError for an unknown engine, ValueError for bad numbers."""
    eng = engine_preset(d.engine) if d.engine else None

    def pick(own, preset_value, default):
        if own is not None:
            return own
        return preset_value if eng is not None else default
    off = room_offload_bytes(deal, scn.devices, scn.model, scn.options).get(d.id, 0) if d.offload_Bps else 0
    dm = DeviceModel(d, scn.model, profile=profile.devices.get(d.id) if profile else None,
                       drafters=profile.drafters if profile else None,
                       self_wake=scn.decoding.wake and d.id == deal.host,
                       efficiency=pick(d.efficiency, eng and eng.efficiency, 1.0),
                       pass_overhead_s=pick(d.pass_overhead_s, eng and eng.pass_overhead_s, 0.0),
                       layer_overhead_s=pick(d.layer_overhead_s, eng and eng.layer_overhead_s, 0.0),
                       offload_bytes=off, offload_Bps=d.offload_Bps)
    last = deal.stages[-1].device if deal.stages else d.id
    if d.id == deal.host and scn.decoding.head == "last_stage" and last != d.id:
        dm.head_device = device_model(scn.device(last), replace(scn, decoding=replace(scn.decoding, head="host")),
                                      deal, profile)
    spec = scn.decoding.speculative
    if d.id == deal.host and spec is not None and spec.draft_model is not None:
        dd = scn.device(spec.draft_device or d.id)
        if spec.draft_engine is not None:
            dd = replace(dd, engine=spec.draft_engine, efficiency=None, pass_overhead_s=None, layer_overhead_s=None)
        dd = replace(dd, offload_Bps=None)
        dm.draft = device_model(dd, replace(scn, model=spec.draft_model, decoding=replace(
            scn.decoding, speculative=replace(spec, draft_model=None))), deal)
        if dd.id != d.id:  # the drafts come back over the link, the request goes out
            there, back = resolve_link(scn.network, d.id, dd.id), resolve_link(scn.network, dd.id, d.id)
            dm.draft_round_trip_s = (there.rtt_s + back.rtt_s) / 2 + there.hop_overhead_s + back.hop_overhead_s
    return dm
