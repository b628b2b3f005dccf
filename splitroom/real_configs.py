"""What each device process of a real room is told to run: its
:class:`runtime.room.NodeConfig` (the chain, the scheduler's settings, the prompts, the
fault injection and the re-deals the planner gives), the model directory, the questions
and whether they fit, and the deal of a room that lost devices before it started.

No process is started here (that is :mod:`splitroom.real_procs`). Errors are
:class:`splitroom.real_errors.RealRunError`, one line each.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Sequence

from planner.deal import Deal
from planner.privacy import TAIL_SUFFIX
from planner.room import RUNTIME_DRAFTERS, Scenario
from splitroom.real_errors import RealRunError
from splitroom.real_predict import on_this_host, real_run_scenario


DEFAULT_PROMPTS = ("What is the capital of France?", "Name three colours of the rainbow.")


def real_model_dir(scn: Scenario) -> Path:
    """The model directory a real room of ``scn`` loads: the bundled SmolLM2 for the catalog
    id ``smollm2-135m``, else the checkpoint the scenario names (``model: {gguf: PATH}`` /
    ``{safetensors: DIR}``), converted once (``weights: gguf``: not converted, its blocks read as stored). Raises RealRunError (one line) for a model with no
    weights here or a checkpoint the runtime cannot use."""
    from splitroom.models import ModelError, model_dir
    try:
        d = model_dir(scn.model, stored=scn.weights == "gguf")
    except ModelError as e:
        raise RealRunError(str(e)) from None
    if not (d / "tokenizer.json").is_file():
        raise RealRunError(f"{scn.model.id} has no tokenizer here: a real room takes its questions as text "
                           "(splitroom generate --ids runs such a model on token ids)")
    return d


def node_configs(scn: Scenario, deal: Deal, model_dir: str, workdir: Path, backend: str) -> list:
    """One runtime.room.NodeConfig per device that holds layers or hosts. Raises
    RealRunError (one line) for what a real room cannot run: a drafter or KV storage the
    runtime lacks, a warm-up question (``workload.warm_up_tokens``, which only the
    simulator asks)."""
    from runtime.room import NodeConfig
    if scn.workload.warm_up_tokens:
        raise RealRunError("workload.warm_up_tokens: a real room asks no warm-up question; it is for predicting "
                           "a room measured after one (scripts/serve_load.py)")
    spec = scn.decoding.speculative
    if spec is not None and spec.drafter not in RUNTIME_DRAFTERS:
        raise RealRunError(f"drafter {spec.drafter!r} is not available in real runs; use ngram, early_exit or model")
    from planner.scheduler import SchedulerConfig
    if scn.options.kv_cache not in ("f32", "f16"):
        raise RealRunError(f"kv_cache {scn.options.kv_cache} is not stored by the runtime; use f32 or f16")
    from runtime.precision import BACKEND_SUPPORT
    weights, kv = scn.weights or "f32", scn.options.kv_cache
    has_w, has_kv = BACKEND_SUPPORT.get(backend, ((weights,), (kv,)))
    if weights not in has_w or kv not in has_kv:
        raise RealRunError(f"the {backend} backend stores weights as {', '.join(has_w)} and KV as "
                           f"{', '.join(has_kv)}; the scenario asks weights {weights}, kv_cache {kv} "
                           f"(choose what it stores with --set, e.g. kv_cache=f32, or use --backend numpy)")
    from runtime.config import ModelConfig
    mcfg = ModelConfig.load(model_dir)  # the checkpoint's own eos (SmolLM2: 2, <|im_end|>) and stop ids
    sched = SchedulerConfig.from_scenario(scn, eos_token=mcfg.eos_id if mcfg.eos_id >= 0 else None,
                                          stop_tokens=tuple(i for i in mcfg.stop_ids if i >= 0),
                                          deal=deal).to_json()
    chain = [(s.device, s.start, s.end) for s in deal.stages]
    members = [deal.host] + [s.device for s in deal.stages if s.device != deal.host]
    prompts = real_prompts(scn)
    check_prompts_fit(scn, deal, prompt_token_counts(model_dir, prompts) if prompts else [])
    crash, crash_s, redeals = _faults(scn, deal)
    key = secrets.token_urlsafe(24)  # signs the weights manifests the host hands out
    from planner.deal import usable_bytes
    opts = scn.options
    lent = {"usable_bytes": {d.id: usable_bytes(d, opts) for d in scn.devices if d.id in members},  # the host's re-deal check
            "layer_bytes": [scn.model.range_memory_bytes(i, i + 1, opts.context_tokens, opts.kv_cache)
                            for i in range(scn.model.layers)],
            "host_extra_bytes": scn.model.host_extra_bytes}
    out = []
    for dev in members:
        d = scn.device(dev)
        out.append(NodeConfig(device=dev, host=deal.host, stages=chain, scheduler=sched, model_dir=model_dir,
                              backend=backend, slowdown=d.emulate_slowdown or 1.0,
                              prompts=prompts if dev == deal.host else [],
                              max_new_tokens=scn.workload.answer_tokens,
                              trace_path=str(workdir / f"{dev}.trace.jsonl"),
                              peers=[m for m in members if m != dev],
                              drafter=spec.drafter if spec else "ngram",
                              crash_at_token=crash if dev == deal.host else [],
                              crash_at_s=crash_s if dev == deal.host else [],
                              crashable=any(f.device == dev for f in scn.faults),
                              redeals=redeals if dev == deal.host else {}, weights=weights, kv=kv,
                              weights_from_peer=bool(scn.faults), room_key=key,
                              ice_servers=list(scn.network.ice_servers),
                              **(lent if dev == deal.host else {})))
    return out


def with_draft_policy(cfgs: list, scn: Scenario, deal: Deal, profile, rtt_s: float,
                      prompt_tokens: Sequence[int]) -> list:
    """``cfgs`` (NodeConfigs) with the adaptive draft rule's settings
    (sim.draft_costs.draft_policy) in every scheduler: the room as this run runs it
    (:func:`real_run_scenario`), costed from ``profile`` when given, else from the
    scenario's rooflines."""
    from runtime.control import DraftPolicySettings
    from sim.draft_costs import draft_policy
    as_run = real_run_scenario(scn, rtt_s, prompt_tokens, scn.workload.answer_tokens)
    pol = draft_policy(as_run.with_profile(on_this_host(profile, deal)[0]) if profile is not None else as_run, deal)
    if pol is None:
        return cfgs
    settings = DraftPolicySettings(**pol.to_json())
    return [c.model_copy(update={"scheduler": c.scheduler.model_copy(update={"draft_policy": settings})})
            for c in cfgs]


def _faults(scn: Scenario, deal: Deal) -> tuple[list, list, dict]:
    """The host's fault injection for a scenario's ``faults:`` (``[(device, token N)]``
    and ``[(device, seconds)]``, the seconds counted from the host's start, when the
    first question is asked, as the simulator counts them) and the re-deal the planner's
    rules give for the loss of each worker of the chain, over the devices that run a
    process (the chain; the prediction re-deals over the same). Raises RealRunError for
    a fault the real room cannot inject: on the model host or on a device outside the
    chain."""
    if not scn.faults:
        return [], [], {}
    from planner.chain import redeal_rule_for
    chain = {s.device for s in deal.stages} - {deal.host}
    crash, crash_s = [], []
    for f in scn.faults:
        if f.device == deal.host or f.device not in chain or f.device.endswith(TAIL_SUFFIX):
            raise RealRunError(f"faults: {f.device} is not a worker of the chain; run --real can only kill a worker")
        if f.at_token is not None:
            crash.append((f.device, f.at_token))
        else:
            crash_s.append((f.device, f.at_s))
    rule = redeal_rule_for(scn, [d for d in scn.devices if d.id in chain | {deal.host}])
    redeals = {}
    for dev in sorted(chain):
        try:
            new = rule(deal, frozenset({dev}))
        except ValueError:  # the rest cannot hold the model: the host will refuse, with the reason
            redeals[dev] = []
            continue
        redeals[dev] = [(s.device, s.start, s.end) for s in new.stages]
    return crash, crash_s, redeals


def check_prompts_fit(scn: Scenario, deal: Deal, prompt_tokens: Sequence[int]) -> None:
    """Raise RealRunError (one line, with the lengths) when a question's prompt
    (``prompt_tokens``, through the chat template) plus its answer cap
    (``workload.answer_tokens``) is longer than the room holds: the scenario's context,
    or less when the smallest stage's KV cache holds fewer positions
    (:attr:`planner.deal.Deal.max_context`)."""
    limits = [(scn.options.context_tokens, "the context")]
    if deal.max_context is not None:
        small = min((sh for sh in deal.shares if sh.max_context is not None
                     and (sh.layers > 0 or sh.role == "model host")), key=lambda sh: sh.max_context)
        limits.append((deal.max_context, f"{small.device}'s KV cache (the smallest stage's)"))
    limit, what = min(limits, key=lambda x: x[0])
    answer = scn.workload.answer_tokens
    for i, n in enumerate(prompt_tokens):
        if n + answer > limit:
            raise RealRunError(f"question {i + 1} does not fit: a prompt of {n:,} tokens + {answer:,} answer "
                               f"tokens > {limit:,} positions, what {what} holds")


def real_prompts(scn: Scenario) -> list[str]:
    """The questions a real run asks: the scenario's prompts, else the defaults."""
    return list(scn.workload.prompts) or list(DEFAULT_PROMPTS)[:scn.workload.questions]


def prompt_token_counts(model_dir: str, prompts: Sequence[str]) -> list[int]:
    """Token counts of ``prompts`` through the model's chat template."""
    from runtime.tokenizer import ChatTokenizer
    tok = ChatTokenizer.from_dir(model_dir)
    return [len(tok.encode_chat(p)) for p in prompts]


def redeal_without(scn: Scenario, deal: Deal, dead: set[str]) -> tuple[Deal | None, str]:
    """The deal of a room that lost ``dead`` before it started: ``(new deal, "")`` when
    the devices left can hold the model (dealt again by the scenario's rules, the host
    kept; a pinned room merges the lost ranges into their neighbours, checked against
    what each lends: :func:`planner.chain.redeal_rule`), else ``(None, why)``. The model
    host among ``dead`` is never re-dealt."""
    from planner.chain import redeal_rule
    if deal.host in dead:
        return None, "the model host is gone"
    try:
        new = redeal_rule(scn.devices, scn.model, scn.options)(deal, frozenset(dead))
    except ValueError as e:
        return None, str(e)
    return new, ""
