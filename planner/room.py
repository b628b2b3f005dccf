"""The room as plain data: devices, network, workload and decoding settings.

These frozen dataclasses are what a scenario file becomes once it is validated
(``splitroom/scenario.py`` does the YAML, units and checks). Every quantity is in SI
base units with the unit in the name: bytes, seconds, bytes per second, FLOP/s.
Nothing here reads a file or a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from planner.model import ModelSpec
from planner.profile import Profile, sample_workload
from planner.sampling import GREEDY, Sampling

#: drafter names a scenario may ask for: ``draft_layer`` (an MTP head), ``ngram``
#: (prompt lookup), ``early_exit`` (the host's first layers), ``model`` (a separate model)
DRAFTERS = ("draft_layer", "ngram", "early_exit", "model")
#: the drafters the real runtime runs (runtime/drafters.py): every one but ``draft_layer``
RUNTIME_DRAFTERS = ("ngram", "early_exit", "model")

#: Memory bandwidth (bytes/s) and compute (FLOP/s) of a device that gives neither, by
#: kind: a computer is an Apple M2 (100 GB/s unified memory, 3.6 TFLOPS for its 10-core
#: GPU: Apple's published figures); a phone 50 GB/s (LPDDR5-6400 on a 64-bit bus =
#: 51.2 GB/s, as in Apple's A17 Pro) and about 2 TFLOPS (a current flagship phone GPU,
#: order of magnitude). The simulator (sim/devices.py), the lap-cost model
#: (planner/lapcost.py) and the trace fitter all take them from here.
DEFAULT_BANDWIDTH_BPS = {"computer": 100e9, "phone": 50e9}
DEFAULT_COMPUTE_FLOPS = {"computer": 3.6e12, "phone": 2.0e12}
#: Seconds per row of greedy sampling (an argmax over one row of ~150-250 k logits).
DEFAULT_SAMPLE_S_PER_TOKEN = 1e-4

DeviceKind = Literal["computer", "phone"]


@dataclass(frozen=True)
class Price:
    """What a device costs (planner/cost.py turns it into USD per hour): rent
    ``per_hour`` (USD/h, all-in), or bought for ``buy`` USD, written off over ``years``,
    drawing ``watts`` while serving (paid at the scenario's electricity price)."""

    per_hour: float | None = None
    buy: float | None = None
    years: float | None = None
    watts: float = 0.0


@dataclass(frozen=True)
class Device:
    """One machine (or browser tab) of the room.

    Attributes:
        id: unique id, ``[a-z0-9_-]+``; ties are broken by it.
        kind: ``computer`` or ``phone``.
        lends_bytes: memory lent to the room, bytes.
        webgpu: False means it can only be a guest.
        name: human name.
        memory_bandwidth_Bps: memory bandwidth, bytes/s (roofline compute model).
        compute_flops: dense f16 compute, FLOP/s.
        copy_speed_Bps: measured GPU memory copy speed, bytes/s (host pick override).
        s_per_layer: measured seconds per layer per decoded token, if measured.
        price_usd_per_h: rent, USD per hour (the older ``price: 1.20 USD/h`` form).
        price: rent or purchase (:class:`Price`); planner/cost.py prices a token with it.
        emulate_slowdown: a real run pads this device's compute to this factor.
        engine: a named engine preset (sim/engines.py) scaling its roofline, or None.
        efficiency: the fraction of the roofline its engine reaches, (0, 1]; None: the
            engine preset's (1.0 without one).
        pass_overhead_s, layer_overhead_s: fixed seconds per forward pass and per layer
            of a pass; None: the engine preset's (0 without one).
        offload_Bps: opt-in to offload: the weights that do not fit in what it lends
            (less the headroom) are read from disk or host memory at this rate, bytes/s,
            on every pass; None: a room that does not fit is an error.
        clocks_down: whether its GPU clocks down when idle (None: phones do, computers
            do not); a real run on one machine has no clock-down to predict.
    """

    id: str
    kind: DeviceKind = "computer"
    lends_bytes: int = 0
    webgpu: bool = True
    name: str = ""
    memory_bandwidth_Bps: float | None = None
    compute_flops: float | None = None
    copy_speed_Bps: float | None = None
    s_per_layer: float | None = None
    price_usd_per_h: float | None = None
    emulate_slowdown: float | None = None
    clocks_down: bool | None = None
    engine: str | None = None
    price: Price | None = None
    efficiency: float | None = None
    pass_overhead_s: float | None = None
    layer_overhead_s: float | None = None
    offload_Bps: float | None = None


@dataclass(frozen=True)
class PinnedStage:
    """A stage fixed by hand in a scenario: ``device`` holds layers ``[start, end)``."""

    device: str
    start: int
    end: int


@dataclass(frozen=True)
class DealOptions:
    """How the room is dealt.

    Attributes:
        context_tokens: the room's context length; KV is sized for it.
        kv_cache: ``f32``, ``f16`` or ``q8`` (float32 KV doubles the f16 KV part of a layer, int8
            halves it).
        split: ``speed`` (default), ``memory`` or ``optimal`` (planner/optimal.py:
            devices, host, ranges and ring order that maximise predicted tokens/s).
        phone_layers: deal phones layers even when computers can hold the model.
        host: force this device id as the model host.
        stages: pin the deal by hand (device and range each); the host may then hold
            zero layers (a coordinator), which the automatic rules never do.
        kv_caches: KV caches each stage holds, each sized for ``context_tokens`` (one per
            question in flight, ``decoding.questions_in_flight``); the deal counts them all
            and, when they do not fit, deals fewer (:attr:`planner.deal.Deal.kv_caches`).
        headroom: fraction of what each device lends kept free for runtime buffers,
            activations and allocator slack (0.05 = 5%); layers are dealt into, and
            ``fits`` is checked against, ``lends - ceil(lends * headroom)``. 0.0 here
            (the product page's accounting, whose tables count the whole lend); a
            scenario file defaults to ``planner.deal.DEFAULT_HEADROOM``.
    """

    context_tokens: int = 8192
    kv_cache: Literal["f32", "f16", "q8"] = "f16"
    split: Literal["speed", "memory", "optimal"] = "speed"
    phone_layers: bool = False
    host: str | None = None
    stages: tuple[PinnedStage, ...] | None = None
    headroom: float = 0.0
    kv_caches: int = 1

    @property
    def kv_tokens(self) -> int:
        """Positions of KV each layer holds: ``kv_caches`` caches of ``context_tokens``."""
        return self.context_tokens * self.kv_caches


@dataclass(frozen=True)
class Jitter:
    """Per-message one-way delay jitter.

    ``distribution`` is one of none, normal, lognormal, gamma, pareto, paretonormal,
    empirical. ``scale_s`` is the spread (netem's jitter, seconds); ``samples_s`` the
    measured one-way extra delays for ``empirical``; ``shape`` the tail parameter of
    gamma/pareto (defaults chosen by the simulator when None).
    """

    distribution: str = "none"
    scale_s: float = 0.0
    shape: float | None = None
    samples_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Episodes:
    """Correlated stall episodes: every ``every_s`` seconds, for ``lasting_s`` seconds,
    the link's round trip grows by ``extra_rtt_s``."""

    every_s: float
    lasting_s: float
    extra_rtt_s: float


@dataclass(frozen=True)
class LinkSpec:
    """Properties of the link between two devices (or the room default when
    ``between`` is empty). ``directed`` means only ``between[0] -> between[1]``."""

    between: tuple[str, ...] = ()
    directed: bool = False
    rtt_s: float | None = None
    jitter: Jitter | None = None
    bandwidth_Bps: float | None = None
    hop_overhead_s: float | None = None
    episodes: Episodes | None = None
    window_bytes: float | None = None


@dataclass(frozen=True)
class Network:
    """Room-wide link defaults plus per-pair overrides. ``window_bytes``: the
    transport's initial congestion window (None: frames are not window-limited).
    ``burst_bytes``: the most bytes the transport sends in one burst before an
    acknowledgement comes back, room-wide (None: no cap; only with a window; a real
    run's prediction sets the tuned SCTP sender's 32 chunks of 1160 bytes).
    ``hop_s_per_byte``: a hand-off's cost that grows with the frame, seconds per byte
    (the transport stack's copies; a calibration profile measures it), on top of
    ``hop_overhead_s``. ``ice_servers``: the STUN/TURN server URLs a real room's peer
    connections use (checked and used by runtime/transport/ice.py; the simulator's links
    do not depend on them)."""

    rtt_s: float = 0.001
    jitter: Jitter = field(default_factory=Jitter)
    bandwidth_Bps: float = 125e6
    hop_overhead_s: float = 0.0
    episodes: Episodes | None = None
    links: tuple[LinkSpec, ...] = ()
    window_bytes: float | None = None
    hop_s_per_byte: float = 0.0
    ice_servers: tuple[str, ...] = ()
    burst_bytes: float | None = None


@dataclass(frozen=True)
class Workload:
    """What the room is asked: ``questions`` questions of ``prompt_tokens`` tokens,
    each answered with ``answer_tokens`` tokens; ``prompts`` are real prompts for
    runs with a real model. ``asked_by`` names the device asking each question
    (round robin over this list; the host when empty). ``kind`` says what the
    questions are like (:data:`planner.profile.WORKLOAD_KINDS`: ``chat`` or
    ``grounded``); a calibration profile's drafter acceptance is drawn from that kind,
    unless ``sample`` gives prompts like the workload's (not the ones a prediction is
    checked on): ``splitroom calibrate`` then measures acceptance on them and a
    prediction draws from that (:attr:`acceptance_workload`). ``clients`` people ask
    at once: each asks its next question when its answer ends (1: one question after
    another). ``warm_up_tokens`` W > 0: before the workload the room answers one
    question of ``prompt_tokens`` tokens alone, cut at W answer tokens, and every figure
    and the trace leave it out (a room measured after a warm-up question, as
    scripts/serve_load.py measures one: its links' congestion windows have grown).
    ``prompt_tokens_each``: when given, question i's prompt is
    ``prompt_tokens_each[i % len]`` tokens long (a real run's own prompts: where each
    prompt's last prefill chunk ends decides what the links' windows have grown to before
    decode); ``prompt_tokens`` stays the mean that the cost models use."""

    questions: int = 1
    prompt_tokens: int = 128
    answer_tokens: int = 128
    prompts: tuple[str, ...] = ()
    asked_by: tuple[str, ...] = ()
    kind: str = "chat"
    clients: int = 1
    sample: tuple[str, ...] = ()
    warm_up_tokens: int = 0
    prompt_tokens_each: tuple[int, ...] = ()

    @property
    def acceptance_workload(self) -> str:
        """The profile workload a prediction's drafter acceptance comes from: the
        sample's key (:func:`planner.profile.sample_workload`) when the workload gives
        a sample, else its ``kind``."""
        return sample_workload(self.sample) if self.sample else self.kind


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding: the host drafts ``draft_tokens`` tokens per lap with
    ``drafter``; ``acceptance`` is the per-token acceptance probability the simulator
    draws from (or ``accepted_lengths`` an empirical distribution of accepted lengths,
    or ``accepted_sequence`` a recorded sequence replayed in order).
    ``draft_s_per_token`` overrides the drafting cost per token, seconds.
    ``draft_model``: a separate draft model (drafter ``model``), run on device
    ``draft_device`` (None: the model host) with engine preset ``draft_engine`` (None:
    that device's own); ``draft_extra_passes``: forward passes of it per round beyond
    the ``draft_tokens`` (1 for engines that run k + 1).
    ``adaptive`` (scenario ``draft_tokens: auto``): each lap drafts the ``k`` in
    ``0..draft_tokens`` that :mod:`planner.draft_policy` chooses (``draft_tokens`` is
    then the scenario's ``max_draft_tokens``)."""

    drafter: str = "draft_layer"
    draft_tokens: int = 4
    acceptance: float | None = 0.75
    accepted_lengths: tuple[int, ...] = ()
    accepted_sequence: tuple[int, ...] = ()
    draft_s_per_token: float | None = None
    draft_model: ModelSpec | None = None
    draft_device: str | None = None
    draft_engine: str | None = None
    draft_extra_passes: int = 0
    adaptive: bool = False


@dataclass(frozen=True)
class Decoding:
    """Prefill and decode settings of the model host; ``sampling``: how the real
    room's head picks tokens (greedy by default; the simulator's timing does not
    depend on it). ``questions_in_flight``: questions whose laps share the chain at once
    (1: product page 001, one question answered at a time). ``via_host``: the host
    relays every stage's output to the next stage (the scenario's ``return: via_host``;
    ``return_path`` is then ``direct``, and the simulator relays the worker-to-worker
    links: sim/relay.py). ``head``: where the output head and sampling run, ``host`` or
    ``last_stage`` (the simulator times them on the last stage's device)."""

    prefill_chunk: int = 16
    speculative: Speculative | None = None
    async_laps: int = 1
    return_path: Literal["direct", "via_stages"] = "direct"
    wake: bool = True
    via_host: bool = False
    head: Literal["host", "last_stage"] = "host"
    sampling: Sampling = GREEDY
    questions_in_flight: int = 1


#: A device silent this long (no heartbeat on the control channel) is lost, seconds.
HEARTBEAT_TIMEOUT_S = 1.0
#: Seconds between a device's heartbeats to each peer (the runtime's NodeConfig default).
HEARTBEAT_S = 0.25
#: Seconds a worker that lost the model host waits for it to come back ("Host
#: reconnecting") before the room is over for it (product page 001: a minute).
HOST_WAIT_S = 60.0


@dataclass(frozen=True)
class Fault:
    """A device that dies during a run (scenario key ``faults``): once ``at_token``
    answer tokens (all questions, counted from 1) have been emitted, or at ``at_s``
    seconds. The room notices ``detect_s`` seconds later (heartbeat timeout)."""

    device: str
    at_token: int | None = None
    at_s: float | None = None
    detect_s: float = HEARTBEAT_TIMEOUT_S


@dataclass(frozen=True)
class Scenario:
    """A whole scenario: room, model, deal options, network, workload, decoding."""

    name: str
    seed: int
    model: ModelSpec
    devices: tuple[Device, ...]
    options: DealOptions = field(default_factory=DealOptions)
    network: Network = field(default_factory=Network)
    workload: Workload = field(default_factory=Workload)
    decoding: Decoding = field(default_factory=Decoding)
    #: seconds per layer measured by a real run, by device (a `measured:` section or
    #: an included calibration file); used by simulate and by plan --redeal
    measured_s_per_layer: dict = field(default_factory=dict)
    #: the host's measured output head + sampling, seconds per row of a lap
    measured_head_s_per_row: float | None = None
    #: devices that die during the run (simulated and, in ``run --real``, killed)
    faults: tuple[Fault, ...] = ()
    #: electricity, USD per kWh, for devices bought with ``watts`` (None: planner.cost's default)
    electricity_usd_per_kwh: float | None = None
    #: privacy ends_local: (first, last) layers the host keeps (planner/privacy.py); None: off
    ends_local: tuple[int, int] | None = None
    #: a calibration profile (``splitroom calibrate``): measured cost curves the
    #: simulator uses instead of rooflines for the devices, drafters and transport it has
    profile: Profile | None = None
    #: weight storage the scenario chose (``f32``, ``f16``, ``q8``; runtime.precision), None:
    #: the model's own; ``model``'s sizes already count it
    weights: str | None = None

    def with_profile(self, profile: Profile) -> "Scenario":
        """This scenario predicted with ``profile``: the simulator then takes each
        profiled device's stage and head times, each profiled drafter's cost and
        acceptance from it, and the transport's measured per-frame cost as the hop
        overhead (fixed part) plus a cost per byte, replacing ``network.hop_overhead``;
        the profile's congestion window applies unless ``network.window_bytes`` is set.
        Devices the profile lacks keep their roofline."""
        net = self.network
        if profile.transport is not None:
            fixed, per_byte = profile.transport.fit
            net = replace(net, hop_overhead_s=fixed, hop_s_per_byte=per_byte,
                          window_bytes=net.window_bytes if net.window_bytes is not None
                          else profile.transport.window_bytes)
        return replace(self, profile=profile, network=net)

    def with_measured(self) -> "Scenario":
        """This scenario with each measured device's ``s_per_layer`` set from the measurement."""
        devs = tuple(replace(d, s_per_layer=self.measured_s_per_layer.get(d.id, d.s_per_layer))
                     for d in self.devices)
        return replace(self, devices=devs)

    def device(self, device_id: str) -> Device:
        """The device with this id. Raises KeyError when there is none."""
        for d in self.devices:
            if d.id == device_id:
                return d
        raise KeyError(device_id)
