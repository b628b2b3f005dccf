"""Ends-local privacy: the asker's machine (the model host) keeps the embedding, the
first ``first`` layers, the last ``last`` layers, the final norm and the output head,
so token ids and logits never leave it; only the middle layers go round the room.

A lap is host (layers 1..N) -> workers (the middle) -> host (the last M layers) ->
head. The host then runs two stages. This module expresses that as an ordinary
chain for a driver that runs one stage per device: the host's tail range is held by a
*virtual device* ``<host>.tail`` with the host's compute figures, joined to the host by a
free link (no round trip, no overhead, no jitter, no stalls, unbounded bandwidth), and
every link override that names the host is repeated for it. The scheduler and the
simulator then need no change.

What the virtual device does not model: it computes in parallel with the host's own
stage, so when two laps overlap on the host (async laps, pipelined prefill chunks) the
host's two stages do not contend for its GPU as they would on one machine; a
calibration profile keyed by the host's id does not cover it (roofline / measured
``ms_per_layer`` is used). Plain decoding with one lap in flight is unaffected.

What ends-local does *not* protect: the residual sent to the first worker is the hidden
state after N layers, and hidden states can be inverted back to the prompt (Qu et al.,
"Prompt Inversion Attack against Collaborative Inference of Large Language Models",
arXiv:2503.09022, 2025: 88.4% token accuracy on Llama-65B from the activations a
participant receives). It keeps the token ids, the logits and the sampled answer on
the asker's machine; it does not make the middle of the ring blind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from planner.deal import Deal, DealError, Stage, _finish, deal, holds_layers, pick_host, usable_bytes
from planner.model import ModelSpec
from planner.room import DealOptions, Device, Episodes, Jitter, LinkSpec, Network

TAIL_SUFFIX = ".tail"  # scenario ids are [a-z0-9_-]+: no device can be named so; the relay accepts it
#: the host-to-itself link: nothing crosses a network (1 PB/s stands for "unbounded")
_FREE = dict(rtt_s=0.0, hop_overhead_s=0.0, bandwidth_Bps=1e15, jitter=Jitter("none"),
             episodes=Episodes(every_s=1e12, lasting_s=0.0, extra_rtt_s=0.0), window_bytes=1e15)


def tail_id(host: str) -> str:
    """The virtual device id holding the host's last layers: ``"<host>.tail"``."""
    return host + TAIL_SUFFIX


def ends_local(devices: Sequence[Device], model: ModelSpec, options: DealOptions, network: Network,
               first: int, last: int) -> tuple[tuple[Device, ...], Network, Deal]:
    """The room, network and deal of an ends-local split (module doc).

    The host is the rules' pick (or ``options.host``). The middle ``layers - first -
    last`` layers are dealt over the other devices by ``options.split`` (``optimal``
    included, with ``network``); the host holds ``[0, first)`` and its virtual tail
    device ``[layers - last, layers)``. ``fits`` is False when the host's two ranges plus
    the embedding, head and draft exceed what it lends less the headroom.

    Returns ``(devices with the virtual tail, network with its links, deal)``.
    Raises DealError when ``first < 1``, ``last < 1``, nothing is left for the middle,
    or no other device can hold a layer.
    """
    L = model.layers
    if first < 1 or last < 1:
        raise DealError(f"privacy.ends_local: first and last must be >= 1 (got first={first}, last={last})")
    if first + last >= L:
        raise DealError(f"privacy.ends_local: first + last = {first + last} leaves no middle layers "
                        f"of {L} for the room")
    host_id = pick_host(devices, options.host)[0]
    host = next(d for d in devices if d.id == host_id)
    workers = [d for d in devices if d.id != host_id]
    if not workers:
        raise DealError("privacy.ends_local: the room has no device besides the host for the middle layers")
    middle = replace(model, layers=L - first - last, embedding_bytes=0, head_bytes=0, draft_bytes=0,
                     layer_sizes=model.layer_sizes[first:L - last] if model.layer_sizes else ())
    try:
        mid = deal(workers, middle, replace(options, host=None, stages=None), network)
    except DealError as e:
        raise DealError(f"privacy.ends_local: the middle {middle.layers} layers: {e}") from None
    tail = Device(id=tail_id(host_id), kind=host.kind, webgpu=True, name=f"{host.name or host_id} (last layers)",
                  lends_bytes=0, memory_bandwidth_Bps=host.memory_bandwidth_Bps, compute_flops=host.compute_flops,
                  copy_speed_Bps=host.copy_speed_Bps, s_per_layer=host.s_per_layer,
                  emulate_slowdown=host.emulate_slowdown, clocks_down=host.clocks_down)
    # what the host's first range and extras leave of its lend is the tail's share,
    # so the tail "fits" exactly when the host's two ranges fit together
    head_used = model.range_memory_bytes(0, first, options.kv_tokens, options.kv_cache) + model.host_extra_bytes
    left = usable_bytes(host, options) - head_used
    tail_lends = left + (left * options.headroom / (1 - options.headroom) if options.headroom < 1 else 0)
    tail = replace(tail, lends_bytes=max(0, int(tail_lends)))
    room = tuple(devices) + (tail,)
    links = list(network.links) + [LinkSpec(between=(host_id, tail.id), **_FREE)]
    for spec in network.links:
        if host_id in spec.between and tail.id not in spec.between:
            links.append(replace(spec, between=tuple(tail.id if x == host_id else x for x in spec.between)))
    net = replace(network, links=tuple(links))
    stages = ((Stage(host_id, 0, first),) + tuple(Stage(s.device, s.start + first, s.end + first) for s in mid.stages)
              + (Stage(tail.id, L - last, L),))
    holds = {d.id: holds_layers(d, model, options, d.id == host_id, 0 if d.id == host_id else None) for d in room}
    front, back = Stage(host_id, 0, first), Stage(host_id, L - last, L)
    # the middle deal's own host pick means nothing here: its notes about hosting are dropped
    mid_notes = [n for n in mid.notes if " hosts" not in n.split(":")[0] and "model host" not in n]
    notes = [f"privacy ends_local: {host_id} keeps the embedding, layers {front.shown} and {back.shown} and "
             f"the head; token ids and logits stay on {host_id}",
             f"the middle layers {first + 1}-{L - last} are dealt over the other devices (split {mid.split})"] + \
        [f"middle: {n}" for n in mid_notes] + \
        [f"{tail.id} is {host_id} itself running its last layers (a second stage on the same machine)"]
    out = _finish(list(room), model, options, host_id, f"{mid.split}+ends_local", stages, holds, notes)
    return room, net, out
