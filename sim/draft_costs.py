"""What the adaptive draft rule (planner/draft_policy.py) is told about a room.

``draft_tokens: auto`` needs two things before the first lap: the seconds of one lap
that drafts ``k`` tokens, for every ``k`` up to ``max_draft_tokens``, and the
acceptance per draft position to start from. Both come from the simulator's own cost
model (sim/devices.py, sim/link.py: a calibration profile's curves when the scenario
has one, else rooflines), so the simulator and every real driver run the same rule
with the same numbers:

    lap_s[k] = draft_s(k)                                   (the host's drafter, one call)
             + sum over stages pass_s(layers, k + 1, context) (+ the host's embedding)
             + sum over hops nominal_s(frame of k + 1 positions)
             + sum over the hops back to the host  rounds(frame) x rtt
             + head_s(k + 1) + sample_s(k + 1)

at ``context`` = the prompt plus half the answer (the mean position of a decode lap);
hops round the ring by the return path, each with its link's ``rtt/2 + overhead +
bytes x (1 / bandwidth + per-byte cost)`` and no jitter (jitter and stalls shift every
``k`` alike). ``rounds(frame)``: on a link with a congestion window (a calibrated or
real room: ``window_bytes``, the tuned SCTP sender's 10 chunks of 1160 bytes), the
extra round trips the result frame needs from the *initial* window, on each hop that
carries a lap's result back towards the host (the ring's last hop, or every return hop
with ``return_path: via_stages``), with the window model the simulator's links use
(:func:`sim.link.sctp_frame_rounds`: aiortc grows the window one chunk per
acknowledgement while it is full). Why the way back: the forward hops carry every
prefill chunk (``prefill_chunk`` positions, 16 by default), so their windows grow before
the first lap; the way back carries only the last chunk's result. Why the initial
window on every lap: a frame above the window pays on several laps before the window
holds it (an 18-chunk frame from 10 chunks: 4 laps), the rule chooses one lap at a time
and cannot count on laps it has not run, and questions are often short. Measured: in
three held-out studies on the 2-vCPU VM at 80 ms and on the device machine the return
hop of a 9-position lap took 31-36 ms longer than that of a 5-position lap, two
questions of 24 and 8 tokens; charging instead the mean rounds over a question of the
answer cap (about 23 ms a lap at k=8) made the rule draft 6.4 a lap there and run at
0.88x of the best fixed k, against 0.92x for this charge (device machine, 2026-12-03,
10:02 and 14:03, docs/benchmarks.md; the replay of scripts/replay_auto.py agrees: 0.84-0.88x against
0.93-1.00x on the held-out prompts, 1.00-1.03x against 1.00x on the sample). The prior: the conditional acceptance per position
(:func:`planner.draft_policy.conditional_rates`) of the profile's walk for the
scenario's workload (its ``workload.sample``, else its kind) at ``max_draft_tokens``
(a position beyond the longest walk measured gets rate 0: the simulator knows nothing
of it, so the rule never drafts that far);
else the scenario's ``accepted_lengths`` / ``accepted_sequence``; else its per-token
``acceptance`` at every position (0.5 when none). With a profile's walk the rule also
gets one prior per draft length (:func:`prior_by_k`): the walk measured at that k, as
the simulator draws a lap of k drafts from it.
"""

from __future__ import annotations

from planner.deal import Deal
from planner.draft_policy import DraftPolicy, conditional_rates
from planner.frames import DType, frame_bytes
from planner.room import Scenario
from sim.devices import device_model
from sim.link import resolve_link, sctp_frame_rounds

__all__ = ["lap_costs", "prior_rates", "prior_by_k", "draft_policy"]


def lap_costs(scn: Scenario, deal: Deal, max_k: int) -> tuple[float, ...]:
    """``lap_s[k]`` for ``k = 0..max_k`` (module doc), seconds; each > 0.
    Raises ValueError for ``max_k < 0``."""
    if max_k < 0:
        raise ValueError(f"max_k must be >= 0, got {max_k}")
    prof = scn.profile
    host = deal.host
    models = {d.id: device_model(d, scn, deal, prof) for d in scn.devices}
    spec = scn.decoding.speculative
    ctx = scn.workload.prompt_tokens + scn.workload.answer_tokens // 2
    f32 = scn.model.residual_bytes_per_token >= 4 * scn.model.hidden
    dtype = DType.FLOAT32 if f32 else DType.FLOAT16
    path = [host] + [s.device for s in deal.stages if s.device != host]
    if scn.decoding.return_path == "via_stages":
        back = list(zip(path[::-1], path[::-1][1:]))
        hops = list(zip(path, path[1:])) + back
    else:
        ring = path + [host]
        hops = list(zip(ring, ring[1:]))
        back = hops[-1:]
    links = {(a, b): resolve_link(scn.network, a, b) for a, b in hops if a != b}
    returns = [links[h] for h in back if h in links and links[h].window_bytes is not None]
    hm = models[host]
    out = []
    for k in range(max_k + 1):
        n = k + 1
        t = hm.draft_s(k, spec) if k else 0.0
        for s in deal.stages:
            dm = models[s.device]
            t += dm.pass_s(s.layers, n, ctx, dm.stage_scale(s.start, s.end))
        t += hm.embed_s(n) + hm.head_s(n) + hm.sample_s(n)
        nbytes = frame_bytes(n, scn.model.hidden, dtype)
        t += sum(link.nominal_s(nbytes) for link in links.values())
        t += sum(sctp_frame_rounds(nbytes, link.window_bytes, link.burst_bytes)[0] * link.rtt_s for link in returns)
        out.append(max(t, 1e-9))
    return tuple(out)


def prior_rates(scn: Scenario, max_k: int) -> tuple[float, ...]:
    """The acceptance per draft position ``1..max_k`` to start each question from
    (module doc)."""
    spec = scn.decoding.speculative
    if spec is None:
        return (0.0,) * max_k
    if spec.accepted_sequence or spec.accepted_lengths:
        lengths = spec.accepted_sequence or spec.accepted_lengths
        return conditional_rates([min(int(a), max_k) for a in lengths], max_k)
    prof = scn.profile
    if prof is not None and spec.drafter in prof.drafters:
        view = prof.drafters[spec.drafter].for_workload(scn.workload.acceptance_workload)
        lengths = view.accepted_lengths(max_k)
        if lengths:  # positions beyond the longest walk measured: rate 0, never drafted
            return conditional_rates(lengths, max_k)
    p = 0.5 if spec.acceptance is None else float(spec.acceptance)
    return (p,) * max_k


def prior_by_k(scn: Scenario, max_k: int) -> tuple[tuple[float, ...], ...]:
    """One prior per draft length k = 1..max_k: the conditional rates of the profile's
    walk measured at the smallest k' >= k, capped at k (what the simulator draws a
    k-draft lap from: sim/acceptance.py); ``()`` without a profile's walk."""
    spec, prof = scn.decoding.speculative, scn.profile
    if spec is None or prof is None or spec.drafter not in prof.drafters or spec.accepted_sequence \
            or spec.accepted_lengths:
        return ()
    view = prof.drafters[spec.drafter].for_workload(scn.workload.acceptance_workload)
    if not view.accepted:
        return ()
    return tuple(conditional_rates(view.accepted_lengths(k), k) for k in range(1, max_k + 1))


def draft_policy(scn: Scenario, deal: Deal) -> DraftPolicy | None:
    """The rule's settings for ``scn`` dealt as ``deal``; None unless the scenario
    asks for ``draft_tokens: auto``."""
    spec = scn.decoding.speculative
    if spec is None or not spec.adaptive:
        return None
    k = spec.draft_tokens
    return DraftPolicy(lap_costs(scn, deal, k), prior_rates(scn, k), by_k=prior_by_k(scn, k))
