"""The simulator's side of a real run: the scenario as this machine runs it, the
prediction from a calibration profile made before the room starts, the same-run
prediction from what the room measured (:mod:`planner.trace_fit` fits it), and the
comparison of measured with predicted (:class:`RealResult`).

Calibration (what the same-run prediction takes from the measurement, nothing else):
each device's seconds per layer, the per-hop overhead over the emulated one-way delay,
the host's output head per row, the drafter's cost per token and the accepted length of
every verify lap, the measured prompt and answer lengths, and the transport's initial
congestion window (aiortc as tuned by runtime.transport: 10 chunks of 1160 bytes), so
large frames pay their slow-start round trips.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.deal import Deal
from planner.metrics import compute as compute_metrics
from planner.metrics import first_token_parts
from planner.protocol import BeginAnswer
from planner.room import Scenario
from planner.trace_fit import calibrated_scenario
from splitroom.real_errors import RealRunError


@dataclass
class RealResult:
    """Measured and predicted numbers of one real run.

    ``predicted`` / ``error_pct``: the same-run figure (the simulator calibrated with
    this run's own measurements: it shows the model composes measured parts, it is
    not a prediction). ``profile_predicted`` / ``profile_error_pct``: the figure
    predicted before the run from a calibration profile, when one was given."""

    measured: dict
    predicted: dict
    error_pct: dict
    answers: list
    calibration: dict
    network: str
    emulated: list
    profile_predicted: dict | None = None
    profile_error_pct: dict | None = None
    #: per question, in asking order: "answered", "refused: REASON" or "lost: REASON"
    #: (``answers`` is aligned with it; a question that ended without an answer has "")
    ended: list = dataclasses.field(default_factory=list)
    #: every device the model host declared lost, in order: ``(device, reason)`` (the
    #: reason names the rule that fired, runtime.room.lost_reason)
    losses: list = dataclasses.field(default_factory=list)

    @property
    def unanswered(self) -> list[tuple[int, str]]:
        """``(question index, how it ended)`` of every question that was not answered."""
        return [(i, e) for i, e in enumerate(self.ended) if e != "answered"]


def sctp_burst_bytes() -> int:
    """Bytes the room's tuned SCTP sender sends in one burst before an acknowledgement
    returns (runtime.transport: DEFAULT_MAX_BURST_CHUNKS chunks of SCTP_CHUNK_BYTES)."""
    from runtime.transport import DEFAULT_MAX_BURST_CHUNKS, SCTP_CHUNK_BYTES
    return DEFAULT_MAX_BURST_CHUNKS * SCTP_CHUNK_BYTES


def real_run_network(scn: Scenario, rtt_s: float):
    """``scn.network`` as a real room on this machine has it (a
    :class:`planner.room.Network`): the round trip ``rtt_s`` (0 on loopback) with the
    scenario's jitter scale as normal jitter (netem applies it; none at 0 ms), no stall
    episodes and no per-pair links (not emulated), no bandwidth limit (loopback has none to
    speak of: the transport's per-byte cost is in the profile) and the tuned SCTP sender's
    burst cap (:func:`sctp_burst_bytes`)."""
    from planner.room import Jitter
    j = scn.network.jitter
    jitter = Jitter("normal", j.scale_s) if (j is not None and j.scale_s > 0 and rtt_s > 0) else Jitter()
    return dataclasses.replace(scn.network, rtt_s=rtt_s, jitter=jitter, episodes=None, links=(), bandwidth_Bps=1e12,
                               burst_bytes=sctp_burst_bytes())


def with_late_hops(scn: Scenario, late_s: float) -> Scenario:
    """``scn`` with ``late_s`` seconds more on every hop (the in-process delay's lateness,
    planner.profile.TransportProfile.delay_late_s). Apply it after
    :meth:`planner.room.Scenario.with_profile`, which sets the hop overhead from the profile's
    transport."""
    if not late_s:
        return scn
    return dataclasses.replace(scn, network=dataclasses.replace(scn.network,
                                                                hop_overhead_s=scn.network.hop_overhead_s + late_s))


def real_run_scenario(scn: Scenario, rtt_s: float, prompt_tokens: Sequence[int], answer_tokens: int) -> Scenario:
    """``scn`` as a real run on this machine will run it, for a prediction made before
    the run: the network of :func:`real_run_network` at ``rtt_s``, the real prompts' token
    counts and the answer cap, asked by the host one after another."""
    net = real_run_network(scn, rtt_s)
    n = max(len(prompt_tokens), 1)
    wl = dataclasses.replace(scn.workload, prompt_tokens=max(int(round(sum(prompt_tokens) / n)), 1),
                             prompt_tokens_each=tuple(max(int(x), 1) for x in prompt_tokens),
                             answer_tokens=max(answer_tokens, 1), questions=n, asked_by=())
    return dataclasses.replace(scn, network=net, workload=wl)


def on_this_host(profile, deal: Deal):
    """``(profile, line)``: ``profile`` for a real run of ``deal``, whose device processes
    (every device that holds layers, and the model host) all run on this machine
    (:meth:`planner.profile.Profile.on_one_host`; the line says what was applied, empty
    when nothing was)."""
    return profile.on_one_host(len({st.device for st in deal.stages if st.layers} | {deal.host}))


def predict_real_run(scn: Scenario, deal: Deal, profile, rtt_s: float, prompt_tokens: Sequence[int],
                     in_process_delay: bool = False, ttft_parts: bool = False) -> dict:
    """Metrics the simulator predicts for a real run of ``scn`` from ``profile`` (a
    :class:`planner.profile.Profile`), before the run: every device process on this
    machine, so with the profile's shared-core excess (:func:`on_this_host`; ``shared_host``
    in the metrics says what was applied). ``in_process_delay``: the round trip ``rtt_s``
    is applied in the device processes, so every hop also pays the profile's
    ``transport.delay_late_s`` when it has one (``delay_late_s`` in the metrics). Raises
    RealRunError when the predicted room answers fewer questions than it is asked (never a
    silent 0.0). ``ttft_parts``: the room is simulated with its trace and the metrics
    carry ``first_token_parts`` (planner.metrics.first_token_parts: the first token split
    into the host's and each worker's stage, each hop, the head and the rest)."""
    from sim.driver import simulate
    from splitroom.ranges import acceptance_source, predict_range
    profile, shared = on_this_host(profile, deal)
    tr = profile.transport
    late = (tr.delay_late_s or 0.0) if (in_process_delay and rtt_s > 0 and tr is not None) else 0.0
    pred_scn = with_late_hops(real_run_scenario(scn, rtt_s, prompt_tokens, scn.workload.answer_tokens)
                              .with_profile(profile), late)
    if ttft_parts:
        run = simulate(pred_scn, deal, trace=True)
        m = run.metrics
        m["first_token_parts"] = first_token_parts(run.trace)
    else:
        m = simulate(pred_scn, deal, trace=False).metrics
    _check_answered(m, "the prediction from the profile")
    m["range"] = predict_range(pred_scn, deal, m)
    if pred_scn.decoding.speculative is not None:  # the same room plain, for the warning (speculation_check)
        from splitroom.speculation_check import plain_scenario, speculation_summary
        plain = simulate(plain_scenario(pred_scn), deal, trace=False).metrics
        m["speculation"] = speculation_summary(pred_scn, m["tokens_per_s"], plain["tokens_per_s"])
    source = acceptance_source(pred_scn)
    if source:
        m["acceptance_from"] = source
    if shared:
        m["shared_host"] = shared
    if late:
        m["delay_late_s"] = late
    return m


def _check_answered(m: dict, what: str) -> None:
    if m.get("answered", 0) < m.get("questions", 0) or m.get("tokens", 1) == 0:
        raise RealRunError(f"{what} answered {m.get('answered', 0)} of {m.get('questions', 0)} questions: "
                           "the simulated room stalled; this is a bug, please report it with the scenario")


def _error_pct(measured: dict, predicted: dict) -> dict:
    out = {}
    for k in ("tokens_per_s", "ttft_s", "tokens_per_lap"):
        m, p = measured.get(k, 0.0), predicted.get(k, 0.0)
        out[k] = 100.0 * (p - m) / m if m else 0.0
    for k in ("p50", "p99"):
        m, p = measured["inter_token_s"][k], predicted["inter_token_s"][k]
        out[f"inter_token_{k}"] = 100.0 * (p - m) / m if m else 0.0
    return out


def predict_from_profile(scn: Scenario, deal: Deal, profile, rtt_s: float, prompt_tokens: Sequence[int],
                         in_process_delay: bool, log) -> dict:
    """:func:`predict_real_run`, with what it predicts said on ``log`` in one line (tokens
    per second with its P10-P90 range, the first token, where the acceptance came from,
    the shared-host excess), and a second line when speculation is predicted to be slower
    than the plain room (splitroom.speculation_check.warning_line)."""
    predicted = predict_real_run(scn, deal, profile, rtt_s, prompt_tokens, in_process_delay=in_process_delay)
    rg = predicted["range"]
    spread = (f" (P10-P90 {rg['tokens_per_s']['p10']:.2f}-{rg['tokens_per_s']['p90']:.2f}, "
              f"{', '.join(rg['sources'])})" if rg["replicas"] else " (one point: nothing varies)")
    log(f"predicted from the profile before running: {predicted['tokens_per_s']:.2f} tok/s{spread}, "
        f"first token {predicted['ttft_s'] * 1000:.0f} ms"
        + (f"; acceptance from {predicted['acceptance_from']}" if predicted.get("acceptance_from") else "")
        + (f"; {predicted['shared_host']}" if predicted.get("shared_host") else ""))
    from splitroom.speculation_check import warning_line
    warning = warning_line(predicted.get("speculation"))
    if warning:
        log(warning)
    return predicted


def predict_same_run(scn: Scenario, deal: Deal, cal: dict, trace: Sequence, answers: Sequence[dict],
                     rtt_s: float) -> dict:
    """Metrics the simulator gives for ``scn`` calibrated with one real run's own
    measurements (``cal``: planner.trace_fit.fit_trace of its ``trace``), at the round
    trip ``rtt_s`` the room ran at, with the run's mean prompt and answer lengths
    (``answers``: the answered questions' records) and the tuned transport's window and
    burst. With ``faults``, only the devices that ran a process can take a lost range, as
    in the real room. Raises RealRunError when the simulated room answers fewer questions
    than it is asked."""
    prompt_lens = [o.prompt_tokens for _, o in trace if isinstance(o, BeginAnswer)]
    n_ans = [len(a["token_ids"]) for a in answers] or [1]
    from runtime.transport import INITIAL_WINDOW_BYTES
    pred_scn = calibrated_scenario(scn, cal, rtt_s, int(np.mean(prompt_lens)) if prompt_lens else 1,
                                   int(round(np.mean(n_ans))), len(answers) or 1, INITIAL_WINDOW_BYTES,
                                   sctp_burst_bytes())
    from sim.driver import simulate
    if scn.faults:  # only the devices that run a process can take a lost range, as in the real room
        pred_scn = dataclasses.replace(pred_scn, devices=tuple(
            d for d in pred_scn.devices if d.id == deal.host or any(s.device == d.id for s in deal.stages)))
    predicted = simulate(pred_scn, deal, trace=False).metrics
    _check_answered(predicted, "the same-run prediction")
    return predicted


def compare(trace: Sequence, predicted: dict, profile_predicted: dict | None, **result) -> RealResult:
    """The :class:`RealResult` of a run: the metrics measured on its ``trace``
    (planner.metrics.compute), beside the same-run ``predicted`` metrics and the
    ``profile_predicted`` ones (None without a profile), each with its error in percent
    of the measured figure (:func:`_error_pct`); the measured metrics also carry
    ``first_token_parts`` (planner.metrics.first_token_parts of the trace). ``result``: the other fields of
    RealResult (answers, calibration, network, emulated, ended, losses)."""
    measured = compute_metrics(trace)
    measured["first_token_parts"] = first_token_parts(trace)
    return RealResult(measured, predicted, _error_pct(measured, predicted), profile_predicted=profile_predicted,
                      profile_error_pct=_error_pct(measured, profile_predicted) if profile_predicted else None,
                      **result)
