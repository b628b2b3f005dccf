"""The typed control plane: what devices tell each other besides residual frames, and
what one device process is told to do.

Control messages travel as JSON objects on the ``reply`` data channel, one message per
transport message, told apart by ``"type"``:

* :class:`Hello`  every device -> every peer, once connected: who it is, whether it is
  the host, the layers it asks for (0-based half-open, or null for "deal them"), the
  bytes it lends.
* :class:`Plan`   host -> every peer: the chain, the scheduler settings, the answer cap.
* :class:`Abort`  anyone -> every peer: the room cannot run, with a reason.
* :class:`Bye`    host -> every peer: the host is done; workers exit.
* :class:`Heartbeat` every device -> every peer, every 0.25 s: "still here"; a peer
  silent for the heartbeat timeout (1 s) after its first heartbeat is lost. Its times
  are NTP's on-wire exchange, from which the host estimates each peer's clock offset.
* :class:`Stamps` a worker -> host, with its heartbeats: when it had and sent each
  lap's frame, on its own clock (the host's hop time per link, planner/hops.py).
* :class:`Progress` a device -> host while it loads its layers: the percent loaded.
* :class:`Replan` host -> the devices of a re-dealt chain (after a lost worker): load
  your new range, empty your KV cache, drop frames of laps before ``first_lap``.
* :class:`Loading` a device of the new chain -> host, as soon as a Replan arrives: it
  takes the re-deal of ``first_lap`` and loads its range now (the host spares its
  silence while it loads; a device that never answers is held to the heartbeat rule).
* :class:`Ready`  a device of the new chain -> host: done loading for ``first_lap``.
* :class:`Crash`  host -> one device, only where fault injection is on (a scenario's
  ``faults:`` in ``run --real``): exit at once, as a killed process would.
* :class:`Fault`  a worker -> host: a residual of a lap went bad (NaN or inf) at a
  device; the host fails that lap's question, naming the device.
* :class:`Unreachable` a worker -> host: after a Replan that dealt a device back, it
  could not make a new connection to its neighbour through the relay; the host deals
  the device it took back out again.

:class:`NodeConfig` is everything one device process needs (written as JSON by
``splitroom run --real`` for ``python -m runtime.node``, built from a Plan by
``splitroom join``). :class:`SchedulerSettings` is :class:`planner.scheduler.SchedulerConfig`
on the wire (the planner stays free of pydantic).

:data:`HANDSHAKE_MESSAGES` and :data:`ROOM_MESSAGES` are the one list of which is
which (a joined device routes by them). Every parse error is a :class:`ControlError`
with a one-line reason.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from planner.deal import Deal
from planner.frames import MAX_SLOTS, DType
from planner.protocol import ReturnPath
from planner.room import HOST_WAIT_S as PLANNER_HOST_WAIT_S, RUNTIME_DRAFTERS
from planner.sampling import MAX_SEED, Sampling
from planner.draft_policy import DraftPolicy
from planner.scheduler import SchedulerConfig

#: Seconds a worker that lost the model host waits for it to come back ("Host
#: reconnecting") before the room is over (planner.room.HOST_WAIT_S: product page 001, a
#: minute; the simulator's stall rule uses the same).
HOST_WAIT_S = PLANNER_HOST_WAIT_S

#: seconds a device that lost a peer waits for it on the live connection (the worker
#: says hello again over it, the host listens) before both meet at the relay for a new
#: one: a device whose Wi-Fi dropped for a few seconds finds the same room still there
#: (chosen: a 7 s drop and some; ICE consent, RFC 7675, keeps a connection for 30 s
#: without answers)
REJOIN_LIVE_S = 10.0

#: A device id as the control plane accepts it.
DEVICE_ID = Annotated[str, Field(min_length=1, max_length=64)]


class ControlError(ValueError):
    """A control message or node configuration is malformed (one-line reason)."""


def _one_line(e: ValidationError, what: str) -> ControlError:
    errs = e.errors()
    parts = []
    for err in errs[:3]:
        where = ".".join(str(x) for x in err.get("loc", ())) or what
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return ControlError(f"bad {what}: " + "; ".join(parts) + more)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingSettings(_Model):
    """:class:`planner.sampling.Sampling` as JSON (limits are Sampling's)."""

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)

    def sampling(self) -> Sampling:
        """As the planner's Sampling."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)


class DraftPolicySettings(_Model):
    """:class:`planner.draft_policy.DraftPolicy` as JSON; limits are DraftPolicy's."""

    lap_s: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] = Field(min_length=2, max_length=65)
    prior: tuple[Annotated[float, Field(ge=0, le=1)], ...] = Field(max_length=64)
    prior_weight: float = Field(4.0, gt=0, allow_inf_nan=False)
    probe_every: int = Field(8, ge=1)
    probe_tokens: int = Field(1, ge=1)
    by_k: tuple[tuple[Annotated[float, Field(ge=0, le=1)], ...], ...] = Field((), max_length=64)

    def policy(self) -> DraftPolicy:
        """The planner's DraftPolicy. Raises ValueError as it does."""
        return DraftPolicy(self.lap_s, self.prior, self.prior_weight, self.probe_every, self.probe_tokens, self.by_k)


class SchedulerSettings(_Model):
    """:class:`planner.scheduler.SchedulerConfig` as JSON (phones a list, dtype its code,
    return_path its name). Field meanings and limits are SchedulerConfig's."""

    hidden: int = Field(ge=1)
    prefill_chunk: int = Field(16, ge=1)
    draft_tokens: int = Field(0, ge=0)
    async_laps: int = Field(1, ge=1)
    return_path: ReturnPath = ReturnPath.DIRECT
    wake: bool = True
    phones: tuple[str, ...] = ()
    eos_token: Optional[int] = None
    dtype: int = Field(int(DType.FLOAT32), ge=0, le=1)
    context: Optional[int] = Field(None, ge=1)
    sampling: SamplingSettings = SamplingSettings()
    stop_tokens: tuple[int, ...] = ()
    draft_policy: Optional[DraftPolicySettings] = None
    questions_in_flight: int = Field(1, ge=1, le=MAX_SLOTS)

    @classmethod
    def of(cls, config: SchedulerConfig) -> "SchedulerSettings":
        """The settings of ``config`` (made by :meth:`SchedulerConfig.from_scenario`)."""
        return cls.model_validate(config.to_json())

    def config(self) -> SchedulerConfig:
        """Back to the planner's frozen SchedulerConfig. Raises ValueError as it does."""
        return SchedulerConfig(hidden=self.hidden, prefill_chunk=self.prefill_chunk,
                               draft_tokens=self.draft_tokens, async_laps=self.async_laps,
                               return_path=self.return_path, wake=self.wake, phones=frozenset(self.phones),
                               eos_token=self.eos_token, dtype=DType(self.dtype), context=self.context,
                               sampling=self.sampling.sampling(), stop_tokens=tuple(self.stop_tokens),
                               draft_policy=self.draft_policy.policy() if self.draft_policy is not None else None,
                               questions_in_flight=self.questions_in_flight)


StageRow = tuple[DEVICE_ID, Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]


def chain_deal(host: str, stages) -> Deal:
    """A pinned :class:`planner.deal.Deal` from ``[(device, start, end), ...]``
    (0-based half-open, the host's range first when it holds one): :meth:`Deal.pinned`."""
    return Deal.pinned(host, stages)


class Hello(_Model):
    """A device introduces itself. ``layers`` is ``[start, end)`` 0-based, None for
    "deal them" (``--layers auto``); ``lends`` bytes (0: unknown). ``proof``: in a room
    with a key, :func:`room_proof` of the key, this device's id and the fingerprint of
    the DTLS certificate it uses on this connection (hex), so the id is bound to the
    certificate the peer's DTLS has verified."""

    type: Literal["hello"] = "hello"
    device: DEVICE_ID
    host: bool = False
    layers: Optional[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]] = None
    lends: int = Field(0, ge=0)
    proof: Optional[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = None


def room_proof(key: str, device: str, fingerprint: str) -> str:
    """HMAC-SHA256 (RFC 2104) keyed with the room key over ``device`` and its DTLS
    certificate ``fingerprint`` (as in the SDP's ``a=fingerprint``, e.g. ``sha-256
    AB:CD:...``; compared without regard to case), as 64 hex digits."""
    import hashlib
    import hmac
    msg = b"splitroom-hello\x00" + device.encode() + b"\x00" + fingerprint.strip().lower().encode()
    return hmac.new(key.encode(), msg, hashlib.sha256).hexdigest()


def manifest_signature(key: str, device: str, start: int, end: int, manifest_sha: str) -> str:
    """HMAC-SHA256 with the room key over the weights a host tells ``device`` to copy:
    layers ``[start, end)`` and their manifest's sha256 (64 hex digits)."""
    import hashlib
    import hmac
    msg = f"splitroom-manifest\x00{device}\x00{start}\x00{end}\x00{manifest_sha}".encode()
    return hmac.new(key.encode(), msg, hashlib.sha256).hexdigest()


def check_manifest_signature(key: str, device: str, start: int, end: int, manifest_sha: str,
                             signature: str) -> bool:
    """Whether ``signature`` is :func:`manifest_signature` of these values with ``key``
    (compared in constant time)."""
    import hmac
    return hmac.compare_digest(str(signature), manifest_signature(key, device, start, end, manifest_sha))


def check_proof(key: str, hello: "Hello", fingerprint: Optional[str]) -> Optional[str]:
    """Why ``hello`` does not prove the room key for the connection whose remote DTLS
    certificate has ``fingerprint`` (None: it does): no proof, no fingerprint known, or
    a proof made with another key or for another certificate (an impostor)."""
    import hmac
    if hello.proof is None:
        return "its hello carries no proof of the room key"
    if not fingerprint:
        return "the connection's certificate fingerprint is unknown"
    if not hmac.compare_digest(hello.proof, room_proof(key, hello.device, fingerprint)):
        return "its hello's proof does not match the room key and its connection's certificate"
    return None


class Plan(_Model):
    """The host's plan: the chain ``[(device, start, end), ...]`` (host first), the
    scheduler settings and the answer cap (tokens)."""

    type: Literal["plan"] = "plan"
    host: DEVICE_ID
    stages: tuple[StageRow, ...] = Field(min_length=1)
    scheduler: SchedulerSettings
    max_new_tokens: int = Field(ge=1)

    def deal(self) -> Deal:
        """The chain as a pinned Deal."""
        return chain_deal(self.host, self.stages)


class Abort(_Model):
    """The room cannot run; everyone exits with ``reason``."""

    type: Literal["abort"] = "abort"
    reason: str = ""


class Bye(_Model):
    """The host is done; the other devices exit."""

    type: Literal["bye"] = "bye"


#: a stamp or heartbeat time, seconds on the sender's monotonic clock (finite, bounded)
CLOCK_S = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
#: stamps one Stamps message carries at most (a device sends them every heartbeat)
MAX_STAMPS = 128


class Heartbeat(_Model):
    """Still here. The times (all optional: a heartbeat without them only says "still
    here") are one leg of NTP's on-wire exchange (planner/hops.py): ``sent_s`` this
    heartbeat's send time on the sender's monotonic clock, ``echo_s`` the ``sent_s`` of
    the last heartbeat the sender heard from the receiver, ``held_s`` how long the sender
    held it before this one (seconds, its own clock)."""

    type: Literal["heartbeat"] = "heartbeat"
    sent_s: Optional[CLOCK_S] = None
    echo_s: Optional[CLOCK_S] = None
    held_s: Optional[Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]] = None


#: one stamp: (lap id, the peer at the other end of the hop, seconds on the sender's clock)
Stamp = tuple[Annotated[int, Field(ge=0, lt=1 << 32)], DEVICE_ID, CLOCK_S]


class Stamps(_Model):
    """A worker -> the model host, with its heartbeats: when it had each lap's frame from
    a peer (``arrived``: lap, that peer, time) and when it sent a lap's frame on
    (``sent``: lap, the peer it went to, time), on its monotonic clock; the host pairs
    them with the other ends' into hop times per link (planner/hops.py)."""

    type: Literal["stamps"] = "stamps"
    arrived: tuple[Stamp, ...] = Field((), max_length=MAX_STAMPS)
    sent: tuple[Stamp, ...] = Field((), max_length=MAX_STAMPS)


class Progress(_Model):
    """A device -> the model host while it loads its layers: ``percent`` of the bytes
    it loads (whole percent, 0-100), for the device screen's "Loading N%"."""

    type: Literal["progress"] = "progress"
    percent: int = Field(ge=0, le=100)


class Replan(_Model):
    """The chain after ``lost`` left: ``stages`` (host first), frames of laps before
    ``first_lap`` are stale. Each device of ``stages`` answers :class:`Ready`."""

    type: Literal["replan"] = "replan"
    lost: Optional[DEVICE_ID] = None
    #: the device taken back into the chain (a re-deal after it came back; ``lost`` None)
    back: Optional[DEVICE_ID] = None
    host: DEVICE_ID
    stages: tuple[StageRow, ...] = Field(min_length=1)
    first_lap: int = Field(ge=0)
    #: device -> sha256 of its new range's weights manifest: copy the range from the
    #: host over the weights channel, verified against it (runtime/weights_share.py)
    manifests: dict[DEVICE_ID, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(default_factory=dict)
    #: device -> the layers ``[start, end)`` that manifest covers: the part of its new
    #: range it does not hold yet (the rest it keeps, read from its own disk); absent:
    #: its whole new range
    copy_ranges: dict[DEVICE_ID, tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]] = \
        Field(default_factory=dict)
    #: device -> :func:`manifest_signature` of its manifest hash and copy range with the
    #: room key (in a room with a key; a device checks it before it trusts the hash)
    signatures: dict[DEVICE_ID, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(default_factory=dict)

    def deal(self) -> Deal:
        """The new chain as a pinned Deal."""
        return chain_deal(self.host, self.stages)


class Loading(_Model):
    """This device took the Replan of ``first_lap`` and loads its range now."""

    type: Literal["loading"] = "loading"
    first_lap: int = Field(ge=0)


class Ready(_Model):
    """This device holds its range of the chain of ``first_lap``, KV cache empty."""

    type: Literal["ready"] = "ready"
    first_lap: int = Field(ge=0)


class Fault(_Model):
    """A worker -> the host: the residual of lap ``lap_id`` went bad at ``device`` (a
    NaN or an infinity; ``reason`` says what). The host fails that lap's question
    (:class:`planner.protocol.LapFailed`)."""

    type: Literal["fault"] = "fault"
    lap_id: int = Field(ge=0)
    device: DEVICE_ID
    reason: str = Field("", max_length=300)


class Unreachable(_Model):
    """A worker -> the host: after the Replan of ``first_lap``, which dealt a device back
    (its ``back``), this device could not make a new connection to its neighbour
    ``device`` through the relay (``reason`` says why). The host deals the device it took
    back out again (runtime.room.Node: otherwise the chain is ready on paper but a lap
    can never cross that link)."""

    type: Literal["unreachable"] = "unreachable"
    first_lap: int = Field(ge=0)
    device: DEVICE_ID
    reason: str = Field("", max_length=300)


class Crash(_Model):
    """Fault injection: exit now without a goodbye (honoured only when enabled)."""

    type: Literal["crash"] = "crash"


#: the handshake's messages (before the room runs): ``join`` waits for them in its queue
HANDSHAKE_MESSAGES = (Hello, Plan, Abort, Bye)
#: the running room's messages: each device's :class:`runtime.room.Node` handles them
ROOM_MESSAGES = (Heartbeat, Replan, Loading, Ready, Crash, Fault, Stamps, Progress, Unreachable)
#: every control message, told apart by ``type``
ControlMessage = Annotated[Union[HANDSHAKE_MESSAGES + ROOM_MESSAGES], Field(discriminator="type")]
_CONTROL = TypeAdapter(ControlMessage)


def parse_control(data: bytes | str) -> (Hello | Plan | Abort | Bye | Heartbeat | Replan | Loading | Ready | Crash
                                         | Fault | Stamps | Progress | Unreachable):
    """One control message from its JSON bytes. Raises ControlError (one line) for
    anything that is not exactly one of the messages above."""
    try:
        return _CONTROL.validate_json(data)
    except ValidationError as e:
        raise _one_line(e, "control message") from None


def encode_control(msg: _Model) -> bytes:
    """A control message as JSON bytes (what :func:`parse_control` reads)."""
    return msg.model_dump_json().encode()


class NodeConfig(BaseModel):
    """Everything one device process needs (JSON: :meth:`to_json` / :meth:`from_json`).

    Attributes:
        device: this device's id.
        host: the model host's id.
        stages: the chain, ``[(device, start, end), ...]`` 0-based half-open.
        scheduler: the scheduler settings (a dict as SchedulerConfig.to_json writes is
            accepted and validated).
        model_dir: safetensors directory of the model.
        backend: ``numpy`` or ``wgpu``.
        slowdown: pad compute to this factor (>= 1).
        prompts: the host's questions (text), asked one after another.
        max_new_tokens: answer length cap (tokens, >= 1).
        trace_path: where to write this node's JSONL trace ("" for none).
        peers: every other device of the room.
        drafter: the host's drafter (``ngram``, ``early_exit``, ``model``).
        early_exit_layers: layers the early_exit drafter runs.
        recover: the host re-deals a lost worker's layers over the chain left (the lost
            range goes to the stage before it, loaded from this machine's model
            directory) and replays; False: a lost device ends the room.
        heartbeat_s: seconds between heartbeats to every peer (0: none).
        heartbeat_timeout_s: a peer silent this long after its first heartbeat is lost
            (0: only the transport notices).
        crash_at_token: the host's fault injection, ``[(device, N), ...]``: once N answer
            tokens (all questions) are emitted, tell ``device`` to crash.
        crash_at_s: the host's fault injection by time, ``[(device, seconds), ...]``: that
            many seconds after the host's node starts (every device connected and
            loaded, the first question asked: the simulator's time 0), tell ``device``
            to crash.
        crashable: obey a Crash message (exit at once, status 9).
        weights_from_peer: on a re-deal, a worker copies its new range from the host
            over the weights channel (verified against the manifest hash the host puts
            in the Replan) instead of reading its own model directory; the host serves.
        redeals: the host's re-deal per lost worker, planned with the planner's rules
            (``run --real`` fills it from the scenario; see :meth:`redeal_rule`).
        weights, kv: how this device stores its weights and KV cache (runtime.precision:
            ``f32``/``f16``/``q8``/``gguf``, the GGUF's blocks as stored, and ``f32``/``f16``); the residual's dtype on the wire is
            the scheduler's ``dtype``.
        room_key: the room's key (``join ...?key=``; ``run --real`` makes one per run): the
            host signs the manifest hash of every weights copy it asks for
            (:func:`manifest_signature`) and a worker copies only when the signature
            checks, else it reads the layers from its own disk.
        host_wait_s: a worker that loses the model host keeps its weights and waits this
            many seconds for the host to come back ("Host reconnecting"), then leaves
            ("Room over"); 0: leaves at once.
        rejoin_live_s: seconds a lost peer is waited for on the live connection
            (:data:`REJOIN_LIVE_S`): a worker says hello again over it, and only then
            asks the relay for a new connection; the model host meets a lost worker at
            the relay after as long (0: at once).
        ice_servers: STUN/TURN server URLs for this device's peer connections
            (runtime/transport/ice.py; the scenario's ``network.ice_servers``); none: no
            server is contacted.
        ice_relay_only: connect only through the TURN server's relay candidates.
        emulate_one_way_s: hold every packet this device sends this many seconds before it
            leaves, in this process (runtime.transport.emulate_delay; 0: none, at most 5 s):
            a room's round trip on a machine without netem, when every device gets half of
            it. What it really did is written beside the trace (``.delay.json``).
        usable_bytes: the host's re-deal check: device id -> bytes of what it lends that
            layers may use (``planner.deal.usable_bytes``); a merged re-deal that puts a
            device over refuses to load (the room stops with the reason). Empty: unchecked.
        layer_bytes: memory of each layer (weights + KV at the context), one per layer,
            for the same check; host_extra_bytes: the host's embedding, head and draft.
    """

    model_config = ConfigDict(extra="forbid")

    device: DEVICE_ID
    host: DEVICE_ID
    stages: list[StageRow]
    scheduler: SchedulerSettings
    model_dir: str
    backend: Literal["numpy", "wgpu"] = "numpy"
    slowdown: float = Field(1.0, ge=1.0)
    prompts: list[str] = Field(default_factory=list)
    max_new_tokens: int = Field(64, ge=1)
    trace_path: str = ""
    peers: list[DEVICE_ID] = Field(default_factory=list)
    drafter: Literal[RUNTIME_DRAFTERS] = "ngram"
    early_exit_layers: int = Field(8, ge=1)
    recover: bool = True
    heartbeat_s: float = Field(0.25, ge=0.0)
    heartbeat_timeout_s: float = Field(1.0, ge=0.0)
    crash_at_token: list[tuple[DEVICE_ID, Annotated[int, Field(ge=1)]]] = Field(default_factory=list)
    crash_at_s: list[tuple[DEVICE_ID, Annotated[float, Field(ge=0.0, allow_inf_nan=False)]]] = \
        Field(default_factory=list)
    crashable: bool = False
    weights_from_peer: bool = False
    redeals: dict[DEVICE_ID, list[StageRow]] = Field(default_factory=dict)
    weights: Literal["f32", "f16", "q8", "gguf"] = "f32"
    kv: Literal["f32", "f16"] = "f32"
    host_wait_s: float = Field(HOST_WAIT_S, ge=0.0)
    rejoin_live_s: float = Field(REJOIN_LIVE_S, ge=0.0, allow_inf_nan=False)
    room_key: Optional[str] = Field(None, min_length=16, max_length=128)
    ice_servers: list[str] = Field(default_factory=list, max_length=2)
    ice_relay_only: bool = False
    emulate_one_way_s: float = Field(0.0, ge=0.0, le=5.0, allow_inf_nan=False)
    usable_bytes: dict[DEVICE_ID, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    layer_bytes: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    host_extra_bytes: int = Field(0, ge=0)

    @field_validator("ice_servers")
    @classmethod
    def _ice_urls(cls, v: list[str]) -> list[str]:
        from .transport.ice import parse_ice_servers
        parse_ice_servers(v)  # ValueError names the bad URL, never its password
        return v

    def ice(self) -> dict:
        """``connect_room``'s ICE keyword arguments: ``ice_servers`` and ``relay_only``."""
        from .transport.ice import parse_ice_servers
        return {"ice_servers": parse_ice_servers(self.ice_servers), "relay_only": self.ice_relay_only}

    def precision(self):
        """This device's :class:`runtime.precision.Precision` (residual from the scheduler's dtype)."""
        from .precision import Precision
        return Precision(self.weights, self.kv, "f16" if self.scheduler.dtype == int(DType.FLOAT16) else "f32")

    def redeal_rule(self):
        """The host's re-deal rule: the chain :attr:`redeals` gives for the loss of one
        worker (``[]``: the rest cannot hold the model), else the lost ranges merged into
        their neighbours (:func:`planner.chain.merge_lost`), checked against what each
        device lends when :attr:`usable_bytes` is given (:func:`planner.chain.check_lent`).
        Raises ValueError (DealError) when the room cannot go on."""
        from planner.chain import check_lent, merge_lost
        from planner.deal import DealError

        def rule(current: Deal, lost: frozenset[str]) -> Deal:
            if len(lost) == 1 and next(iter(lost)) in self.redeals:
                stages = self.redeals[next(iter(lost))]
                if not stages:
                    raise DealError("the devices left cannot hold the model")
                return chain_deal(self.host, stages)
            merged = merge_lost(current, lost)
            if self.usable_bytes and len(self.layer_bytes) >= merged.stages[-1].end:
                check_lent(merged, self.usable_bytes, self.layer_bytes, self.host_extra_bytes, current)
            return merged
        return rule

    def rejoin_rule(self):
        """The host's rule for a device that came back (planner.chain.RejoinRule): the
        room's first chain (:attr:`stages`, the planner's deal) with the ranges of the
        devices still lost merged into their neighbours, checked against what each
        device lends when :attr:`usable_bytes` is given, and taken only when it is
        measured faster than the chain now (:func:`planner.chain.measured_faster` past
        :data:`planner.chain.REJOIN_MARGIN`, on the seconds per layer each device was
        timed at in this room; a hop the room did not time counts 0). Returns None (the
        device stays out of the chain) when it is not; raises DealError when it does not
        fit (the scheduler then leaves the device out, with the reason)."""
        from planner.chain import check_lent, measured_faster, merge_lost

        def rule(current: Deal, lost: frozenset[str], measured) -> Deal | None:
            first = self.deal()
            gone = lost & {s.device for s in first.stages}
            new = merge_lost(first, frozenset(gone)) if gone else first
            if self.usable_bytes and len(self.layer_bytes) >= new.stages[-1].end:
                check_lent(new, self.usable_bytes, self.layer_bytes, self.host_extra_bytes, current)
            return new if measured_faster(current, new, measured, None, self.scheduler.return_path) else None
        return rule

    def deal(self) -> Deal:
        """The chain as a pinned :class:`planner.deal.Deal`."""
        return chain_deal(self.host, self.stages)

    def scheduler_config(self) -> SchedulerConfig:
        """The planner's SchedulerConfig. Raises ValueError for settings it refuses."""
        return self.scheduler.config()

    def to_json(self) -> str:
        """As JSON text."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> "NodeConfig":
        """From :meth:`to_json` text. Raises ControlError (a ValueError, one line) when malformed."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as e:
            raise _one_line(e, "node configuration") from None
