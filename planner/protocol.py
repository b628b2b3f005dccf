"""Events (what happened, past tense) and commands (what to do, imperative).

The sans-IO core speaks only these frozen dataclasses: a driver (the simulator, a
device of the real room, the test harness; every one through :class:`planner.drive.Driver`)
feeds events into :class:`planner.scheduler.HostScheduler` and
:class:`planner.scheduler.WorkerMachine` and carries out the commands they return.
Every driver appends every event and command, with its time, to the same JSONL trace
(:mod:`planner.trace`), from which :mod:`planner.metrics` computes every number. An
event a machine does not act on leaves an :class:`Ignored` record (with a reason from
:class:`IgnoreReason`); one that only a driver's mistake can produce raises
:class:`DriverError`.

Token ids are plain ints; positions are 0-based indices into a question's sequence
(prompt then answer). The scheduler never computes logits: the host's output head
reports one token per row in :class:`HeadFinished` (the argmax, or under sampling the
token drawn with the uniforms the scheduler put in :class:`RunHead`; see
:mod:`planner.sampling`), and the scheduler keeps the longest prefix of drafts that
agree with them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Union

from planner.fastdc import frozen
from planner.frames import FrameHeader
from planner.sampling import Sampling


class LapKind(StrEnum):
    """What a lap carries: a prompt chunk, one decode token, or a verify batch of k+1.

    A ``str`` enum: compares equal to (and serialises as) its value, so traces written
    before the enum existed still read back."""

    PREFILL = "prefill"
    DECODE = "decode"
    VERIFY = "verify"
    #: after a re-deal: prompt + answer so far again, in prefill chunks, to rebuild every
    #: stage's KV cache (its head gives the next answer token, as a prefill's does)
    REPLAY = "replay"


class IgnoreReason(StrEnum):
    """Why a machine took no action on an event (the ``reason`` of :class:`Ignored`).

    * ``stale``: it belongs to a lap, draft, chain or question that is over (a lap
      made stale by a rejection, a frame of the chain before a re-deal);
    * ``unknown``: it names something this machine never had, and it came from outside
      (a peer's frame or Fault, an asker's withdrawal): refused quietly, never trusted;
    * ``repeated``: the same news again (a device lost that was already lost);
    * ``not_here``: it is for a machine this process does not run;
    * ``bug``: in a room of honest peers only a driver's mistake produces it (a second
      head result for one lap, a frame kind the receiver never gets); the property
      tests assert that no run leaves one.
    """

    STALE = "stale"
    UNKNOWN = "unknown"
    REPEATED = "repeated"
    NOT_HERE = "not_here"
    BUG = "bug"


class DriverError(RuntimeError):
    """An event that only a wrong driver can produce: a ``HeadFinished`` or a
    ``StageFinished`` at the host for a lap the host never launched, a ``HeadFinished``
    for a lap the host gave no RunHead, a ``DraftReady`` for a draft it never asked for. The machine raises it (the driver's own mistake, as
    h11 raises ``LocalProtocolError``) instead of ignoring the event."""


class ReturnPath(StrEnum):
    """How the last stage's residual gets back to the host: ``direct`` (last stage ->
    host) or ``via_stages`` (back through every stage, as RETURN frames)."""

    DIRECT = "direct"
    VIA_STAGES = "via_stages"

# --- events -----------------------------------------------------------------------


@frozen
class QuestionAsked:
    """``device`` asked a question: ``prompt`` token ids, answer at most ``max_new_tokens``,
    decoded with ``sampling`` (None: the room's, :attr:`SchedulerConfig.sampling`)."""

    question_id: int
    device: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: Sampling | None = None


@frozen
class StageFinished:
    """``device`` finished running its layers for lap ``lap_id`` (see RunStage)."""

    device: str
    lap_id: int


@frozen
class FrameArrived:
    """A frame from ``src`` arrived at ``device``."""

    device: str
    src: str
    header: FrameHeader


@frozen
class HeadFinished:
    """The host's output head ran on lap ``lap_id``: ``predictions[i]`` is the next
    token after the lap's i-th input position (as many as RunHead.rows): the argmax, or
    under sampling the token :func:`planner.sampling.head_tokens` picked with that row's
    uniforms."""

    lap_id: int
    predictions: tuple[int, ...]


@frozen
class DraftReady:
    """The host's drafter proposed ``tokens`` for draft request ``draft_id``."""

    draft_id: int
    tokens: tuple[int, ...]


@frozen
class DeviceLost:
    """``device`` left the room (connection closed, timed out). ``silent_since_s``: when
    it was last heard from (driver clock, seconds), when known: the loss happened then,
    and was noticed now (a heartbeat timeout later)."""

    device: str
    reason: str = ""
    silent_since_s: float | None = None


@frozen
class DeviceBack:
    """``device``, lost earlier, is heard again (it said hello again and its heartbeats
    kept coming for the rejoin hold, :func:`planner.liveness.rejoin_hold_s`): it is a
    member of the room again. The host re-deals it back into the chain when its rejoin
    rule (:func:`planner.chain.rejoin_rule`) finds a faster deal with it (a
    :class:`Redeal` whose ``back`` names it); otherwise it waits outside the chain."""

    device: str
    reason: str = ""


@frozen
class ChainReady:
    """Every device of the chain announced by :class:`Redeal` ``first_lap`` holds its new
    layer range (weights loaded) with an empty KV cache: the host may replay."""

    first_lap: int


@frozen
class QuestionWithdrawn:
    """The asker of ``question_id`` no longer wants its answer (it went away, or its
    answer reached one of its stop sequences). A waiting question leaves the queue
    (:class:`Refuse`, "withdrawn by the asker"); the question being answered ends now
    (:class:`AnswerDone` with reason ``withdrawn``, its laps in flight dropped) and the
    next one begins. An unknown or finished question: nothing."""

    question_id: int


@frozen
class LapFailed:
    """Lap ``lap_id``'s residual went bad at ``device``: a NaN or an infinity in what
    ``device`` computed or sent (``reason`` says which and how many). The question the
    lap belongs to fails (:class:`Refuse` with a reason naming ``device``); the room
    goes on with the next question. A lap that is unknown or stale: nothing."""

    lap_id: int
    device: str
    reason: str


# --- commands ---------------------------------------------------------------------


@frozen
class BeginAnswer:
    """Start answering ``question_id`` (it leaves the queue)."""

    question_id: int
    device: str
    prompt_tokens: int


@frozen
class RunStage:
    """Run ``device``'s layers on ``tokens`` positions from ``first_pos`` for lap ``lap_id``.

    First truncate that device's KV cache for the question to ``first_pos`` positions.
    On the model host, ``inputs`` are the token ids to embed first (the host's own
    range may be empty: then only the embedding runs). ``slot``: which of the device's
    KV caches holds the question (one per question in flight; the frame header's).
    Report StageFinished.
    """

    device: str
    lap_id: int
    question_id: int
    first_pos: int
    tokens: int
    inputs: tuple[int, ...] = ()
    slot: int = 0


@frozen
class SendFrame:
    """Send the frame ``header`` (with the residual of lap ``header.lap_id``) from
    ``src`` to ``dst``."""

    src: str
    dst: str
    header: FrameHeader


@frozen
class RunHead:
    """On the host: final norm and output head on the last ``rows`` rows of lap
    ``lap_id``'s returned residual, one token per row out (report HeadFinished): the
    argmax when ``sampling`` is None, else drawn as :func:`planner.sampling.head_tokens`
    does with ``uniforms[i]`` (the ``(u, v)`` pair of the answer token row ``i``
    decides) for row ``i``."""

    lap_id: int
    question_id: int
    rows: int
    sampling: Sampling | None = None
    uniforms: tuple[tuple[float, float], ...] = ()


@frozen
class Draft:
    """On the host: propose ``k`` tokens continuing question ``question_id``'s sequence
    of ``base_len`` committed tokens followed by ``assumed`` (earlier drafts taken as
    accepted). Report DraftReady."""

    draft_id: int
    question_id: int
    base_len: int
    assumed: tuple[int, ...]
    k: int


@frozen
class Wake:
    """Tell phone ``device`` a frame is coming for lap ``lap_id``: keep its GPU busy
    until it arrives, at most ``max_s`` seconds (product page 001: 50 ms)."""

    device: str
    lap_id: int
    max_s: float


@frozen
class RollbackKV:
    """Truncate ``device``'s KV cache for ``question_id`` (its cache ``slot``) to
    ``to_pos`` positions."""

    device: str
    question_id: int
    to_pos: int
    slot: int = 0


@frozen
class DropFrame:
    """``device`` dropped a frame (stale lap or wrong question); nothing to do but log."""

    device: str
    header: FrameHeader
    reason: str


@frozen
class EmitToken:
    """Token ``token`` is answer token number ``index`` of ``question_id``: stream it
    to the asking device."""

    question_id: int
    device: str
    index: int
    token: int


@frozen
class LapEnded:
    """Lap ``lap_id`` came back and was judged: ``kept`` tokens committed, ``stale``
    when an earlier rejection made it useless. Bookkeeping for traces and metrics."""

    lap_id: int
    question_id: int
    kind: LapKind
    drafted: int
    kept: int
    stale: bool


@frozen
class AnswerDone:
    """``question_id`` is answered (``tokens`` answer tokens, ``reason`` eos|length, or
    withdrawn: the asker withdrew it mid-answer, see :class:`QuestionWithdrawn`)."""

    question_id: int
    device: str
    tokens: int
    reason: str


@frozen
class Refuse:
    """``question_id`` is refused or aborted, with a reason a person can read."""

    question_id: int
    device: str
    reason: str


@frozen
class Redeal:
    """``lost`` left the chain (or ``back`` came back to the room: ``lost`` is then
    empty); the host re-dealt the layers over the devices in the room. ``stages`` is the new chain ``((device, start, end), ...)`` 0-based
    half-open, host ``host``. Every device of the new chain loads its range (from its
    disk or a peer) and empties its KV cache; frames of laps before ``first_lap`` are
    dropped. Report :class:`ChainReady` ``(first_lap)`` when all are ready. The host then
    replays every question in flight (prompt + answer so far, each in its own KV cache
    slot): ``question_id`` is the first of them and ``replay_tokens`` their tokens in
    all (None and 0 when no question is being answered)."""

    lost: str
    host: str
    stages: tuple[tuple[str, int, int], ...]
    first_lap: int
    question_id: int | None = None
    replay_tokens: int = 0
    back: str | None = None


@frozen
class Computed:
    """Trace bookkeeping, written by a driver: ``device`` spent ``seconds`` computing
    ``command`` (RunStage, RunHead, Draft) of lap or draft ``ref``, queue wait excluded."""

    device: str
    command: str
    ref: int
    seconds: float


@frozen
class WeightsCopied:
    """Trace bookkeeping, written by a driver: after the re-deal whose first lap is
    ``first_lap``, ``device`` got the weights of layers ``[start, end)`` (0-based,
    half-open) from ``source`` (a peer's id, or ``"disk"``: its own model directory),
    ``nbytes`` bytes in ``seconds`` (copy, checks and load until the stage was built)."""

    device: str
    first_lap: int
    source: str
    start: int
    end: int
    nbytes: int
    seconds: float


@frozen
class Ignored:
    """Trace bookkeeping: the machine of ``device`` took no action on an event of type
    ``event`` (its class name) for ``reason`` (an :class:`IgnoreReason` value);
    ``detail`` says which lap, draft or question, for a person."""

    device: str
    event: str
    reason: str
    detail: str = ""


EVENTS = (QuestionAsked, StageFinished, FrameArrived, HeadFinished, DraftReady, DeviceLost, DeviceBack, ChainReady,
          QuestionWithdrawn, LapFailed)
RECORDS = (Computed, WeightsCopied, Ignored)
COMMANDS = (BeginAnswer, RunStage, SendFrame, RunHead, Draft, Wake, RollbackKV, DropFrame, EmitToken,
            LapEnded, AnswerDone, Refuse, Redeal)

#: Anything a driver feeds to :meth:`planner.chain.Chain.handle` (or a machine).
Event = Union[QuestionAsked, StageFinished, FrameArrived, HeadFinished, DraftReady, DeviceLost, DeviceBack,
              ChainReady, QuestionWithdrawn, LapFailed]
#: Anything a machine returns for a driver to carry out.
Command = Union[BeginAnswer, RunStage, SendFrame, RunHead, Draft, Wake, RollbackKV, DropFrame, EmitToken,
                LapEnded, AnswerDone, Refuse, Redeal]
