"""``splitroom run --real``: start a real room on this machine, measure it, and compare
with the simulator's prediction for the same scenario calibrated with what was measured.

One process per device (``python -m runtime.node``), a signalling relay, WebRTC data
channels between the processes. With root and the tools for it, each device runs in its
own network namespace and the scenario's round trip is applied to its packets
(runtime/testbed/netem.py); otherwise the room runs on loopback and says so, or, with
``in_process_delay``, on loopback with each device process holding what it sends for half
the round trip (runtime.transport.emulate_delay: one delay for every pair, no jitter).

:func:`run_real` is a pipeline, one module per step:

    plan     the device configs and the network        (:func:`plan_room`: splitroom.real_configs,
                                                        splitroom.real_procs.plan_network)
    predict  before the run, from a profile if given   (splitroom.real_predict.predict_from_profile)
    run      the processes; read what they wrote       (splitroom.real_procs.run_room, read_room)
    fit      the calibration from the trace            (planner.trace_fit.fit_trace)
    predict  the same run, calibrated with it          (splitroom.real_predict.predict_same_run)
    compare  measured against predicted                (splitroom.real_predict.compare)
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.deal import Deal
from planner.privacy import TAIL_SUFFIX
from planner.room import Scenario
from planner.trace_fit import fit_trace
from splitroom.real_configs import (node_configs, prompt_token_counts, real_model_dir, real_prompts, redeal_without,
                                    with_draft_policy)
from splitroom.real_errors import DiedWhileLoading, RealRunError
from splitroom.real_predict import RealResult, compare, predict_from_profile, predict_same_run
from splitroom.real_procs import plan_network, read_room, run_room

__all__ = ["RealResult", "RealRunError", "RoomPlan", "node_configs", "plan_network", "plan_room", "real_model_dir",
           "redeal_without", "run_real"]


@dataclass
class RoomPlan:
    """A real room before it starts (:func:`plan_room`): the model directory it loads, one
    NodeConfig per device process, the devices the model host's process also runs
    (``colocated``: its ends-local tail), the network (an EmulatedNetwork not entered yet,
    or None for loopback) with its one-line ``description`` and round trip ``rtt_s``, and
    the questions' prompt token counts (``prompt_tokens``; empty when nothing needs them
    before the run)."""

    model_dir: str
    cfgs: list
    colocated: set
    net: object | None
    description: str
    rtt_s: float
    prompt_tokens: list


def plan_room(scn: Scenario, deal: Deal, backend: str, netns: bool, in_process_delay: bool, profile,
              workdir: Path) -> RoomPlan:
    """What each device process of ``deal`` runs and on which network: the node configs
    (:func:`splitroom.real_configs.node_configs`, writing traces under ``workdir``), the
    network (:func:`splitroom.real_procs.plan_network`; with an in-process delay every
    process holds what it sends ``rtt_s / 2``) and, for ``draft_tokens: auto``, the
    adaptive draft rule's settings costed from ``profile`` or the rooflines. Raises
    RealRunError (one line) for what the room cannot run."""
    model_dir = str(real_model_dir(scn))
    cfgs = node_configs(scn, deal, model_dir, workdir, backend)
    # a device the host's own machine runs (its ends-local tail) shares the host's process
    colocated = {c.device for c in cfgs if c.device.endswith(TAIL_SUFFIX)}
    net, description, rtt_s = plan_network(scn, [c.device for c in cfgs if c.device not in colocated], netns,
                                           in_process_delay)
    if net is None and rtt_s > 0:  # in-process delay: every device process holds what it sends rtt/2
        cfgs = [c.model_copy(update={"emulate_one_way_s": rtt_s / 2}) for c in cfgs]
    spec = scn.decoding.speculative
    counts = prompt_token_counts(model_dir, real_prompts(scn)) if (profile is not None or (spec and spec.adaptive)) \
        else []
    if spec is not None and spec.adaptive:  # draft_tokens: auto: the host's rule gets this room's lap costs
        cfgs = with_draft_policy(cfgs, scn, deal, profile, rtt_s, counts)
    return RoomPlan(model_dir, cfgs, colocated, net, description, rtt_s, counts)


def run_real(scn: Scenario, deal: Deal, backend: str = "numpy", netns: bool = True, timeout_s: float = 300.0,
             log=print, profile=None, in_process_delay: bool = False) -> RealResult:
    """Run the room for real and predict it; see the module doc. With ``profile`` (a
    :class:`planner.profile.Profile`) the room is also predicted from it before it
    runs (``RealResult.profile_predicted``). ``RealResult.ended`` says how each
    question ended (answered, or refused/lost with the reason). ``in_process_delay``:
    when the room does not run in namespaces (``netns`` False, or this machine cannot),
    its round trip is applied in the device processes (:func:`plan_network`); what
    that delay really did per device is ``RealResult.calibration["in_process_delay"]``.

    The work folder (device configs, traces, logs) is a temporary directory removed
    when the run ends, failed or not (``SPLITROOM_KEEP_WORKDIR=1`` keeps it).

    A worker whose process ends before the room started (it died while loading: before
    the model host's process joined the room) makes the room start again without it
    when the devices left can hold the model (:func:`redeal_without`, said on ``log``).

    Raises RealRunError when the scenario's model has no weights here (see
    :func:`real_model_dir`), a device process fails (with the last line of its log), a
    worker dies while loading and the devices left cannot hold the model ("cannot start:
    DEVICE died while loading (how; why)"), or the run exceeds ``timeout_s`` seconds.
    """
    import shutil
    gone: set[str] = set()
    while True:
        workdir = Path(tempfile.mkdtemp(prefix="splitroom-real-"))
        try:
            return _run_real(scn, deal, backend, netns, timeout_s, log, profile, workdir, in_process_delay)
        except DiedWhileLoading as e:  # the room never started: without that device, or a one-line error
            gone.add(e.device)
            new, why = redeal_without(scn, deal, gone)
            if new is None:
                raise RealRunError(f"cannot start: {e.device} died while loading ({e.how}; {why})") from None
            deal = new
            log(f"{e.device} died while loading: re-dealt without it: "
                + ", ".join(f"{s.device} {s.shown}" for s in deal.stages))
        finally:
            if os.environ.get("SPLITROOM_KEEP_WORKDIR") != "1":
                shutil.rmtree(workdir, ignore_errors=True)


def _run_real(scn: Scenario, deal: Deal, backend: str, netns: bool, timeout_s: float, log, profile,
              workdir: Path, in_process_delay: bool = False) -> RealResult:
    """One attempt of :func:`run_real` in ``workdir``: plan -> run -> fit -> predict -> compare."""
    plan = plan_room(scn, deal, backend, netns, in_process_delay, profile, workdir)
    before = None if profile is None else predict_from_profile(scn, deal, profile, plan.rtt_s, plan.prompt_tokens,
                                                               plan.net is None, log)
    wall_s = run_room(plan.cfgs, plan.colocated, plan.net, plan.description, deal.host, workdir, timeout_s, log)
    ran = read_room(plan.cfgs, deal.host, wall_s)
    cal = fit_trace(ran.trace, deal)
    if ran.delays:
        cal["in_process_delay"] = ran.delays
    predicted = predict_same_run(scn, deal, cal, ran.trace, ran.answers, plan.rtt_s)
    cal["wall_s"] = ran.wall_s
    emulated = [f"{c.device}: compute padded {c.slowdown:g}x" for c in plan.cfgs if c.slowdown > 1]
    return compare(ran.trace, predicted, before, answers=ran.aligned, calibration=cal, network=plan.description,
                   emulated=emulated, ended=ran.ended, losses=ran.losses)
