"""Scenario files: YAML in, a validated :class:`planner.room.Scenario` out.

The format and its keys are documented in docs/scenario.md. Validation is done by pydantic with unknown keys forbidden;
quantities are strings with units parsed by :mod:`splitroom.units`. Every error is
raised as :class:`ScenarioError` whose message is one line:
``FILE: KEY.PATH: what is wrong``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      field_validator, model_validator)

from planner import model as catalog_mod
from planner.deal import DEFAULT_HEADROOM, LayerRangeError, parse_layers
from planner.model import Architecture, ModelSpec, spec_from_architecture
from planner.room import Price as PriceSpec
from planner.room import (DRAFTERS, HEARTBEAT_TIMEOUT_S, DealOptions, Decoding, Device, Episodes, Fault, Jitter,
                          LinkSpec, Network, PinnedStage, Scenario, Speculative, Workload)
from planner.sampling import Sampling
from sim.engines import ENGINES
from splitroom import units
from splitroom.input_limits import MAX_PROFILE_VALUES, read_text_capped, size_problem


class ScenarioError(ValueError):
    """A scenario (file, key or value) is invalid; the message is one line."""


def _q(kind: str):
    def check(v: Any) -> float:
        return units.parse(v, kind)
    # the JSON Schema shows what a file holds: a string with a unit, not the parsed float
    return BeforeValidator(check, json_schema_input_type=str)


def _positive(kind: str):
    def check(v: Any) -> float:
        x = units.parse(v, kind)
        if x <= 0:
            raise units.QuantityError(f"expected {units.example(kind)} that is more than 0, got {units.show(v)}")
        return x
    return BeforeValidator(check, json_schema_input_type=str)


Size = Annotated[float, _q("size")]
Time = Annotated[float, _q("time")]
Rate = Annotated[float, _q("rate")]
Compute = Annotated[float, _q("compute")]
Price = Annotated[float, _q("price")]


def _usd(pattern: str, example: str):
    rx = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?\s*" + pattern + r"\s*$")

    def check(v: Any) -> float:
        m = rx.match(v) if isinstance(v, str) else None
        if not m:
            raise ValueError(f"expected {example}, got {v!r}")
        return float(v.strip().split("USD")[0])
    return BeforeValidator(check, json_schema_input_type=str)


#: an amount of money, "3999 USD"; an electricity price, "0.17 USD/kWh"
Money = Annotated[float, _usd("USD", "an amount like '3999 USD'")]
ElectricityPrice = Annotated[float, _usd(r"USD\s*/\s*kWh", "a price like '0.17 USD/kWh'")]
#: a rate, compute or time that something is divided by: zero is refused
PosRate = Annotated[float, _positive("rate")]
PosCompute = Annotated[float, _positive("compute")]
PosTime = Annotated[float, _positive("time")]
PosSize = Annotated[float, _positive("size")]

#: Upper bounds on counts, so that a typo like ``questions: 1e9`` is an error, not a
#: simulation that runs for days.
MAX_CONTEXT = 1 << 24
MAX_QUESTIONS = 100_000
#: Most questions in flight at once, and most clients asking at once (each question in
#: flight holds a KV cache on every stage; product page 001 keeps 10 waiting).
MAX_IN_FLIGHT = 16
MAX_CLIENTS = 1_000
#: Largest scenario after YAML aliases are expanded (values), and deepest nesting: an
#: alias bomb ("billion laughs") is refused before anything walks it.
MAX_VALUES = 200_000
MAX_DEPTH = 32


def _admits_bool(annotation: Any) -> bool:
    """Whether a field's type names ``bool`` (``bool``, ``bool | None``) or anything
    (``Any``) among its alternatives."""
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(a) for a in get_args(annotation))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: Any) -> Any:
        """YAML's ``true``/``false`` are refused where the key is not a boolean: pydantic's
        lax mode would read ``context: true`` as a context of 1 token. A key with a
        parser of its own (quantities with units, ``draft_tokens``) refuses booleans there.

        Raises ValueError (the one-line key error of :func:`from_mapping`)."""
        field = cls.model_fields[info.field_name]
        own_check = any(isinstance(m, BeforeValidator) for m in field.metadata)  # units, draft_tokens
        if isinstance(value, bool) and not own_check and not _admits_bool(field.annotation):
            raise ValueError(f"expected a number or a text value, not the boolean {str(value).lower()}")
        return value


class EmulateIn(_Strict):
    slowdown: float = Field(ge=1.0)


class PriceIn(_Strict):
    """A device's price: ``{buy: 3999 USD, years: 3, watts: 140}`` or ``{per_hour: 2.10 USD}``."""

    buy: Money | None = None
    years: float | None = Field(default=None, gt=0, le=100)
    watts: float = Field(default=0.0, ge=0, le=1e6)
    per_hour: Money | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        if self.per_hour is not None and self.buy is not None:
            raise ValueError("a price is either per_hour (rent) or buy + years, not both")
        if self.per_hour is None and (self.buy is None or self.years is None):
            raise ValueError("a price needs per_hour, or buy and years (and watts)")
        return self


class OverheadIn(_Strict):
    """A device's fixed engine costs: seconds per forward pass and per layer of a pass."""

    pass_: Time = Field(default=0.0, alias="pass")
    layer: Time = 0.0


class OffloadIn(_Strict):
    """Opt-in to offload: weights that do not fit are read at ``bandwidth`` on every pass."""

    bandwidth: PosRate


class DeviceIn(_Strict):
    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    name: str = ""
    kind: Literal["computer", "phone"] = "computer"
    webgpu: bool = True
    lends: Size
    memory_bandwidth: PosRate | None = None
    compute: PosCompute | None = None
    copy_speed: PosRate | None = None
    ms_per_layer: PosTime | None = None
    # '1.20 USD/h' (rent), or a PriceIn mapping; a mapping is checked as PriceIn only
    price: Annotated[Annotated[Price, Tag("str")] | Annotated[PriceIn, Tag("PriceIn")],
                     Discriminator(lambda v: "PriceIn" if isinstance(v, (dict, PriceIn)) else "str")] | None = None
    emulate: EmulateIn | None = None
    clocks_down: bool | None = None
    # sim/engines.py ENGINES: a named engine's efficiency and overheads for the roofline
    engine: Literal[tuple(ENGINES)] | None = None
    # the fraction of the roofline its engine reaches, and its fixed costs (replace the engine's)
    efficiency: float | None = Field(default=None, gt=0.0, le=1.0)
    overhead: OverheadIn | None = None
    offload: OffloadIn | None = None


class JitterIn(_Strict):
    distribution: Literal["none", "normal", "lognormal", "gamma", "pareto", "paretonormal", "empirical"] = "none"
    scale: Time = 0.0
    shape: float | None = Field(default=None, gt=0)
    samples: list[Time] = []

    @model_validator(mode="after")
    def _empirical_has_samples(self):
        if self.distribution == "empirical" and not self.samples:
            raise ValueError("an empirical jitter needs samples: [...] of measured delays")
        if self.distribution in ("pareto", "paretonormal") and self.shape is not None and not self.shape > 1:
            raise ValueError(f"a {self.distribution} jitter needs shape > 1 (its tail index), got {self.shape}")
        return self


class EpisodesIn(_Strict):
    every: Time
    lasting: Time
    extra_rtt: Time

    @model_validator(mode="after")
    def _lasting_shorter(self):
        if self.lasting > self.every:
            raise ValueError("episodes: lasting must not be longer than every")
        if self.every <= 0:
            raise ValueError("episodes: every must be positive")
        return self


class LinkIn(_Strict):
    between: list[str] | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    rtt: Time | None = None
    jitter: JitterIn | None = None
    bandwidth: PosRate | None = None
    hop_overhead: Time | None = None
    episodes: EpisodesIn | None = None
    window: PosSize | None = None
    round_trips_per_hop: int | None = Field(default=None, ge=1, le=64)
    poll: Time | None = None

    @model_validator(mode="after")
    def _ends(self):
        if self.between is not None:
            if len(self.between) != 2 or self.from_ or self.to:
                raise ValueError("a link names two devices: between: [a, b] (or from: a, to: b)")
        elif not (self.from_ and self.to):
            raise ValueError("a link names two devices: between: [a, b] (or from: a, to: b)")
        return self


class NetworkIn(_Strict):
    rtt: Time = 0.001
    jitter: JitterIn = JitterIn()
    bandwidth: PosRate = 125e6
    hop_overhead: Time = 0.0
    episodes: EpisodesIn | None = None
    links: list[LinkIn] = []
    window: PosSize | None = None
    # an engine that makes several round trips per hand-off, or polls for frames
    round_trips_per_hop: int = Field(default=1, ge=1, le=64)
    poll: Time = 0.0
    # STUN/TURN URLs for a real room's peer connections (runtime/transport/ice.py)
    ice_servers: list[str] = Field(default=[], max_length=2)

    @field_validator("ice_servers")
    @classmethod
    def _ice_urls(cls, v: list[str]) -> list[str]:
        from runtime.transport.ice import parse_ice_servers
        parse_ice_servers(v)  # a one-line ValueError naming the URL, never its password
        return v


class WorkloadIn(_Strict):
    questions: int = Field(default=1, ge=1, le=MAX_QUESTIONS)
    prompt_tokens: int = Field(default=128, ge=1, le=MAX_CONTEXT)
    answer_tokens: int = Field(default=128, ge=1, le=MAX_CONTEXT)
    prompts: list[str] = []
    asked_by: list[str] = []
    # planner.profile.WORKLOAD_KINDS: which measured drafter acceptance a profile lends
    kind: Literal["chat", "grounded"] = "chat"
    # people asking at once: each asks its next question when its answer ends
    clients: int = Field(default=1, ge=1, le=MAX_CLIENTS)
    # prompts like the workload's, for calibrate to measure acceptance on: a list, or a
    # file (one prompt a line; .json/.yaml/.yml: a list of text), relative to the scenario
    sample: list[str] | str | None = None
    # answer tokens of one question the room answers alone before the workload (0: none),
    # left out of every figure and of the trace
    warm_up_tokens: int = Field(default=0, ge=0, le=MAX_CONTEXT)


def _draft_tokens(v: Any) -> Any:
    """``draft_tokens``: a whole number 1-64 or ``auto`` (a bool or a float is refused)."""
    if v == "auto" and isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 64:
        return v
    raise ValueError(f"expected a whole number 1-64 or auto, got {units.show(str(v))}")


def _model_json_schema(checkpoints: bool):
    """The JSON Schema of a model key (``model``, ``decoding.speculative.draft_model``)
    for docs/scenario.schema.json: a catalog id or an inline mapping
    (:class:`InlineModelIn`, its MoE keys included), and for ``model`` also
    ``{gguf: PATH}`` / ``{safetensors: DIR}``. The key itself is validated by
    :func:`_model_spec` (its one-line errors), not by pydantic; this only describes it."""
    def fill(schema: dict) -> None:
        forms = [{"type": "string", "description": "a catalog id (planner/model.py; docs/scenario.md, top level)"},
                 InlineModelIn.model_json_schema(mode="validation")]
        if checkpoints:
            forms += [{"type": "object", "properties": {k: {"type": "string"}}, "required": [k],
                       "additionalProperties": False, "title": f"{k} checkpoint"} for k in ("gguf", "safetensors")]
        schema["anyOf"] = forms
    return fill


class SpeculativeIn(_Strict):
    # planner.room.DRAFTERS: a drafter the simulator has no cost model for is an error
    drafter: Literal[DRAFTERS] = "draft_layer"
    draft_tokens: Annotated[int | Literal["auto"], BeforeValidator(_draft_tokens)] = 4
    max_draft_tokens: int | None = Field(default=None, ge=1, le=64)
    acceptance: float | None = Field(default=0.75, ge=0.0, le=1.0)
    accepted_lengths: list[int] = []
    accepted_sequence: list[int] = []
    draft_cost: Time | None = None
    # a separate draft model (drafter: model): catalog id or inline mapping, where it
    # runs, its engine, and whether the engine runs k or k + 1 passes of it a round
    draft_model: Any = Field(default=None, json_schema_extra=_model_json_schema(checkpoints=False))
    draft_device: str | None = None
    draft_engine: Literal[tuple(ENGINES)] | None = None
    draft_passes: Literal["k", "k+1"] = "k"

    @model_validator(mode="after")
    def _draft_model_needs_model_drafter(self):
        given = [k for k in ("draft_model", "draft_device", "draft_engine") if getattr(self, k) is not None]
        given += ["draft_passes"] if "draft_passes" in self.model_fields_set else []  # it has a default
        if given and self.drafter != "model":
            raise ValueError(f"{given[0]} needs drafter: model (got drafter: {self.drafter})")
        if (self.draft_device is not None or self.draft_engine is not None) and self.draft_model is None:
            raise ValueError("draft_device and draft_engine describe a draft_model: give draft_model too")
        return self

    @model_validator(mode="after")
    def _k(self):
        if self.draft_tokens != "auto":
            if self.max_draft_tokens is not None:
                raise ValueError("max_draft_tokens: only with draft_tokens: auto (a fixed k is its own maximum)")
        return self


class SamplingIn(_Strict):
    # planner.sampling.Sampling; temperature 0 is greedy (the default)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1)


class DecodingIn(_Strict):
    prefill_chunk: int = Field(default=16, ge=1)
    speculative: SpeculativeIn | None = None
    async_laps: int = Field(default=1, ge=1, le=64)
    return_: Literal["direct", "via_stages", "via_host"] = Field(default="direct", alias="return")
    wake: bool = True
    # where the output head and sampling run: the model host, or the last stage's device
    head: Literal["host", "last_stage"] = "host"
    sampling: SamplingIn = SamplingIn()
    # questions whose laps share the chain at once (1: product page 001)
    questions_in_flight: int = Field(default=1, ge=1, le=MAX_IN_FLIGHT)


class InlineModelIn(_Strict):
    name: str = "inline"
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    # one size for every layer, or a list of per-layer sizes (length `layers`)
    layer_bytes: Size | list[Size] | None = None
    layer_active_bytes: Size | None = None
    kv_bytes_per_token: Size = 0
    embedding_bytes: Size = 0
    head_bytes: Size = 0
    draft_bytes: Size = 0
    residual_bytes_per_token: Size | None = None
    # architecture numbers, to derive sizes instead
    heads: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    ffn: int | None = Field(default=None, ge=1)
    vocab: int | None = Field(default=None, ge=1)
    dtype: Literal["f32", "f16", "bf16", "q8", "q4"] | None = None
    # mixture of experts, by architecture: routed experts, those a token uses, always-on
    # shared experts (each expert_ffn wide); then ffn is not needed
    experts: int | None = Field(default=None, ge=1, le=65536)
    active_experts: int | None = Field(default=None, ge=1)
    shared_experts: int = Field(default=0, ge=0, le=64)
    expert_ffn: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _sizes_or_architecture(self):
        moe = (self.experts, self.active_experts, self.expert_ffn)
        if any(x is not None for x in moe) or self.shared_experts:
            if None in moe:
                raise ValueError("a mixture-of-experts model needs experts, active_experts and expert_ffn")
            if self.active_experts > self.experts:
                raise ValueError(f"active_experts ({self.active_experts}) is more than experts ({self.experts})")
            if self.layer_bytes is not None:
                raise ValueError("give layer_bytes or the experts' architecture, not both")
            if None in (self.heads, self.vocab):
                raise ValueError("a mixture-of-experts model needs heads and vocab too (sizes are derived)")
            return self
        if self.layer_bytes is None and None in (self.heads, self.ffn, self.vocab):
            raise ValueError("an inline model needs layer_bytes, or heads, ffn and vocab to derive it")
        if isinstance(self.layer_bytes, list) and len(self.layer_bytes) != self.layers:
            raise ValueError(f"layer_bytes: a list needs one size per layer ({self.layers}), "
                             f"got {len(self.layer_bytes)}")
        return self


class StageIn(_Strict):
    device: str
    layers: str = Field(description="1-based inclusive range as people write it: '1-13'")


class MeasuredIn(_Strict):
    """What a real run measured (``splitroom run --real --calibration FILE`` writes it)."""

    ms_per_layer: dict[str, PosTime] = {}
    head_per_row: Time | None = None  # the host's output head + sampling per row of a lap


class EndsLocalIn(_Strict):
    first: int = Field(ge=1)  # layers the host keeps at the start
    last: int = Field(ge=1)   # layers the host keeps at the end


class PrivacyIn(_Strict):
    ends_local: EndsLocalIn | None = None


class FaultIn(_Strict):
    device: str
    at: str | float  # "token 20" (answer tokens emitted, all questions) or a time ("3 s"; a number is seconds)
    detect: Time = HEARTBEAT_TIMEOUT_S


_AT_TOKEN = re.compile(r"^\s*token\s+(\d+)\s*$")


class ScenarioIn(_Strict):
    name: str = ""
    seed: int = Field(default=1, ge=0, le=2**64 - 1)
    # catalog id | inline mapping | {gguf: PATH} | {safetensors: DIR}
    model: Any = Field(default=catalog_mod.BUNDLED_MODEL_ID, json_schema_extra=_model_json_schema(checkpoints=True))
    context: int = Field(default=8192, ge=1, le=MAX_CONTEXT)
    kv_cache: Literal["f32", "f16", "q8"] = "f16"
    weights: Literal["f32", "f16", "q8", "gguf"] | None = None  # weight storage; None: the model's own; gguf: as the file stores it
    residual: Literal["f32", "f16"] | None = None  # residual frames on the wire; None: the model's own
    split: Literal["speed", "memory", "optimal"] = "speed"
    headroom: float = Field(default=DEFAULT_HEADROOM, ge=0.0, lt=1.0)  # fraction of each lend kept free
    phone_layers: bool = False
    host: str | None = None
    stages: list[StageIn] | None = Field(default=None, min_length=1)  # null, not [], for no pinning
    devices: list[DeviceIn] = Field(min_length=1)
    network: NetworkIn = NetworkIn()
    workload: WorkloadIn = WorkloadIn()
    decoding: DecodingIn = DecodingIn()
    measured: MeasuredIn | None = None
    electricity: ElectricityPrice | None = None  # USD per kWh for bought devices' watts
    privacy: PrivacyIn | None = None
    calibration: str | None = None  # a YAML file holding a `measured:` mapping (path relative to the scenario)
    faults: list[FaultIn] = Field(default=[], max_length=64)


_DTYPE_BITS = {"f32": 32, "f16": 16, "bf16": 16, "q8": 8.5, "q4": 4.5}
#: Bits per weight of the scenario's ``weights`` choices as the runtime stores them
#: (runtime.precision.WEIGHT_BITS: q8 is int8 plus a float32 scale per row, stored once per
#: 32 weights on wgpu: at most 9 bits).
WEIGHTS_BITS = {"f32": 32.0, "f16": 16.0, "q8": 9.0}
#: Bytes per residual value of the scenario's ``residual`` choices.
RESIDUAL_BYTES = {"f32": 4, "f16": 2}


def _checkpoint_spec(m: dict, base: Path | None, bits: float | None = None, stored: bool = False) -> ModelSpec:
    """``{gguf: PATH}`` / ``{safetensors: DIR}``: the architecture read from the checkpoint's
    metadata (splitroom.models); PATH relative to the scenario file's folder; ``bits``: the
    scenario's ``weights`` (default float32, the runtime's own storage); ``stored``: weights
    ``gguf``, the file's own bytes per layer."""
    kind, raw = next(iter(m.items()))
    if not isinstance(raw, str) or not raw.strip() or "\0" in raw:
        raise _KeyProblem(f"model.{kind}", f"expected a path, got {units.show(raw)}")
    from splitroom.models import ModelError, spec_from_checkpoint
    p = Path(raw).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    try:
        return spec_from_checkpoint(p, kind, None if stored else (32.0 if bits is None else bits))
    except ModelError as e:
        raise _KeyProblem(f"model.{kind}", str(e)) from None
    except OSError as e:  # a name too long, a loop of links
        raise _KeyProblem(f"model.{kind}", f"cannot read {units.show(raw)} ({e.strerror or e})") from None


def _bundled_stored(m: str) -> ModelSpec:
    """The bundled model's spec held as its GGUF stores it (``weights: gguf`` with a catalog id)."""
    from splitroom.models import ModelError, stored_spec
    if m != catalog_mod.BUNDLED_MODEL_ID:
        raise _KeyProblem("weights", f"gguf (blocks as stored) needs a GGUF file: model {{gguf: PATH}} or the "
                                     f"bundled {catalog_mod.BUNDLED_MODEL_ID}, not {units.show(m)}")
    from runtime.weights import WeightsError, find_gguf
    try:
        return stored_spec(catalog_mod.lookup(m), find_gguf())
    except (ModelError, WeightsError) as e:
        raise _KeyProblem("weights", str(e)) from None


def _model_spec(m: Any, bits: float | str | None = None, base: Path | None = None) -> ModelSpec:
    """The model's spec; ``bits`` (the scenario's ``weights``) re-derives every weight size
    at that many bits per weight, which needs architecture numbers. ``base``: the folder a
    checkpoint's relative path starts from."""
    if isinstance(m, str) and bits == "gguf":
        return _bundled_stored(m)
    if isinstance(m, str):
        try:
            if bits is None:
                return catalog_mod.lookup(m)
            name, arch = catalog_mod.ARCHITECTURES[m]
            return spec_from_architecture(m, name, replace(arch, bits_per_weight=bits))
        except KeyError:
            try:
                catalog_mod.lookup(m)
            except KeyError as e:
                raise _KeyProblem("model", str(e.args[0])) from None
            raise
    if isinstance(m, dict):
        if set(m) in ({"gguf"}, {"safetensors"}):
            return _checkpoint_spec(m, base, None if bits == "gguf" else bits, stored=bits == "gguf")
        try:
            m = InlineModelIn.model_validate(m)
        except ValidationError as e:
            path, msg = _first_error(e)
            raise _KeyProblem(f"model.{path}", msg) from None
    else:
        raise _KeyProblem("model", f"expected a catalog id, an inline mapping, {{gguf: PATH}} or "
                                   f"{{safetensors: DIR}}, got {units.show(m)}")
    if bits == "gguf":
        raise _KeyProblem("weights", "gguf (blocks as stored) needs a GGUF file: model {gguf: PATH} or the bundled model")
    if m.layer_bytes is not None:
        if bits is not None:
            raise _KeyProblem("weights", "an inline model with layer_bytes states its own sizes; "
                                         "give architecture numbers (heads, ffn, vocab) to choose weights")
        sizes = tuple(int(x) for x in m.layer_bytes) if isinstance(m.layer_bytes, list) else ()
        lb = -(-sum(sizes) // len(sizes)) if sizes else int(m.layer_bytes)  # the mean, rounded up
        return ModelSpec(
            id=m.name, name=m.name, layers=m.layers, hidden=m.hidden,
            layer_bytes=lb, layer_sizes=sizes,
            layer_active_bytes=int(m.layer_active_bytes if m.layer_active_bytes is not None else lb),
            layer_flops_per_token=2.0 * (m.layer_active_bytes or lb) / (_DTYPE_BITS[m.dtype or "f16"] / 8),
            kv_bytes_per_token=int(m.kv_bytes_per_token), embedding_bytes=int(m.embedding_bytes),
            head_bytes=int(m.head_bytes), draft_bytes=int(m.draft_bytes),
            residual_bytes_per_token=int(m.residual_bytes_per_token if m.residual_bytes_per_token is not None
                                         else 2 * m.hidden))
    heads = m.heads or 1
    arch = Architecture(layers=m.layers, hidden=m.hidden, heads=heads, kv_heads=m.kv_heads or heads,
                        head_dim=m.head_dim or m.hidden // heads, ffn=0 if m.experts else (m.ffn or 0),
                        vocab=m.vocab or 0, experts=m.experts or 0, active_experts=m.active_experts or 0,
                        expert_ffn=m.expert_ffn or 0, shared_ffn=m.shared_experts * (m.expert_ffn or 0),
                        bits_per_weight=bits if bits is not None else _DTYPE_BITS[m.dtype or "f16"])
    return spec_from_architecture(m.name, m.name, arch)


class _KeyProblem(Exception):
    def __init__(self, path: str, msg: str):
        super().__init__(msg)
        self.path = path
        self.msg = msg




#: ``draft_tokens: auto`` without ``max_draft_tokens``: the longest draft the calibration
#: walks measure (runtime.calibrate.DRAFT_KS ends at 8)
DEFAULT_MAX_DRAFT_TOKENS = 8
#: workload.sample limits: prompts, characters of one prompt, bytes of a sample file
MAX_SAMPLE_PROMPTS = 1000
MAX_SAMPLE_PROMPT_CHARS = 20_000
MAX_SAMPLE_FILE_BYTES = 4_000_000


def _sample_prompts(sample: list[str] | str | None, base: Path | None) -> tuple[str, ...]:
    """``workload.sample`` as prompts: a list as given, or a file read (relative to
    ``base``): one prompt a line (blank lines skipped), or a list of text in a
    ``.json``/``.yaml``/``.yml`` file. Raises _KeyProblem naming ``workload.sample``."""
    where = "workload.sample"
    if sample is None:
        return ()
    if isinstance(sample, str):
        if not sample.strip():
            raise _KeyProblem(where, "an empty file name (give a file of prompts, or a list)")
        p = (base or Path(".")) / sample
        try:
            text = read_text_capped(p, MAX_SAMPLE_FILE_BYTES)
        except OSError as e:
            # a relative name is looked for beside the scenario, not in the working folder
            looked = "" if Path(sample).is_absolute() or base in (None, Path(".")) else \
                f"; a sample file is relative to the scenario's folder, {base}{os.sep}"
            raise _KeyProblem(where, f"{units.show(sample)}: cannot read ({e.strerror or e}){looked}") from None
        except UnicodeDecodeError:
            raise _KeyProblem(where, f"{units.show(sample)}: not UTF-8 text") from None
        except ValueError:
            raise _KeyProblem(where, f"{units.show(sample)}: not a file name") from None
        if p.suffix.lower() in (".json", ".yaml", ".yml"):
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                raise _KeyProblem(where, f"{units.show(sample)}: not valid YAML or JSON") from None
            if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
                raise _KeyProblem(where, f"{units.show(sample)}: expected a list of prompts (text)")
            prompts = [x for x in data]
        else:
            prompts = [line for line in text.splitlines() if line.strip()]
    else:
        prompts = list(sample)
    if not prompts:
        raise _KeyProblem(where, "no prompts (give at least one, or leave the key out)")
    if len(prompts) > MAX_SAMPLE_PROMPTS:
        raise _KeyProblem(where, f"{len(prompts)} prompts is more than {MAX_SAMPLE_PROMPTS}")
    for i, x in enumerate(prompts):
        if not x.strip():
            raise _KeyProblem(f"{where}[{i}]", "an empty prompt")
        if len(x) > MAX_SAMPLE_PROMPT_CHARS:
            raise _KeyProblem(f"{where}[{i}]", f"longer than {MAX_SAMPLE_PROMPT_CHARS:,} characters")
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise _KeyProblem(f"{where}[{i}]", "not Unicode text") from None
    return tuple(prompts)


def _to_scenario(s: ScenarioIn, base: Path | None = None) -> Scenario:
    ids = [d.id for d in s.devices]
    for i, d in enumerate(ids):
        if d in ids[:i]:
            raise _KeyProblem(f"devices[{i}].id", f"duplicate device id {units.show(d)}")
    if s.host is not None and s.host not in ids:
        raise _KeyProblem("host", f"{units.show(s.host)} is not a device (devices: {', '.join(ids)})")
    model = _model_spec(s.model, "gguf" if s.weights == "gguf" else (WEIGHTS_BITS[s.weights] if s.weights else None), base)
    if s.residual is not None:
        model = replace(model, residual_bytes_per_token=model.hidden * RESIDUAL_BYTES[s.residual])
    devices = tuple(
        Device(id=d.id, name=d.name or d.id, kind=d.kind, webgpu=d.webgpu, lends_bytes=int(d.lends),
               memory_bandwidth_Bps=d.memory_bandwidth, compute_flops=d.compute, copy_speed_Bps=d.copy_speed,
               s_per_layer=d.ms_per_layer, price_usd_per_h=None if isinstance(d.price, PriceIn) else d.price,
               price=PriceSpec(per_hour=d.price.per_hour, buy=d.price.buy, years=d.price.years,
                               watts=d.price.watts) if isinstance(d.price, PriceIn) else None,
               emulate_slowdown=d.emulate.slowdown if d.emulate else None, clocks_down=d.clocks_down,
               engine=d.engine, efficiency=d.efficiency,
               pass_overhead_s=d.overhead.pass_ if d.overhead else None,
               layer_overhead_s=d.overhead.layer if d.overhead else None,
               offload_Bps=d.offload.bandwidth if d.offload else None)
        for d in s.devices)
    pins = None
    if s.stages is not None:
        pins = []
        for i, st in enumerate(s.stages):
            if st.device not in ids:
                raise _KeyProblem(f"stages[{i}].device", f"{units.show(st.device)} is not a device")
            try:
                start, end = parse_layers(st.layers, model.layers)
            except LayerRangeError as e:
                raise _KeyProblem(f"stages[{i}].layers",
                                  f"expected a range like '1-13', got {units.show(st.layers)}" if e.malformed else
                                  f"range {units.show(st.layers)} is outside 1-{model.layers} or reversed") from None
            pins.append(PinnedStage(st.device, start, end))
        pins = tuple(pins)
    options = DealOptions(context_tokens=s.context, kv_cache=s.kv_cache, split=s.split,
                          phone_layers=s.phone_layers, host=s.host, stages=pins, headroom=s.headroom,
                          kv_caches=s.decoding.questions_in_flight)

    def jit(j: JitterIn | None) -> Jitter | None:
        if j is None:
            return None
        return Jitter(distribution=j.distribution, scale_s=j.scale, shape=j.shape, samples_s=tuple(j.samples))

    def ep(e: EpisodesIn | None) -> Episodes | None:
        return None if e is None else Episodes(every_s=e.every, lasting_s=e.lasting, extra_rtt_s=e.extra_rtt)

    n = s.network

    def handoff_s(link: LinkIn | None) -> Time | None:
        """A hand-off's fixed cost: hop_overhead + (round_trips_per_hop - 1) x rtt + poll / 2
        (docs/scenario.md), from the link's own values where it gives them, else the room's;
        None for a link that gives none of the four (it inherits the room's). With one round
        trip and no poll anywhere, a link's hop_overhead as given (None: inherited)."""
        if link is not None and link.round_trips_per_hop is None and link.poll is None and (
                n.round_trips_per_hop == 1 and n.poll == 0 or link.rtt is None and link.hop_overhead is None):
            return link.hop_overhead
        pick = (lambda own, room: room if link is None or own is None else own)
        trips = pick(link and link.round_trips_per_hop, n.round_trips_per_hop)
        return (pick(link and link.hop_overhead, n.hop_overhead) + (trips - 1) * pick(link and link.rtt, n.rtt)
                + pick(link and link.poll, n.poll) / 2)

    links = []
    for i, link in enumerate(s.network.links):
        ends = tuple(link.between) if link.between is not None else (link.from_, link.to)
        for e in ends:
            if e not in ids:
                raise _KeyProblem(f"network.links[{i}]", f"{units.show(e)} is not a device")
        if ends[0] == ends[1]:
            raise _KeyProblem(f"network.links[{i}]", "a link joins two different devices")
        links.append(LinkSpec(between=ends, directed=link.between is None, rtt_s=link.rtt, jitter=jit(link.jitter),
                              bandwidth_Bps=link.bandwidth, hop_overhead_s=handoff_s(link),
                              episodes=ep(link.episodes), window_bytes=link.window))
    network = Network(rtt_s=n.rtt, jitter=jit(n.jitter), bandwidth_Bps=n.bandwidth, hop_overhead_s=handoff_s(None),
                      episodes=ep(n.episodes), links=tuple(links), window_bytes=n.window,
                      ice_servers=tuple(n.ice_servers))
    for i, who in enumerate(s.workload.asked_by):
        if who not in ids:
            raise _KeyProblem(f"workload.asked_by[{i}]", f"{units.show(who)} is not a device")
    w = s.workload
    workload = Workload(questions=w.questions, prompt_tokens=w.prompt_tokens, answer_tokens=w.answer_tokens,
                        prompts=tuple(w.prompts), asked_by=tuple(w.asked_by), kind=w.kind,
                        clients=w.clients, sample=_sample_prompts(w.sample, base), warm_up_tokens=w.warm_up_tokens)
    if w.warm_up_tokens and s.faults:
        raise _KeyProblem("workload.warm_up_tokens", "a warm-up question cannot go with faults (their times and "
                                                     "tokens count from the workload's start)")
    sp = s.decoding.speculative
    spec = None
    if sp is not None:
        auto = sp.draft_tokens == "auto"
        k = (sp.max_draft_tokens or DEFAULT_MAX_DRAFT_TOKENS) if auto else sp.draft_tokens
        draft_model = None
        if sp.draft_model is not None:
            if isinstance(sp.draft_model, dict) and set(sp.draft_model) & {"gguf", "safetensors"}:
                raise _KeyProblem("decoding.speculative.draft_model", "a catalog id or an inline mapping "
                                                                      "(a checkpoint path is for model:)")
            try:
                draft_model = _model_spec(sp.draft_model, None, base)
            except _KeyProblem as e:
                raise _KeyProblem("decoding.speculative.draft_" + e.path, e.msg) from None
        if sp.draft_device is not None and sp.draft_device not in ids:
            raise _KeyProblem("decoding.speculative.draft_device", f"{units.show(sp.draft_device)} is not a device")
        spec = Speculative(drafter=sp.drafter, draft_tokens=k, acceptance=sp.acceptance,
                           accepted_lengths=tuple(sp.accepted_lengths), accepted_sequence=tuple(sp.accepted_sequence),
                           draft_s_per_token=sp.draft_cost, draft_model=draft_model, draft_device=sp.draft_device,
                           draft_engine=sp.draft_engine, draft_extra_passes=1 if sp.draft_passes == "k+1" else 0,
                           adaptive=auto)
        for i, a in enumerate(sp.accepted_lengths + sp.accepted_sequence):
            if a < 0 or a > k:
                raise _KeyProblem("decoding.speculative", f"accepted length {a} outside 0..draft_tokens")
    smp = s.decoding.sampling
    decoding = Decoding(prefill_chunk=s.decoding.prefill_chunk, speculative=spec, async_laps=s.decoding.async_laps,
                        return_path="direct" if s.decoding.return_ == "via_host" else s.decoding.return_,
                        via_host=s.decoding.return_ == "via_host", wake=s.decoding.wake, head=s.decoding.head,
                        questions_in_flight=s.decoding.questions_in_flight,
                        sampling=Sampling(temperature=smp.temperature, top_p=smp.top_p, top_k=smp.top_k, seed=smp.seed))
    faults = []
    for i, f in enumerate(s.faults):
        if f.device not in ids:
            raise _KeyProblem(f"faults[{i}].device", f"{units.show(f.device)} is not a device")
        m = _AT_TOKEN.match(f.at) if isinstance(f.at, str) else None
        if m:
            if int(m.group(1)) < 1:
                raise _KeyProblem(f"faults[{i}].at", "the first answer token is token 1")
            faults.append(Fault(f.device, at_token=int(m.group(1)), detect_s=f.detect))
            continue
        try:
            at_s = float(f.at) if not isinstance(f.at, str) else units.parse(f.at, "time")
        except (units.QuantityError, ValueError):
            raise _KeyProblem(f"faults[{i}].at",
                              f"expected 'token N' or a time like '3 s', got {units.show(str(f.at))}") from None
        if not at_s >= 0 or at_s == float("inf"):
            raise _KeyProblem(f"faults[{i}].at", "a fault time must be >= 0 and finite")
        faults.append(Fault(f.device, at_s=at_s, detect_s=f.detect))
    measured = {}
    if s.measured is not None:
        for dev, v in s.measured.ms_per_layer.items():
            if dev not in ids:
                raise _KeyProblem(f"measured.ms_per_layer.{dev}", f"{units.show(dev)} is not a device")
            measured[dev] = v
    return Scenario(name=s.name, seed=s.seed, model=model, devices=devices, options=options, network=network,
                    workload=workload, decoding=decoding, measured_s_per_layer=measured, faults=tuple(faults),
                    electricity_usd_per_kwh=s.electricity,
                    ends_local=(s.privacy.ends_local.first, s.privacy.ends_local.last)
                    if s.privacy is not None and s.privacy.ends_local is not None else None,
                    measured_head_s_per_row=s.measured.head_per_row if s.measured is not None else None,
                    weights=s.weights)


def _branch_tags() -> frozenset[str]:
    names = {"str", "dict", "int", "float", "list", "bool", "none", "function-after"}
    todo = [_Strict]
    while todo:
        c = todo.pop()
        names.add(c.__name__)
        todo.extend(c.__subclasses__())
    return frozenset(names)


_BRANCH_TAGS = _branch_tags()


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = {"from_": "from", "return_": "return", "pass_": "pass"}.get(str(part), str(part))
            # pydantic adds union branch names (str, InlineModelIn, ...) and validator names
            # (function-after[...]): drop them, but keep a user's own key ("Devices" typo).
            if part in _BRANCH_TAGS or "[" in part or part.startswith("function-"):
                continue
            out += ("." if out else "") + part
    return out or "(top)"


def _first_error(e: ValidationError) -> tuple[str, str]:
    errs = e.errors(include_url=False)
    # prefer errors on the inline-model branch only when the value was a mapping
    err = errs[0]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (a typo?)"
    if err["type"] == "missing":
        msg = "required key is missing"
    if err["type"] == "model_type":  # "... instance of SpeculativeIn" names a class of ours
        msg = f"expected a mapping of keys, got {units.show(err.get('input'))}"
    return _loc(err["loc"]), msg


def set_key(data: dict, dotted: str, value: Any) -> None:
    """Set ``dotted`` (``decoding.speculative.drafter``, ``devices[1].lends`` or
    ``devices.1.lends``) in the raw scenario mapping ``data`` to ``value``.

    Raises ScenarioError when a list index is out of range or a step is not a mapping.
    """
    parts: list[str | int] = []
    for p in re.split(r"\.|\[([0-9]+)\]", dotted):
        if p is None or p == "":
            continue
        if "[" in p or "]" in p:  # devices[-1], devices[x]: not an item [N] nor a key
            raise ScenarioError(f"--set {dotted}: {units.show(p)} is neither a key nor a list item "
                                "(items are [0], [1], ...)")
        parts.append(int(p) if p.isascii() and p.isdigit() else p)  # "³".isdigit() is True
    if not parts:
        raise ScenarioError(f"--set {dotted}: empty key")
    cur: Any = data
    for i, p in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(p, int):
            if not isinstance(cur, list) or p >= len(cur):
                raise ScenarioError(f"--set {dotted}: no item {p} there")
            cur = cur[p]
        else:
            if not isinstance(cur, dict):
                raise ScenarioError(f"--set {dotted}: {units.show(p)} is not inside a mapping")
            if cur.get(p) is None:
                cur[p] = [] if isinstance(nxt, int) else {}
            cur = cur[p]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(cur, list) or last >= len(cur):
            raise ScenarioError(f"--set {dotted}: no item {last} there")
        cur[last] = value
    else:
        if not isinstance(cur, dict):
            raise ScenarioError(f"--set {dotted}: {units.show(last)} is not inside a mapping")
        cur[last] = value


def parse_set(assignment: str) -> tuple[str, Any]:
    """Split ``KEY=VALUE`` and read VALUE as YAML. Raises ScenarioError when malformed."""
    if "=" not in assignment:
        raise ScenarioError(f"--set {assignment}: expected KEY=VALUE")
    key, _, raw = assignment.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ScenarioError(f"--set {assignment}: VALUE is not YAML ({str(e).splitlines()[0]})") from None
    return key.strip(), value


def check_size(data: Any, source: str, limit: int = MAX_VALUES) -> None:
    """Refuse a loaded scenario larger than ``limit`` (:data:`MAX_VALUES`) values once YAML
    aliases are expanded (every visit of a shared node counts), or nested deeper than
    :data:`MAX_DEPTH`: an alias bomb stops here, before validation or an error message
    walks it. Stops counting at the limit, so it takes at most ``limit`` steps.

    Raises ScenarioError (one line naming ``source``)."""
    problem = size_problem(data, limit, MAX_DEPTH)
    if problem is not None:
        raise ScenarioError(f"{source}: {problem}")


def _read_yaml(text: str, name: str, what: str = "") -> Any:
    """YAML text -> Python objects, every failure one ScenarioError line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ScenarioError(f"{name}: {what}{where}: not valid YAML "
                            f"({str(getattr(e, 'problem', None) or str(e).splitlines()[0])[:200]})") from None
    except RecursionError:
        raise ScenarioError(f"{name}: {what}nested too deep to read") from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise ScenarioError(f"{name}: {what}not a value this tool reads ({units.show(str(e))})") from None


def from_mapping(data: Any, source: str = "<scenario>", overrides: list[str] = (), base: Path | None = None) -> Scenario:
    """Validate a raw scenario mapping (as loaded from YAML) and apply ``--set`` overrides.
    ``base``: the folder relative model paths (``model: {gguf: PATH}``) start from (the
    scenario file's; None: the working directory).

    Raises ScenarioError with a one-line ``source: key.path: problem`` message.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping of scenario keys at the top")
    check_size(data, source)
    for o in overrides:
        try:
            key, value = parse_set(o)
            check_size(value, f"--set {units.show(key)}")
            set_key(data, key, value)
        except ScenarioError as e:  # name the file the override was applied to
            raise ScenarioError(f"{source}: {e}") from None
    try:
        parsed = ScenarioIn.model_validate(data)
        return _to_scenario(parsed, base)
    except ValidationError as e:
        path, msg = _first_error(e)
        raise ScenarioError(f"{source}: {path}: {msg}") from None
    except _KeyProblem as e:
        raise ScenarioError(f"{source}: {e.path}: {e.msg}") from None


def _read_text(p: Path, name: str) -> str:
    """A file's text (UTF-8); an unreadable or non-UTF-8 file is one ScenarioError line."""
    try:
        return read_text_capped(p)
    except OSError as e:
        raise ScenarioError(f"{name}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{name}: not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x})") from None
    except ValueError:  # a path holding a NUL character
        raise ScenarioError(f"{name}: cannot read (not a file name)") from None


def load(path: str | Path, overrides: list[str] = ()) -> Scenario:
    """Load and validate a scenario file. Raises ScenarioError (one line) on any problem."""
    p = Path(path)
    text = _read_text(p, str(path))  # the path as typed: a missing file's folder matters
    name = str(path)  # every error names the file as the user typed it
    data = _read_yaml(text, name)
    if isinstance(data, dict):
        check_size(data, name)
    if isinstance(data, dict) and isinstance(data.get("calibration"), str):
        cal_path = (p.parent / data["calibration"])
        what = f"calibration: {cal_path.name}: "
        cal = _read_yaml(_read_text(cal_path, f"{name}: {what}".rstrip(": ")), name, what)
        check_size(cal, f"{name}: {what}".rstrip(": "), MAX_PROFILE_VALUES)
        if isinstance(cal, dict) and "splitroom_profile" in cal:  # a profile (splitroom calibrate)
            from planner.profile import Profile, ProfileError
            try:
                profile = Profile.from_mapping(cal)
            except ProfileError as e:
                raise ScenarioError(f"{name}: {what}{e}") from None
            from splitroom.calibration import CalibrationError, apply_profile
            try:
                return apply_profile(from_mapping(data, name, overrides, p.parent), profile,
                                     f"{name}: {what}".rstrip(": "))
            except CalibrationError as e:
                raise ScenarioError(str(e)) from None
        if not isinstance(cal, dict) or not isinstance(cal.get("measured"), dict):
            raise ScenarioError(f"{name}: calibration: {cal_path.name} is neither a profile "
                                "(splitroom calibrate) nor a `measured:` mapping")
        data = dict(data)
        merged = dict(cal["measured"])
        merged.update(data.get("measured") or {})
        data["measured"] = merged
    return from_mapping(data, name, overrides, p.parent)
