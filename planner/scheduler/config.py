"""The scheduler's settings and the product's queue and wake limits.

:class:`SchedulerConfig` is what :class:`planner.scheduler.HostScheduler` schedules by;
:meth:`SchedulerConfig.from_scenario` makes it from a scenario, and every room (the
simulator, a device process, the tests' rooms) makes it that way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from planner.draft_policy import DraftPolicy
from planner.frames import MAX_SLOTS, DType
from planner.protocol import ReturnPath
from planner.room import Scenario
from planner.sampling import GREEDY, Sampling

#: Product page 001: "Up to 10 questions wait in the host's queue, at most two per device."
MAX_WAITING = 10
MAX_WAITING_PER_DEVICE = 2
#: Product page 001: a woken phone keeps its GPU busy "for at most 50 ms".
WAKE_MAX_S = 0.050
#: Question ids the host remembers to refuse a repeated one (the latest; a long-lived
#: room forgets older ids, so its memory stays bounded).
SEEN_QUESTIONS = 4096


@dataclass(frozen=True)
class SchedulerConfig:
    """How the host schedules work.

    Attributes:
        hidden: residual width (columns of every frame).
        prefill_chunk: prompt tokens per pipelined prefill frame.
        draft_tokens: k drafted tokens per verify lap; 0 for plain decoding.
        async_laps: verify laps in flight at once (>= 1; used only when k > 0).
        return_path: :class:`ReturnPath` (a plain ``"direct"`` / ``"via_stages"`` is
            converted).
        wake: send phones a wake message at the start of each lap.
        phones: device ids that are phones (woken when they hold layers).
        eos_token: stop when the head predicts this token (None: never).
        stop_tokens: more tokens that end an answer like ``eos_token`` (e.g. Llama 3's
            ``<|eot_id|>`` beside ``<|end_of_text|>``).
        dtype: residual dtype on the wire.
        context: positions every stage's KV cache holds, tokens (None: unbounded). A
            question whose prompt + max new tokens exceeds it is refused when asked,
            and verify laps draft no further than its last position.
        sampling: how questions that do not say are decoded (:data:`GREEDY` by default).
        draft_policy: ``draft_tokens: auto``: each lap's k in 0..``draft_tokens`` is
            chosen per question by :mod:`planner.draft_policy` (None: always
            ``draft_tokens``); its ``max_draft_tokens`` must equal ``draft_tokens``.
        questions_in_flight: questions answered at once, each in its own KV cache slot
            (1 .. :data:`planner.frames.MAX_SLOTS`; 1 is product page 001's rule). The
            host answers no more than its deal's ``kv_caches`` when the deal says.
    """

    hidden: int
    prefill_chunk: int = 16
    draft_tokens: int = 0
    async_laps: int = 1
    return_path: ReturnPath = ReturnPath.DIRECT
    wake: bool = True
    phones: frozenset[str] = frozenset()
    eos_token: int | None = None
    dtype: DType = DType.FLOAT32
    context: int | None = None
    sampling: Sampling = GREEDY
    stop_tokens: tuple[int, ...] = ()
    draft_policy: DraftPolicy | None = None
    questions_in_flight: int = 1

    @classmethod
    def from_scenario(cls, scn: Scenario, eos_token: int | None = None,
                      stop_tokens: tuple[int, ...] = (), deal=None) -> "SchedulerConfig":
        """The settings a scenario asks for. Residuals travel as float32 when the
        model's residual is 4 bytes per value (the real runtime's SmolLM2), else f16.
        A sampling section without a seed takes the scenario's ``seed``. With ``deal``
        (:class:`planner.deal.Deal`), questions in flight are no more than the KV caches
        it holds (``deal.kv_caches``)."""
        n = scn.decoding.questions_in_flight
        if deal is not None and deal.kv_caches:
            n = min(n, deal.kv_caches)
        spec = scn.decoding.speculative
        f32 = scn.model.residual_bytes_per_token >= 4 * scn.model.hidden
        return cls(hidden=scn.model.hidden, prefill_chunk=scn.decoding.prefill_chunk,
                   draft_tokens=spec.draft_tokens if spec else 0,
                   async_laps=scn.decoding.async_laps if spec else 1,
                   return_path=scn.decoding.return_path, wake=scn.decoding.wake,
                   phones=frozenset(d.id for d in scn.devices if d.kind == "phone"),
                   eos_token=eos_token, dtype=DType.FLOAT32 if f32 else DType.FLOAT16,
                   context=scn.options.context_tokens, sampling=_seeded(scn.decoding.sampling, scn.seed),
                   stop_tokens=tuple(sorted(set(stop_tokens) - {eos_token})), questions_in_flight=n)

    def to_json(self) -> dict:
        """As a JSON-ready mapping (phones a sorted list, dtype its code, sampling a mapping)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "phones": sorted(self.phones), "dtype": int(self.dtype), "return_path": str(self.return_path),
            "sampling": self.sampling.to_json(), "stop_tokens": list(self.stop_tokens),
            "draft_policy": self.draft_policy.to_json() if self.draft_policy is not None else None}

    def capped(self, positions: int | None) -> "SchedulerConfig":
        """These settings with ``context`` lowered to ``positions`` (a stage's KV cache
        holds no more; the smallest cache of a room bounds its questions). ``positions``
        None, or not below the context already set: unchanged."""
        if positions is None or (self.context is not None and self.context <= positions):
            return self
        return replace(self, context=positions)

    def __post_init__(self):
        if self.prefill_chunk < 1 or self.async_laps < 1 or self.draft_tokens < 0 or self.hidden < 1:
            raise ValueError("prefill_chunk, async_laps and hidden must be >= 1 and draft_tokens >= 0")
        if not 1 <= self.questions_in_flight <= MAX_SLOTS:
            raise ValueError(f"questions_in_flight must be 1-{MAX_SLOTS}, got {self.questions_in_flight}")
        if self.context is not None and self.context < 1:
            raise ValueError(f"context must be >= 1 position or None, got {self.context}")
        try:
            object.__setattr__(self, "return_path", ReturnPath(self.return_path))
        except ValueError:
            raise ValueError(f"return_path must be direct or via_stages, got {self.return_path!r}") from None
        if not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a planner.sampling.Sampling, got {type(self.sampling).__name__}")
        if self.draft_policy is not None and self.draft_policy.max_draft_tokens != self.draft_tokens:
            raise ValueError(f"draft_policy chooses up to {self.draft_policy.max_draft_tokens} drafts, "
                             f"draft_tokens is {self.draft_tokens}")


def _seeded(sampling: Sampling, seed: int) -> Sampling:
    """``sampling`` with ``seed`` when it has none (greedy needs none)."""
    return sampling if sampling.greedy or sampling.seed is not None else sampling.with_seed(seed)
