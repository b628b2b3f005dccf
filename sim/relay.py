"""The ``via_host`` return path: a model host that relays every stage's output.

In a room whose client routes every hand-off itself (Petals' client-side routing: the
client sends the hidden state to a server, gets the result back, and sends it to the
next server), a frame from one worker to the next crosses two links, worker -> host and
host -> next worker. :func:`relayed_network` turns the room's network into one where
each ordered pair of workers ``a -> b`` is a directed link with the cost of those two:

* round trip ``rtt(a, host) + rtt(host, b)`` (its one-way flight, half of it, is the two
  flights);
* hand-off cost ``hop_overhead(a, host) + hop_overhead(host, b)`` (two hand-offs);
* bandwidth ``1 / (1 / bw(a, host) + 1 / bw(host, b))``, so a frame's serialization
  time is the two serializations' sum;
* the congestion window the smaller of the two; jitter and stall episodes those of
  ``a -> host`` (one draw per frame: the sum of two draws is not a distribution the
  scenario can name).

Links from and to the host are unchanged: the first hop (host -> first worker) and the
return (last worker -> host) are what they were with a direct return. Not modelled: the
host's own uplink being shared by the frames it relays, and its time to receive and
resend them (put it in ``hop_overhead``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from planner.room import LinkSpec, Network
from sim.link import resolve_link

__all__ = ["relayed_network"]


def relayed_network(network: Network, device_ids: Iterable[str], host: str) -> Network:
    """``network`` with every ordered pair of devices other than ``host`` relayed
    through ``host`` (module doc). Raises ValueError as :func:`sim.link.resolve_link`."""
    ids = [d for d in device_ids if d != host]
    extra = []
    for a in ids:
        up = resolve_link(network, a, host)
        for b in ids:
            if a == b:
                continue
            down = resolve_link(network, host, b)
            windows = [w for w in (up.window_bytes, down.window_bytes) if w is not None]
            extra.append(LinkSpec(between=(a, b), directed=True, rtt_s=up.rtt_s + down.rtt_s, jitter=up.jitter,
                                  bandwidth_Bps=1.0 / (1.0 / up.bandwidth_Bps + 1.0 / down.bandwidth_Bps),
                                  hop_overhead_s=up.hop_overhead_s + down.hop_overhead_s,
                                  episodes=up.episodes, window_bytes=min(windows) if windows else None))
    return replace(network, links=tuple(network.links) + tuple(extra))
